//! `ferrymq serve`: runs the broker until SIGINT or SIGTERM, then shuts down gracefully.

use std::io::IsTerminal;
use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Args;
use ferrymq_broker::{Broker, DiskConfig};
use ferrymq_http::{HttpConfig, HttpServer, Readiness, StartingHttp};
use ferrymq_server::{Server, ServerConfig, TlsAcceptor};
use tokio::sync::watch;
use tracing_subscriber::EnvFilter;

use crate::config::{Resolved, Settings};

/// How many task polls a busy worker makes between two looks for new socket and timer events
/// (tokio's default is 61). A connection's poll is short, a few microseconds for an HTTP request,
/// so looking less often costs no responsiveness; at 100 keep-alive HTTP connections on two
/// workers it halved the p99 (about 4.4 -> 2 ms) at the same rate, with the binary protocol's
/// throughput and latency unchanged (docs/benchmarks-history.md, HTTP 16).
const EVENT_INTERVAL: u32 = 127;

#[derive(Args, Debug)]
pub struct ServeArgs {
    #[command(flatten)]
    pub settings: Settings,
}

pub fn run(args: ServeArgs) -> anyhow::Result<()> {
    let resolved = args.settings.resolve()?;
    init_logging(&resolved)?;
    // The soft open-files limit is raised to the hard one when the broker opens its data dir
    // (`ferrymq_broker::raise_open_files_limit`), which logs both with the log-file bound.
    // Bad TLS files stop the start before anything is opened or bound, with the file named.
    let tls = match &resolved.tls {
        Some(files) => Some(TlsAcceptor::new(files.clone()).context("cannot start with TLS")?),
        None => None,
    };
    let data_dir = &resolved.server.data_dir;
    let existed = data_dir.exists();
    keep_files_private();
    std::fs::create_dir_all(data_dir)
        .with_context(|| format!("cannot create data directory {}", data_dir.display()))?;
    if existed {
        warn_if_readable_by_others(data_dir);
    }

    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if let Some(threads) = resolved.worker_threads {
        builder.worker_threads(threads);
    }
    builder.event_interval(EVENT_INTERVAL);
    let runtime = builder
        .enable_all()
        .build()
        .context("cannot start the runtime")?;
    runtime.block_on(serve(resolved, tls))
}

/// Every directory and file the broker creates from here on is its own user's alone (0700 and
/// 0600): the data dir holds password and token hashes (`meta.redb`) and every message.
pub(crate) fn keep_files_private() {
    // SAFETY: umask only sets the process's file mode mask; it cannot fail.
    unsafe {
        libc::umask(0o077);
    }
}

/// Warns, naming the fix, when a data dir made before (by an older release, or by hand) or the
/// metadata in it can be read by other local users.
fn warn_if_readable_by_others(data_dir: &std::path::Path) {
    use std::os::unix::fs::PermissionsExt;
    for path in [data_dir.to_path_buf(), data_dir.join("meta.redb")] {
        let Ok(metadata) = std::fs::metadata(&path) else {
            continue;
        };
        let mode = metadata.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            tracing::warn!(
                path = %path.display(),
                mode = format!("{mode:o}"),
                "readable by other local users: it holds messages and credential hashes; run chmod -R go= {}",
                data_dir.display()
            );
        }
    }
}

/// Refuses a log setting that names no level: `EnvFilter` reads a lone word such as `verbose`
/// as a module name, and the broker would then log nothing at all.
fn check_log_levels(filter: &str) -> anyhow::Result<()> {
    const LEVELS: [&str; 6] = ["off", "error", "warn", "info", "debug", "trace"];
    for directive in filter.split(',').map(str::trim).filter(|d| !d.is_empty()) {
        let level = directive
            .rsplit_once('=')
            .map_or(directive, |(_, level)| level);
        if !LEVELS.contains(&level.to_ascii_lowercase().as_str()) {
            bail!(
                "unknown log level '{level}' in '{filter}': use off, error, warn, info, debug or trace, or a filter such as info,ferrymq_broker=debug"
            );
        }
    }
    Ok(())
}

