//! The wall clock as the broker stamps messages with it. A leaf module: every layer reads the
//! time, and none of them should depend on the topic to do so.

/// Milliseconds since the Unix epoch, for message timestamps.
pub(crate) fn unix_ms() -> u64 {
    unix_us() / 1000
}

/// Microseconds since the Unix epoch: when messages are published and delivered, for latencies.
pub(crate) fn unix_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}
