//! The registry of client connections, for operators: who is connected, since when, what each
//! holds and moves, and a way to close one.
//!
//! A transport registers a connection when it accepts it and holds the [`ConnectionGuard`] for as
//! long as the connection lives; dropping the guard removes the entry. The counters are atomics
//! the transport bumps on its own path (one relaxed add per frame or batch), so the registry
//! costs nothing on the hot path but that.
//!
//! Invariants:
//! - An id is never reused within a broker's life (a `u64` counter), so closing an id that has
//!   gone away can never close a newer connection.
//! - An entry is listed exactly while its guard lives.
//! - The registry holds no strong reference to a consumer: a connection that drops a consumer
//!   returns its in-flight messages at once, whatever a listing is doing.
//!
//! Lock order: registry `entries` → one entry's `consumers` (a listing takes them in that order;
//! nothing takes them the other way round).

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Weak};

use parking_lot::{Mutex, RwLock};
use tokio::sync::Notify;

use crate::clock::unix_ms;
use crate::consumer::Consumer;
use crate::error::BrokerError;

/// Connections one listing page holds at most: 1 000 entries encode to about 200 KB, far inside
/// a frame, and answer in a few milliseconds.
pub const CONNECTIONS_PAGE_MAX: u32 = 1000;

/// Which listener a connection came through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listener {
    /// The binary protocol.
    Binary,
    /// A long-lived HTTP stream (server-sent events or a WebSocket).
    Http,
}

impl Listener {
    pub fn as_str(self) -> &'static str {
        match self {
            Listener::Binary => "binary",
            Listener::Http => "http",
        }
    }

    pub fn code(self) -> u8 {
        match self {
            Listener::Binary => 0,
            Listener::Http => 1,
        }
    }

    pub fn from_code(code: u8) -> Option<Listener> {
        match code {
            0 => Some(Listener::Binary),
            1 => Some(Listener::Http),
            _ => None,
        }
    }
}

/// The registry; one per broker.
#[derive(Default)]
pub struct Connections {
    next_id: AtomicU64,
    entries: RwLock<BTreeMap<u64, Arc<ConnectionEntry>>>,
}

/// The live counters and identity of one connection.
pub struct ConnectionEntry {
    id: u64,
    listener: Listener,
    peer: SocketAddr,
    tls: bool,
    connected_ms: u64,
    /// User and client name: known after the handshake.
    names: Mutex<(String, String)>,
    pub messages_in: AtomicU64,
    pub bytes_in: AtomicU64,
    pub messages_out: AtomicU64,
    pub bytes_out: AtomicU64,
    consumers: Mutex<HashMap<u32, ConsumerProbe>>,
    close_requested: AtomicBool,
    close: Notify,
}

/// What a listing reads of one consumer: the registry never keeps it alive.
struct ConsumerProbe {
    consumer: Weak<Consumer>,
    credit: Weak<dyn HeldCredit>,
}

/// The credit a transport's consumer holds now (the transport keeps the count): on the binary
/// protocol what the client granted and the broker has not used yet; on an HTTP stream the room
/// left under its `max_in_flight`.
pub trait HeldCredit: Send + Sync {
    fn credit(&self) -> u32;
}

/// One connection as listed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectionInfo {
    pub id: u64,
    pub listener: Listener,
    pub peer: String,
    /// Empty: anonymous (a broker without users) or not yet authenticated.
    pub user: String,
    /// As the client sent it in HELLO, e.g. `ferrymq-python/0.1`.
    pub client_name: String,
    pub tls: bool,
    pub connected_ms: u64,
    /// Distinct subscriptions its consumers are on.
    pub subscriptions: u32,
    pub consumers: u32,
    pub messages_in: u64,
    pub bytes_in: u64,
    pub messages_out: u64,
    pub bytes_out: u64,
    /// Credit its consumers hold: messages the broker may still send without waiting.
    pub credit: u64,
    /// Messages delivered to it and neither acked nor nacked yet.
    pub unacked: u64,
}

/// One page of a listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectionPage {
    pub connections: Vec<ConnectionInfo>,
    /// Connections open now, on every page.
    pub total: u64,
    /// The id to pass as `after` for the next page; 0 on the last page.
    pub next_after: u64,
}

