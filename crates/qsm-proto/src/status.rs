//! The server core's errors on the wire: each [`ServerError`] kind travels as one gRPC status
//! code, so a remote client reads back the kind the core returned.

use qsm_types::ServerError;
use tonic::{Code, Status};

/// The status a service sends for `e`.
pub fn to_status(e: ServerError) -> Status {
    let code = match &e {
        ServerError::NotFound(_) => Code::NotFound,
        ServerError::Exists(_) => Code::AlreadyExists,
        ServerError::Invalid(_) => Code::InvalidArgument,
        ServerError::Refused(_) => Code::FailedPrecondition,
        ServerError::Exhausted(_) => Code::ResourceExhausted,
        ServerError::Unauthenticated(_) => Code::Unauthenticated,
        ServerError::Denied(_) => Code::PermissionDenied,
        ServerError::Cancelled(_) => Code::Cancelled,
        ServerError::Busy(_) | ServerError::Unreachable(_) => Code::Unavailable,
        ServerError::TimedOut(_) => Code::DeadlineExceeded,
        ServerError::Aborted(_) => Code::Aborted,
        ServerError::Failed(_) => Code::Internal,
    };
    Status::new(code, e.into_message())
}

/// The kind a status names, with `message` (a client puts the server's address in it).
/// `Unavailable` is [`ServerError::Unreachable`]: whether the server said so or the
/// connection broke, another server may answer.
pub fn from_code(code: Code, message: String) -> ServerError {
    match code {
        Code::NotFound => ServerError::NotFound(message),
        Code::AlreadyExists => ServerError::Exists(message),
        Code::InvalidArgument | Code::OutOfRange => ServerError::Invalid(message),
        Code::FailedPrecondition => ServerError::Refused(message),
        Code::ResourceExhausted => ServerError::Exhausted(message),
        Code::Unauthenticated => ServerError::Unauthenticated(message),
        Code::PermissionDenied => ServerError::Denied(message),
        Code::Cancelled => ServerError::Cancelled(message),
        Code::Unavailable => ServerError::Unreachable(message),
        Code::DeadlineExceeded => ServerError::TimedOut(message),
        Code::Aborted => ServerError::Aborted(message),
        _ => ServerError::Failed(message),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_comes_back_as_itself() {
        let kinds: [fn(String) -> ServerError; 12] = [
            ServerError::NotFound,
            ServerError::Exists,
            ServerError::Invalid,
            ServerError::Refused,
            ServerError::Exhausted,
            ServerError::Unauthenticated,
            ServerError::Denied,
            ServerError::Cancelled,
            ServerError::TimedOut,
            ServerError::Aborted,
            ServerError::Unreachable,
            ServerError::Failed,
        ];
        for kind in kinds {
            let e = kind("why".into());
            let s = to_status(e.clone());
            assert_eq!(s.message(), "why");
            assert_eq!(from_code(s.code(), s.message().into()), e);
        }
        // Busy travels as Unavailable: a client may try another server.
        let s = to_status(ServerError::Busy("later".into()));
        assert_eq!(from_code(s.code(), "later".into()), ServerError::Unreachable("later".into()));
    }
}
