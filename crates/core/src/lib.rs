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

// Modules in layer order: each uses only modules above it (a DAG, checked by
// reading the `use crate::` lines; keep it so when adding one).
//   error          the error type (depends on nothing)
//   wait           deadlines and interrupts of blocking calls
//   signature      fields, dtypes, shapes
//   item           row ranges, windows, items
//   rate_limiter   the one limiter mechanism
//   memory         mapped shared memory (raw memory lives here and in columns)
//   selectors      samplers and removers
//   cluster        cluster mode's plan arithmetic (uses selectors' generator)
//   columns        step data, column by column, over one mapping
//   blocks         the block allocator and reference counts
//   store          columns + allocator + the tables over them (as a trait)
//   sample         drawn items holding their blocks; collecting rows
//   attributes     named per-item scalars and their records
//   extensions     observers of a table's events and their statistics (uses memory)
//   table          tables (table/sampling, table/batch_insert, table/snapshot, table/shard)
//   writer         steps into leased blocks, items over recent steps
//   checkpoint     tables and their rows on disk, and back (uses table, store)
//   durable        a durable file store's commits (uses checkpoint, table; the store
//                  holds them as `store::Commits`)
pub mod error;
pub mod wait;
pub mod signature;
pub mod item;
pub mod rate_limiter;
pub(crate) mod memory;
pub mod selectors;
pub mod cluster;
pub mod columns;
pub mod blocks;
pub mod store;
pub mod sample;
pub mod attributes;
pub mod extensions;
pub mod table;
pub mod writer;
pub mod checkpoint;
pub mod durable;
pub mod auth;

pub use memory::{backing, remove_stale_regions, stale_regions, Backing};
pub use table::snapshot;
pub use columns::Columns;
pub use extensions::ExtensionSpec;
pub use error::{Error, Result};
pub use item::{RowRange, Window};
pub use rate_limiter::RateLimiterConfig;
pub use sample::{Collect, SampleBatch, SampledItem};
pub use selectors::SelectorSpec;
pub use signature::{DType, Field, Signature, StackPadding};
pub use store::Store;
pub use table::{Table, TableConfig, TableInfo};
pub use wait::Wait;
pub use writer::Writer;
