//! What a run measured, printed as text for people or as one JSON object.

use std::io::Write;
use std::time::Duration;

use hdrhistogram::Histogram;
use serde_json::json;

use crate::cmd::StorageArg;

use super::args::{BenchArgs, Mode};
use super::breakdown::StageSummary;
use super::floor::Floor;

pub(super) struct Report {
    pub(super) topic: String,
    pub(super) published: u64,
    pub(super) publish_failed: u64,
    pub(super) expected: u64,
    pub(super) delivered: u64,
    pub(super) redelivered: u64,
    pub(super) producer_elapsed: Duration,
    /// Until the last delivery; with --preload, from the consumers' start until the last
    /// delivery and the confirmation of the consumers' acks, whichever came later.
    pub(super) consumer_elapsed: Duration,
    /// With --preload: from the consumers' start until the last delivery.
    pub(super) consume_received: Option<Duration>,
    /// With --preload: every consumer that acked got its final confirmed ack answered.
    pub(super) acks_confirmed: bool,
    pub(super) latency: Histogram<u64>,
    pub(super) interrupted: bool,
    pub(super) first_error: Option<String>,
    /// With --breakdown: each stage of the broker's paths during this run.
    pub(super) stages: Option<Vec<StageSummary>>,
    /// With --fsync-floor: append + fdatasync of one publish's bytes, in nanoseconds.
    pub(super) fsync_floor: Option<Floor>,
}

fn per_second(count: u64, elapsed: Duration) -> f64 {
    let seconds = elapsed.as_secs_f64();
    if seconds > 0.0 {
        count as f64 / seconds
    } else {
        0.0
    }
}

const QUANTILES: [(&str, f64); 6] = [
    ("p50", 0.50),
    ("p90", 0.90),
    ("p95", 0.95),
    ("p99", 0.99),
    ("p99.9", 0.999),
    ("p99.99", 0.9999),
];

impl Report {
    fn missing(&self) -> u64 {
        self.expected
            .saturating_sub(self.delivered.saturating_sub(self.redelivered))
    }

    fn latency_us(&self, quantile: f64) -> f64 {
        self.latency.value_at_quantile(quantile) as f64 / 1000.0
    }

    // The document's shape in one literal, so that a reader sees every field of the JSON report
    // in one place.
    pub(super) fn to_json(&self, args: &BenchArgs) -> serde_json::Value {
        let size = args.size as f64;
        let producer_rate = per_second(self.published, self.producer_elapsed);
        let consumer_rate = per_second(self.delivered, self.consumer_elapsed);
        let mut latency = serde_json::Map::new();
        latency.insert("samples".into(), json!(self.latency.len()));
        if !self.latency.is_empty() {
            latency.insert("min".into(), json!(self.latency.min() as f64 / 1000.0));
            latency.insert("mean".into(), json!(self.latency.mean() / 1000.0));
            for (name, quantile) in QUANTILES {
                latency.insert(name.replace('.', "_"), json!(self.latency_us(quantile)));
            }
            latency.insert("max".into(), json!(self.latency.max() as f64 / 1000.0));
        }
        let mut report = json!({
            "topic": self.topic,
            "topics": args.topics,
            "mode": match args.mode { Mode::Queue => "queue", Mode::Fanout => "fanout" },
            "storage": match args.storage { StorageArg::Memory => "memory", StorageArg::Disk => "disk" },
            "producers": args.producers,
            "consumers": args.consumers,
            "size": args.size,
            "batch": args.batch,
            "pipeline": args.pipeline,
            "partitions": args.partitions,
            "rate": args.rate,
            "credit": args.credit,
            "auto_ack": args.no_ack,
            "published": self.published,
            "publish_failed": self.publish_failed,
            "expected": self.expected,
            "delivered": self.delivered,
            "redelivered": self.redelivered,
            "missing": self.missing(),
            "interrupted": self.interrupted,
            "error": self.first_error,
            "producer": {
                "elapsed_s": self.producer_elapsed.as_secs_f64(),
                "msgs_per_s": producer_rate,
                "mb_per_s": producer_rate * size / 1e6,
            },
            "consumer": {
                "elapsed_s": self.consumer_elapsed.as_secs_f64(),
                "msgs_per_s": consumer_rate,
                "mb_per_s": consumer_rate * size / 1e6,
            },
            "latency_us": latency,
        });
        report["keys"] = json!(args.keys);
        report["ordered"] = json!(args.ordered);
        report["ack"] = json!(if args.no_ack {
            "auto"
        } else if args.ack_each {
            "per message"
        } else {
            "per frame"
        });
        report["preload"] = json!(args.preload);
        if let Some(floor) = &self.fsync_floor {
            report["fsync_floor_us"] = histogram_json(&floor.fsyncs);
            report["fsync_floor_group_commit_us"] = histogram_json(&floor.group_commit);
        }
        if let Some(stages) = &self.stages {
            report["stages_us"] = stages
                .iter()
                .map(|s| {
                    json!({"stage": s.stage, "count": s.count, "p50_at_most": s.p50,
                           "p99_at_most": s.p99, "p99_9_at_most": s.p999, "max_at_most": s.max})
                })
                .collect();
        }
        if let Some(received) = self.consume_received {
            // "producer" and "consumer" above are these two phases; named here as well.
            report["phases"] = json!({
                "preload": {
                    "messages": self.published,
                    "elapsed_s": self.producer_elapsed.as_secs_f64(),
                    "msgs_per_s": producer_rate,
                    "mb_per_s": producer_rate * size / 1e6,
                },
                "consume": {
                    "messages": self.delivered,
                    "elapsed_s": self.consumer_elapsed.as_secs_f64(),
                    "msgs_per_s": consumer_rate,
                    "mb_per_s": consumer_rate * size / 1e6,
                    "last_delivery_s": received.as_secs_f64(),
                    "acks_confirmed": self.acks_confirmed,
                },
            });
        }
        report
    }

