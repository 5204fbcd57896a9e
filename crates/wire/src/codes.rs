//! Core errors <-> what travels on a wire: gRPC statuses for the remote protocol,
//! one-byte codes in the local protocol's `ERROR` replies. One to one, so a call
//! raises the same error in process, locally and remotely.

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
        // Made by the transport from an error of its own (the connection broke: a body
        // cut off, a reset stream), not a status the server sent.
        code if std::error::Error::source(&s).is_some() => Error::Io(format!("connection to the replay server lost ({code:?}): {message}")),
        code => Error::Io(format!("replay server: {code:?}: {message}")),
    }
}

/// The code of `e` in a local `ERROR` reply.
pub fn local_code(e: &Error) -> u8 {
    match e {
        Error::InvalidArgument(_) => 1,
        Error::NotFound(_) => 2,
        Error::Timeout { .. } => 3,
        Error::ResourceExhausted(_) => 4,
        Error::Corrupt(_) => 5,
        Error::Io(_) | Error::Interrupted { .. } => 6,
        Error::Unauthenticated(_) => 7,
    }
}

/// The error a local `ERROR` reply's code and message stand for.
pub fn from_local_code(code: u8, message: String) -> Error {
    match code {
        1 => Error::InvalidArgument(message),
        2 => Error::NotFound(message),
        3 => Error::Timeout { message, partial: Default::default() },
        4 => Error::ResourceExhausted(message),
        5 => Error::Corrupt(message),
        7 => Error::Unauthenticated(message),
        _ => Error::Io(message),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_broken_connection_reads_as_lost_and_a_server_status_as_sent() {
        let broken = Status::from_error(Box::new(std::io::Error::new(std::io::ErrorKind::BrokenPipe, "h2 protocol error")));
        let e = from_status(broken);
        assert!(matches!(&e, Error::Io(m) if m.starts_with("connection to the replay server lost")), "{e}");
        let sent = from_status(Status::unknown("something the server said"));
        assert!(matches!(&sent, Error::Io(m) if m == "replay server: Unknown: something the server said"), "{sent}");
    }
}
