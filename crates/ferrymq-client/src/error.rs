//! The client's error type.
//!
//! `Error` is `Clone` so that one cause (a reset socket, a dead heartbeat) can fail every request
//! pending on a connection and end every subscription stream with the same value.

use std::io;
use std::sync::Arc;

use ferrymq_protocol::{ErrorCode, ProtocolError};

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, Clone, thiserror::Error)]
pub enum Error {
    /// The socket failed: connecting, reading or writing.
    #[error("I/O error on the broker connection: {0}")]
    Io(Arc<io::Error>),

    /// The server sent bytes this client cannot decode; the connection is closed.
    #[error("protocol error: {0}")]
    Protocol(#[from] ProtocolError),

    /// The server answered with an ERROR frame.
    #[error("server error {}: {message}", code.as_str())]
    Server { code: ErrorCode, message: String },

    /// The connection was closed, by [`crate::Client::close`] or by the server, before an answer
    /// arrived. Open a new client to continue.
    #[error("connection closed")]
    ConnectionClosed,

    /// Connecting or a request took longer than its configured limit.
    #[error("timed out: {0}")]
    Timeout(String),

    /// Nothing arrived from the server for three heartbeat intervals: the connection is dead.
    #[error("no frame from the server for {silence_ms} ms (3 heartbeat intervals); connection considered dead")]
    HeartbeatTimeout { silence_ms: u64 },

    /// A message or batch breaks a limit of the codec or of this server; nothing was sent.
    #[error("invalid message: {0}")]
    InvalidMessage(String),

    /// An argument (a name, a credit window, a duration) is out of range; nothing was sent.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),

    /// TLS could not be set up: a file that cannot be read, or a handshake the server or this
    /// client refused (an untrusted certificate, say).
    #[error("TLS: {0}")]
    Tls(String),

    /// The server answered with a frame that does not fit the request, or broke flow control.
    #[error("unexpected response from the server: {0}")]
    UnexpectedResponse(String),
}

impl Error {
    /// The server's error code, when the server refused the request.
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            Error::Server { code, .. } => Some(*code),
            _ => None,
        }
    }

    /// True when the connection itself is gone (as opposed to one request being refused): the
    /// client must reconnect to continue.
    pub fn is_connection_error(&self) -> bool {
        matches!(
            self,
            Error::Io(_)
                | Error::ConnectionClosed
                | Error::Protocol(_)
                | Error::HeartbeatTimeout { .. }
        )
    }

    pub(crate) fn server(code: u16, message: String) -> Error {
        match ErrorCode::from_u16(code) {
            Some(code) => Error::Server { code, message },
            // A newer server may send codes this client does not know: keep the number visible.
            None => Error::Server {
                code: ErrorCode::Internal,
                message: format!("(unknown error code {code}) {message}"),
            },
        }
    }
}

impl From<io::Error> for Error {
    fn from(error: io::Error) -> Self {
        Error::Io(Arc::new(error))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_error_keeps_an_unknown_code_in_the_text() {
        let error = Error::server(999, "later".into());
        assert_eq!(error.code(), Some(ErrorCode::Internal));
        assert!(error.to_string().contains("999"), "{error}");
        let known = Error::server(ErrorCode::UnknownTopic as u16, "no topic t".into());
        assert_eq!(known.code(), Some(ErrorCode::UnknownTopic));
        assert_eq!(known.to_string(), "server error unknown_topic: no topic t");
    }

    #[test]
    fn heartbeat_timeout_is_a_connection_error_but_a_request_timeout_is_not() {
        assert!(Error::HeartbeatTimeout { silence_ms: 15_000 }.is_connection_error());
        assert!(!Error::Timeout("request took longer than 30 s".into()).is_connection_error());
        assert!(Error::ConnectionClosed.is_connection_error());
    }
}
