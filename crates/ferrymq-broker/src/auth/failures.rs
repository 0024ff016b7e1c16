//! Failed logins: counted per address, and answered late once an address keeps failing, so
//! that guessing passwords is slow while a person who mistypes is not held up.

use super::*;

impl Auth {
    /// How long to hold back the answer to a failed login from `address`: nothing for the first
    /// few, then doubling up to [`FAILURE_DELAY_MAX`]. Counts the failure.
    pub fn login_failed(&self, address: IpAddr) -> Duration {
        self.failures_total.fetch_add(1, Ordering::Relaxed);
        let now = Instant::now();
        let mut failures = self.failures.lock();
        let table = &mut failures.by_address;
        if !table.contains_key(&address) && table.len() >= FAILURE_ADDRESSES_MAX {
            table.retain(|_, (_, last)| now.duration_since(*last) < FAILURE_MEMORY);
            if table.len() >= FAILURE_ADDRESSES_MAX {
                if let Some(oldest) = table
                    .iter()
                    .min_by_key(|(_, (_, last))| *last)
                    .map(|(a, _)| *a)
                {
                    table.remove(&oldest);
                }
            }
        }
        let entry = table.entry(address).or_insert((0, now));
        if now.duration_since(entry.1) >= FAILURE_MEMORY {
            entry.0 = 0;
        }
        entry.0 = entry.0.saturating_add(1);
        entry.1 = now;
        let free = self.failures_free.load(Ordering::Relaxed);
        if entry.0 <= free {
            return Duration::ZERO;
        }
        self.delayed_total.fetch_add(1, Ordering::Relaxed);
        let doublings = (entry.0 - free - 1).min(16);
        (Duration::from_millis(100) * (1u32 << doublings)).min(FAILURE_DELAY_MAX)
    }

    /// How many failed logins one address gets before its answers are slowed.
    pub fn set_failures_free(&self, failures: u32) {
        self.failures_free.store(failures, Ordering::Relaxed);
    }

    /// A successful login from `address` forgets its failures.
    pub fn login_succeeded(&self, address: IpAddr) {
        let mut failures = self.failures.lock();
        if !failures.by_address.is_empty() {
            failures.by_address.remove(&address);
        }
    }

    pub fn failure_counts(&self) -> FailureCounts {
        FailureCounts {
            failures: self.failures_total.load(Ordering::Relaxed),
            delayed: self.delayed_total.load(Ordering::Relaxed),
            addresses: self.failures.lock().by_address.len(),
        }
    }
}
