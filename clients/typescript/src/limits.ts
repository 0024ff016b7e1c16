// The protocol's limits (docs/protocol.md), mirrored from the broker's `limits.rs` so that a
// client refuses what the broker would refuse before sending it, with a clear error.

/** The protocol version this client speaks (docs/protocol.md, "Versions"). */
export const PROTOCOL_VERSION = 3;
export const FRAME_HEADER_BYTES = 12;
/** What a client accepts before HELLO_OK tells it the server's limit: the server's default. */
export const FRAME_BYTES_DEFAULT = 16 * 1024 * 1024;
export const KEY_BYTES_MAX = 1024;
export const HEADERS_COUNT_MAX = 64;
export const HEADER_BYTES_MAX = 4096;
export const NAME_BYTES_MAX = 255;
export const BATCH_COUNT_MAX = 65_536;
export const RANGES_COUNT_MAX = 65_536;
export const ACK_RESULT_BYTES_MAX = 4096;
export const LIST_LIMIT_MAX = 1000;
export const LIST_PAGE_BYTES_MAX = 64;
export const PARTITIONS_MAX = 1024;
export const PRIORITY_MAX = 9;
export const DELAY_MS_MAX = 30 * 86_400_000;
export const ERROR_MESSAGE_BYTES_MAX = 1024;
export const LATENCY_BUCKETS = 272;
export const CONSUMER_CREDIT_MAX = 1_000_000;
/** PUBLISH `partition` meaning "the broker chooses". */
export const NO_PARTITION = 0xffffffff;
/** Bytes of a record beyond its body with no key, headers or delay. */
export const RECORD_PREFIX_BYTES = 10;
export const DELIVERY_PREFIX_BYTES = 22;
