//! The comparison table (markdown, FerryMQ / peer ratios) and the SVG chart.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use anyhow::Context;
use plotters::prelude::*;
use serde::Deserialize;

use crate::harness::{median, Outcome, Scenario, ScenarioResult};

/// What the script knows about the sitting: shown above the table.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct Meta {
    pub date: String,
    pub machine: String,
    pub commit: String,
    pub command: String,
    /// (name, version) in the order to print.
    pub versions: Vec<(String, String)>,
    /// Extra lines for the notes (settings the script chose, e.g. NATS's sync setting).
    pub notes: Vec<String>,
}

const FERRY: &str = "ferrymq";

/// Column keys in table order; unknown keys follow in the order they appear.
const KNOWN_COLUMNS: [(&str, &str); 9] = [
    (FERRY, "FerryMQ"),
    // bench/peers/cluster's columns.
    ("ferrymq-r3", "FerryMQ, 3 nodes"),
    ("nats-r3", "JetStream R3"),
    ("nats-r3-fsync", "JetStream R3, fsync always"),
    ("rabbitmq-r3", "RabbitMQ quorum queue, 3 nodes"),
    ("nats", "NATS"),
    ("redis-always", "Redis (appendfsync always)"),
    ("redis-everysec", "Redis (appendfsync everysec)"),
    ("rabbitmq", "RabbitMQ"),
];

fn column_title(key: &str) -> String {
    KNOWN_COLUMNS
        .iter()
        .find(|(k, _)| *k == key)
        .map_or_else(|| key.to_string(), |(_, title)| title.to_string())
}

fn scenario_title(scenario: Scenario) -> &'static str {
    match scenario {
        Scenario::Transient => "transient fan-out, 100 B, 1 → 1 (msg/s)",
        Scenario::Durable100 => "durable publish, 100 B, confirmed after fsync (msg/s)",
        Scenario::Durable1k => "durable publish, 1 KiB, confirmed after fsync (msg/s)",
        Scenario::WorkQueue => "work queue: pre-loaded durable queue, consume + ack (msg/s)",
        Scenario::Latency => "latency at 10 k msg/s",
    }
}

const PERCENTILES: [&str; 4] = ["p50", "p99", "p99.9", "max"];

pub fn format_rate(rate: f64) -> String {
    if rate >= 1e6 {
        format!("{:.2} M", rate / 1e6)
    } else if rate >= 1e5 {
        format!("{:.0} k", rate / 1e3)
    } else if rate >= 1e3 {
        format!("{:.1} k", rate / 1e3)
    } else {
        format!("{rate:.0}")
    }
}

pub fn format_us(us: f64) -> String {
    if us >= 10_000.0 {
        format!("{:.0} ms", us / 1000.0)
    } else if us >= 1000.0 {
        format!("{:.1} ms", us / 1000.0)
    } else {
        format!("{us:.0} µs")
    }
}

/// FerryMQ / peer, bold where FerryMQ is not ahead (`higher_is_better` for throughput).
pub fn format_ratio(ferry: f64, peer: f64, higher_is_better: bool) -> String {
    if !(ferry.is_finite() && peer.is_finite()) || peer <= 0.0 {
        return String::new();
    }
    let ratio = ferry / peer;
    let text = if ratio >= 10.0 {
        format!("{ratio:.0}×")
    } else {
        format!("{ratio:.2}×")
    };
    let ahead = if higher_is_better {
        ratio > 1.0
    } else {
        ratio < 1.0
    };
    if ahead {
        text
    } else {
        format!("**{text}**")
    }
}

/// Results by column, in table order.
pub struct Results {
    pub columns: Vec<String>,
    pub by_key: BTreeMap<(String, Scenario), ScenarioResult>,
}

impl Results {
    pub fn new(results: Vec<ScenarioResult>) -> Results {
        let mut columns: Vec<String> = Vec::new();
        for (key, _) in KNOWN_COLUMNS {
            if results.iter().any(|r| r.system == key) {
                columns.push(key.to_string());
            }
        }
        for r in &results {
            if !columns.contains(&r.system) {
                columns.push(r.system.clone());
            }
        }
        let by_key = results
            .into_iter()
            .map(|r| ((r.system.clone(), r.scenario), r))
            .collect();
        Results { columns, by_key }
    }

    fn get(&self, column: &str, scenario: Scenario) -> Option<&ScenarioResult> {
        self.by_key.get(&(column.to_string(), scenario))
    }