    // One line after another in the order they are printed: splitting it would only scatter
    // the report's layout.
    pub(super) fn write_text(&self, args: &BenchArgs, out: &mut impl Write) -> std::io::Result<()> {
        let size = args.size as f64;
        writeln!(
            out,
            "topic {} ({}, {} partition{}), {} mode, {} producer{}, {} consumer{}, {} B messages, batch {}, pipeline {}{}",
            self.topic,
            match args.storage {
                StorageArg::Memory => "memory",
                StorageArg::Disk => "disk",
            },
            args.partitions,
            if args.partitions == 1 { "" } else { "s" },
            match args.mode {
                Mode::Queue => "queue",
                Mode::Fanout => "fanout",
            },
            args.producers,
            if args.producers == 1 { "" } else { "s" },
            args.consumers,
            if args.consumers == 1 { "" } else { "s" },
            args.size,
            args.batch,
            args.pipeline,
            [
                (args.rate > 0).then(|| format!(", rate {} msg/s", args.rate)),
                args.keys.map(|n| format!(", {n} keys")),
                args.ordered.then(|| ", ordered".to_string()),
                (args.ack_each && !args.no_ack).then(|| ", ack per message".to_string()),
                args.no_ack.then(|| ", auto-ack".to_string()),
                args.preload.map(|n| format!(", preload {n}")),
            ]
            .into_iter()
            .flatten()
            .collect::<String>(),
        )?;
        let mut rate_line = |label: &str, count: u64, elapsed: Duration| {
            let rate = per_second(count, elapsed);
            writeln!(
                out,
                "{label:<9} {count:>12} msgs in {:>8.3} s  {rate:>12.0} msg/s  {:>9.1} MB/s",
                elapsed.as_secs_f64(),
                rate * size / 1e6
            )
        };
        match self.consume_received {
            Some(received) => {
                rate_line("preloaded", self.published, self.producer_elapsed)?;
                rate_line("consumed", self.delivered, self.consumer_elapsed)?;
                writeln!(
                    out,
                    "          (consume phase: from the consumers' start; last delivery at {:.3} s, {})",
                    received.as_secs_f64(),
                    if args.no_ack {
                        "auto-ack"
                    } else if self.acks_confirmed {
                        "acks confirmed by the broker at the end"
                    } else {
                        "acks NOT confirmed"
                    }
                )?;
            }
            None => {
                rate_line("published", self.published, self.producer_elapsed)?;
                if args.consumers > 0 {
                    rate_line("delivered", self.delivered, self.consumer_elapsed)?;
                }
            }
        }
        if self.publish_failed > 0 {
            writeln!(
                out,
                "failed    {:>12} msgs (refused, or unconfirmed when a connection was lost)",
                self.publish_failed
            )?;
        }
        if self.missing() > 0 {
            writeln!(
                out,
                "missing   {:>12} of {} expected deliveries (not delivered within the {:?} grace period)",
                self.missing(),
                self.expected,
                args.grace
            )?;
        }
        if self.redelivered > 0 {
            writeln!(out, "redelivered {:>10} msgs", self.redelivered)?;
        }
        self.write_latency(out)?;
        self.write_stages(out)?;
        if self.interrupted {
            writeln!(out, "interrupted: the numbers cover the run until Ctrl-C")?;
        }
        Ok(())
    }

