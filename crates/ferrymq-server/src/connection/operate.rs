//! The operator's requests (version 3): LIST_CONNECTIONS, CLOSE_CONNECTION, PURGE_TOPIC and
//! PAUSE_SUBSCRIPTION.
//!
//! Who may: listing connections needs the monitor or admin role (it shows every user's
//! connections); closing one needs the admin role; purge needs the purge action on the topic and
//! pause the pause action, each a grant of its own (`manage`, which deletes topics and
//! subscriptions, implies both).

use ferrymq_broker::connections::ConnectionInfo;
use ferrymq_broker::Action;
use ferrymq_protocol::{ConnectionEntry, Frame};

use super::Session;

/// The wire form of a listed connection.
pub(crate) fn connection_entry(c: ConnectionInfo) -> ConnectionEntry {
    ConnectionEntry {
        id: c.id,
        listener: c.listener.code(),
        tls: c.tls,
        peer: c.peer,
        user: c.user,
        client_name: c.client_name,
        connected_ms: c.connected_ms,
        subscriptions: c.subscriptions,
        consumers: c.consumers,
        messages_in: c.messages_in,
        bytes_in: c.bytes_in,
        messages_out: c.messages_out,
        bytes_out: c.bytes_out,
        credit: c.credit,
        unacked: c.unacked,
    }
}

/// Whether `frame` is one of the operator's requests.
pub(crate) fn is_operator(frame: &Frame) -> bool {
    matches!(
        frame,
        Frame::ListConnections { .. }
            | Frame::CloseConnection { .. }
            | Frame::PurgeTopic { .. }
            | Frame::PauseSubscription { .. }
    )
}

impl Session {
    /// Answers one operator request; run in a span naming who acted.
    pub(super) async fn operate(&mut self, id: u32, frame: Frame) {
        match frame {
            Frame::ListConnections { after, limit } => self.list_connections(id, after, limit),
            Frame::CloseConnection { id: connection } => self.close_connection(id, connection),
            Frame::PurgeTopic { name } => self.purge_topic(id, &name),
            Frame::PauseSubscription {
                topic,
                subscription,
                paused,
            } => self.pause_subscription(id, &topic, &subscription, paused),
            other => unreachable!("{} is not an operator frame", other.name()),
        }
    }

    pub(super) fn list_connections(&mut self, id: u32, after: u64, limit: u32) {
        let result = self
            .access()
            .check_monitor("list connections")
            .and_then(|_| self.broker.connections().list(after, limit))
            .map(|page| Frame::ConnectionList {
                total: page.total,
                next_after: page.next_after,
                connections: page.connections.into_iter().map(connection_entry).collect(),
            });
        self.reply(id, result)
    }

    pub(super) fn close_connection(&mut self, id: u32, connection: u64) {
        let result = self
            .access()
            .check_admin("close connections")
            .and_then(|_| self.broker.connections().close(connection))
            .map(|closed| {
                tracing::info!(connection, peer = %closed.peer, user = %closed.user, client = %closed.client_name, "connection closed");
                Frame::Ok
            });
        self.reply(id, result)
    }

    pub(super) fn purge_topic(&mut self, id: u32, name: &str) {
        let result = self
            .allow(Action::Purge, name)
            .and_then(|_| self.broker.purge_topic(name))
            .map(|messages| Frame::Purged { messages });
        self.reply(id, result)
    }

    pub(super) fn pause_subscription(
        &mut self,
        id: u32,
        topic: &str,
        subscription: &str,
        paused: bool,
    ) {
        let result = self.allow(Action::Pause, topic).and_then(|_| {
            self.broker
                .pause_subscription(topic, subscription, paused)
                .map(|_| Frame::Ok)
        });
        self.reply(id, result)
    }
}