    fn rate(&self, column: &str, scenario: Scenario) -> Option<f64> {
        self.get(column, scenario)
            .and_then(|r| r.outcome.median_rate())
    }

    fn latency(&self, column: &str) -> Option<[f64; 4]> {
        self.get(column, Scenario::Latency)
            .and_then(|r| r.outcome.median_latency())
    }
}

/// The markdown section: sitting, table, notes.
pub fn markdown(results: &Results, meta: &Meta) -> String {
    let mut out = String::new();
    if !meta.date.is_empty() {
        let _ = writeln!(out, "Date: {}. Commit: {}.", meta.date, meta.commit);
    }
    if !meta.machine.is_empty() {
        let _ = writeln!(out, "Machine: {}.", meta.machine);
    }
    if !meta.command.is_empty() {
        let _ = writeln!(out, "Command: `{}`.", meta.command);
    }
    if !meta.versions.is_empty() {
        let versions: Vec<String> = meta
            .versions
            .iter()
            .map(|(name, version)| format!("{name} {version}"))
            .collect();
        let _ = writeln!(out, "Versions: {}.", versions.join("; "));
    }
    if !out.is_empty() {
        out.push('\n');
    }

    // Footnotes: caveats that make a figure mean something else than the row says.
    let mut footnotes: Vec<String> = Vec::new();
    let mut mark = |text: &str| -> String {
        let index = match footnotes.iter().position(|f| f == text) {
            Some(i) => i,
            None => {
                footnotes.push(text.to_string());
                footnotes.len() - 1
            }
        };
        format!(" [{}]", index + 1)
    };

    let _ = write!(out, "| scenario |");
    for column in &results.columns {
        let _ = write!(out, " {} |", column_title(column));
    }
    out.push('\n');
    let _ = write!(out, "| --- |");
    for _ in &results.columns {
        out.push_str(" --- |");
    }
    out.push('\n');

    for scenario in Scenario::ALL {
        if results
            .columns
            .iter()
            .all(|c| results.get(c, scenario).is_none())
        {
            continue;
        }
        if scenario == Scenario::Latency {
            let ferry = results.latency(FERRY);
            for (i, name) in PERCENTILES.iter().enumerate() {
                let _ = write!(out, "| {}, {name} |", scenario_title(scenario));
                for column in &results.columns {
                    let cell = match results.get(column, scenario) {
                        None => "—".to_string(),
                        Some(r) => match (&r.outcome, r.outcome.median_latency()) {
                            (Outcome::NotApplicable { reason }, _) => {
                                format!("n/a ({reason})")
                            }
                            (_, Some(lat)) => {
                                let mut cell = format_us(lat[i]);
                                if column != FERRY {
                                    if let Some(f) = ferry {
                                        let _ = write!(
                                            cell,
                                            " ({})",
                                            format_ratio(f[i], lat[i], false)
                                        );
                                    }
                                }
                                if let Some(caveat) = &r.caveat {
                                    cell.push_str(&mark(caveat));
                                }
                                cell
                            }
                            _ => "—".to_string(),
                        },
                    };
                    let _ = write!(out, " {cell} |");
                }
                out.push('\n');
            }
            continue;
        }
        let ferry = results.rate(FERRY, scenario);
        let _ = write!(out, "| {} |", scenario_title(scenario));
        for column in &results.columns {
            let cell = match results.get(column, scenario) {
                None => "—".to_string(),
                Some(r) => match (&r.outcome, r.outcome.median_rate()) {
                    (Outcome::NotApplicable { reason }, _) => format!("n/a ({reason})"),
                    (Outcome::Throughput { runs }, Some(rate)) => {
                        let mut cell = format_rate(rate);
                        if column != FERRY {
                            if let Some(f) = ferry {
                                let _ = write!(cell, " ({})", format_ratio(f, rate, true));
                            }
                        }
                        let lost: u64 = runs.iter().map(|r| r.lost).sum();
                        if lost > 0 {
                            let _ = write!(cell, ", {lost} lost");
                        }
                        if let Some(caveat) = &r.caveat {
                            cell.push_str(&mark(caveat));
                        }
                        cell
                    }
                    _ => "—".to_string(),
                },
            };
            let _ = write!(out, " {cell} |");
        }
        out.push('\n');
    }
    out.push('\n');
    out.push_str(
        "Each figure is the median of the runs; in brackets FerryMQ / peer: for throughput above 1 \
         means FerryMQ is ahead, for latency below 1 means FerryMQ is ahead; bold where it is not.\n",
    );
    for (i, note) in footnotes.iter().enumerate() {
        let _ = writeln!(out, "\n[{}] {note}", i + 1);
    }
    let mut setups = String::new();
    for column in &results.columns {
        if let Some(r) = Scenario::ALL.iter().find_map(|s| results.get(column, *s)) {
            let _ = writeln!(setups, "- {}: {}", column_title(column), r.setup);
        }
    }
    if !setups.is_empty() {
        let _ = write!(out, "\nSettings per system:\n\n{setups}");
    }
    for note in &meta.notes {
        let _ = writeln!(out, "\n{note}");
    }
    out
}

