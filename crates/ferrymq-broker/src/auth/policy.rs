//! What may be done: the actions a grant gives on a topic, the roles, and the topic patterns
//! grants are made on.

use super::*;

/// May publish to the topic.
pub const ACTION_PUBLISH: u8 = 1;
/// May subscribe, ack and nack.
pub const ACTION_CONSUME: u8 = 2;
/// May describe, read statistics, message status and listings.
pub const ACTION_INSPECT: u8 = 4;
/// May create, delete, requeue dead letters and delete subscriptions; implies purge and pause.
pub const ACTION_MANAGE: u8 = 8;
/// May drop every message a topic retains (PURGE_TOPIC).
pub const ACTION_PURGE: u8 = 16;
/// May pause and resume a subscription's deliveries (PAUSE_SUBSCRIPTION).
pub const ACTION_PAUSE: u8 = 32;
pub const ACTIONS_ALL: u8 =
    ACTION_PUBLISH | ACTION_CONSUME | ACTION_INSPECT | ACTION_MANAGE | ACTION_PURGE | ACTION_PAUSE;

// The protocol carries the same bits (GRANT, REVOKE, USER_LIST_REPLY).
const _: () = assert!(ACTIONS_ALL == ferrymq_protocol::ACTION_BITS_V3);

/// What `granted` allows: itself, and purge and pause wherever it has manage.
pub fn effective_actions(granted: u8) -> u8 {
    if granted & ACTION_MANAGE != 0 {
        granted | ACTION_PURGE | ACTION_PAUSE
    } else {
        granted
    }
}

/// Everything, users and grants included.
pub const ROLE_ADMIN: u8 = 1;
/// Inspect every topic, read `/metrics`.
pub const ROLE_MONITOR: u8 = 2;
pub const ROLES_ALL: u8 = ROLE_ADMIN | ROLE_MONITOR;

/// One action on a topic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Publish,
    Consume,
    Inspect,
    Manage,
    Purge,
    Pause,
}

impl Action {
    pub fn bit(self) -> u8 {
        match self {
            Action::Publish => ACTION_PUBLISH,
            Action::Consume => ACTION_CONSUME,
            Action::Inspect => ACTION_INSPECT,
            Action::Manage => ACTION_MANAGE,
            Action::Purge => ACTION_PURGE,
            Action::Pause => ACTION_PAUSE,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Action::Publish => "publish",
            Action::Consume => "consume",
            Action::Inspect => "inspect",
            Action::Manage => "manage",
            Action::Purge => "purge",
            Action::Pause => "pause",
        }
    }
}

/// `publish,consume` (or `all`) as bits.
pub fn parse_actions(text: &str) -> Result<u8, BrokerError> {
    let mut bits = 0;
    for word in text.split(',').map(str::trim).filter(|w| !w.is_empty()) {
        bits |= match word {
            "publish" => ACTION_PUBLISH,
            "consume" => ACTION_CONSUME,
            "inspect" => ACTION_INSPECT,
            "manage" => ACTION_MANAGE,
            "purge" => ACTION_PURGE,
            "pause" => ACTION_PAUSE,
            "all" => ACTIONS_ALL,
            other => {
                return Err(BrokerError::invalid(
                    "actions",
                    format!(
                        "unknown action '{other}': use publish, consume, inspect, manage, purge, \
                         pause or all"
                    ),
                ))
            }
        };
    }
    Ok(bits)
}

/// Bits as `publish,consume`.
pub fn actions_to_string(bits: u8) -> String {
    let names = [
        (ACTION_PUBLISH, "publish"),
        (ACTION_CONSUME, "consume"),
        (ACTION_INSPECT, "inspect"),
        (ACTION_MANAGE, "manage"),
        (ACTION_PURGE, "purge"),
        (ACTION_PAUSE, "pause"),
    ];
    let list: Vec<&str> = names
        .iter()
        .filter(|(bit, _)| bits & bit != 0)
        .map(|(_, name)| *name)
        .collect();
    list.join(",")
}

/// `admin,monitor` as bits.
pub fn parse_roles(text: &str) -> Result<u8, BrokerError> {
    let mut bits = 0;
    for word in text.split(',').map(str::trim).filter(|w| !w.is_empty()) {
        bits |= match word {
            "admin" => ROLE_ADMIN,
            "monitor" => ROLE_MONITOR,
            other => {
                return Err(BrokerError::invalid(
                    "roles",
                    format!("unknown role '{other}': use admin or monitor"),
                ))
            }
        };
    }
    Ok(bits)
}

pub fn roles_to_string(bits: u8) -> String {
    let mut list = Vec::new();
    if bits & ROLE_ADMIN != 0 {
        list.push("admin");
    }
    if bits & ROLE_MONITOR != 0 {
        list.push("monitor");
    }
    list.join(",")
}

/// Which topics a grant covers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pattern {
    /// `*`: every topic.
    Any,
    /// `orders.*`: every topic whose name starts with `orders.` (kept without the `*`).
    Prefix(String),
    Exact(String),
}

impl Pattern {
    pub fn parse(text: &str) -> Result<Pattern, BrokerError> {
        let invalid = |why: String| BrokerError::invalid("grant pattern", why);
        if text == "*" {
            return Ok(Pattern::Any);
        }
        let (body, prefix) = match text.strip_suffix('*') {
            Some(body) => (body, true),
            None => (text, false),
        };
        if body.is_empty() || body.len() > ferrymq_protocol::limits::NAME_BYTES_MAX {
            return Err(invalid(format!(
                "'{text}' is not a topic name, a prefix such as orders.* or *"
            )));
        }
        if let Some(c) = body
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
        {
            return Err(invalid(format!(
                "'{text}' contains '{c}': a pattern is a topic name, a prefix such as orders.* \
                 ('*' only at the end) or *"
            )));
        }
        Ok(if prefix {
            Pattern::Prefix(body.to_owned())
        } else {
            Pattern::Exact(body.to_owned())
        })
    }

    pub fn matches(&self, topic: &str) -> bool {
        match self {
            Pattern::Any => true,
            Pattern::Prefix(prefix) => topic.starts_with(prefix.as_str()),
            Pattern::Exact(name) => topic == name,
        }
    }
}

impl std::fmt::Display for Pattern {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Pattern::Any => f.write_str("*"),
            Pattern::Prefix(prefix) => write!(f, "{prefix}*"),
            Pattern::Exact(name) => f.write_str(name),
        }
    }
}
