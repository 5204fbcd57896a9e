//! Core errors <-> gRPC statuses, one to one, so a remote call raises what the same
//! call in process would.

use reprise_core::error::{Error, Partial};
use tonic::{Code, Status};

/// The status a server answers for `e`.
pub fn to_status(e: Error) -> Status {
    let message = e.to_string();
    match e {
        Error::InvalidArgument(_) => Status::invalid_argument(message),
        Error::NotFound(_) => Status::not_found(message),
        Error::Timeout { .. } => Status::deadline_exceeded(message),
        Error::Interrupted { .. } => Status::cancelled(message),
        Error::ResourceExhausted(_) => Status::resource_exhausted(message),
        Error::Corrupt(_) => Status::data_loss(message),
        Error::Io(_) => Status::internal(message),
        Error::Unauthenticated(_) => Status::unauthenticated(message),
    }
}

/// The error a client raises for a status (transport failures are `Io`).
pub fn from_status(s: Status) -> Error {
    let message = s.message().to_string();
    match s.code() {
        Code::InvalidArgument | Code::OutOfRange | Code::FailedPrecondition => Error::InvalidArgument(message),
        Code::NotFound => Error::NotFound(message),
        Code::DeadlineExceeded => Error::Timeout { message, partial: Partial::Nothing },
        Code::ResourceExhausted => Error::ResourceExhausted(message),
        Code::DataLoss => Error::Corrupt(message),
        Code::Unauthenticated | Code::PermissionDenied => Error::Unauthenticated(message),
        Code::Unavailable => Error::Io(format!("replay server unavailable: {message}")),
        code => Error::Io(format!("replay server: {code:?}: {message}")),
    }
}
