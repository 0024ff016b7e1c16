//! A fault-injecting TCP proxy for the cluster links between real nodes on loopback.
//!
//! One [`Proxy`] forwards one direction of one pair of nodes: node A's `--peers` names the proxy
//! as node B's cluster address, the proxy forwards to B. Every connection it carries is pumped
//! both ways by one task, so the test can change what happens to the link at any moment:
//!
//! - [`LinkState::Open`]: bytes flow.
//! - [`LinkState::Stalled`]: nothing is forwarded either way, nothing is closed: bytes already
//!   read wait in the proxy, the rest waits in the kernel's buffers, new connections are accepted
//!   and wait too. The nodes see silence, not errors (a switch that drops every packet). When the
//!   link opens again what waited is delivered, late.
//! - [`LinkState::Refused`]: every connection is closed at once and new ones are closed as soon
//!   as they are accepted (a peer whose process is gone).
//!
//! A [`Mesh`] holds one proxy per ordered pair of nodes and cuts or heals both directions of a
//! pair, or isolates a node from all the others. Traffic stays on 127.0.0.1.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// What a proxy does to its link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkState {
    Open,
    Stalled,
    Refused,
}

/// The largest chunk a pump holds.
const CHUNK_BYTES_MAX: usize = 64 * 1024;

/// One direction of one pair of nodes: listens on `addr`, forwards to `target`.
pub struct Proxy {
    pub addr: SocketAddr,
    state: watch::Sender<LinkState>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Proxy {
    /// Listens on `addr` (a free loopback port chosen by the caller) and forwards to `target`.
    pub async fn start(addr: SocketAddr, target: SocketAddr) -> Proxy {
        let listener = TcpListener::bind(addr).await.unwrap();
        let (state, watching) = watch::channel(LinkState::Open);
        let task = tokio::spawn(accept_loop(listener, target, watching));
        Proxy { addr, state, task }
    }

    pub fn set(&self, state: LinkState) {
        self.state.send_replace(state);
    }
}

async fn accept_loop(listener: TcpListener, target: SocketAddr, state: watch::Receiver<LinkState>) {
    // Owned here, so dropping the proxy ends every connection it carries.
    let mut connections = tokio::task::JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((inbound, _)) = accepted else { continue };
                if *state.borrow() == LinkState::Refused {
                    continue; // dropped: closed at once
                }
                connections.spawn(carry(inbound, target, state.clone()));
            }
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

/// Carries one connection until either side closes it or the link is refused.
async fn carry(inbound: TcpStream, target: SocketAddr, state: watch::Receiver<LinkState>) {
    let Ok(outbound) = TcpStream::connect(target).await else {
        return; // the node is down: the connection is closed, as it would be
    };
    let _ = inbound.set_nodelay(true);
    let _ = outbound.set_nodelay(true);
    let (in_rd, in_wr) = inbound.into_split();
    let (out_rd, out_wr) = outbound.into_split();
    tokio::select! {
        () = pump(in_rd, out_wr, state.clone()) => {}
        () = pump(out_rd, in_wr, state) => {}
    }
}

/// Copies `from` to `to` while the link is open; holds what it read while it is stalled; returns
/// (closing the connection) at the end of the stream, on an error, or once the link is refused.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut state: watch::Receiver<LinkState>,
) {
    let mut buf = vec![0u8; CHUNK_BYTES_MAX];
    loop {
        let n = tokio::select! {
            read = from.read(&mut buf) => match read {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            },
            _ = state.wait_for(|s| *s == LinkState::Refused) => return,
        };
        match state.wait_for(|s| *s != LinkState::Stalled).await {
            Ok(s) if *s == LinkState::Open => {}
            _ => return,
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

/// One proxy per ordered pair of nodes: `from` reaches `to` through `proxies[(from, to)]`.
pub struct Mesh {
    proxies: BTreeMap<(u64, u64), Arc<Proxy>>,
}

impl Mesh {
    /// Proxies between every two of `nodes` (id, cluster address), each on an address from
    /// `free_port`.
    pub async fn start(nodes: &[(u64, SocketAddr)], free_port: impl Fn() -> SocketAddr) -> Mesh {
        let mut proxies = BTreeMap::new();
        for (from, _) in nodes {
            for (to, target) in nodes {
                if from != to {
                    let proxy = Proxy::start(free_port(), *target).await;
                    proxies.insert((*from, *to), Arc::new(proxy));
                }
            }
        }
        Mesh { proxies }
    }

    /// The `--peers` of node `me`: itself at `own` (its cluster address), every other node at
    /// the proxy that leads there from `me`.
    pub fn peers_of(&self, me: u64, own: SocketAddr) -> String {
        let mut entries = vec![(me, own)];
        entries.extend(
            self.proxies
                .iter()
                .filter(|((from, _), _)| *from == me)
                .map(|((_, to), proxy)| (*to, proxy.addr)),
        );
        entries.sort();
        entries
            .iter()
            .map(|(id, addr)| format!("{id}={addr}"))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Sets both directions between `a` and `b`.
    pub fn set_pair(&self, a: u64, b: u64, state: LinkState) {
        self.proxies[&(a, b)].set(state);
        self.proxies[&(b, a)].set(state);
    }

    /// Sets every link between `node` and the others.
    pub fn isolate(&self, node: u64, state: LinkState) {
        for ((from, to), proxy) in &self.proxies {
            if *from == node || *to == node {
                proxy.set(state);
            }
        }
    }

    /// Opens every link.
    pub fn heal(&self) {
        for proxy in self.proxies.values() {
            proxy.set(LinkState::Open);
        }
    }
}
