//! `ferrymq serve`: runs the broker until SIGINT or SIGTERM, then shuts down gracefully.

use std::io::IsTerminal;

use anyhow::{bail, Context};
use clap::Args;
use ferrymq_broker::{Broker, DiskConfig};
use ferrymq_server::Server;
use tracing_subscriber::EnvFilter;

use crate::config::Settings;

#[derive(Args, Debug)]
pub struct ServeArgs {
    #[command(flatten)]
    pub settings: Settings,
}

pub fn run(args: ServeArgs) -> anyhow::Result<()> {
    let resolved = args.settings.resolve()?;
    let filter = EnvFilter::try_new(&resolved.log)
        .with_context(|| format!("invalid log filter '{}'", resolved.log))?;
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(false)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    let config = resolved.server;

    // No authentication exists yet, so the only safe exposure is loopback.
    if !config.tcp_addr.ip().is_loopback() && !resolved.insecure {
        bail!(
            "refusing to listen on {} without authentication: use a loopback address, or pass --insecure (FERRYMQ_INSECURE=true) to accept anyone who can reach it",
            config.tcp_addr
        );
    }
    std::fs::create_dir_all(&config.data_dir)
        .with_context(|| format!("cannot create data directory {}", config.data_dir.display()))?;

    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if let Some(threads) = resolved.worker_threads {
        builder.worker_threads(threads);
    }
    let runtime = builder
        .enable_all()
        .build()
        .context("cannot start the runtime")?;
    runtime.block_on(async move {
        let shutdown = shutdown_signal()?;
        let mut disk = DiskConfig::new(&config.data_dir);
        disk.segment_bytes = resolved.segment_bytes;
        let broker = Broker::open_durable(config.broker.clone(), disk)
            .with_context(|| format!("cannot open the data dir {}", config.data_dir.display()))?;
        let server = Server::bind(config.clone(), broker)
            .await
            .with_context(|| format!("cannot listen on {}", config.tcp_addr))?;
        let addr = server.local_addr()?;
        tracing::info!(
            tcp = %addr,
            data_dir = %config.data_dir.display(),
            version = env!("CARGO_PKG_VERSION"),
            "FerryMQ serving the binary protocol"
        );
        if addr.ip().is_loopback() {
            tracing::info!("no credentials configured: listening on loopback only");
        } else {
            tracing::warn!(%addr, "listening beyond loopback without authentication (--insecure)");
        }
        server.run(shutdown).await?;
        tracing::info!("shutdown complete");
        Ok(())
    })
}

/// Installs the SIGINT and SIGTERM handlers now, before the server announces itself, so a signal
/// that arrives right after start-up shuts down gracefully instead of killing the process; the
/// returned future completes on the first of them.
#[cfg(unix)]
fn shutdown_signal() -> anyhow::Result<impl std::future::Future<Output = ()>> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut interrupt = signal(SignalKind::interrupt()).context("cannot listen for SIGINT")?;
    let mut terminate = signal(SignalKind::terminate()).context("cannot listen for SIGTERM")?;
    Ok(async move {
        tokio::select! {
            _ = interrupt.recv() => tracing::info!("SIGINT received"),
            _ = terminate.recv() => tracing::info!("SIGTERM received"),
        }
    })
}

#[cfg(not(unix))]
fn shutdown_signal() -> anyhow::Result<impl std::future::Future<Output = ()>> {
    Ok(async {
        let _ = tokio::signal::ctrl_c().await;
    })
}
