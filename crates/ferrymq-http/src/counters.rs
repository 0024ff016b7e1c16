//! The HTTP API's request counters: by method, route and status for every counted route, and the
//! publish route's own striped counts, which the hot path adds to without contention. They are
//! read into the metrics recorder when `/metrics` is scraped.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::OnceLock;

use axum::http::{Method, StatusCode};
use metrics::Counter;
use parking_lot::RwLock;

/// Counters of requests by method, route and status, looked up without allocating once seen.
type RequestCounters = HashMap<String, Vec<(Method, u16, Counter)>>;

pub(crate) fn request_counter(method: &Method, route: &str, status: StatusCode) -> Counter {
    static COUNTERS: OnceLock<RwLock<RequestCounters>> = OnceLock::new();
    let counters = COUNTERS.get_or_init(Default::default);
    let code = status.as_u16();
    let find = |list: &Vec<(Method, u16, Counter)>| {
        list.iter()
            .find(|(m, s, _)| m == method && *s == code)
            .map(|(_, _, c)| c.clone())
    };
    if let Some(counter) = counters.read().get(route).and_then(find) {
        return counter;
    }
    let mut counters = counters.write();
    let list = counters.entry(route.to_string()).or_default();
    if let Some(counter) = find(list) {
        return counter;
    }
    let counter = metrics::counter!(
        "ferrymq_http_requests_total",
        "method" => method.as_str().to_string(),
        "route" => route.to_string(),
        "status" => status.as_str().to_string(),
    );
    list.push((method.clone(), code, counter.clone()));
    counter
}

/// Counters of the publish route, the hot path: requests answered 201, and the messages and
/// bytes they carried. Each is a [`Striped`] count, folded into the metrics recorder when
/// `/metrics` is scraped ([`fold_publish_counters`]), so that publishers on different workers
/// do not pass a shared cache line back and forth three times per request.
pub(crate) struct PublishCounters {
    pub created: Striped,
    pub messages: Striped,
    pub bytes: Striped,
}

pub(crate) fn publish_counters() -> &'static PublishCounters {
    static COUNTERS: PublishCounters = PublishCounters {
        created: Striped::new(),
        messages: Striped::new(),
        bytes: Striped::new(),
    };
    &COUNTERS
}

/// Stripes of a [`Striped`] counter: more than the cores of the machines FerryMQ runs on, each
/// thread adding to one of them.
const STRIPES: usize = 16;

/// A monotonic counter that threads add to without contention: each thread adds to its own
/// stripe (a cache line of its own), and a read sums them.
pub(crate) struct Striped {
    stripes: [Stripe; STRIPES],
}

#[repr(align(128))]
struct Stripe(AtomicU64);

impl Striped {
    pub(crate) const fn new() -> Self {
        Striped {
            stripes: [const { Stripe(AtomicU64::new(0)) }; STRIPES],
        }
    }

    pub(crate) fn add(&self, n: u64) {
        thread_local! {
            static STRIPE: usize = {
                static NEXT: AtomicUsize = AtomicUsize::new(0);
                NEXT.fetch_add(1, Relaxed) % STRIPES
            };
        }
        let stripe = STRIPE.with(|s| *s);
        self.stripes[stripe].0.fetch_add(n, Relaxed);
    }

    pub(crate) fn sum(&self) -> u64 {
        self.stripes
            .iter()
            .fold(0u64, |sum, s| sum.wrapping_add(s.0.load(Relaxed)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn striped_counts_from_many_threads_add_up() {
        static COUNTER: Striped = Striped::new();
        let threads: Vec<_> = (0..2 * STRIPES as u64)
            .map(|t| {
                std::thread::spawn(move || {
                    for _ in 0..1000 {
                        COUNTER.add(t + 1);
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().unwrap();
        }
        let n = 2 * STRIPES as u64;
        assert_eq!(COUNTER.sum(), 1000 * n * (n + 1) / 2);
    }
}
