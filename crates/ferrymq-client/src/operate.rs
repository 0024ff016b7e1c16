//! The operator's requests (protocol version 3): list and close connections, purge a topic,
//! pause and resume a subscription. A broker that speaks only version 2 answers them
//! `unknown_opcode`.

use ferrymq_protocol::{ConnectionEntry, Frame};

use crate::client::{unexpected, Client};
use crate::error::Result;

/// One page of connections.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectionPage {
    pub connections: Vec<ConnectionEntry>,
    /// Open connections, on every page.
    pub total: u64,
    /// Pass as `after` for the next page; 0 on the last page.
    pub next_after: u64,
}

impl Client {
    /// Up to `limit` (1..=1000) connections with ids above `after` (0: the first page). Needs
    /// the monitor or admin role.
    pub async fn connection_list(&self, after: u64, limit: u32) -> Result<ConnectionPage> {
        match self
            .connection()
            .request(Frame::ListConnections { after, limit })
            .await?
        {
            Frame::ConnectionList {
                total,
                next_after,
                connections,
            } => Ok(ConnectionPage {
                connections,
                total,
                next_after,
            }),
            other => Err(unexpected(&other, "LIST_CONNECTIONS")),
        }
    }

    /// Closes connection `id` (admin role).
    pub async fn connection_close(&self, id: u64) -> Result<()> {
        self.expect_ok(Frame::CloseConnection { id }).await
    }

    /// Drops every message `topic` retains; returns how many (manage action).
    pub async fn purge_topic(&self, topic: &str) -> Result<u64> {
        let request = Frame::PurgeTopic {
            name: topic.to_owned(),
        };
        match self.connection().request(request).await? {
            Frame::Purged { messages } => Ok(messages),
            other => Err(unexpected(&other, "PURGE_TOPIC")),
        }
    }

    /// Pauses (`true`) or resumes deliveries of a subscription (manage action).
    pub async fn pause_subscription(
        &self,
        topic: &str,
        subscription: &str,
        paused: bool,
    ) -> Result<()> {
        self.expect_ok(Frame::PauseSubscription {
            topic: topic.to_owned(),
            subscription: subscription.to_owned(),
            paused,
        })
        .await
    }
}