const COLORS: [RGBColor; 6] = [
    RGBColor(0xd9, 0x5f, 0x02), // FerryMQ
    RGBColor(0x1b, 0x9e, 0x77),
    RGBColor(0x75, 0x70, 0xb3),
    RGBColor(0xa6, 0xa0, 0xe0),
    RGBColor(0xe7, 0x29, 0x8a),
    RGBColor(0x66, 0xa6, 0x1e),
];

/// Throughput per scenario (left) and latency per percentile (right), log scales, one bar per
/// system; scenarios no system ran are left out. Without latency results but with failover
/// times (`failovers`: column and seconds), the right side shows their medians instead.
pub fn chart<DB: DrawingBackend>(
    results: &Results,
    failovers: &[(String, f64)],
    root: DrawingArea<DB, plotters::coord::Shift>,
) -> anyhow::Result<()>
where
    DB::ErrorType: 'static,
{
    root.fill(&WHITE).map_err(|e| anyhow::anyhow!("{e}"))?;
    let (left, right) = root.split_horizontally(root.dim_in_pixel().0 * 3 / 5);
    let groups = [
        (Scenario::Transient, "transient 100 B"),
        (Scenario::Durable100, "durable 100 B"),
        (Scenario::Durable1k, "durable 1 KiB"),
        (Scenario::WorkQueue, "work queue"),
    ];
    let groups: Vec<_> = groups
        .into_iter()
        .filter(|(s, _)| {
            results
                .columns
                .iter()
                .any(|c| results.rate(c, *s).is_some())
        })
        .collect();
    let rates: Vec<Vec<Option<f64>>> = results
        .columns
        .iter()
        .map(|c| groups.iter().map(|(s, _)| results.rate(c, *s)).collect())
        .collect();
    let labels: Vec<&str> = groups.iter().map(|(_, l)| *l).collect();
    bars(
        &left,
        "Throughput, msg/s (median, log scale)",
        &labels,
        &results.columns,
        &rates,
        format_rate,
        true,
    )?;
    let has_latency = results.columns.iter().any(|c| results.latency(c).is_some());
    if !has_latency && !failovers.is_empty() {
        let secs: Vec<Vec<Option<f64>>> = results
            .columns
            .iter()
            .map(|c| {
                let mut v: Vec<f64> = failovers
                    .iter()
                    .filter(|(k, _)| k == c)
                    .map(|(_, s)| *s)
                    .collect();
                vec![median(&mut v)]
            })
            .collect();
        bars(
            &right,
            "Failover, kill -9 of the leader (median, log scale)",
            &["to the next acknowledged publish"],
            &results.columns,
            &secs,
            |s| format!("{s:.1} s"),
            false,
        )?;
        root.present().map_err(|e| anyhow::anyhow!("{e}"))?;
        return Ok(());
    }
    let latencies: Vec<Vec<Option<f64>>> = results
        .columns
        .iter()
        .map(|c| match results.latency(c) {
            Some(l) => l.iter().map(|v| Some(*v)).collect(),
            None => vec![None; 4],
        })
        .collect();
    bars(
        &right,
        "Latency at 10 k msg/s (median, log scale)",
        &PERCENTILES,
        &results.columns,
        &latencies,
        format_us,
        false,
    )?;
    root.present().map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(())
}

