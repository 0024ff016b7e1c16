//! `ferrymq`: the broker and its tools in one binary.

mod bench;
mod cluster_routes;
mod cmd;
mod config;
mod healthcheck;
mod notify;
mod serve;
mod users;
mod verify;

use clap::{Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(
    name = "ferrymq",
    version,
    about = "FerryMQ: a fast, durable message broker in one binary"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the broker.
    Serve(Box<serve::ServeArgs>),
    /// Publish messages (an argument, lines of stdin, or lines of a file).
    Pub(cmd::PubArgs),
    /// Subscribe and print messages as they arrive.
    Sub(cmd::SubArgs),
    /// Create, delete, list and describe topics.
    Topic(cmd::TopicArgs),
    /// Print per-topic and per-subscription statistics.
    Stats(cmd::StatsArgs),
    /// Show where one message stands in every subscription of its topic.
    Status(cmd::StatusArgs),
    /// List a subscription's messages by state, or delete a subscription.
    Subscription(cmd::SubscriptionArgs),
    /// Requeue dead letters to the subscription they died in.
    Dead(cmd::DeadArgs),
    /// Show a cluster's nodes and who leads each replicated partition.
    Cluster(cmd::ClusterArgs),
    /// List client connections, or close one.
    Connection(cmd::ConnectionArgs),
    /// Manage users, their grants and API tokens; reset a lost admin password offline.
    User(users::UserArgs),
    /// Measure throughput and latency against a running broker.
    Bench(bench::BenchArgs),
    /// Ask a running broker whether it is ready (GET /readyz): exit 0 if so, 1 if not; for
    /// container health checks.
    Healthcheck(healthcheck::HealthcheckArgs),
    /// Check the partition logs in a data directory offline, read-only: checksums, offsets,
    /// indexes.
    ///
    /// Verifies partition logs written by the storage layer (ferrymq-storage): every directory
    /// under the data directory (up to 8 levels deep, symbolic links not followed) that holds
    /// segment files ({base_offset:020}.log) is one partition. Every entry of every segment is
    /// checked (length, CRC-32C checksum, offset continuity within and across segments, torn
    /// tail), and every point of the .index and .timeindex files against the entry it names.
    /// Nothing is written, cut or rebuilt: run it on a stopped broker or a copy. Each finding
    /// names the file and byte position and says whether opening the log repairs it.
    Verify(verify::VerifyArgs),
}

/// The `FERRYMQ_*` variable a refused value came from, when it did: clap names only the flag,
/// which leaves a user who never typed that flag looking in the wrong place.
fn environment_source(error: &clap::Error) -> Option<String> {
    use clap::error::{ContextKind, ContextValue};
    let (Some(ContextValue::String(arg)), Some(ContextValue::String(value))) = (
        error.get(ContextKind::InvalidArg),
        error.get(ContextKind::InvalidValue),
    ) else {
        return None;
    };
    let flag = arg.split_whitespace().next()?.strip_prefix("--")?;
    let variable = format!("FERRYMQ_{}", flag.replace('-', "_").to_ascii_uppercase());
    std::env::var(&variable)
        .is_ok_and(|set| &set == value)
        .then(|| format!("{variable}={value}"))
}

fn main() -> std::process::ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(error) => {
            let _ = error.print();
            if let Some(variable) = environment_source(&error) {
                eprintln!("note: the value comes from the environment: {variable}");
            }
            return std::process::ExitCode::from(error.exit_code() as u8);
        }
    };
    let result = match cli.command {
        Command::Serve(args) => serve::run(*args),
        Command::Pub(args) => cmd::run_pub(args),
        Command::Sub(args) => cmd::run_sub(args),
        Command::Topic(args) => cmd::run_topic(args),
        Command::Stats(args) => cmd::run_stats(args),
        Command::Status(args) => cmd::run_status(args),
        Command::Subscription(args) => cmd::run_subscription(args),
        Command::Dead(args) => cmd::run_dead(args),
        Command::Cluster(args) => cmd::run_cluster(args),
        Command::Connection(args) => cmd::run_connection(args),
        Command::User(args) => users::run(args),
        Command::Bench(args) => bench::run(args),
        Command::Healthcheck(args) => healthcheck::run(args),
        Command::Verify(args) => return verify::run(args),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
