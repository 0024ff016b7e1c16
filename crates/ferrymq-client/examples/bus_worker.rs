//! A bus worker for `bench/sdk/targets.py`, the Rust twin of `bench/sdk/worker.py`: receives
//! Job messages until SIGTERM drains it, then writes one `id attempt` line per handled message
//! to OUT and prints a JSON summary.
//!
//! `bus_worker ADDR TOPIC IDENTITY CONCURRENCY PREFETCH WORK_MS OUT`

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ferrymq_client::bus::{
    BusMessage, Context, FieldType, Handler, Receiver, ReceiverOptions, Settings,
};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
struct Job {
    id: i64,
    customer: String,
    pad: String,
}

impl BusMessage for Job {
    const TYPE_NAME: &'static str = "Job";
    const FIELDS: &'static [(&'static str, FieldType)] = &[
        ("id", FieldType::Int),
        ("customer", FieldType::String),
        ("pad", FieldType::String),
    ];
    const KEY: &'static str = "customer";
}

/// (id, attempt) in the order handled, and when the first and the last were handled.
#[derive(Default)]
struct Seen {
    handled: Vec<(i64, u16)>,
    first: Option<Instant>,
    last: Option<Instant>,
}

struct Worker {
    work: Duration,
    seen: Mutex<Seen>,
}

impl Handler<Job> for Worker {
    async fn handle(&self, job: &Job, context: &Context) -> Result<(), String> {
        if !self.work.is_zero() {
            tokio::time::sleep(self.work).await;
        }
        let now = Instant::now();
        let mut seen = self.seen.lock().unwrap();
        seen.handled.push((job.id, context.attempt));
        seen.first.get_or_insert(now);
        seen.last = Some(now);
        Ok(())
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [addr, topic, identity, concurrency, prefetch, work_ms, out] = &args[..] else {
        return Err(
            "usage: bus_worker ADDR TOPIC IDENTITY CONCURRENCY PREFETCH WORK_MS OUT".into(),
        );
    };
    let settings = Settings {
        addr: addr.clone(),
        identity: identity.clone(),
        topic_template: topic.clone(),
        ..Settings::default()
    };
    let client = ferrymq_client::Client::connect(addr.clone()).await?;
    let worker = Arc::new(Worker {
        work: Duration::from_millis(work_ms.parse()?),
        seen: Mutex::new(Seen::default()),
    });
    let options = ReceiverOptions {
        concurrency: concurrency.parse()?,
        prefetch: Some(prefetch.parse()?),
        create_topics: false,
        ..ReceiverOptions::default()
    };
    let mut receiver = Receiver::subscribe(&client, settings, worker.clone(), options).await?;
    let drain = receiver.drain_handle();
    tokio::spawn(async move {
        let kind = tokio::signal::unix::SignalKind::terminate();
        let mut term = tokio::signal::unix::signal(kind).expect("a SIGTERM handler");
        term.recv().await;
        drain.drain();
    });
    println!("READY");
    let summary = receiver.run(|_| {}).await?;
    let seen = std::mem::take(&mut *worker.seen.lock().unwrap());
    let lines: String = seen
        .handled
        .iter()
        .map(|(id, attempt)| format!("{id} {attempt}\n"))
        .collect();
    std::fs::write(out, lines)?;
    let seconds = match (seen.first, seen.last) {
        (Some(first), Some(last)) => (last - first).as_secs_f64(),
        _ => 0.0,
    };
    let handled = seen.handled.len();
    let rate = if seconds > 0.0 {
        (handled as f64 - 1.0) / seconds
    } else {
        0.0
    };
    println!(
        "{{\"handled\": {handled}, \"released\": {}, \"seconds\": {seconds}, \"rate\": {rate}}}",
        summary.released
    );
    client.close().await?;
    Ok(())
}
