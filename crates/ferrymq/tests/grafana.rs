//! `deploy/grafana/ferrymq.json` queries only what a live broker's `/metrics` has: every metric
//! a panel names exists, with every label the panel groups, filters or labels its lines by. A
//! renamed metric or label fails here rather than as an empty panel on an operator's screen.

mod common;

use std::collections::{BTreeMap, BTreeSet};

use common::{http, temp_dir, Served};

const BOARD: &str = include_str!("../../../deploy/grafana/ferrymq.json");

/// Every `ferrymq_*` series of a `/metrics` text, by metric name, with the label names seen.
fn series(metrics: &str) -> BTreeMap<String, BTreeSet<String>> {
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for line in metrics.lines().filter(|l| l.starts_with("ferrymq_")) {
        let name_end = line.find(['{', ' ']).unwrap_or(line.len());
        let labels = out.entry(line[..name_end].to_string()).or_default();
        // `name="value",...}`: values are quoted and may hold `{`, `}` or `,` (a route).
        let mut rest = line[name_end..].strip_prefix('{').unwrap_or("");
        while let Some(eq) = rest.find("=\"") {
            labels.insert(rest[..eq].trim_start_matches(',').trim().to_string());
            let value = &rest[eq + 2..];
            let close = value.find('"').unwrap_or(value.len());
            rest = &value[(close + 1).min(value.len())..];
            if rest.starts_with('}') {
                break;
            }
        }
    }
    out
}

/// The identifiers of `text` made of `[a-z0-9_]` starting at each `ferrymq_`.
fn metric_names(expr: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = expr;
    while let Some(at) = rest.find("ferrymq_") {
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'))
            .unwrap_or(tail.len());
        names.push(tail[..end].to_string());
        rest = &tail[end..];
    }
    names
}

/// Label names an expression groups by (`by (a, b)`), filters on (`{a=~"..."}`), or a legend
/// shows (`{{a}}`).
fn label_names(expr: &str, legend: &str) -> BTreeSet<String> {
    let mut labels = BTreeSet::new();
    let mut rest = expr;
    while let Some(at) = rest.find("by (") {
        let tail = &rest[at + 4..];
        let end = tail.find(')').unwrap();
        labels.extend(tail[..end].split(',').map(|l| l.trim().to_string()));
        rest = &tail[end..];
    }
    let mut rest = expr;
    while let Some(at) = rest.find('{') {
        let tail = &rest[at + 1..];
        let end = tail.find('}').unwrap();
        for matcher in tail[..end].split(',').filter(|m| !m.trim().is_empty()) {
            let name_end = matcher.find(['=', '!']).unwrap();
            labels.insert(matcher[..name_end].trim().to_string());
        }
        rest = &tail[end..];
    }
    let mut rest = legend;
    while let Some(at) = rest.find("{{") {
        let tail = &rest[at + 2..];
        let end = tail.find("}}").unwrap();
        labels.insert(tail[..end].trim().to_string());
        rest = &tail[end..];
    }
    labels
}

#[test]
fn every_metric_and_label_the_board_queries_exists_in_a_live_broker() {
    let dir = temp_dir("grafana");
    let mut served = Served::start_in(&dir, &[], &[]);
    let http_addr = served.http_addr();
    // Traffic, so that per-topic and per-subscription series exist.
    let json = [("content-type", "application/json")];
    let (status, _) = http(
        http_addr,
        "POST",
        "/topics/orders/messages",
        &json,
        br#"{"messages":[{"body":"a"},{"body":"b"}]}"#,
    );
    assert_eq!(status, 201);
    let (status, body) = http(
        http_addr,
        "POST",
        "/topics/orders/subscriptions/billing/poll?start=earliest&wait_ms=1000",
        &json,
        b"{}",
    );
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let (status, body) = http(http_addr, "GET", "/metrics", &[], b"");
    assert_eq!(status, 200);
    let live = series(&String::from_utf8_lossy(&body));

    let board: serde_json::Value = serde_json::from_str(BOARD).unwrap();
    let mut problems = Vec::new();
    let mut queried = 0;
    for panel in board["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = target["expr"].as_str().unwrap();
            let legend = target["legendFormat"].as_str().unwrap_or("");
            let metrics = metric_names(expr);
            assert!(
                !metrics.is_empty(),
                "a query without a FerryMQ metric: {expr}"
            );
            queried += metrics.len();
            for metric in &metrics {
                if !live.contains_key(metric) {
                    problems.push(format!("{}: {metric} is not in /metrics", panel["title"]));
                }
            }
            let has: BTreeSet<&String> = metrics
                .iter()
                .filter_map(|m| live.get(m))
                .flatten()
                .collect();
            for label in label_names(expr, legend) {
                if !has.contains(&label) {
                    problems.push(format!(
                        "{}: label {label} is on none of {metrics:?}",
                        panel["title"]
                    ));
                }
            }
        }
    }
    assert!(queried > 20, "the board queries {queried} metrics");
    assert!(problems.is_empty(), "{problems:#?}");
    served.signal("TERM");
    served.wait_exit();
    let _ = std::fs::remove_dir_all(&dir);
}