fn init_logging(resolved: &Resolved) -> anyhow::Result<()> {
    check_log_levels(&resolved.log)?;
    // The Raft engine narrates every election and heartbeat at info and its expected races at
    // warn; the cluster logs what an operator needs itself. A filter naming it decides alone.
    let directives = match resolved.log.contains("openraft") {
        true => resolved.log.clone(),
        false => format!("{},openraft=off", resolved.log),
    };
    let filter = EnvFilter::try_new(&directives)
        .with_context(|| format!("invalid log filter '{}'", resolved.log))?;
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(false)
        .with_writer(std::io::stderr);
    if resolved.log_json {
        // One JSON object per line, the event's fields at the top level beside `message`.
        logs.json().flatten_event(true).init();
    } else {
        logs.with_ansi(std::io::stderr().is_terminal()).init();
    }
    Ok(())
}

/// `GET /node` and `/metrics` ask the cluster for its groups' state on every request.
fn cluster_probe(
    cluster: std::sync::Arc<ferrymq_server::cluster::Cluster>,
) -> ferrymq_http::ClusterProbe {
    ferrymq_http::ClusterProbe(std::sync::Arc::new(move || {
        let groups = cluster.group_states();
        let view = cluster.view();
        ferrymq_http::ClusterFacts {
            node_id: cluster.node_id(),
            cluster_id: cluster.settings().cluster_id.clone(),
            metadata_leader: view.metadata_leader,
            removed: cluster.is_removed(),
            under_replicated: groups.iter().filter(|g| g.under_replicated()).count() as u64,
            groups: groups
                .into_iter()
                .map(crate::cluster_routes::group_facts)
                .collect(),
        }
    }))
}

/// Opens the broker, binds both listeners, announces them, and serves until SIGINT or SIGTERM.
async fn serve(resolved: Resolved, tls: Option<TlsAcceptor>) -> anyhow::Result<()> {
    let config = &resolved.server;
    let shutdown = shutdown_signal()?;
    reload_on_hangup(tls.clone())?;
    let starting = listen_while_starting(config, tls.is_some())?;
    let broker = open_broker(&resolved).await?;
    let users = broker.auth().user_count();
    refuse_open_listeners(config, users, resolved.insecure)?;
    let mut config = config.clone();
    if let Some(settings) = resolved.cluster.clone() {
        let cluster =
            ferrymq_server::cluster::Cluster::start(settings, broker.clone(), &config.data_dir)
                .await
                .map_err(anyhow::Error::msg)?;
        config.cluster = Some(cluster);
    }
    let config = &config;
    let mut server = Server::bind(config.clone(), broker.clone())
        .await
        .with_context(|| format!("cannot listen on {}", config.tcp_addr))?;
    if let Some(tls) = &tls {
        server = server.with_tls(tls.clone());
    }
    let mut http_config = http_config(&resolved, &broker, tls.is_some());
    if let Some(cluster) = config.cluster.clone() {
        http_config.node.cluster = Some(cluster_probe(cluster.clone()));
        http_config.cluster = Some(crate::cluster_routes::router(cluster));
    }
    let node_listeners = http_config.node.listeners.clone();
    let mut http = match starting {
        Some(starting) => {
            let listener = starting.finish().await?;
            HttpServer::bind_listener(listener, http_config, broker)
        }
        None => HttpServer::bind(http_config, broker).await,
    }
    .with_context(|| format!("cannot listen on {} (HTTP)", config.http_addr))?;
    if let Some(tls) = &tls {
        http = http.with_tls(tls.clone());
    }
    let addr = server.local_addr()?;
    let http_addr = http.local_addr()?;
    tracing::info!(
        tcp = %addr,
        data_dir = %config.data_dir.display(),
        version = env!("CARGO_PKG_VERSION"),
        "FerryMQ serving the binary protocol"
    );
    tracing::info!(http = %http_addr, https = tls.is_some(), "FerryMQ serving HTTP");
    let tls_mode = match &tls {
        None => "none",
        Some(tls) if tls.mutual() => "mutual",
        Some(_) => "tls",
    };
    *node_listeners.lock() = [("binary", addr), ("http", http_addr)]
        .into_iter()
        .map(|(protocol, addr)| ferrymq_http::ListenerInfo {
            protocol: protocol.into(),
            addr: addr.to_string(),
            tls: tls_mode.into(),
        })
        .collect();
    // Recovery is done (the broker opened) and both listeners are bound.
    let readiness = http.readiness();
    readiness.set_ready();
    crate::notify::notify("READY=1");
    log_security_mode(users, addr, http_addr, tls.as_ref());
    let grace = Duration::from_millis(config.shutdown_grace_ms);
    run_until_stopped(server, http, readiness, shutdown, grace).await
}

