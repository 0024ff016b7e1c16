//! At most one log line per interval for an event that can repeat very fast, such as a
//! connection refused during a flood of them: the line says how many went unlogged since the
//! last one, so nothing is hidden and the log cannot fill a disk.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

pub struct LogThrottle {
    interval_ms: u64,
    epoch: Instant,
    /// Milliseconds after `epoch` from which the next occurrence is logged.
    next_ms: AtomicU64,
    /// Occurrences not logged since the last one that was.
    skipped: AtomicU64,
}

impl LogThrottle {
    pub fn new(interval: Duration) -> Self {
        LogThrottle {
            interval_ms: interval.as_millis() as u64,
            epoch: Instant::now(),
            next_ms: AtomicU64::new(0),
            skipped: AtomicU64::new(0),
        }
    }

    /// `Some(skipped)`: log this occurrence, and say that `skipped` others were not since the
    /// last logged one. `None`: count it only.
    pub fn allow(&self) -> Option<u64> {
        self.allow_at(self.epoch.elapsed())
    }

    fn allow_at(&self, now: Duration) -> Option<u64> {
        let now_ms = now.as_millis() as u64;
        let next = self.next_ms.load(Relaxed);
        if now_ms >= next
            && self
                .next_ms
                .compare_exchange(next, now_ms + self.interval_ms, Relaxed, Relaxed)
                .is_ok()
        {
            Some(self.skipped.swap(0, Relaxed))
        } else {
            self.skipped.fetch_add(1, Relaxed);
            None
        }
    }
}

/// A throttle of its own for a log site that can repeat for as long as a fault lasts (a full
/// disk, a dead-letter topic that refuses writes): `static SITE: OnceLock<LogThrottle>`, then
/// `if let Some(skipped) = throttled(&SITE) { warn!(skipped, ...) }`. One line a minute at most.
pub(crate) fn throttled(site: &'static std::sync::OnceLock<LogThrottle>) -> Option<u64> {
    site.get_or_init(|| LogThrottle::new(Duration::from_secs(60)))
        .allow()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_interval_counting_the_rest() {
        let throttle = LogThrottle::new(Duration::from_secs(1));
        let at = Duration::from_millis;
        assert_eq!(throttle.allow_at(at(0)), Some(0));
        assert_eq!(throttle.allow_at(at(10)), None);
        assert_eq!(throttle.allow_at(at(999)), None);
        assert_eq!(throttle.allow_at(at(1000)), Some(2));
        assert_eq!(throttle.allow_at(at(1500)), None);
        // A quiet spell: the next one is logged at once, with the one counted before it.
        assert_eq!(throttle.allow_at(at(60_000)), Some(1));
        assert_eq!(throttle.allow_at(at(60_001)), None);
    }

    #[test]
    fn concurrent_occurrences_are_all_accounted_for() {
        let throttle = LogThrottle::new(Duration::from_secs(3600));
        let logged = std::thread::scope(|s| {
            let handles: Vec<_> = (0..4)
                .map(|_| {
                    s.spawn(|| {
                        (0..10_000)
                            .filter(|_| throttle.allow_at(Duration::ZERO).is_some())
                            .count()
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap())
                .sum::<usize>()
        });
        assert_eq!(logged, 1);
        assert_eq!(throttle.skipped.load(Relaxed), 39_999);
    }
}
