//! Every default and maximum of FerryMQ in one place, each with the reason for its number.
//!
//! Names carry their unit last (`_bytes`, `_ms`, `_count`). Where limits relate, a compile-time
//! assertion below holds them together.

/// The newest protocol version this build speaks, the one it writes unless a connection agreed on
/// an older one. A client offers a range in HELLO; the server picks the highest version both
/// support. Any change to a frame's layout or meaning raises it (docs/protocol.md, "Versions").
pub const PROTOCOL_VERSION: u16 = 3;

/// The oldest protocol version this build still speaks: every version from here to
/// [`PROTOCOL_VERSION`] is served, each in its own layout, so that a client built for an older
/// broker keeps working against this one.
pub const PROTOCOL_VERSION_MIN: u16 = 1;

/// Version 2: the topic config's `retention_policy` and `dedup_window_ms`, the `default` value of
/// `storage` and `overflow`, NACK's `release` flag and the `before_start` message state.
pub const PROTOCOL_VERSION_2: u16 = 2;

/// Version 3: new opcodes (each listed with its version in `opcode_since`), STATS_REPLY's
/// `paused` byte at the end of each subscription, and the action bits 16 purge and 32 pause.
pub const PROTOCOL_VERSION_3: u16 = 3;

const _: () = assert!(PROTOCOL_VERSION_MIN >= 1 && PROTOCOL_VERSION_MIN <= PROTOCOL_VERSION);

/// Size of the fixed frame header: payload length, opcode, flags, request id.
pub const FRAME_HEADER_BYTES: usize = 12;

/// Size of one offset range on the wire: partition u32, offset u64, count u32. Here rather than
/// beside [`crate::OffsetRange`] so that the frame size limits below need nothing above them.
pub const OFFSET_RANGE_BYTES: usize = 16;

/// Default largest message body. 256 KiB is what small HTTP queues (and NSQ's default of 1 MiB
/// divided by batching headroom) taught users to expect; larger payloads belong in object storage.
pub const MESSAGE_BODY_BYTES_DEFAULT: u32 = 256 * 1024;

/// Hard ceiling for a configured body limit: past 64 MiB a broker is a file server.
pub const MESSAGE_BODY_BYTES_CEILING: u32 = 64 * 1024 * 1024;

/// Largest key. Keys pick partitions and order work; they are identifiers, not payloads.
pub const KEY_BYTES_MAX: usize = 1024;

/// Most headers on one message, and the largest header name or value: headers are metadata.
pub const HEADERS_COUNT_MAX: usize = 64;
pub const HEADER_BYTES_MAX: usize = 4096;

/// Bytes a message record may carry beyond its body: fixed prefix, delay, key and headers at their
/// maxima. Used to size frames so that the largest message always fits one frame.
pub const RECORD_OVERHEAD_BYTES_MAX: usize =
    10 + 8 + KEY_BYTES_MAX + HEADERS_COUNT_MAX * (4 + 2 * HEADER_BYTES_MAX);

/// Default largest frame: 16 MiB carries a batch of thousands of small messages or one message
/// of the default maximum with room to spare, and bounds what one connection can make the server
/// buffer before it has seen the whole frame.
pub const FRAME_BYTES_DEFAULT: u32 = 16 * 1024 * 1024;

/// A frame must be able to carry the largest message its server accepts, plus the publish header,
/// and the largest acknowledgement a client sends ([`ACK_FRAME_BYTES_MAX`]).
pub const fn frame_bytes_needed(message_body_bytes_max: u32) -> usize {
    let publish = FRAME_HEADER_BYTES
        + 2
        + 255 * 4
        + 8
        + RECORD_OVERHEAD_BYTES_MAX
        + message_body_bytes_max as usize;
    if publish > ACK_FRAME_BYTES_MAX {
        publish
    } else {
        ACK_FRAME_BYTES_MAX
    }
}

