use thiserror::Error;

/// What can be wrong with bytes handed to the codec. Every variant names the field or limit at
/// fault so that the peer can be told exactly what it sent.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ProtocolError {
    #[error("frame truncated while reading {field}")]
    Truncated { field: &'static str },
    #[error("frame of {len} bytes exceeds the limit of {max} bytes")]
    FrameTooLarge { len: usize, max: usize },
    #[error("unknown opcode 0x{0:04x}")]
    UnknownOpcode(u16),
    #[error("frame flags must be zero, got 0x{0:04x}")]
    InvalidFlags(u16),
    #[error("field {field} is not valid UTF-8")]
    InvalidUtf8 { field: &'static str },
    #[error("invalid {field}: {reason}")]
    InvalidValue { field: &'static str, reason: String },
    #[error("{extra} unexpected bytes after the end of a {opcode} frame")]
    TrailingBytes { opcode: &'static str, extra: usize },
}

impl ProtocolError {
    pub(crate) fn invalid(field: &'static str, reason: impl Into<String>) -> Self {
        ProtocolError::InvalidValue {
            field,
            reason: reason.into(),
        }
    }
}
