//! `--breakdown`: the broker's per-stage latency histograms (`ferrymq_stage_latency_seconds` in
//! `/metrics`), read before and after the run, so that the difference is this run's share and a
//! slow message can be attributed to a stage.
//!
//! The histograms have four buckets per power of two, so a percentile read from them is the
//! upper bound of its bucket: at most 25 % above the true value.

use std::collections::BTreeMap;

use anyhow::{bail, Context};

use crate::cmd::{http_get, ConnectArgs};

const STAGE_BUCKET_PREFIX: &str = "ferrymq_stage_latency_seconds_bucket{stage=\"";

/// Cumulative counts by upper bound (µs; `u64::MAX` for `+Inf`), per stage, in the order
/// `/metrics` lists the stages.
#[derive(Debug, Clone, Default, PartialEq)]
pub(super) struct StageCounts(Vec<(String, BTreeMap<u64, u64>)>);

/// One stage's share of a run.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct StageSummary {
    pub stage: String,
    pub count: u64,
    /// Upper bounds of the buckets holding p50, p99 and p99.9, and of the highest value, in µs
    /// (`None` for a value beyond the last finite bound).
    pub p50: Option<u64>,
    pub p99: Option<u64>,
    pub p999: Option<u64>,
    pub max: Option<u64>,
}

/// Reads the stage histograms from the broker's `/metrics`.
pub(super) async fn scrape(http_addr: &str, connect: &ConnectArgs) -> anyhow::Result<StageCounts> {
    let (status, body) = http_get(http_addr, "/metrics", connect)
        .await
        .context("--breakdown reads the broker's /metrics")?;
    if status != 200 {
        bail!("GET /metrics at {http_addr} answered {status}: {body}");
    }
    let counts = parse(&body);
    if counts.0.is_empty() {
        bail!("the broker at {http_addr} exposes no stage histograms (ferrymq_stage_latency_seconds): is it older than this bench?");
    }
    Ok(counts)
}

fn parse(text: &str) -> StageCounts {
    let mut stages: Vec<(String, BTreeMap<u64, u64>)> = Vec::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix(STAGE_BUCKET_PREFIX) else {
            continue;
        };
        let Some((stage, rest)) = rest.split_once('"') else {
            continue;
        };
        let Some((le, count)) = rest
            .strip_prefix(",le=\"")
            .and_then(|r| r.split_once("\"} "))
        else {
            continue;
        };
        let bound_us = match le {
            "+Inf" => u64::MAX,
            seconds => match seconds.parse::<f64>() {
                Ok(s) => (s * 1e6).round() as u64,
                Err(_) => continue,
            },
        };
        let Ok(count) = count.trim().parse::<u64>() else {
            continue;
        };
        match stages.iter_mut().find(|(name, _)| name == stage) {
            Some((_, buckets)) => {
                buckets.insert(bound_us, count);
            }
            None => stages.push((stage.to_string(), BTreeMap::from([(bound_us, count)]))),
        }
    }
    StageCounts(stages)
}

/// Each stage's values between two scrapes, summarised.
pub(super) fn between(before: &StageCounts, after: &StageCounts) -> Vec<StageSummary> {
    after
        .0
        .iter()
        .map(|(stage, buckets)| {
            let earlier = before.0.iter().find(|(name, _)| name == stage);
            let cumulative: Vec<(u64, u64)> = buckets
                .iter()
                .map(|(&bound, &count)| {
                    let was = earlier.and_then(|(_, b)| b.get(&bound)).copied();
                    (bound, count.saturating_sub(was.unwrap_or(0)))
                })
                .collect();
            let count = cumulative.last().map_or(0, |&(_, n)| n);
            let at = |q: f64| -> Option<u64> {
                let rank = ((q * count as f64).ceil() as u64).max(1);
                let &(bound, _) = cumulative.iter().find(|&&(_, n)| n >= rank)?;
                (bound != u64::MAX).then_some(bound)
            };
            StageSummary {
                stage: stage.clone(),
                count,
                p50: at(0.50),
                p99: at(0.99),
                p999: at(0.999),
                max: at(1.0),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const BEFORE: &str = "\
# TYPE ferrymq_stage_latency_seconds histogram
ferrymq_stage_latency_seconds_bucket{stage=\"fsync\",le=\"0.0001\"} 5
ferrymq_stage_latency_seconds_bucket{stage=\"fsync\",le=\"0.001\"} 10
ferrymq_stage_latency_seconds_bucket{stage=\"fsync\",le=\"+Inf\"} 10
ferrymq_stage_latency_seconds_count{stage=\"fsync\"} 10
ferrymq_subscription_ack_latency_seconds_bucket{topic=\"t\",subscription=\"s\",le=\"0.001\"} 3
";

    #[test]
    fn a_run_is_the_difference_of_two_scrapes() {
        let before = parse(BEFORE);
        assert_eq!(before.0.len(), 1, "only the stage histograms are read");
        let after = parse(&BEFORE.replace(
            "le=\"0.001\"} 10\nferrymq_stage_latency_seconds_bucket{stage=\"fsync\",le=\"+Inf\"} 10",
            "le=\"0.001\"} 1009\nferrymq_stage_latency_seconds_bucket{stage=\"fsync\",le=\"+Inf\"} 1010",
        ));
        let summary = between(&before, &after);
        assert_eq!(
            summary,
            vec![StageSummary {
                stage: "fsync".into(),
                count: 1000,
                p50: Some(1000),
                p99: Some(1000),
                p999: Some(1000),
                max: None,
            }]
        );
        let nothing = between(&after, &after);
        assert_eq!(nothing[0].count, 0);
        assert_eq!(nothing[0].p99, None);
    }
}