/// Binds the HTTP listener before recovery, so that probes meet a broker that says it is
/// starting rather than a closed port (`/livez` 200, `/readyz` 503 with the progress). Over
/// HTTPS the port opens with the real server, as before: the answers here are plaintext.
fn listen_while_starting(
    config: &ServerConfig,
    https: bool,
) -> anyhow::Result<Option<StartingHttp>> {
    if https {
        return Ok(None);
    }
    let started = std::time::Instant::now();
    let progress: ferrymq_http::Progress = std::sync::Arc::new(move || {
        serde_json::json!({
            "phase": "opening the data dir and recovering its logs",
            "elapsed_ms": started.elapsed().as_millis() as u64,
        })
    });
    let starting = StartingHttp::listen(config.http_addr, config.connections_max, progress)
        .with_context(|| format!("cannot listen on {} (HTTP)", config.http_addr))?;
    tracing::info!(http = %starting.local_addr(), "HTTP answering while the broker starts: /readyz says 503 until recovery is done");
    Ok(Some(starting))
}

/// Opens the data dir (recovering what it holds) and creates the first admin when asked to.
async fn open_broker(resolved: &Resolved) -> anyhow::Result<Broker> {
    let config = &resolved.server;
    let mut disk = DiskConfig::new(&config.data_dir);
    disk.segment_bytes = resolved.segment_bytes;
    // Off the runtime's workers: the HTTP listener answers meanwhile.
    let broker_config = config.broker.clone();
    let broker = tokio::task::spawn_blocking(move || Broker::open_durable(broker_config, disk))
        .await
        .context("opening the data dir was interrupted")?
        .with_context(|| format!("cannot open the data dir {}", config.data_dir.display()))?;
    let auth = broker.auth().clone();
    if let Some(free) = resolved.auth_failures_free {
        auth.set_failures_free(free);
    }
    if let Some((user, password)) = &resolved.admin {
        let (auth, user, password) = (auth.clone(), user.clone(), password.clone());
        let created = tokio::task::spawn_blocking(move || auth.bootstrap_admin(&user, &password))
            .await
            .context("creating the admin user was interrupted")?
            .context("cannot create the admin user")?;
        match created {
            true => tracing::info!(user = %resolved.admin.as_ref().map_or("", |a| a.0.as_str()), "first start: admin user created"),
            false => tracing::info!("users exist: the admin password setting is not used (ferrymq user passwd changes a password)"),
        }
    }
    Ok(broker)
}

/// Without users anyone who reaches the broker may do anything: only loopback is safe.
fn refuse_open_listeners(
    config: &ServerConfig,
    users: usize,
    insecure: bool,
) -> anyhow::Result<()> {
    for addr in [config.tcp_addr, config.http_addr] {
        if !addr.ip().is_loopback() && users == 0 && !insecure {
            bail!(
                "refusing to listen on {addr} without authentication: create the first admin (FERRYMQ_ADMIN_PASSWORD or --admin-password-file), use a loopback address, or pass --insecure (FERRYMQ_INSECURE=true) to accept anyone who can reach it",
            );
        }
    }
    Ok(())
}

fn http_config(resolved: &Resolved, broker: &Broker, https: bool) -> HttpConfig {
    let config = &resolved.server;
    let mut http_config = HttpConfig::for_broker(config.http_addr, broker);
    http_config.data_dir = Some(config.data_dir.clone());
    // The same limit for each listener: the binary protocol's and this one.
    http_config.connections_max = config.connections_max;
    // A JSON batch is bounded like a binary protocol frame.
    http_config.body_bytes_max = http_config
        .body_bytes_max
        .max(config.effective_frame_bytes_max());
    http_config.buffered_bytes_max = http_config
        .buffered_bytes_max
        .max(http_config.body_bytes_max);
    http_config.allowed_hosts = resolved.http_hosts.clone();
    http_config.session_lifetime = resolved.session_lifetime;
    // Over HTTPS the dashboard's session cookie is never sent in plaintext.
    http_config.session_cookie_secure = https;
    http_config.node.settings = settings_in_force(resolved);
    http_config
}

