//! Reprise core: the replay engine behind every way of running Reprise.
//!
//! A [`Store`] holds step data column by column in shared memory, handed out in
//! fixed-size blocks by a reference-counting [`blocks::BlockAllocator`]. A [`Table`]
//! holds items (windows of rows in a store) and picks them with a sampler
//! [`selectors::Selector`], evicts them with a remover, and paces inserts against
//! samples with a [`rate_limiter::RateLimiter`]. A [`Writer`] appends steps into
//! blocks it leased and creates items over recent steps of its episode.
//!
//! No networking lives here; the Python bindings, the local server and the gRPC
//! service are thin layers over these types.

pub mod blocks;
mod bulk;
pub mod columns;
pub mod error;
pub mod item;
pub(crate) mod memory;
pub mod rate_limiter;
pub mod sample;
pub mod selectors;
pub mod signature;
pub mod snapshot;
pub mod store;
pub mod table;
pub mod wait;
pub mod writer;

pub use columns::Columns;
pub use error::{Error, Result};
pub use item::{RowRange, Window};
pub use rate_limiter::RateLimiterConfig;
pub use sample::{Collect, SampleBatch, SampledItem};
pub use selectors::SelectorSpec;
pub use signature::{DType, Field, Signature};
pub use store::Store;
pub use table::{Table, TableConfig, TableInfo};
pub use wait::Wait;
pub use writer::Writer;
