//! The one error of the server core, whichever transport carries it: the gRPC services turn
//! each kind into its status code, and a remote client turns the code back into the kind, so
//! a caller sees the same error from the embedded server and from a network one.

/// Why a server refused or failed a request. The message names what and where.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ServerError {
    /// No such thing, or not the caller's (the same answer, so nothing leaks).
    #[error("{0}")]
    NotFound(String),
    /// It exists already.
    #[error("{0}")]
    Exists(String),
    /// The request is malformed or out of range.
    #[error("{0}")]
    Invalid(String),
    /// The request is well formed but the state forbids it now (a process already running, a
    /// catalog restored from a copy...).
    #[error("{0}")]
    Refused(String),
    /// Out of space or of a bounded resource (a full disk, too many sessions).
    #[error("{0}")]
    Exhausted(String),
    /// Not logged in, or a wrong password.
    #[error("{0}")]
    Unauthenticated(String),
    /// Logged in, but not allowed (a node on an administrator's command, a locked account).
    #[error("{0}")]
    Denied(String),
    /// Stopped by an administrator or by the server's shutdown.
    #[error("{0}")]
    Cancelled(String),
    /// Try again later (a login lockout, a server busy checking passwords).
    #[error("{0}")]
    Busy(String),
    /// The stream went quiet past the session's idle timeout.
    #[error("{0}")]
    TimedOut(String),
    /// The client ended a stream in the middle.
    #[error("{0}")]
    Aborted(String),
    /// The server could not be reached or the connection broke (seen by a remote client
    /// only): another server sharing the catalog and pool may take over.
    #[error("{0}")]
    Unreachable(String),
    /// The server failed (an I/O error, a damaged catalog, a bug).
    #[error("{0}")]
    Failed(String),
}

impl ServerError {
    /// The message alone.
    pub fn message(&self) -> &str {
        match self {
            ServerError::NotFound(m)
            | ServerError::Exists(m)
            | ServerError::Invalid(m)
            | ServerError::Refused(m)
            | ServerError::Exhausted(m)
            | ServerError::Unauthenticated(m)
            | ServerError::Denied(m)
            | ServerError::Cancelled(m)
            | ServerError::Busy(m)
            | ServerError::TimedOut(m)
            | ServerError::Aborted(m)
            | ServerError::Unreachable(m)
            | ServerError::Failed(m) => m,
        }
    }

    /// The message alone, owned.
    pub fn into_message(self) -> String {
        self.split().1
    }

    /// The same kind with `context` put before the message ("object a/b: chunk 3: ...").
    pub fn context(self, context: impl std::fmt::Display) -> ServerError {
        self.map(|m| format!("{context}: {m}"))
    }

    /// The same kind with its message rewritten.
    pub fn map(self, f: impl FnOnce(String) -> String) -> ServerError {
        let (kind, message) = self.split();
        kind(f(message))
    }

    /// The kind (as its constructor) and the message.
    fn split(self) -> (fn(String) -> ServerError, String) {
        match self {
            ServerError::NotFound(m) => (ServerError::NotFound, m),
            ServerError::Exists(m) => (ServerError::Exists, m),
            ServerError::Invalid(m) => (ServerError::Invalid, m),
            ServerError::Refused(m) => (ServerError::Refused, m),
            ServerError::Exhausted(m) => (ServerError::Exhausted, m),
            ServerError::Unauthenticated(m) => (ServerError::Unauthenticated, m),
            ServerError::Denied(m) => (ServerError::Denied, m),
            ServerError::Cancelled(m) => (ServerError::Cancelled, m),
            ServerError::Busy(m) => (ServerError::Busy, m),
            ServerError::TimedOut(m) => (ServerError::TimedOut, m),
            ServerError::Aborted(m) => (ServerError::Aborted, m),
            ServerError::Unreachable(m) => (ServerError::Unreachable, m),
            ServerError::Failed(m) => (ServerError::Failed, m),
        }
    }
}

/// Constructors taking any text, for call sites that hold a `&str` or a `String`.
impl ServerError {
    /// [`ServerError::NotFound`].
    pub fn not_found(m: impl Into<String>) -> ServerError {
        ServerError::NotFound(m.into())
    }
    /// [`ServerError::Exists`].
    pub fn exists(m: impl Into<String>) -> ServerError {
        ServerError::Exists(m.into())
    }
    /// [`ServerError::Invalid`].
    pub fn invalid(m: impl Into<String>) -> ServerError {
        ServerError::Invalid(m.into())
    }
    /// [`ServerError::Refused`].
    pub fn refused(m: impl Into<String>) -> ServerError {
        ServerError::Refused(m.into())
    }
    /// [`ServerError::Exhausted`].
    pub fn exhausted(m: impl Into<String>) -> ServerError {
        ServerError::Exhausted(m.into())
    }
    /// [`ServerError::Unauthenticated`].
    pub fn unauthenticated(m: impl Into<String>) -> ServerError {
        ServerError::Unauthenticated(m.into())
    }
    /// [`ServerError::Denied`].
    pub fn denied(m: impl Into<String>) -> ServerError {
        ServerError::Denied(m.into())
    }
    /// [`ServerError::Failed`].
    pub fn failed(m: impl Into<String>) -> ServerError {
        ServerError::Failed(m.into())
    }
}

/// Cuts `text` to at most `max` bytes, at a character boundary (text a peer sent, kept
/// bounded).
pub fn truncate_utf8(text: &mut String, max: usize) {
    if text.len() > max {
        let mut end = max;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
}

/// `text` with its control characters written escaped (`\n`, `\u{1b}`): text from a peer or
/// an administrator shown on other administrators' terminals, where escape sequences,
/// carriage returns and newlines could forge lines.
pub fn printable(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// An error's message with each cause added once: a layer whose message already holds its
/// cause's text (a library that formats its source in) does not repeat it ("X: X").
pub fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = String::new();
    let mut next = Some(e);
    while let Some(cause) = next {
        let part = cause.to_string();
        if !part.is_empty() && !text.contains(&part) {
            if !text.is_empty() {
                text.push_str(": ");
            }
            text.push_str(&part);
        }
        next = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::ServerError;

    #[test]
    fn context_keeps_the_kind() {
        let e = ServerError::Invalid("bad frame".into()).context("object a");
        assert_eq!(e, ServerError::Invalid("object a: bad frame".into()));
        assert_eq!(e.message(), "object a: bad frame");
        assert_eq!(e.to_string(), "object a: bad frame");
    }
}