/// The settings `GET /node` shows, by the flag names an operator sets them with. Secrets (the
/// admin password, TLS private keys' contents) are never among them: a key's path is shown, as
/// a certificate's is.
// One line per setting, as a table: split, it would list the settings in two places.
fn settings_in_force(resolved: &Resolved) -> Vec<(String, String)> {
    let server = &resolved.server;
    let broker = &server.broker;
    let topics = &broker.topic_defaults;
    let mut settings = vec![
        ("data-dir", server.data_dir.display().to_string()),
        ("tcp-addr", server.tcp_addr.to_string()),
        ("http-addr", server.http_addr.to_string()),
        (
            "default-storage",
            ferrymq_json::storage_name(topics.storage).into(),
        ),
        ("default-partitions", topics.partitions.to_string()),
        (
            "topic-overflow",
            ferrymq_json::overflow_name(topics.overflow).into(),
        ),
        ("topic-max-messages", topics.max_messages.to_string()),
        ("topic-max-bytes", topics.max_bytes.to_string()),
        ("fsync", topics.fsync.to_string()),
        ("retention-ms", topics.retention_ms.to_string()),
        ("dedup-window-ms", topics.dedup_window_ms.to_string()),
        ("ack-timeout-ms", broker.ack_timeout_ms_default.to_string()),
        ("max-attempts", broker.max_attempts_default.to_string()),
        (
            "message-max-bytes",
            broker.message_body_bytes_max.to_string(),
        ),
        ("auto-create-topics", broker.auto_create_topics.to_string()),
        ("max-connections", server.connections_max.to_string()),
        (
            "max-connections-per-user",
            server.connections_per_user_max.to_string(),
        ),
        ("heartbeat-ms", server.heartbeat_ms_default.to_string()),
        (
            "frame-max-bytes",
            server.effective_frame_bytes_max().to_string(),
        ),
        ("status-history", broker.status_history.to_string()),
        (
            "session-lifetime-ms",
            resolved.session_lifetime.as_millis().to_string(),
        ),
        ("http-host", resolved.http_hosts.join(",")),
        ("segment-bytes", resolved.segment_bytes.to_string()),
        ("log", resolved.log.clone()),
        ("insecure", resolved.insecure.to_string()),
    ];
    if let Some(threads) = resolved.worker_threads {
        settings.push(("worker-threads", threads.to_string()));
    }
    if let Some(cluster) = &resolved.cluster {
        settings.push(("node-id", cluster.node_id.to_string()));
        settings.push(("cluster-id", cluster.cluster_id.clone()));
        settings.push(("cluster-addr", cluster.cluster_addr.to_string()));
        let peers: Vec<String> = cluster
            .peers
            .iter()
            .map(|(id, addr)| format!("{id}={addr}"))
            .collect();
        settings.push(("peers", peers.join(",")));
        settings.push(("advertise-addr", cluster.client_addr.clone()));
    }
    if let Some(tls) = &resolved.tls {
        settings.push(("tls-cert", tls.cert.display().to_string()));
        settings.push(("tls-key", tls.key.display().to_string()));
        if let Some(ca) = &tls.client_ca {
            settings.push(("tls-client-ca", ca.display().to_string()));
        }
    }
    if let Some(cluster) = &resolved.cluster {
        let peers: Vec<String> = cluster
            .peers
            .iter()
            .map(|(id, addr)| format!("{id}={addr}"))
            .collect();
        settings.push(("node-id", cluster.node_id.to_string()));
        settings.push(("cluster-id", cluster.cluster_id.clone()));
        settings.push(("cluster-addr", cluster.cluster_addr.to_string()));
        settings.push(("peers", peers.join(",")));
        if let Some(tls) = &cluster.tls {
            settings.push(("cluster-tls-cert", tls.cert.display().to_string()));
            settings.push(("cluster-tls-key", tls.key.display().to_string()));
            settings.push(("cluster-tls-ca", tls.ca.display().to_string()));
        }
    }
    settings
        .into_iter()
        .map(|(name, value)| (name.to_string(), value))
        .collect()
}

