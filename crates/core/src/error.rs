//! One error type for the core, mapped one to one onto `reprise.errors` in Python.
//!
//! This module is the bottom layer of the crate: it depends on no other module, so
//! every module may return its errors. A sample cut short travels inside the error as
//! a [`PartialSample`], whose contents the `sample` module (a layer above) defines.

/// What a blocking call had already done when its deadline passed, so that nothing
/// it took from or gave to a table is lost.
#[derive(Debug, Default)]
pub enum Partial {
    #[default]
    Nothing,
    /// Keys of the items inserted before the deadline.
    Inserted(Vec<u64>),
    /// The items drawn before the deadline.
    Sampled(PartialSample),
}

/// The items a draw took before it was cut short: always a `sample::SampleBatch`
/// (made only by `PartialSample::new`; read it with `batch`/`into_batch`). Held as
/// `Any` so that this module need not depend on the sample layer above it.
pub struct PartialSample(pub(crate) Box<dyn std::any::Any + Send>);

impl std::fmt::Debug for PartialSample {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PartialSample")
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Bad shape, dtype, field, priority or argument. Nothing was changed.
    #[error("{0}")]
    InvalidArgument(String),
    /// Unknown table, field or key.
    #[error("{0}")]
    NotFound(String),
    /// A blocking call ran past its deadline. `partial` holds what it did before.
    #[error("{message}")]
    Timeout { message: String, partial: Partial },
    /// A blocking call was told to stop (Ctrl-C). `partial` as for `Timeout`.
    #[error("interrupted")]
    Interrupted { partial: Partial },
    /// The store has no free block, and evicting the items of its oldest blocks
    /// could not free one.
    #[error("{0}")]
    ResourceExhausted(String),
    /// A checkpoint or message failed validation.
    #[error("{0}")]
    Corrupt(String),
    /// The operating system refused something (creating or mapping shared memory),
    /// or a connection failed.
    #[error("{0}")]
    Io(String),
    /// A remote call without the server's token, or with a wrong one.
    #[error("{0}")]
    Unauthenticated(String),
}

pub type Result<T> = std::result::Result<T, Error>;

/// Builds an `Error::InvalidArgument` from format arguments.
#[macro_export]
macro_rules! invalid {
    ($($arg:tt)*) => { $crate::error::Error::InvalidArgument(format!($($arg)*)) };
}
