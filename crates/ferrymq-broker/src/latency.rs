//! Publish-to-deliver and publish-to-ack latencies, recorded by each cursor under its partition's
//! lock (plain counters: no atomics on the delivery path) and added up per subscription when
//! statistics are asked for. Buckets are the protocol's (see `ferrymq_protocol::Latency`).

use ferrymq_protocol::{latency_bucket, Latency, LATENCY_BUCKETS};

/// Counts of microsecond values per bucket; the buckets are allocated at the first value, so an
/// idle cursor costs nothing.
///
/// A run of equal values is counted once, when it ends (or when the counts are read): the
/// messages of one published batch share their publish time, and those of one delivery pass
/// their delivery time, so a batch costs one bucket update instead of one per message.
#[derive(Default)]
pub(crate) struct LatencyRecorder {
    counts: Option<Box<[u64; LATENCY_BUCKETS]>>,
    sum_us: u64,
    /// The value of the run not yet counted, and its length.
    run_us: u64,
    run: u64,
}

impl LatencyRecorder {
    #[inline]
    pub fn record(&mut self, us: u64) {
        if us == self.run_us {
            self.run += 1;
        } else {
            let (value, n) = (self.run_us, self.run);
            self.add(value, n);
            self.run_us = us;
            self.run = 1;
        }
    }

    /// Counts `n` values of `us`.
    fn add(&mut self, us: u64, n: u64) {
        if n == 0 {
            return;
        }
        let counts = self
            .counts
            .get_or_insert_with(|| Box::new([0; LATENCY_BUCKETS]));
        let count = &mut counts[latency_bucket(us)];
        *count = count.saturating_add(n);
        self.sum_us = self.sum_us.saturating_add(us.saturating_mul(n));
    }

    /// Adds this recorder's values, its run included, to `total`'s counts.
    pub fn add_into(&self, total: &mut LatencyRecorder) {
        total.add(self.run_us, self.run);
        let Some(counts) = &self.counts else {
            return;
        };
        let into = total
            .counts
            .get_or_insert_with(|| Box::new([0; LATENCY_BUCKETS]));
        for (t, c) in into.iter_mut().zip(counts.iter()) {
            *t = t.saturating_add(*c);
        }
        total.sum_us = total.sum_us.saturating_add(self.sum_us);
    }

    pub fn to_latency(&self) -> Latency {
        let mut all = LatencyRecorder::default();
        self.add_into(&mut all);
        match &all.counts {
            Some(counts) => Latency::from_counts(&counts[..], all.sum_us),
            None => Latency::default(),
        }
    }
}

/// Both latencies of one cursor (or, added up, of one subscription).
#[derive(Default)]
pub(crate) struct Latencies {
    /// From publish (or the end of a message's delay) to its first delivery.
    pub deliver: LatencyRecorder,
    /// From publish (or the end of a message's delay) to its ack.
    pub ack: LatencyRecorder,
}

impl Latencies {
    pub fn add_into(&self, total: &mut Latencies) {
        self.deliver.add_into(&mut total.deliver);
        self.ack.add_into(&mut total.ack);
    }
}

/// Above this, a lag is kept in milliseconds (the high bit set).
const LAG_IN_MS: u32 = 1 << 31;

/// A message's wait for its first delivery, in the 32 bits its slot has room for: microseconds
/// up to about 35 minutes, milliseconds (with the high bit set) up to about 24 days.
pub(crate) fn encode_lag(us: u64) -> u32 {
    if us < LAG_IN_MS as u64 {
        us as u32
    } else {
        LAG_IN_MS | (us / 1000).min(LAG_IN_MS as u64 - 1) as u32
    }
}

pub(crate) fn decode_lag(lag: u32) -> u64 {
    if lag & LAG_IN_MS == 0 {
        lag as u64
    } else {
        (lag & !LAG_IN_MS) as u64 * 1000
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lags_keep_microseconds_then_milliseconds() {
        for us in [0, 1, 999, 123_456, (1 << 31) - 1] {
            assert_eq!(decode_lag(encode_lag(us)), us);
        }
        let hour = 3_600_000_000;
        assert_eq!(decode_lag(encode_lag(hour + 999)), hour);
        let far = u64::MAX;
        assert_eq!(decode_lag(encode_lag(far)), ((1u64 << 31) - 1) * 1000);
    }

    #[test]
    fn recorders_add_up_bucket_by_bucket_and_count_runs_of_equal_values() {
        let mut a = LatencyRecorder::default();
        let mut b = LatencyRecorder::default();
        assert_eq!(a.to_latency(), Latency::default());
        a.record(5);
        a.record(100);
        for us in [100, 1_000_000, 1_000_000, 1_000_000, 0, 0] {
            b.record(us);
        }
        assert_eq!(b.to_latency().count(), 6, "the run still open is read too");
        assert_eq!(b.to_latency().count(), 6, "and reading leaves it open");
        let mut total = LatencyRecorder::default();
        a.add_into(&mut total);
        b.add_into(&mut total);
        LatencyRecorder::default().add_into(&mut total);
        let latency = total.to_latency();
        assert_eq!(latency.count(), 8);
        assert_eq!(latency.sum_us, 3_000_205);
        assert_eq!(
            latency.buckets,
            vec![
                (0, 2),
                (latency_bucket(5) as u16, 1),
                (latency_bucket(100) as u16, 2),
                (latency_bucket(1_000_000) as u16, 3)
            ]
        );
        b.record(0);
        assert_eq!(b.to_latency().buckets[0], (0, 3));
    }
}
