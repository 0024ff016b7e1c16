//! What the broker's log says about dead letters: one line each, saying why it died.

use std::io;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use ferrymq_broker::{Broker, BrokerConfig};
use ferrymq_protocol::{Message, OffsetRange, SubscribeRequest};

/// The broker's log lines at every level, as text.
fn captured_log() -> &'static Mutex<Vec<u8>> {
    static LOG: OnceLock<&'static Mutex<Vec<u8>>> = OnceLock::new();
    LOG.get_or_init(|| {
        let log: &'static Mutex<Vec<u8>> = Box::leak(Box::new(Mutex::new(Vec::new())));
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::DEBUG)
            .with_ansi(false)
            .with_writer(move || LogWriter(log))
            .finish();
        tracing::subscriber::set_global_default(subscriber).expect("one subscriber");
        log
    })
}

struct LogWriter(&'static Mutex<Vec<u8>>);

impl io::Write for LogWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The lines about the dead letters and the messages given up of `topic`.
fn dead_letter_lines(topic: &str) -> Vec<String> {
    let log = captured_log().lock().unwrap();
    let fields = [format!("topic={topic} "), format!("topic=\"{topic}\" ")];
    String::from_utf8_lossy(&log)
        .lines()
        .filter(|l| fields.iter().any(|f| l.contains(f.as_str())))
        .filter(|l| {
            l.contains("dead-letter") || l.contains("given up") || l.contains("max_attempts")
        })
        .map(str::to_string)
        .collect()
}

/// Waits (at most 5 s) until `topic` has `n` dead-letter lines.
async fn wait_for_lines(topic: &str, n: usize) -> Vec<String> {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let lines = dead_letter_lines(topic);
        if lines.len() >= n {
            return lines;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{lines:#?} in {}",
            String::from_utf8_lossy(&captured_log().lock().unwrap())
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn an_explicit_rejection_is_one_debug_line_saying_so() {
    captured_log();
    let broker = Broker::open(BrokerConfig::default());
    let consumer = broker
        .subscribe(&SubscribeRequest::earliest("rejecting", "workers"))
        .unwrap();
    let messages: Vec<Message> = (0..5).map(|i| Message::new(format!("m{i}"))).collect();
    broker
        .publish_messages("rejecting", &messages)
        .await
        .unwrap();
    let mut rejected = 0;
    while rejected < 5 {
        for d in consumer.recv(10).await.unwrap() {
            let range = OffsetRange::single(d.partition, d.offset);
            assert_eq!(consumer.dead_letter(&[range], "bad input").unwrap(), 1);
            rejected += 1;
        }
    }
    let lines = wait_for_lines("rejecting", 5).await;
    // Settled: nothing more comes.
    let stats = broker.stats(Some("rejecting")).unwrap();
    assert_eq!(stats[0].subscriptions[0].gave_up, 5);
    let lines_after = dead_letter_lines("rejecting");
    assert_eq!(lines_after.len(), 5, "{lines_after:#?}");
    for line in &lines {
        assert!(line.contains("DEBUG"), "{line}");
        assert!(line.contains("rejected by its consumer"), "{line}");
        assert!(line.contains("bad input"), "{line}");
        assert!(!line.contains("reached max_attempts"), "{line}");
    }
}

#[tokio::test]
async fn attempts_exhausted_is_one_warning_saying_so() {
    captured_log();
    let broker = Broker::open(BrokerConfig::default());
    let consumer = broker
        .subscribe(&SubscribeRequest {
            max_attempts: 2,
            ..SubscribeRequest::earliest("exhausting", "workers")
        })
        .unwrap();
    broker
        .publish_messages("exhausting", &[Message::new("poison")])
        .await
        .unwrap();
    for _ in 0..2 {
        let got = consumer.recv(1).await.unwrap();
        consumer
            .nack(
                &[OffsetRange::single(got[0].partition, got[0].offset)],
                Duration::ZERO,
            )
            .unwrap();
    }
    let lines = wait_for_lines("exhausting", 1).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while broker.stats(Some("exhausting")).unwrap()[0].subscriptions[0].gave_up < 1 {
        assert!(std::time::Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(dead_letter_lines("exhausting").len(), 1, "{lines:#?}");
    assert!(lines[0].contains("WARN"), "{}", lines[0]);
    assert!(lines[0].contains("reached max_attempts"), "{}", lines[0]);
    assert!(lines[0].contains("max_attempts=2"), "{}", lines[0]);
}
