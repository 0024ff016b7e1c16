use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use ferrymq_broker::Broker;
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;

use crate::config::ServerConfig;
use crate::connection::{self, Stream};
use crate::tls::{Refused, TlsAcceptor};

/// Binds a listener whose accept queue holds `backlog` connections (the kernel caps it at
/// `net.core.somaxconn`, 4096 by default). The standard library's 128 made a burst of reconnecting
/// clients, or one arriving while the accept loop was busy, wait for SYN retries (1 s, then 3 s);
/// a queue as long as the connection limit lets every client the broker would admit wait in it.
pub fn listen(addr: SocketAddr, backlog: usize) -> io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    // As the standard library's bind does on Unix: a restart may bind while old connections of
    // the previous process are in TIME_WAIT.
    #[cfg(unix)]
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(u32::try_from(backlog).unwrap_or(u32::MAX).max(1))
}

/// A bound, not yet running server.
pub struct Server {
    config: Arc<ServerConfig>,
    broker: Broker,
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
}

impl Server {
    /// Binds the binary protocol listener. Port 0 picks a free port (see [`Server::local_addr`]).
    pub async fn bind(config: ServerConfig, broker: Broker) -> io::Result<Server> {
        let listener = listen(config.tcp_addr, config.connections_max)?;
        Ok(Server {
            config: Arc::new(config),
            broker,
            listener,
            tls: None,
        })
    }

    /// Serves TLS only: every connection must complete a TLS handshake first.
    pub fn with_tls(mut self, tls: TlsAcceptor) -> Server {
        self.tls = Some(tls);
        self
    }

    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    pub fn broker(&self) -> &Broker {
        &self.broker
    }

    /// Serves until `shutdown` completes, then stops accepting, lets connections finish what they
    /// have read and flush, and returns.
    pub async fn run(self, shutdown: impl Future<Output = ()>) -> io::Result<()> {
        let Server {
            config,
            broker,
            listener,
            tls,
        } = self;
        let permits = Arc::new(Semaphore::new(config.connections_max));
        let refusals = ferrymq_broker::LogThrottle::new(Duration::from_secs(1));
        let (stop_tx, stop_rx) = watch::channel(false);
        let mut connections = JoinSet::new();
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                _ = &mut shutdown => break,
                accepted = listener.accept() => match accepted {
                    Ok((stream, peer)) => {
                        let permit = permits.clone().try_acquire_owned().ok();
                        if permit.is_none() {
                            if let Some(skipped) = refusals.allow() {
                                tracing::warn!(%peer, limit = config.connections_max, refused_unlogged = skipped, "connection refused: too many connections");
                            }
                        }
                        let (broker, config, stop_rx) = (broker.clone(), config.clone(), stop_rx.clone());
                        connections.spawn(serve_accepted(stream, peer, tls.clone(), broker, config, stop_rx, permit));
                    }
                    Err(error) => {
                        // Out of file descriptors or a reset during accept: the listener itself is
                        // fine, so log, back off briefly and carry on.
                        tracing::warn!(%error, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                },
                Some(_) = connections.join_next(), if !connections.is_empty() => {}
            }
        }
        drop(listener);
        drain(connections, stop_tx, &config).await;
        broker.shutdown();
        Ok(())
    }
}

/// Serves one accepted connection. A TLS handshake runs here, in the connection's task: a slow
/// client never holds up the accept loop.
async fn serve_accepted(
    stream: TcpStream,
    peer: SocketAddr,
    tls: Option<TlsAcceptor>,
    broker: Broker,
    config: Arc<ServerConfig>,
    stop_rx: watch::Receiver<bool>,
    permit: Option<OwnedSemaphorePermit>,
) {
    let Some(tls) = tls else {
        let stream = Stream::Plain(stream);
        return connection::serve(stream, None, peer, broker, config, stop_rx, permit).await;
    };
    match tls.accept(stream, peer).await {
        Ok(accepted) => {
            connection::serve(
                Stream::Tls(Box::new(accepted.stream)),
                accepted.certificate_user,
                peer,
                broker,
                config,
                stop_rx,
                permit,
            )
            .await
        }
        Err(Refused::Plaintext(stream)) => connection::refuse_plaintext(stream).await,
        Err(Refused::Failed) => {}
    }
}

/// After the listener closed: tells connections to stop, waits the grace period for them to
/// finish what they read and flush, then closes the rest.
async fn drain(mut connections: JoinSet<()>, stop_tx: watch::Sender<bool>, config: &ServerConfig) {
    tracing::info!(
        connections = connections.len(),
        "shutting down: no longer accepting connections"
    );
    let _ = stop_tx.send(true);
    let grace = Duration::from_millis(config.shutdown_grace_ms);
    let drained = tokio::time::timeout(grace, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        tracing::warn!(
            remaining = connections.len(),
            "shutdown grace period over: closing remaining connections"
        );
        connections.shutdown().await;
    }
}