/// The largest ACK, NACK or ACK_RESULT frame: the most ranges, with the longest result (ACK_RESULT)
/// or reason (NACK). A client merges acks into one frame up to this size.
pub const ACK_FRAME_BYTES_MAX: usize = {
    let ranges = 4 + RANGES_COUNT_MAX as usize * OFFSET_RANGE_BYTES;
    let ack_result = FRAME_HEADER_BYTES + 4 + 2 + ACK_RESULT_BYTES_MAX + ranges;
    let nack = FRAME_HEADER_BYTES + 4 + 4 + 1 + 2 + ERROR_MESSAGE_BYTES_MAX + ranges;
    if ack_result > nack {
        ack_result
    } else {
        nack
    }
};

const _: () =
    assert!(frame_bytes_needed(MESSAGE_BODY_BYTES_DEFAULT) <= FRAME_BYTES_DEFAULT as usize);
const _: () = assert!(frame_bytes_needed(MESSAGE_BODY_BYTES_CEILING) <= u32::MAX as usize);

/// Longest topic or subscription name; names appear in metrics labels and file names later.
pub const NAME_BYTES_MAX: usize = 255;

/// Most messages in one PUBLISH or DELIVER frame. Batches amortise syscalls and locks; past 64 k
/// the gain is nil and one frame would hold a partition's lock too long.
pub const BATCH_COUNT_MAX: u32 = 65_536;

/// Most ranges in one ACK or NACK frame.
pub const RANGES_COUNT_MAX: u32 = 65_536;

/// Largest result a consumer may attach to an ack (ACK_RESULT): a short outcome kept with the
/// message for status queries, not a second body.
pub const ACK_RESULT_BYTES_MAX: usize = 4096;

/// Most entries one LIST_MESSAGES page may ask for: a page stays a small frame and a short walk
/// of the broker's state.
pub const LIST_LIMIT_MAX: u32 = 1000;

/// Largest page token of LIST_MESSAGES / MESSAGE_LIST: an opaque position the broker hands out,
/// big enough for a partition, an offset and a time, small enough to keep frames small.
pub const LIST_PAGE_BYTES_MAX: usize = 64;

/// Most partitions of one topic: each is a lock and a cursor per subscription.
pub const PARTITIONS_MAX: u32 = 1024;

/// Highest priority; 0 is the default and lowest.
pub const PRIORITY_MAX: u8 = 9;

/// Default heartbeat interval. A peer silent for three intervals is considered gone.
pub const HEARTBEAT_MS_DEFAULT: u32 = 5_000;
/// Heartbeats below 100 ms cost more than they detect; above 5 minutes a dead peer holds its
/// in-flight messages too long.
pub const HEARTBEAT_MS_MIN: u32 = 100;
pub const HEARTBEAT_MS_MAX: u32 = 300_000;

/// Default time a consumer has to ack a delivery before it is given to another consumer.
pub const ACK_TIMEOUT_MS_DEFAULT: u32 = 30_000;
/// Below 10 ms a redelivery storm is likelier than a slow consumer.
pub const ACK_TIMEOUT_MS_MIN: u32 = 10;
/// A day: anything longer is a forgotten message, not a slow one.
pub const ACK_TIMEOUT_MS_MAX: u32 = 86_400_000;

/// Default deliveries of one message before it is given up (dead-lettered).
pub const MAX_ATTEMPTS_DEFAULT: u32 = 5;

/// Most credit a consumer may hold at once. Credit bounds what the server has in flight for it,
/// and so the memory a slow consumer can pin.
pub const CONSUMER_CREDIT_MAX: u32 = 1_000_000;

/// Longest delay a publish or nack may ask for: 30 days.
pub const DELAY_MS_MAX: u64 = 30 * 86_400_000;

/// Longest error message the server sends; the code carries the meaning, the text the detail.
pub const ERROR_MESSAGE_BYTES_MAX: usize = 1024;