/// One log line that says who may connect and how: authentication, TLS and reach.
fn log_security_mode(
    users: usize,
    addr: SocketAddr,
    http_addr: SocketAddr,
    tls: Option<&TlsAcceptor>,
) {
    let loopback = addr.ip().is_loopback() && http_addr.ip().is_loopback();
    let tls_mode = match tls {
        None => "off",
        Some(tls) if tls.mutual() => "on, client certificates accepted",
        Some(_) => "on",
    };
    match (users, loopback) {
        (0, true) => tracing::info!(
            authentication = "off",
            tls = tls_mode,
            "security mode: no users configured, open to anyone on loopback only"
        ),
        (0, false) => tracing::warn!(
            authentication = "off",
            tls = tls_mode,
            tcp = %addr,
            http = %http_addr,
            "security mode: listening beyond loopback without authentication (--insecure)"
        ),
        (users, true) => tracing::info!(
            authentication = "on",
            users,
            tls = tls_mode,
            "security mode: credentials required on every transport"
        ),
        (users, false) => match tls {
            Some(_) => tracing::info!(
                authentication = "on",
                users,
                tls = tls_mode,
                "security mode: credentials required on every transport"
            ),
            None => tracing::warn!(
                authentication = "on",
                users,
                tls = tls_mode,
                "security mode: credentials required, but passwords and tokens cross the network in plaintext: set --tls-cert and --tls-key"
            ),
        },
    }
}

/// Runs both listeners until `shutdown`; then the HTTP listener gets `grace` to finish.
async fn run_until_stopped(
    server: Server,
    http: HttpServer,
    readiness: Readiness,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    grace: Duration,
) -> anyhow::Result<()> {
    // One signal stops both listeners.
    let (stop_tx, stop_rx) = watch::channel(false);
    tokio::spawn(async move {
        shutdown.await;
        readiness.set_stopping();
        crate::notify::notify("STOPPING=1");
        let _ = stop_tx.send(true);
    });
    let stopped = |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|stop| *stop).await;
    };
    let http_rx = stop_rx.clone();
    let http_run = async move {
        let run = http.run(stopped(http_rx.clone()));
        tokio::pin!(run);
        tokio::select! {
            result = &mut run => result,
            // Streaming consumers may hold connections open: after the grace period they
            // are closed with the process.
            _ = async { stopped(http_rx).await; tokio::time::sleep(grace).await } => {
                tracing::warn!("HTTP shutdown grace period over: closing remaining connections");
                Ok(())
            }
        }
    };
    let (tcp, http) = tokio::join!(server.run(stopped(stop_rx)), http_run);
    tcp?;
    http.context("HTTP listener failed")?;
    tracing::info!("shutdown complete");
    Ok(())
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

/// Reloads the TLS files on SIGHUP: new handshakes use the new certificate, open connections keep
/// theirs, and files that cannot be read leave the previous ones in use. Installed before the
/// broker announces itself, and without TLS too: a `systemctl reload` (or an early SIGHUP) must
/// not kill the broker.
#[cfg(unix)]
fn reload_on_hangup(tls: Option<TlsAcceptor>) -> anyhow::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut hangup = signal(SignalKind::hangup()).context("cannot listen for SIGHUP")?;
    tokio::spawn(async move {
        while hangup.recv().await.is_some() {
            let Some(tls) = tls.clone() else {
                tracing::info!("SIGHUP: TLS is off, nothing to reload");
                continue;
            };
            let reloaded = tokio::task::spawn_blocking(move || {
                let result = tls.reload();
                (result, tls)
            })
            .await;
            match reloaded {
                Ok((Ok(()), tls)) => tracing::info!(
                    cert = %tls.files().cert.display(),
                    "SIGHUP: TLS certificate and key reloaded; new connections use them"
                ),
                Ok((Err(error), _)) => tracing::error!(
                    %error,
                    "SIGHUP: TLS reload failed; the previous certificate stays in use"
                ),
                Err(error) => tracing::error!(%error, "SIGHUP: TLS reload was interrupted"),
            }
        }
    });
    Ok(())
}

#[cfg(not(unix))]
fn reload_on_hangup(_tls: Option<TlsAcceptor>) -> anyhow::Result<()> {
    Ok(())
}

#[cfg(not(unix))]
fn shutdown_signal() -> anyhow::Result<impl std::future::Future<Output = ()>> {
    Ok(async {
        let _ = tokio::signal::ctrl_c().await;
    })
}

#[cfg(test)]
mod tests {
    use super::check_log_levels;

    #[test]
    fn a_log_setting_without_a_level_is_refused() {
        for good in [
            "info",
            "WARN",
            "info,ferrymq_broker=debug",
            "ferrymq=trace",
            "off",
        ] {
            assert!(check_log_levels(good).is_ok(), "{good}");
        }
        for bad in ["verbose", "info,loud", "ferrymq=chatty"] {
            let error = check_log_levels(bad).unwrap_err().to_string();
            assert!(error.contains("unknown log level"), "{bad}: {error}");
        }
    }
}