/// Keeps a connection listed; dropping it removes the entry.
pub struct ConnectionGuard {
    entry: Arc<ConnectionEntry>,
    registry: Weak<Connections>,
}

impl Drop for ConnectionGuard {
    fn drop(&mut self) {
        if let Some(registry) = self.registry.upgrade() {
            registry.entries.write().remove(&self.entry.id);
        }
    }
}

impl std::ops::Deref for ConnectionGuard {
    type Target = Arc<ConnectionEntry>;
    fn deref(&self) -> &Arc<ConnectionEntry> {
        &self.entry
    }
}

impl Connections {
    /// Lists a new connection until the returned guard drops.
    pub fn register(
        self: &Arc<Self>,
        listener: Listener,
        peer: SocketAddr,
        tls: bool,
    ) -> ConnectionGuard {
        let id = self.next_id.fetch_add(1, Relaxed) + 1;
        let entry = Arc::new(ConnectionEntry {
            id,
            listener,
            peer,
            tls,
            connected_ms: unix_ms(),
            names: Mutex::new((String::new(), String::new())),
            messages_in: AtomicU64::new(0),
            bytes_in: AtomicU64::new(0),
            messages_out: AtomicU64::new(0),
            bytes_out: AtomicU64::new(0),
            consumers: Mutex::new(HashMap::new()),
            close_requested: AtomicBool::new(false),
            close: Notify::new(),
        });
        self.entries.write().insert(id, entry.clone());
        ConnectionGuard {
            entry,
            registry: Arc::downgrade(self),
        }
    }

    /// Connections open now.
    pub fn count(&self) -> usize {
        self.entries.read().len()
    }

    /// Up to `limit` (1..=[`CONNECTIONS_PAGE_MAX`]) connections with ids above `after`, in id
    /// order: paging by id stays correct while connections come and go.
    pub fn list(&self, after: u64, limit: u32) -> Result<ConnectionPage, BrokerError> {
        if limit == 0 || limit > CONNECTIONS_PAGE_MAX {
            return Err(BrokerError::invalid(
                "limit",
                format!("{limit}: must be 1..={CONNECTIONS_PAGE_MAX}"),
            ));
        }
        // Copy the page's handles out first: counters are read without the registry's lock.
        let (page, total, more) = {
            let entries = self.entries.read();
            let mut range = entries.range(after.saturating_add(1)..);
            let page: Vec<Arc<ConnectionEntry>> = range
                .by_ref()
                .take(limit as usize)
                .map(|(_, e)| e.clone())
                .collect();
            (page, entries.len() as u64, range.next().is_some())
        };
        let next_after = match (more, page.last()) {
            (true, Some(last)) => last.id,
            _ => 0,
        };
        Ok(ConnectionPage {
            connections: page.iter().map(|e| e.info()).collect(),
            total,
            next_after,
        })
    }

    /// Asks connection `id` to close; it tells its peer why and goes within one turn of its
    /// read loop. The caller logs who asked (its span names the actor).
    pub fn close(&self, id: u64) -> Result<ConnectionInfo, BrokerError> {
        let entry = self
            .entries
            .read()
            .get(&id)
            .cloned()
            .ok_or(BrokerError::UnknownConnection(id))?;
        entry.close_requested.store(true, Relaxed);
        entry.close.notify_one();
        Ok(entry.info())
    }
}

impl ConnectionEntry {
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Records who the connection authenticated as and the name its client gave.
    pub fn set_names(&self, user: &str, client_name: &str) {
        *self.names.lock() = (user.to_owned(), client_name.to_owned());
    }