fn bars<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    caption: &str,
    groups: &[&str],
    columns: &[String],
    values: &[Vec<Option<f64>>],
    format: fn(f64) -> String,
    legend: bool,
) -> anyhow::Result<()>
where
    DB::ErrorType: 'static,
{
    let present: Vec<f64> = values
        .iter()
        .flatten()
        .flatten()
        .copied()
        .filter(|v| *v > 0.0)
        .collect();
    let lo = present.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = present.iter().copied().fold(0.0, f64::max);
    let (lo, hi) = if present.is_empty() {
        (1.0, 10.0)
    } else {
        (
            10f64.powf(lo.log10().floor()),
            10f64.powf(hi.log10().ceil() + 0.3),
        )
    };
    let n = groups.len();
    let err = |e: DrawingAreaErrorKind<DB::ErrorType>| anyhow::anyhow!("{e}");
    let mut chart = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(30)
        .y_label_area_size(70)
        .build_cartesian_2d(-0.5f64..(n as f64 - 0.5), (lo..hi).log_scale())
        .map_err(err)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(n)
        .x_label_formatter(&|x| {
            let i = x.round();
            if (x - i).abs() < 1e-6 && i >= 0.0 && (i as usize) < n {
                groups[i as usize].to_string()
            } else {
                String::new()
            }
        })
        .y_label_formatter(&|y| format(*y))
        .draw()
        .map_err(err)?;
    let width = 0.8 / columns.len().max(1) as f64;
    for (j, column) in columns.iter().enumerate() {
        let color = COLORS[j % COLORS.len()];
        let bars: Vec<Rectangle<(f64, f64)>> = values[j]
            .iter()
            .enumerate()
            .filter_map(|(i, v)| {
                let v = (*v)?;
                let x0 = i as f64 - 0.4 + j as f64 * width;
                Some(Rectangle::new(
                    [(x0, lo), (x0 + width * 0.9, v)],
                    color.filled(),
                ))
            })
            .collect();
        let series = chart.draw_series(bars).map_err(err)?;
        if legend {
            series.label(column_title(column)).legend(move |(x, y)| {
                Rectangle::new([(x, y - 5), (x + 10, y + 5)], color.filled())
            });
        }
    }
    if legend {
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .position(SeriesLabelPosition::UpperRight)
            .draw()
            .map_err(err)?;
    }
    Ok(())
}

pub fn read_results(path: &Path) -> anyhow::Result<Vec<ScenarioResult>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).with_context(|| format!("bad result line: {l}")))
        .collect()
}

/// Failover times (`ferrymq-peers failover` lines): column and seconds.
fn read_failovers(path: &Path) -> anyhow::Result<Vec<(String, f64)>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let run: crate::failover::FailoverRun =
                serde_json::from_str(l).with_context(|| format!("bad failover line: {l}"))?;
            Ok((run.system, run.secs))
        })
        .collect()
}