    /// The latency percentiles, then the disk's own fsync floor and FerryMQ's p99 and p99.9
    /// against it.
    fn write_latency(&self, out: &mut impl Write) -> std::io::Result<()> {
        if !self.latency.is_empty() {
            let mut line = String::from("latency µs");
            for (name, quantile) in QUANTILES {
                line.push_str(&format!("  {name} {:.1}", self.latency_us(quantile)));
            }
            line.push_str(&format!("  max {:.1}", self.latency.max() as f64 / 1000.0));
            writeln!(out, "{line}")?;
        }
        let Some(floor) = self.fsync_floor.as_ref().filter(|f| !f.fsyncs.is_empty()) else {
            return Ok(());
        };
        let us = |h: &Histogram<u64>, q: f64| h.value_at_quantile(q) as f64 / 1000.0;
        for (label, h) in [
            ("fsync floor µs", &floor.fsyncs),
            ("as group commit", &floor.group_commit),
        ] {
            let mut line = String::from(label);
            for (name, quantile) in QUANTILES {
                line.push_str(&format!("  {name} {:.1}", us(h, quantile)));
            }
            line.push_str(&format!("  max {:.1}", h.max() as f64 / 1000.0));
            writeln!(out, "{line}")?;
        }
        writeln!(
            out,
            "          ({} appends + fdatasync; as group commit: what a message arriving during one waits, its rest and the next)",
            floor.fsyncs.len()
        )?;
        if !self.latency.is_empty() {
            let p99 = us(&self.latency, 0.99);
            let (fsync_p99, model_p99) = (us(&floor.fsyncs, 0.99), us(&floor.group_commit, 0.99));
            writeln!(
                out,
                "vs floor  p99 {p99:.1} µs = {:.2}× the disk's fsync p99 {fsync_p99:.1} µs, {:.2}× its group commit's {model_p99:.1} µs; p99.9 {:.1} µs vs fsync {:.1} µs",
                p99 / fsync_p99.max(0.001),
                p99 / model_p99.max(0.001),
                us(&self.latency, 0.999),
                us(&floor.fsyncs, 0.999)
            )?;
        }
        Ok(())
    }

    /// Where the broker spent this run's time, stage by stage (bucket upper bounds).
    fn write_stages(&self, out: &mut impl Write) -> std::io::Result<()> {
        let Some(stages) = &self.stages else {
            return Ok(());
        };
        writeln!(
            out,
            "stage (µs, at most)   count       p50       p99     p99.9       max"
        )?;
        let text = |v: Option<u64>| v.map_or_else(|| "-".to_string(), |v| v.to_string());
        for s in stages {
            writeln!(
                out,
                "  {:<14} {:>10} {:>9} {:>9} {:>9} {:>9}",
                s.stage,
                s.count,
                text(s.p50),
                text(s.p99),
                text(s.p999),
                text(s.max)
            )?;
        }
        Ok(())
    }
}

/// A histogram of nanoseconds as JSON, in microseconds.
fn histogram_json(h: &Histogram<u64>) -> serde_json::Value {
    let mut map = serde_json::Map::new();
    map.insert("samples".into(), json!(h.len()));
    if !h.is_empty() {
        for (name, quantile) in QUANTILES {
            let us = h.value_at_quantile(quantile) as f64 / 1000.0;
            map.insert(name.replace('.', "_"), json!(us));
        }
        map.insert("max".into(), json!(h.max() as f64 / 1000.0));
    }
    map.into()
}

#[cfg(test)]
mod tests {
    use crate::bench::new_histogram;

    use super::*;

    #[test]
    fn missing_counts_first_deliveries_only() {
        let report = Report {
            topic: "t".into(),
            published: 10,
            publish_failed: 0,
            expected: 10,
            delivered: 9,
            redelivered: 2,
            producer_elapsed: Duration::from_secs(1),
            consumer_elapsed: Duration::from_secs(1),
            consume_received: None,
            acks_confirmed: false,
            latency: new_histogram().unwrap(),
            interrupted: false,
            first_error: None,
            stages: None,
            fsync_floor: None,
        };
        assert_eq!(report.missing(), 3);
    }
}
