//! `ferrymq-peers`: the same scenarios against FerryMQ, NATS, Redis and RabbitMQ, each through its
//! own maintained Rust client, and the comparison table and chart made from the results.
//!
//! `bench/peers/run` starts each server on loopback, calls `ferrymq-peers run` against it (one
//! system at a time, so servers never compete for the CPUs), then `ferrymq-peers report`.
//!
//!   ferrymq-peers run --system redis --addr 127.0.0.1:6390 --column redis-always --out r.jsonl
//!   ferrymq-peers report --results r.jsonl --meta meta.json --svg docs/peers.svg

mod failover;
mod ferry;
mod harness;
mod nats;
mod rabbit;
mod redis_peer;
mod report;

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand, ValueEnum};

use harness::{bounded, Outcome, Params, Scenario, ScenarioResult};

#[derive(Parser)]
#[command(about = "FerryMQ beside NATS, Redis Streams and RabbitMQ (see bench/peers/run)")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Runs the scenarios against one running system and appends one JSON line per scenario.
    Run(RunArgs),
    /// Against a running cluster: kill -9 of the queue's leader under load, and the time to the
    /// first publish acknowledged afterwards (one JSON line appended to `--out`).
    Failover(FailoverArgs),
    /// Prints the markdown table (FerryMQ / peer ratios) and writes the SVG chart.
    Report(ReportArgs),
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
enum System {
    Ferrymq,
    Nats,
    Redis,
    Rabbitmq,
}

#[derive(clap::Args)]
struct RunArgs {
    #[arg(long, value_enum)]
    system: System,
    /// host:port of the system's client port.
    #[arg(long)]
    addr: String,
    /// Column of the table these results go to [default: the system's name].
    #[arg(long)]
    column: Option<String>,
    /// NATS: the server's JetStream `sync_interval` ("always", or the default when the server has
    /// no such setting), for the notes.
    #[arg(long, default_value = "default (2 min)")]
    nats_sync: String,
    /// NATS: replicas of every JetStream stream (3 against a cluster of three servers).
    #[arg(long, default_value_t = 1)]
    nats_replicas: usize,
    /// NATS cluster: every server as NAME=HOST:PORT (its `server_name` and client port), so that
    /// publishers and workers connect to the server leading their stream.
    #[arg(long, value_delimiter = ',')]
    nats_servers: Vec<String>,
    /// FerryMQ: `--addr` lists the nodes of a cluster (comma-separated); topics are replicated
    /// and publishers and consumers go to the partition's leader. Only the durable and work
    /// queue scenarios follow leaders.
    #[arg(long)]
    ferry_cluster: bool,
    /// RabbitMQ: durable and work queues are quorum queues (`--addr` may list every node of a
    /// cluster, comma-separated; the first is used).
    #[arg(long)]
    rabbit_quorum: bool,
    /// Redis: the server's appendfsync, for the notes.
    #[arg(long, default_value = "always")]
    redis_appendfsync: String,
    /// Redis: set TCP_NODELAY on the client's sockets, as every other client here does (redis-rs
    /// leaves Nagle's algorithm on by default).
    #[arg(long)]
    redis_nodelay: bool,
    /// Scenarios to run [default: all].
    #[arg(long, value_enum, value_delimiter = ',')]
    scenarios: Vec<Scenario>,
    /// Measured runs per scenario (the table shows the median).
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Seconds of load before each throughput measurement window (not counted).
    #[arg(long, default_value_t = 1.0)]
    warmup_secs: f64,
    /// Seconds of each throughput measurement window.
    #[arg(long, default_value_t = 3.0)]
    measure_secs: f64,
    /// Seconds of each latency run after its warm-up.
    #[arg(long, default_value_t = 5.0)]
    latency_secs: f64,
    /// Work queue: most messages pre-loaded per run.
    #[arg(long, default_value_t = 1_000_000)]
    preload_max: u64,
    /// JSON lines file the results are appended to.
    #[arg(long)]
    out: PathBuf,
}

#[derive(clap::Args)]
struct FailoverArgs {
    #[command(flatten)]
    run: RunArgs,
    /// Every node's process as NAME=PID: FerryMQ node id, nats-server `server_name`, RabbitMQ
    /// node's place in `--addr` (1, 2, 3).
    #[arg(long, value_delimiter = ',', required = true)]
    pids: Vec<String>,
    /// Seconds of acknowledged publishing before the kill.
    #[arg(long, default_value_t = 2.0)]
    failover_warmup_secs: f64,
}

#[derive(clap::Args)]
struct ReportArgs {
    /// The JSON lines written by `run`.
    #[arg(long)]
    results: PathBuf,
    /// JSON object with date, machine, commit, command, versions and notes (written by the
    /// script).
    #[arg(long)]
    meta: Option<PathBuf>,
    /// Where to write the SVG chart.
    #[arg(long)]
    svg: Option<PathBuf>,
    /// Failover times written by `failover`: without latency results, the chart's right side
    /// shows them.
    #[arg(long)]
    failovers: Option<PathBuf>,
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Run(args) => run(args),
        Command::Failover(args) => failover(args),
        Command::Report(args) => report::run(
            &args.results,
            args.meta.as_deref(),
            args.svg.as_deref(),
            args.failovers.as_deref(),
        ),
    }
}

