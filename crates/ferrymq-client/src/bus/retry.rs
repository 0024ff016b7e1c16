//! When a failed message is tried again, and how its reason is bounded.

use std::time::{SystemTime, UNIX_EPOCH};

use super::BusError;

/// A nack or dead-letter reason is at most this many bytes: the protocol's limit for a reason.
pub const REASON_BYTES_MAX: usize = ferrymq_protocol::limits::ERROR_MESSAGE_BYTES_MAX;

/// `text` cut to at most `max_bytes` bytes on a character boundary, with `...` when cut.
pub fn bounded(text: &str, max_bytes: usize) -> String {
    if text.len() <= max_bytes {
        return text.to_string();
    }
    let mut end = max_bytes.saturating_sub(3);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &text[..end])
}

/// When a failed message is tried again: after `initial_delay_ms`, multiplied by `multiplier`
/// at each attempt up to `max_delay_ms`, each delay spread by ±`jitter` (a fraction) so that
/// failures do not come back in step. The delay travels in the NACK, so the broker holds the
/// message meanwhile. The same policy as the Python and TypeScript buses.
///
/// `max_attempts` is the subscription's: `None` leaves it to the broker (its default), which
/// then dead-letters the message after its last attempt with the last nack's reason; a number
/// is sent in SUBSCRIBE and the receiver dead-letters the last failure itself, with the
/// handler's error as the dead letter's `x-ferrymq-dead-reason`. Every receiver of one
/// subscription must use the same `max_attempts` (the broker refuses a different one).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RetryPolicy {
    pub max_attempts: Option<u32>,
    pub initial_delay_ms: u32,
    pub multiplier: f64,
    pub max_delay_ms: u32,
    pub jitter: f64,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: None,
            initial_delay_ms: 200,
            multiplier: 2.0,
            max_delay_ms: 60_000,
            jitter: 0.2,
        }
    }
}

impl RetryPolicy {
    /// The default policy with `max_attempts`.
    pub fn attempts(max_attempts: u32) -> RetryPolicy {
        RetryPolicy {
            max_attempts: Some(max_attempts),
            ..RetryPolicy::default()
        }
    }

    pub fn check(&self) -> Result<(), BusError> {
        if self.max_attempts == Some(0) {
            return Err(BusError::Config(
                "max_attempts is at least 1 (or None: the broker's)".into(),
            ));
        }
        // Written so that a NaN fails too.
        if !(1.0..=f64::MAX).contains(&self.multiplier) || !(0.0..=1.0).contains(&self.jitter) {
            return Err(BusError::Config(
                "a retry policy has a multiplier >= 1 and a jitter within 0..=1".into(),
            ));
        }
        Ok(())
    }

    /// The delay before attempt `attempt + 1`, after attempt `attempt` (1-based) failed;
    /// `unit` is a number in 0..1 that picks the jitter.
    pub fn delay_ms_with(&self, attempt: u16, unit: f64) -> u32 {
        let exponent = i32::from(attempt.max(1) - 1);
        let base = (f64::from(self.initial_delay_ms) * self.multiplier.powi(exponent))
            .min(f64::from(self.max_delay_ms));
        let spread = base * self.jitter * (2.0 * unit - 1.0);
        (base + spread).clamp(0.0, f64::from(u32::MAX)) as u32
    }

    /// [`RetryPolicy::delay_ms_with`] with a pseudo-random jitter.
    pub fn delay_ms(&self, attempt: u16) -> u32 {
        self.delay_ms_with(attempt, unit_random())
    }

    /// True when `attempt` is the last the subscription allows.
    pub fn is_last(&self, attempt: u16) -> bool {
        self.max_attempts
            .is_some_and(|max| u32::from(attempt) >= max)
    }
}

/// A number in 0..1, different from call to call; jitter needs spread, not security.
fn unit_random() -> f64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static STATE: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let mut x = STATE.fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed) ^ nanos;
    // splitmix64's finaliser.
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^= x >> 31;
    (x >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_grow_by_the_multiplier_up_to_the_cap_within_the_jitter() {
        let policy = RetryPolicy {
            max_attempts: Some(5),
            initial_delay_ms: 100,
            multiplier: 2.0,
            max_delay_ms: 1000,
            jitter: 0.2,
        };
        assert_eq!(policy.delay_ms_with(1, 0.5), 100);
        assert_eq!(policy.delay_ms_with(2, 0.5), 200);
        assert_eq!(policy.delay_ms_with(3, 0.5), 400);
        assert_eq!(policy.delay_ms_with(9, 0.5), 1000);
        assert_eq!(policy.delay_ms_with(1, 0.0), 80);
        assert_eq!(policy.delay_ms_with(1, 1.0), 120);
        for attempt in 1..20 {
            let d = policy.delay_ms(attempt);
            assert!(d <= 1200, "attempt {attempt}: {d} ms");
        }
        assert!(!policy.is_last(4) && policy.is_last(5));
        assert!(!RetryPolicy::default().is_last(u16::MAX));
        assert!(RetryPolicy::attempts(0).check().is_err());
        let bad = RetryPolicy {
            multiplier: 0.5,
            ..RetryPolicy::default()
        };
        assert!(bad.check().is_err());
    }

    #[test]
    fn reasons_are_cut_on_a_character_boundary() {
        assert_eq!(bounded("short", 10), "short");
        let long = "é".repeat(1000);
        let cut = bounded(&long, REASON_BYTES_MAX);
        assert!(cut.len() <= REASON_BYTES_MAX && cut.ends_with("..."));
    }
}