    /// Lists a consumer of this connection under its connection-local id.
    pub fn add_consumer<C: HeldCredit + 'static>(
        &self,
        consumer_id: u32,
        consumer: &Arc<Consumer>,
        credit: Arc<C>,
    ) {
        let credit: Arc<dyn HeldCredit> = credit;
        self.consumers.lock().insert(
            consumer_id,
            ConsumerProbe {
                consumer: Arc::downgrade(consumer),
                credit: Arc::downgrade(&credit),
            },
        );
    }

    pub fn remove_consumer(&self, consumer_id: u32) {
        self.consumers.lock().remove(&consumer_id);
    }

    /// Whether an operator asked this connection to close.
    pub fn close_requested(&self) -> bool {
        self.close_requested.load(Relaxed)
    }

    /// Completes once an operator asks this connection to close (at once if one already has).
    pub async fn closed(&self) {
        let notified = self.close.notified();
        if self.close_requested() {
            return;
        }
        notified.await;
    }

    fn info(&self) -> ConnectionInfo {
        let (user, client_name) = self.names.lock().clone();
        let (mut subscriptions, mut consumers, mut credit, mut unacked) = (Vec::new(), 0, 0, 0);
        for probe in self.consumers.lock().values() {
            let Some(consumer) = probe.consumer.upgrade() else {
                continue;
            };
            consumers += 1;
            credit += u64::from(probe.credit.upgrade().map_or(0, |c| c.credit()));
            unacked += u64::from(consumer.in_flight());
            let key = (
                consumer.topic().name().to_owned(),
                consumer.subscription().name().to_owned(),
            );
            if !subscriptions.contains(&key) {
                subscriptions.push(key);
            }
        }
        ConnectionInfo {
            id: self.id,
            listener: self.listener,
            peer: self.peer.to_string(),
            user,
            client_name,
            tls: self.tls,
            connected_ms: self.connected_ms,
            subscriptions: subscriptions.len() as u32,
            consumers,
            messages_in: self.messages_in.load(Relaxed),
            bytes_in: self.bytes_in.load(Relaxed),
            messages_out: self.messages_out.load(Relaxed),
            bytes_out: self.bytes_out.load(Relaxed),
            credit,
            unacked,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(port: u16) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], port))
    }

    #[test]
    fn a_connection_is_listed_while_its_guard_lives() {
        let registry = Arc::new(Connections::default());
        let first = registry.register(Listener::Binary, peer(1000), false);
        let second = registry.register(Listener::Binary, peer(1001), true);
        second.set_names("alice", "ferrymq-python/0.1");
        second.bytes_in.fetch_add(12, Relaxed);
        let page = registry.list(0, 10).unwrap();
        assert_eq!(page.total, 2);
        assert_eq!(page.next_after, 0);
        assert_eq!(page.connections[1].user, "alice");
        assert_eq!(page.connections[1].client_name, "ferrymq-python/0.1");
        assert_eq!(page.connections[1].bytes_in, 12);
        assert!(page.connections[1].tls);
        drop(first);
        assert_eq!(registry.count(), 1);
        drop(second);
        assert_eq!(registry.count(), 0);
    }

    #[test]
    fn pages_follow_ids_and_ids_are_never_reused() {
        let registry = Arc::new(Connections::default());
        let guards: Vec<_> = (0..5)
            .map(|i| registry.register(Listener::Binary, peer(2000 + i), false))
            .collect();
        let page = registry.list(0, 2).unwrap();
        assert_eq!(page.connections.len(), 2);
        assert_eq!(page.next_after, guards[1].id());
        let last = registry.list(guards[3].id(), 2).unwrap();
        assert_eq!(last.connections.len(), 1);
        assert_eq!(last.next_after, 0);
        let gone = guards[4].id();
        drop(guards);
        let again = registry.register(Listener::Binary, peer(3000), false);
        assert!(again.id() > gone);
        assert!(registry.list(0, 0).is_err());
        assert!(registry.list(0, CONNECTIONS_PAGE_MAX + 1).is_err());
    }

    #[tokio::test]
    async fn closing_wakes_the_connection_and_an_unknown_id_is_refused() {
        let registry = Arc::new(Connections::default());
        let guard = registry.register(Listener::Binary, peer(4000), false);
        let entry = Arc::clone(&guard);
        let waiter = tokio::spawn(async move { entry.closed().await });
        registry.close(guard.id()).unwrap();
        tokio::time::timeout(std::time::Duration::from_secs(5), waiter)
            .await
            .unwrap()
            .unwrap();
        let id = guard.id();
        drop(guard);
        assert_eq!(
            registry.close(id).unwrap_err(),
            BrokerError::UnknownConnection(id)
        );
    }
}