pub fn run(
    results: &Path,
    meta: Option<&Path>,
    svg: Option<&Path>,
    failovers: Option<&Path>,
) -> anyhow::Result<()> {
    let results = Results::new(read_results(results)?);
    let failovers = match failovers {
        Some(path) => read_failovers(path)?,
        None => Vec::new(),
    };
    let meta: Meta = match meta {
        Some(path) => serde_json::from_str(
            &std::fs::read_to_string(path)
                .with_context(|| format!("cannot read {}", path.display()))?,
        )
        .with_context(|| format!("bad meta file {}", path.display()))?,
        None => Meta::default(),
    };
    print!("{}", markdown(&results, &meta));
    if let Some(svg) = svg {
        let root = SVGBackend::new(svg, (1200, 480)).into_drawing_area();
        chart(&results, &failovers, root)?;
        eprintln!("chart written to {}", svg.display());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::harness::{LatencyRun, Throughput};

    fn throughput(system: &str, scenario: Scenario, rates: &[f64]) -> ScenarioResult {
        ScenarioResult {
            system: system.into(),
            scenario,
            outcome: Outcome::Throughput {
                runs: rates
                    .iter()
                    .map(|r| Throughput {
                        msgs_per_s: *r,
                        counted: 1,
                        secs: 1.0,
                        lost: 0,
                    })
                    .collect(),
            },
            setup: format!("{system} setup"),
            caveat: None,
        }
    }

    fn latency(system: &str, p50: f64) -> ScenarioResult {
        ScenarioResult {
            system: system.into(),
            scenario: Scenario::Latency,
            outcome: Outcome::Latency {
                runs: vec![LatencyRun {
                    p50_us: p50,
                    p99_us: p50 * 4.0,
                    p999_us: p50 * 10.0,
                    max_us: 5000.0,
                    count: 50_000,
                    lost: 0,
                }],
            },
            setup: String::new(),
            caveat: None,
        }
    }

    fn sample() -> Results {
        let mut nats_durable = throughput("nats", Scenario::Durable100, &[400e3]);
        nats_durable.caveat = Some("no fsync per write".into());
        Results::new(vec![
            throughput("rabbitmq", Scenario::Transient, &[50e3]),
            throughput(FERRY, Scenario::Transient, &[3e6, 1e6, 2e6]),
            throughput("nats", Scenario::Transient, &[4e6]),
            throughput(FERRY, Scenario::Durable100, &[2e6]),
            nats_durable,
            ScenarioResult {
                system: "rabbitmq".into(),
                scenario: Scenario::Durable100,
                outcome: Outcome::NotApplicable {
                    reason: "why".into(),
                },
                setup: String::new(),
                caveat: None,
            },
            latency(FERRY, 100.0),
            latency("nats", 200.0),
        ])
    }

    #[test]
    fn numbers_read_at_a_glance() {
        assert_eq!(format_rate(2_034_000.0), "2.03 M");
        assert_eq!(format_rate(612_400.0), "612 k");
        assert_eq!(format_rate(41_230.0), "41.2 k");
        assert_eq!(format_rate(950.0), "950");
        assert_eq!(format_us(412.4), "412 µs");
        assert_eq!(format_us(3_640.0), "3.6 ms");
        assert_eq!(format_us(52_000.0), "52 ms");
        assert_eq!(format_ratio(2e6, 1e6, true), "2.00×");
        assert_eq!(format_ratio(1e6, 2e6, true), "**0.50×**");
        assert_eq!(format_ratio(100.0, 200.0, false), "0.50×");
        assert_eq!(format_ratio(300.0, 200.0, false), "**1.50×**");
        assert_eq!(format_ratio(40e6, 1e6, true), "40×");
        assert_eq!(format_ratio(1.0, 0.0, true), "");
    }

    #[test]
    fn table_has_ferrymq_first_ratios_caveats_and_gaps() {
        let table = markdown(&sample(), &Meta::default());
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(
            lines[0], "| scenario | FerryMQ | NATS | RabbitMQ |",
            "{table}"
        );
        let transient = lines.iter().find(|l| l.contains("transient")).unwrap();
        // FerryMQ's median is 2 M: behind NATS (bold), ahead of RabbitMQ.
        assert!(
            transient.contains("| 2.00 M | 4.00 M (**0.50×**) | 50.0 k (40×) |"),
            "{transient}"
        );
        let durable = lines
            .iter()
            .find(|l| l.contains("100 B, confirmed"))
            .unwrap();
        assert!(durable.contains("400 k (5.00×) [1]"), "{durable}");
        assert!(durable.contains("n/a (why)"), "{durable}");
        assert!(table.contains("[1] no fsync per write"), "{table}");
        let p50 = lines.iter().find(|l| l.contains(", p50 |")).unwrap();
        assert!(p50.contains("| 100 µs | 200 µs (0.50×) | — |"), "{p50}");
        assert!(
            !table.contains("1 KiB"),
            "rows without results are left out"
        );
    }

    #[test]
    fn chart_renders_as_svg() {
        let mut svg = String::new();
        {
            let root = SVGBackend::with_string(&mut svg, (1200, 480)).into_drawing_area();
            chart(&sample(), &[], root).unwrap();
        }
        assert!(svg.starts_with("<svg"), "{}", &svg[..svg.len().min(200)]);
        assert!(svg.contains("FerryMQ") && svg.contains("durable 100 B"));
        // The sample has no work queue results: no empty group for it.
        assert!(!svg.contains("work queue"));
    }

    #[test]
    fn cluster_chart_shows_failovers_without_latency() {
        let results = Results::new(vec![
            throughput("ferrymq-r3", Scenario::Durable100, &[500_000.0]),
            throughput("nats-r3", Scenario::Durable100, &[100_000.0]),
        ]);
        let failovers = [
            ("ferrymq-r3".to_string(), 0.5),
            ("ferrymq-r3".to_string(), 0.7),
            ("ferrymq-r3".to_string(), 0.6),
            ("nats-r3".to_string(), 6.0),
        ];
        let mut svg = String::new();
        {
            let root = SVGBackend::with_string(&mut svg, (1200, 480)).into_drawing_area();
            chart(&results, &failovers, root).unwrap();
        }
        assert!(svg.contains("Failover"), "no failover panel");
        assert!(svg.contains("1.0 s"), "no seconds on the failover axis");
        assert!(!svg.contains("transient"), "a scenario nobody ran is drawn");
        assert!(svg.contains("FerryMQ, 3 nodes") && svg.contains("JetStream R3"));
    }
}
