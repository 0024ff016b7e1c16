//! What a SUBSCRIBE asks for: the subscription, where it starts and how it delivers.

/// Where a new subscription starts reading. Ignored when joining an existing subscription.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StartPosition {
    /// Only messages published after the subscription was created.
    #[default]
    Latest,
    /// Every message the topic still retains.
    Earliest,
    /// The given offset in every partition (clamped to what is retained).
    Offset(u64),
    /// The first message published at or after this Unix time in milliseconds.
    TimeMs(u64),
}

/// What a consumer subscribes to and how. `Default` is the server's default for every setting:
/// a new ephemeral subscription from the latest message, with no credit; name the fields that
/// differ and fill the rest with `..Default::default()`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SubscribeRequest {
    pub topic: String,
    /// Empty for an ephemeral subscription that lives as long as this consumer.
    pub subscription: String,
    pub start: StartPosition,
    /// 0 = the server's default.
    pub ack_timeout_ms: u32,
    /// 0 = the server's default.
    pub max_attempts: u32,
    /// Initial credit: how many messages the server may send before hearing more.
    pub credit: u32,
    /// Messages count as acked when sent (at-most-once, like a plain pub/sub subscriber).
    pub auto_ack: bool,
    /// Each partition's messages are delivered in offset order, the next once the one before is
    /// settled. Needs acks: the decoder refuses it together with `auto_ack`.
    pub ordered: bool,
    /// The partitions this consumer takes messages from, as inclusive ranges `(first, last)`;
    /// empty = all. See [`parse_partition_list`].
    pub partitions: Vec<(u32, u32)>,
    /// Where given-up messages go; empty = the default `<topic>.dlq`, otherwise a topic name
    /// (1..=255 bytes).
    pub dead_letter_topic: String,
}

impl SubscribeRequest {
    /// A request for subscription `name` of `topic` (empty: a new ephemeral one) from its
    /// earliest retained message, with the server's defaults for everything else.
    pub fn earliest(topic: &str, name: &str) -> Self {
        SubscribeRequest {
            topic: topic.into(),
            subscription: name.into(),
            start: StartPosition::Earliest,
            ..Default::default()
        }
    }
}

/// Parses a partition list such as `1,2,4-7` into inclusive ranges, in the order given.
pub fn parse_partition_list(text: &str) -> Result<Vec<(u32, u32)>, String> {
    let bad = |part: &str| {
        format!("'{part}' in '{text}' is not a partition or a range: write e.g. 1,2,4-7")
    };
    let mut out = Vec::new();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (first, last) = match part.split_once('-') {
            Some((a, b)) => (a.trim().parse(), b.trim().parse()),
            None => (part.parse(), part.parse()),
        };
        match (first, last) {
            (Ok(first), Ok(last)) if first <= last => out.push((first, last)),
            (Ok(first), Ok(last)) => {
                return Err(format!(
                    "'{part}' in '{text}' is reversed: a range goes up, write {last}-{first}"
                ))
            }
            _ => return Err(bad(part)),
        }
    }
    if out.is_empty() {
        return Err(format!("'{text}' names no partition"));
    }
    Ok(out)
}
