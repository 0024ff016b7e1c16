//! Latency histograms as the broker reports them: counts of microsecond values in fixed
//! log-linear buckets, the same on every interface (STATS_REPLY, HTTP, `/metrics`).
//!
//! Values below 16 µs have a bucket each. Above, every power of two is cut into 8 buckets, so a
//! bucket is at most 12.5 % of its lower bound wide: `[16, 18)`, `[18, 20)` … `[30, 32)`,
//! `[32, 36)` … The last bucket, from `15 << 32` µs (about 17.9 hours), takes everything beyond.
//! Fixed buckets can be added up across partitions and over time without losing anything, which a
//! set of percentiles cannot.

/// How many buckets a histogram has.
pub const LATENCY_BUCKETS: usize = 272;

/// Values below this have a bucket each.
const LINEAR: u64 = 16;
/// Buckets per power of two above [`LINEAR`] (a power of two itself).
const SUB_BUCKETS: u64 = 8;
const SUB_BITS: u32 = SUB_BUCKETS.trailing_zeros();
const LINEAR_BITS: u32 = LINEAR.trailing_zeros();

/// The bucket that holds `us`.
pub fn latency_bucket(us: u64) -> usize {
    if us < LINEAR {
        return us as usize;
    }
    let exponent = 63 - us.leading_zeros();
    let sub = (us >> (exponent - SUB_BITS)) & (SUB_BUCKETS - 1);
    let index = LINEAR + (exponent - LINEAR_BITS) as u64 * SUB_BUCKETS + sub;
    (index as usize).min(LATENCY_BUCKETS - 1)
}

/// The smallest value bucket `index` holds.
pub fn latency_bucket_low(index: usize) -> u64 {
    let index = index as u64;
    if index < LINEAR {
        return index;
    }
    let exponent = LINEAR_BITS as u64 + (index - LINEAR) / SUB_BUCKETS;
    let sub = (index - LINEAR) % SUB_BUCKETS;
    (SUB_BUCKETS + sub) << (exponent - SUB_BITS as u64)
}

/// The largest value bucket `index` holds (`u64::MAX` for the last one).
pub fn latency_bucket_high(index: usize) -> u64 {
    if index + 1 >= LATENCY_BUCKETS {
        u64::MAX
    } else {
        latency_bucket_low(index + 1) - 1
    }
}

/// A latency histogram: the non-empty buckets in ascending order, each with its count, and the
/// sum of every value recorded (for the mean).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Latency {
    pub sum_us: u64,
    /// `(bucket, count)`: buckets ascending and below [`LATENCY_BUCKETS`], counts above zero.
    pub buckets: Vec<(u16, u64)>,
}

/// The figures people read from a histogram, in microseconds; `None` while it is empty.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LatencySummary {
    pub count: u64,
    pub mean: Option<u64>,
    pub p50: Option<u64>,
    pub p90: Option<u64>,
    pub p99: Option<u64>,
    pub p999: Option<u64>,
    pub max: Option<u64>,
}

impl Latency {
    /// The sparse form of dense bucket counts (`counts[i]` for bucket `i`).
    pub fn from_counts(counts: &[u64], sum_us: u64) -> Latency {
        Latency {
            sum_us,
            buckets: counts
                .iter()
                .take(LATENCY_BUCKETS)
                .enumerate()
                .filter(|(_, &n)| n > 0)
                .map(|(i, &n)| (i as u16, n))
                .collect(),
        }
    }

    /// How many values were recorded.
    pub fn count(&self) -> u64 {
        self.buckets
            .iter()
            .fold(0u64, |n, &(_, c)| n.saturating_add(c))
    }

    /// The value at quantile `q` (0..=1), as the largest value of the bucket it falls in, so
    /// that "p99 = 130 µs" means 99 % of values were at most 130 µs. For the last, unbounded
    /// bucket its lower bound is given.
    pub fn quantile(&self, q: f64) -> Option<u64> {
        let count = self.count();
        if count == 0 {
            return None;
        }
        // The rank of the value sought, 1-based: at least 1, at most count.
        let rank = ((q.clamp(0.0, 1.0) * count as f64).ceil() as u64).clamp(1, count);
        let mut seen = 0u64;
        for &(bucket, n) in &self.buckets {
            seen = seen.saturating_add(n);
            if seen >= rank {
                return Some(Self::reported(bucket as usize));
            }
        }
        self.buckets
            .last()
            .map(|&(b, _)| Self::reported(b as usize))
    }

    fn reported(bucket: usize) -> u64 {
        match latency_bucket_high(bucket) {
            u64::MAX => latency_bucket_low(bucket),
            high => high,
        }
    }

    pub fn summary(&self) -> LatencySummary {
        let count = self.count();
        LatencySummary {
            count,
            mean: (count > 0).then(|| self.sum_us / count),
            p50: self.quantile(0.5),
            p90: self.quantile(0.9),
            p99: self.quantile(0.99),
            p999: self.quantile(0.999),
            max: self.quantile(1.0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_tile_the_values_without_gaps_or_overlaps() {
        assert_eq!(latency_bucket_low(0), 0);
        for i in 0..LATENCY_BUCKETS - 1 {
            let (low, high) = (latency_bucket_low(i), latency_bucket_high(i));
            assert!(low <= high, "bucket {i}");
            assert_eq!(latency_bucket(low), i, "low end of bucket {i}");
            assert_eq!(latency_bucket(high), i, "high end of bucket {i}");
            assert_eq!(latency_bucket(high + 1), i + 1, "past bucket {i}");
            // At most 12.5 % wide above the linear range.
            assert!(
                low < LINEAR || (high - low + 1) * 8 <= low,
                "bucket {i} too wide"
            );
        }
        let last = LATENCY_BUCKETS - 1;
        assert_eq!(latency_bucket_low(last), 15 << 32);
        assert_eq!(latency_bucket(u64::MAX), last);
        assert_eq!(latency_bucket(1 << 40), last);
    }

    #[test]
    fn quantiles_come_from_the_bucket_holding_that_rank() {
        let mut counts = vec![0u64; LATENCY_BUCKETS];
        // 90 values of 100 µs, 9 of 1 ms, 1 of 1 s.
        counts[latency_bucket(100)] += 90;
        counts[latency_bucket(1000)] += 9;
        counts[latency_bucket(1_000_000)] += 1;
        let sum = 90 * 100 + 9 * 1000 + 1_000_000;
        let h = Latency::from_counts(&counts, sum);
        assert_eq!(h.count(), 100);
        assert_eq!(h.buckets.len(), 3);
        let s = h.summary();
        assert_eq!(s.mean, Some(sum / 100));
        let within = |v: Option<u64>, x: u64| {
            let v = v.unwrap();
            v >= x && v <= x + x / 8
        };
        assert!(within(s.p50, 100), "{s:?}");
        assert!(within(s.p90, 100), "{s:?}");
        assert!(within(s.p99, 1000), "{s:?}");
        assert!(within(s.p999, 1_000_000), "{s:?}");
        assert!(within(s.max, 1_000_000), "{s:?}");
        assert_eq!(Latency::default().summary().p50, None);
        assert_eq!(Latency::default().summary().count, 0);
    }
}
