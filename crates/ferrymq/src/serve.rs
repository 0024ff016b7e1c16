//! `ferrymq serve`: runs the broker until SIGINT or SIGTERM, then shuts down gracefully.

use anyhow::{bail, Context};
use clap::Args;
use ferrymq_broker::Broker;
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
    let filter = EnvFilter::try_new(&resolved.log).with_context(|| format!("invalid log filter '{}'", resolved.log))?;
    tracing_subscriber::fmt().with_env_filter(filter).with_target(false).init();
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

    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().context("cannot start the runtime")?;
    runtime.block_on(async move {
        let broker = Broker::open(config.broker.clone());
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
        server.run(shutdown_signal()).await?;
        tracing::info!("shutdown complete");
        Ok(())
    })
}

async fn shutdown_signal() {
    let interrupt = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut terminate = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(signal) => signal,
            Err(error) => {
                tracing::warn!(%error, "cannot listen for SIGTERM; only SIGINT stops the server");
                let _ = interrupt.await;
                return;
            }
        };
        tokio::select! {
            _ = interrupt => tracing::info!("SIGINT received"),
            _ = terminate.recv() => tracing::info!("SIGTERM received"),
        }
    }
    #[cfg(not(unix))]
    {
        let _ = interrupt.await;
    }
}