fn run(args: RunArgs) -> anyhow::Result<()> {
    let params = Params {
        runs: args.runs.max(1),
        warmup: Duration::from_secs_f64(args.warmup_secs),
        measure: Duration::from_secs_f64(args.measure_secs),
        latency_time: Duration::from_secs_f64(args.latency_secs),
        preload_max: args.preload_max,
        ..Params::default()
    };
    let scenarios = if args.scenarios.is_empty() {
        Scenario::ALL.to_vec()
    } else {
        args.scenarios.clone()
    };
    let column = args
        .column
        .clone()
        .unwrap_or_else(|| format!("{:?}", args.system).to_lowercase());
    // Two workers (the machine's two vCPUs are what the table is about); sleeps on them end when
    // asked, for the paced publisher.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .on_thread_start(harness::precise_sleeps)
        .enable_all()
        .build()?;
    harness::clock();
    let mut out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&args.out)
        .with_context(|| format!("cannot open {}", args.out.display()))?;
    for scenario in scenarios {
        let result = runtime.block_on(run_scenario(&args, &column, scenario, &params));
        writeln!(out, "{}", serde_json::to_string(&result)?)?;
        out.flush()?;
    }
    Ok(())
}

fn failover(args: FailoverArgs) -> anyhow::Result<()> {
    let pids = args
        .pids
        .iter()
        .map(|s| {
            let (name, pid) = s
                .split_once('=')
                .with_context(|| format!("--pids wants NAME=PID, not {s}"))?;
            let pid: u32 = pid
                .parse()
                .with_context(|| format!("--pids: {pid} is not a pid"))?;
            anyhow::Ok((name.to_string(), pid))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let warmup = Duration::from_secs_f64(args.failover_warmup_secs);
    let column = args
        .run
        .column
        .clone()
        .unwrap_or_else(|| format!("{:?}", args.run.system).to_lowercase());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let driver = Driver::new(&args.run);
    let run = runtime.block_on(async {
        match &driver {
            Driver::Ferry(d) => failover::ferrymq(d, &pids, warmup).await,
            Driver::Nats(d) => failover::nats(d, &pids, warmup).await,
            Driver::Rabbit(d) => failover::rabbitmq(d, &pids, warmup).await,
            Driver::Redis(_) => anyhow::bail!("no failover for Redis"),
        }
    });
    runtime.shutdown_timeout(Duration::from_secs(1));
    let mut run = run.with_context(|| format!("{column} failover"))?;
    run.system = column;
    eprintln!(
        "{} failover: leader {} killed after {} acknowledged publishes, first publish \
         acknowledged {:.3} s later ({} attempts)",
        run.system, run.leader, run.acked_before, run.secs, run.attempts
    );
    let mut out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&args.run.out)
        .with_context(|| format!("cannot open {}", args.run.out.display()))?;
    writeln!(out, "{}", serde_json::to_string(&run)?)?;
    Ok(())
}

/// The one place that knows which driver does what.
enum Driver {
    Ferry(ferry::Ferry),
    Nats(nats::Nats),
    Redis(redis_peer::Redis),
    Rabbit(rabbit::Rabbit),
}

impl Driver {
    fn new(args: &RunArgs) -> Driver {
        let addr = args.addr.clone();
        match args.system {
            System::Ferrymq => Driver::Ferry(ferry::Ferry {
                addr,
                cluster: args.ferry_cluster,
            }),
            System::Nats => Driver::Nats(nats::Nats {
                addr,
                sync: args.nats_sync.clone(),
                replicas: args.nats_replicas,
                servers: args
                    .nats_servers
                    .iter()
                    .filter_map(|s| s.split_once('='))
                    .map(|(n, a)| (n.to_string(), a.to_string()))
                    .collect(),
            }),
            System::Redis => Driver::Redis(redis_peer::Redis {
                addr,
                appendfsync: args.redis_appendfsync.clone(),
                nodelay: args.redis_nodelay,
            }),
            System::Rabbitmq => Driver::Rabbit(rabbit::Rabbit {
                addr,
                quorum: args.rabbit_quorum,
            }),
        }
    }

    /// Why this system's figure for `scenario` means less than the row says, if it does.
    fn caveat(&self, scenario: Scenario) -> Option<String> {
        let durable = matches!(
            scenario,
            Scenario::Durable100 | Scenario::Durable1k | Scenario::WorkQueue
        );
        match self {
            Driver::Nats(d) if durable && d.sync != "always" => Some(format!(
                "NATS: PubAcks are sent before fsync: this nats-server has no per-write sync \
                 setting (JetStream `sync_interval` came in 2.10), so it ran with {}",
                d.sync
            )),
            Driver::Redis(d) if durable && d.appendfsync != "always" => Some(format!(
                "Redis appendfsync {}: replies are sent before fsync (the AOF is fsynced about \
                 once a second)",
                d.appendfsync
            )),
            Driver::Redis(d) if scenario == Scenario::Latency && !d.nodelay => Some(
                "Redis: its client (redis-rs) leaves Nagle's algorithm on, the other clients set \
                 TCP_NODELAY; with TCP_NODELAY Redis's tail is FerryMQ's \
                 (docs/benchmarks-history.md, Peers 4)"
                    .into(),
            ),
            _ => None,
        }
    }

    fn setup(&self) -> String {
        match self {
            Driver::Ferry(d) => d.setup(),
            Driver::Nats(d) => d.setup(),
            Driver::Redis(d) => d.setup(),
            Driver::Rabbit(d) => d.setup(),
        }
    }

    async fn throughput(
        &self,
        scenario: Scenario,
        p: &Params,
        preload: (u64, Duration),
    ) -> anyhow::Result<harness::Throughput> {
        let size = if scenario == Scenario::Durable1k {
            1024
        } else {
            100
        };
        match (self, scenario) {
            (Driver::Ferry(d), Scenario::Transient) => d.transient(p).await,
            (Driver::Nats(d), Scenario::Transient) => d.transient(p).await,
            (Driver::Redis(d), Scenario::Transient) => d.transient(p).await,
            (Driver::Rabbit(d), Scenario::Transient) => d.transient(p).await,
            (Driver::Ferry(d), Scenario::WorkQueue) => d.work_queue(p, preload.0, preload.1).await,
            (Driver::Nats(d), Scenario::WorkQueue) => d.work_queue(p, preload.0, preload.1).await,
            (Driver::Redis(d), Scenario::WorkQueue) => d.work_queue(p, preload.0, preload.1).await,
            (Driver::Rabbit(d), Scenario::WorkQueue) => d.work_queue(p, preload.0, preload.1).await,
            (Driver::Ferry(d), _) => d.durable(p, size).await,
            (Driver::Nats(d), _) => d.durable(p, size).await,
            (Driver::Redis(d), _) => d.durable(p, size).await,
            (Driver::Rabbit(d), _) => d.durable(p, size).await,
        }
    }

    async fn latency(&self, p: &Params) -> anyhow::Result<harness::LatencyRun> {
        match self {
            Driver::Ferry(d) => d.latency(p).await,
            Driver::Nats(d) => d.latency(p).await,
            Driver::Redis(d) => d.latency(p).await,
            Driver::Rabbit(d) => d.latency(p).await,
        }
    }
}

async fn run_scenario(
    args: &RunArgs,
    column: &str,
    scenario: Scenario,
    p: &Params,
) -> ScenarioResult {
    let driver = Driver::new(args);
    let what = format!("{column} {scenario:?}");
    let mut errors = Vec::new();
    let outcome = if scenario == Scenario::Latency {
        let mut runs = Vec::new();
        for i in 0..p.runs {
            match bounded(&what, driver.latency(p)).await {
                Ok(run) => {
                    eprintln!(
                        "{what} run {}: p50 {:.0} µs, p99 {:.0} µs, p99.9 {:.0} µs, max {:.0} µs ({} msgs, {} lost)",
                        i + 1, run.p50_us, run.p99_us, run.p999_us, run.max_us, run.count, run.lost
                    );
                    runs.push(run);
                }
                Err(error) => {
                    eprintln!("{what} run {}: {error:#}", i + 1);
                    errors.push(format!("{error:#}"));
                }
            }
        }
        (!runs.is_empty()).then_some(Outcome::Latency { runs })
    } else {
        if scenario == Scenario::WorkQueue {
            // The drain has no warm-up of its own: one smaller run first, not counted.
            let warm = (p.preload_max / 10, p.preload_time / 3);
            if let Err(error) = bounded(&what, driver.throughput(scenario, p, warm)).await {
                eprintln!("{what} warm-up: {error:#}");
            }
        }
        let mut runs = Vec::new();
        for i in 0..p.runs {
            let preload = (p.preload_max, p.preload_time);
            match bounded(&what, driver.throughput(scenario, p, preload)).await {
                Ok(run) => {
                    eprintln!(
                        "{what} run {}: {:.0} msg/s ({} in {:.2} s, {} lost)",
                        i + 1,
                        run.msgs_per_s,
                        run.counted,
                        run.secs,
                        run.lost
                    );
                    runs.push(run);
                }
                Err(error) => {
                    eprintln!("{what} run {}: {error:#}", i + 1);
                    errors.push(format!("{error:#}"));
                }
            }
        }
        (!runs.is_empty()).then_some(Outcome::Throughput { runs })
    };
    ScenarioResult {
        system: column.to_string(),
        scenario,
        outcome: outcome.unwrap_or_else(|| Outcome::NotApplicable {
            reason: format!(
                "every run failed: {}",
                errors.first().map(String::as_str).unwrap_or("no run")
            ),
        }),
        setup: driver.setup(),
        caveat: driver.caveat(scenario),
    }
}
