use ferrymq_protocol::ErrorCode;
use thiserror::Error;

/// What a broker operation can refuse. Each variant says what was wrong and, where it helps, what
/// to do about it.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum BrokerError {
    /// No hint here: whether a request creates topics depends on the request and the server's
    /// settings, which the layer that answers knows.
    #[error("unknown topic '{0}'")]
    UnknownTopic(String),
    #[error("topic '{0}' already exists")]
    TopicExists(String),
    #[error("topic '{topic}' is full ({reason}) and its overflow policy is reject; consume or raise its limits")]
    TopicFull { topic: String, reason: String },
    #[error("message {index} of the batch has a {size}-byte body, above the limit of {max} bytes")]
    MessageTooLarge { index: usize, size: u32, max: u32 },
    #[error("invalid {field}: {reason}")]
    InvalidArgument { field: &'static str, reason: String },
    #[error("unknown subscription '{subscription}' on topic '{topic}'")]
    UnknownSubscription { topic: String, subscription: String },
    #[error("unknown message {id} in topic '{topic}': {why}")]
    UnknownMessage {
        topic: String,
        id: String,
        why: String,
    },
    #[error("unknown consumer {0}")]
    UnknownConsumer(u64),
    /// Answered as `invalid_argument` over the binary protocol (it has no code of its own; new
    /// codes are reserved), as 404 over HTTP.
    #[error("unknown connection {0}: it has closed or never existed (list them with `ferrymq connection list`)")]
    UnknownConnection(u64),
    #[error("limit reached: {0}")]
    LimitExceeded(String),
    #[error("conflict: {0}")]
    Conflict(String),
    #[error("the broker is shutting down")]
    ShuttingDown,
    /// The disk refused or failed (full, read-only, a file gone, damage found): the message says
    /// which file and why; writes are retried by the broker once the cause is gone.
    #[error("storage: {0}")]
    Storage(String),
    /// Credentials missing, wrong, expired or revoked. Never names which part of a secret was
    /// wrong.
    #[error("{0}")]
    AuthenticationFailed(String),
    /// The user is known and sees the topic, but may not do this.
    #[error("{0}")]
    Forbidden(String),
    /// A user management request names a user the broker does not have. The binary protocol
    /// answers it as `invalid_argument` (it has no code of its own); HTTP as 404.
    #[error("invalid user: no user named '{0}'")]
    UnknownUser(String),
    /// As [`BrokerError::UnknownUser`], for a token the user does not have.
    #[error("invalid token: user '{user}' has no token named '{name}'")]
    UnknownToken { user: String, name: String },
    /// In a cluster: this node does not lead what the request needs. The message names the
    /// leader and its client address when known.
    #[error("{0}")]
    NotLeader(String),
    /// In a cluster: the error another node answered a request this node forwarded to it, as
    /// that node's client would have read it.
    #[error("{message}")]
    Remote { code: ErrorCode, message: String },
}

impl BrokerError {
    pub fn code(&self) -> ErrorCode {
        match self {
            BrokerError::UnknownTopic(_) => ErrorCode::UnknownTopic,
            BrokerError::TopicExists(_) => ErrorCode::TopicExists,
            BrokerError::TopicFull { .. } => ErrorCode::TopicFull,
            BrokerError::MessageTooLarge { .. } => ErrorCode::MessageTooLarge,
            BrokerError::InvalidArgument { .. } => ErrorCode::InvalidArgument,
            BrokerError::UnknownSubscription { .. } => ErrorCode::UnknownSubscription,
            BrokerError::UnknownConsumer(_) => ErrorCode::UnknownConsumer,
            BrokerError::UnknownMessage { .. } => ErrorCode::UnknownMessage,
            BrokerError::LimitExceeded(_) => ErrorCode::LimitExceeded,
            BrokerError::Conflict(_) => ErrorCode::Conflict,
            BrokerError::ShuttingDown => ErrorCode::ShuttingDown,
            BrokerError::Storage(_) => ErrorCode::StorageUnavailable,
            BrokerError::AuthenticationFailed(_) => ErrorCode::AuthenticationFailed,
            BrokerError::Forbidden(_) => ErrorCode::Forbidden,
            BrokerError::NotLeader(_) => ErrorCode::NotLeader,
            BrokerError::Remote { code, .. } => *code,
            BrokerError::UnknownUser(_)
            | BrokerError::UnknownToken { .. }
            | BrokerError::UnknownConnection(_) => ErrorCode::InvalidArgument,
        }
    }

    pub fn invalid(field: &'static str, reason: impl Into<String>) -> Self {
        BrokerError::InvalidArgument {
            field,
            reason: reason.into(),
        }
    }
}
