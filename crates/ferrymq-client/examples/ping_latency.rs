//! Round trips of PING/PONG at a fixed rate: the floor under publish-to-deliver latency on a
//! machine (two network hops through the broker, no broker work).
//!
//!     cargo run --release -p ferrymq-client --example ping_latency -- ADDR RATE SECONDS

use std::time::{Duration, Instant};

use ferrymq_client::Client;
use hdrhistogram::Histogram;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let addr = args
        .first()
        .cloned()
        .unwrap_or_else(|| "127.0.0.1:7070".into());
    let rate: u64 = args.get(1).map_or(Ok(10_000), |s| s.parse())?;
    let seconds: u64 = args.get(2).map_or(Ok(5), |s| s.parse())?;
    let client = Client::connect(addr).await?;
    let mut histogram = Histogram::<u64>::new(3)?;
    let interval = Duration::from_nanos(1_000_000_000 / rate.max(1));
    let start = Instant::now();
    for k in 0..rate * seconds {
        let due = start + interval * k as u32;
        let now = Instant::now();
        if due > now {
            std::thread::sleep(due - now);
        }
        client.ping().await?;
        // From the scheduled moment, as the bench measures.
        histogram.record(due.elapsed().as_nanos() as u64)?;
    }
    let us = |q: f64| histogram.value_at_quantile(q) as f64 / 1000.0;
    println!(
        "{} pings at {rate}/s: p50 {:.0} µs, p90 {:.0} µs, p99 {:.0} µs, p99.9 {:.0} µs, max {:.0} µs",
        histogram.len(),
        us(0.5),
        us(0.9),
        us(0.99),
        us(0.999),
        histogram.max() as f64 / 1000.0
    );
    Ok(())
}
