//! The public handle: publish, subscribe, administer topics, inspect messages and requeue dead
//! letters.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use ferrymq_protocol::limits::{BATCH_COUNT_MAX, LIST_LIMIT_MAX, LIST_PAGE_BYTES_MAX};
use ferrymq_protocol::{
    ClusterInfo, Frame, ListKind, Message, MessageEntry, MessageStatus, PublishEncoder,
    RequeueSelection, TopicConfig, TopicInfo, TopicStats,
};

use crate::config::{check_subscription, check_topic, ClientConfig};
use crate::conn::{Connection, ServerInfo};
use crate::error::{Error, Result};
use crate::publish::{inspect_publish_frame, MessageId, PendingPublish, PublishReceipt};

/// A connection to a FerryMQ broker. Cheap to clone; every clone shares the one connection and
/// may be used from many tasks at once. The connection closes when the last clone (and the last
/// [`Subscription`](crate::Subscription)) is dropped, or at [`Client::close`].
#[derive(Clone)]
pub struct Client {
    handle: Arc<Handle>,
}

/// Owned by the clients only (the tasks hold the connection, not this), so dropping the last
/// client closes the connection.
struct Handle {
    connection: Arc<Connection>,
}

impl Drop for Handle {
    fn drop(&mut self) {
        self.connection.begin_close();
    }
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("addr", &self.handle.connection.config.addr)
            .field("server", &self.handle.connection.server)
            .finish()
    }
}

/// How often [`Client::connect_leader`] asks again while no reachable leader is named: a few
/// requests a second to one node, and a failover noticed within this much of its election.
const LEADER_POLL: Duration = Duration::from_millis(20);

impl Client {
    /// Connects to `addr` (`host:port`) anonymously with default settings.
    pub async fn connect(addr: impl Into<String>) -> Result<Client> {
        Client::connect_with(ClientConfig::new(addr)).await
    }

    /// Connects with `config`. An `addr` listing several nodes (`a:7070,b:7070,c:7070`, the
    /// nodes of a cluster) connects to the first that answers, in order.
    pub async fn connect_with(config: ClientConfig) -> Result<Client> {
        let addrs = config.addrs();
        if addrs.len() <= 1 {
            return Client::connect_one(config).await;
        }
        let mut failures = Vec::new();
        for addr in addrs {
            let mut one = config.clone();
            one.addr = addr.clone();
            match Client::connect_one(one).await {
                Ok(client) => return Ok(client),
                // Credentials and TLS settings are the same for every node: no use going on.
                Err(e @ (Error::Server { .. } | Error::Tls(_) | Error::InvalidArgument(_))) => {
                    return Err(e)
                }
                Err(e) => failures.push(format!("{addr}: {e}")),
            }
        }
        Err(Error::Io(Arc::new(std::io::Error::new(
            std::io::ErrorKind::ConnectionRefused,
            format!("no node answered: {}", failures.join("; ")),
        ))))
    }

    pub(crate) async fn connect_one(config: ClientConfig) -> Result<Client> {
        let connection = Connection::connect(config).await?;
        Ok(Client {
            handle: Arc::new(Handle { connection }),
        })
    }

    /// Connects to the node that leads `partition` of `topic` (`None`: the cluster metadata,
    /// where topics are created and deleted), found through any node `config.addr` lists. While
    /// a leader is being elected, or the leader named cannot be reached (it may have just
    /// failed), it asks again every 20 ms, for up to `config.connect_timeout`. A broker that
    /// runs alone leads everything: the connection to it is returned as it is.
    pub async fn connect_leader(
        config: ClientConfig,
        topic: Option<&str>,
        partition: u32,
    ) -> Result<Client> {
        let deadline = tokio::time::Instant::now() + config.connect_timeout;
        let seed = Client::connect_with(config.clone()).await?;
        loop {
            let info = seed.cluster_info().await?;
            if info.node_id == 0 {
                return Ok(seed);
            }
            let leader = match topic {
                None => info.metadata_leader,
                Some(topic) => info
                    .partitions
                    .iter()
                    .find(|p| p.topic == topic && p.partition == partition)
                    .map_or(info.node_id, |p| p.leader),
            };
            if leader == info.node_id {
                return Ok(seed);
            }
            let addr = info
                .nodes
                .iter()
                .find(|n| n.id == leader && !n.addr.is_empty())
                .map(|n| n.addr.clone());
            if let Some(addr) = addr {
                let mut direct = config.clone();
                direct.addr = addr;
                match Client::connect_one(direct).await {
                    Ok(leader) => {
                        let _ = seed.close().await;
                        return Ok(leader);
                    }
                    // The node named may be a leader that has just failed, which the others
                    // still name until they elect its successor: ask again.
                    Err(Error::Io(_) | Error::Timeout(_) | Error::ConnectionClosed)
                        if tokio::time::Instant::now() < deadline => {}
                    Err(e) => {
                        let _ = seed.close().await;
                        return Err(e);
                    }
                }
            }
            if tokio::time::Instant::now() >= deadline {
                // No leader known yet: the node reached answers not_leader with what it knows.
                return Ok(seed);
            }
            tokio::time::sleep(LEADER_POLL).await;
        }
    }

    /// The cluster's nodes and who leads each replicated partition, as the connected node sees
    /// them; node 0 and nothing else from a broker that runs alone.
    pub async fn cluster_info(&self) -> Result<ClusterInfo> {
        match self.connection().request(Frame::ClusterInfo).await? {
            Frame::ClusterInfoReply(info) => Ok(info),
            other => Err(unexpected(&other, "CLUSTER_INFO")),
        }
    }

    pub(crate) fn connection(&self) -> &Arc<Connection> {
        &self.handle.connection
    }

    /// What the server announced in its handshake (limits, heartbeat, name).
    pub fn server_info(&self) -> &ServerInfo {
        &self.connection().server
    }

    pub fn config(&self) -> &ClientConfig {
        &self.connection().config
    }

    /// True once the connection has closed, for whatever reason.
    pub fn is_closed(&self) -> bool {
        self.connection().closed_reason().is_some()
    }

    /// Why the connection closed, if it has.
    pub fn closed_reason(&self) -> Option<Error> {
        self.connection().closed_reason()
    }

    /// Errors the server reported for fire-and-forget frames (acks, nacks, credit), which have
    /// no caller to return them to: how many, and the latest.
    pub fn async_error_count(&self) -> u64 {
        self.connection().async_error_count()
    }

    pub fn last_async_error(&self) -> Option<Error> {
        self.connection().last_async_error()
    }

    /// Publishes one message and waits for its id. The broker picks the partition by key.
    pub async fn publish(&self, topic: &str, message: Message) -> Result<MessageId> {
        let receipt = self
            .publish_batch(topic, None, std::slice::from_ref(&message))
            .await?;
        receipt
            .first_id()
            .ok_or_else(|| Error::UnexpectedResponse("PUBLISHED without ids".into()))
    }

    /// Publishes a batch (accepted or refused whole) and waits for the receipt.
    pub async fn publish_batch(
        &self,
        topic: &str,
        partition: Option<u32>,
        messages: &[Message],
    ) -> Result<PublishReceipt> {
        self.send_batch(topic, partition, messages).await?.await
    }

    /// Queues a batch and returns at once with the future of its receipt, so one task can keep
    /// many batches in flight. Waits only when the connection's write buffer is full.
    pub async fn send_batch(
        &self,
        topic: &str,
        partition: Option<u32>,
        messages: &[Message],
    ) -> Result<PendingPublish> {
        check_topic(topic)?;
        if messages.is_empty() || messages.len() > BATCH_COUNT_MAX as usize {
            return Err(Error::InvalidMessage(format!(
                "a batch holds 1..={BATCH_COUNT_MAX} messages, got {}",
                messages.len()
            )));
        }
        let body_bytes_max = self.server_info().message_bytes_max as usize;
        let request_id = self.connection().next_request_id();
        let mut encoder = PublishEncoder::new(topic, partition, request_id);
        for (index, message) in messages.iter().enumerate() {
            if message.body.len() > body_bytes_max {
                return Err(Error::InvalidMessage(format!(
                    "message {index}: body of {} bytes exceeds the server's limit of {body_bytes_max} bytes",
                    message.body.len()
                )));
            }
            encoder
                .push(message)
                .map_err(|error| Error::InvalidMessage(format!("message {index}: {error}")))?;
        }
        self.send_encoded(encoder.finish()).await
    }

    /// Starts a PUBLISH frame with a fresh request id, for callers that encode messages straight
    /// into the frame (`push_body` for bodies without headers) and send it with
    /// [`Client::send_encoded`]: no `Message` values, no copies.
    pub fn publish_encoder(&self, topic: &str, partition: Option<u32>) -> Result<PublishEncoder> {
        check_topic(topic)?;
        Ok(PublishEncoder::new(
            topic,
            partition,
            self.connection().next_request_id(),
        ))
    }

    /// Queues a finished PUBLISH frame (from [`Client::publish_encoder`]) without copying it and
    /// returns the future of its receipt.
    /// An encoder for an unconfirmed publish (request id 0): see [`Client::send_unconfirmed`].
    pub fn unconfirmed_encoder(
        &self,
        topic: &str,
        partition: Option<u32>,
    ) -> Result<PublishEncoder> {
        check_topic(topic)?;
        Ok(PublishEncoder::new(topic, partition, 0))
    }

    /// Sends a finished PUBLISH frame built with request id 0: the server sends no receipt, so
    /// nothing is awaited (at-most-once, like a NATS core publish). A refusal still comes back as
    /// an ERROR frame with request id 0, counted in [`Client::async_error_count`] and kept in
    /// [`Client::last_async_error`].
    pub async fn send_unconfirmed(&self, frame: Bytes) -> Result<()> {
        let (request_id, _) = inspect_publish_frame(&frame)?;
        if request_id != 0 {
            return Err(Error::InvalidArgument(
                "an unconfirmed publish must carry request id 0 (use unconfirmed_encoder)".into(),
            ));
        }
        let frame_bytes_max = self.server_info().frame_bytes_max as usize;
        if frame.len() > frame_bytes_max {
            return Err(Error::InvalidMessage(format!(
                "the batch encodes to {} bytes; the server accepts frames up to {frame_bytes_max} bytes: send smaller batches",
                frame.len()
            )));
        }
        self.connection()
            .enqueue(|queue| queue.push_bytes(frame))
            .await
    }

    pub async fn send_encoded(&self, frame: Bytes) -> Result<PendingPublish> {
        let (request_id, count) = inspect_publish_frame(&frame)?;
        if request_id == 0 {
            return Err(Error::InvalidArgument(
                "not a finished PUBLISH frame: request id 0 asks for no receipt; build it with Client::publish_encoder, or send it with send_unconfirmed".into(),
            ));
        }
        let frame_bytes_max = self.server_info().frame_bytes_max as usize;
        if frame.len() > frame_bytes_max {
            return Err(Error::InvalidMessage(format!(
                "the batch encodes to {} bytes; the server accepts frames up to {frame_bytes_max} bytes: send smaller batches",
                frame.len()
            )));
        }
        let response = self
            .connection()
            .request_with_id(request_id, "PUBLISH", None, |queue| queue.push_bytes(frame))
            .await?;
        Ok(PendingPublish::new(response, count))
    }

    pub async fn create_topic(
        &self,
        name: &str,
        config: TopicConfig,
        if_not_exists: bool,
    ) -> Result<()> {
        check_topic(name)?;
        self.expect_ok(Frame::CreateTopic {
            name: name.to_string(),
            config,
            if_not_exists,
        })
        .await
    }

    pub async fn delete_topic(&self, name: &str) -> Result<()> {
        check_topic(name)?;
        self.expect_ok(Frame::DeleteTopic {
            name: name.to_string(),
        })
        .await
    }

    pub async fn list_topics(&self) -> Result<Vec<TopicInfo>> {
        match self.connection().request(Frame::ListTopics).await? {
            Frame::TopicList { topics } => Ok(topics),
            other => Err(unexpected(&other, "LIST_TOPICS")),
        }
    }

    pub async fn describe_topic(&self, name: &str) -> Result<TopicInfo> {
        check_topic(name)?;
        match self
            .connection()
            .request(Frame::DescribeTopic {
                name: name.to_string(),
            })
            .await?
        {
            Frame::TopicInfo(info) => Ok(info),
            other => Err(unexpected(&other, "DESCRIBE_TOPIC")),
        }
    }

    /// Removes a named subscription and its cursor.
    pub async fn delete_subscription(&self, topic: &str, subscription: &str) -> Result<()> {
        check_topic(topic)?;
        check_subscription(subscription, false)?;
        self.expect_ok(Frame::DeleteSubscription {
            topic: topic.to_string(),
            subscription: subscription.to_string(),
        })
        .await
    }

    /// Statistics of one topic, or of every topic with `None`.
    pub async fn stats(&self, topic: Option<&str>) -> Result<Vec<TopicStats>> {
        if let Some(topic) = topic {
            check_topic(topic)?;
        }
        match self
            .connection()
            .request(Frame::Stats {
                topic: topic.unwrap_or("").to_string(),
            })
            .await?
        {
            Frame::StatsReply { topics } => Ok(topics),
            other => Err(unexpected(&other, "STATS")),
        }
    }

    /// Where one message stands: its publish time, priority, key and body size, and its state in
    /// every subscription of the topic (attempts, times, ack result, dead-letter reason and
    /// place). A message never published, or no longer retained, is refused with
    /// [`ErrorCode::UnknownMessage`](ferrymq_protocol::ErrorCode::UnknownMessage).
    pub async fn message_status(
        &self,
        topic: &str,
        partition: u32,
        offset: u64,
    ) -> Result<MessageStatus> {
        check_topic(topic)?;
        match self
            .connection()
            .request(Frame::MessageStatus {
                topic: topic.to_string(),
                partition,
                offset,
            })
            .await?
        {
            Frame::MessageStatusReply(status) => Ok(status),
            other => Err(unexpected(&other, "MESSAGE_STATUS")),
        }
    }

    /// One page of a subscription's messages of one `kind`: at most `limit`
    /// (1..=[`LIST_LIMIT_MAX`]) entries and the token of the next page, empty after the last.
    /// Start with an empty `page` and pass each returned token back unchanged, with the same
    /// topic, subscription and kind. `Pending` and `InFlight` list in partition, then offset
    /// order (pending includes delayed messages); `Acked` and `DeadLettered` list newest first,
    /// from the broker's bounded history.
    pub async fn list_messages(
        &self,
        topic: &str,
        subscription: &str,
        kind: ListKind,
        page: Bytes,
        limit: u32,
    ) -> Result<(Vec<MessageEntry>, Bytes)> {
        check_topic(topic)?;
        check_subscription(subscription, false)?;
        if limit == 0 || limit > LIST_LIMIT_MAX {
            return Err(Error::InvalidArgument(format!(
                "a listing page holds 1..={LIST_LIMIT_MAX} entries, got {limit}"
            )));
        }
        if page.len() > LIST_PAGE_BYTES_MAX {
            return Err(Error::InvalidArgument(format!(
                "a page token is at most {LIST_PAGE_BYTES_MAX} bytes, got {}: pass back the token a listing returned",
                page.len()
            )));
        }
        match self
            .connection()
            .request(Frame::ListMessages {
                topic: topic.to_string(),
                subscription: subscription.to_string(),
                kind,
                page,
                limit,
            })
            .await?
        {
            Frame::MessageList { entries, next_page } => Ok((entries, next_page)),
            other => Err(unexpected(&other, "LIST_MESSAGES")),
        }
    }

    /// Publishes the selected dead letters of `dead_letter_topic` again to their source topic,
    /// for the subscription each one died in only. Each dead letter is requeued at most once;
    /// returns `(requeued, skipped)`: dead letters published again, and selected offsets that
    /// were requeued before or are not dead letters.
    ///
    /// Many dead letters take a while (each is published again): the wait is bounded by the
    /// client's [`request_timeout`](ClientConfig::request_timeout); select ranges to requeue in
    /// steps. When the wait times out the requeue goes on in the broker, and a second call
    /// skips what it did.
    pub async fn requeue_dead_letters(
        &self,
        dead_letter_topic: &str,
        selection: RequeueSelection,
    ) -> Result<(u64, u64)> {
        check_topic(dead_letter_topic)?;
        if let RequeueSelection::Range { first, last, .. } = selection {
            if last < first {
                return Err(Error::InvalidArgument(format!(
                    "requeue range {first}..={last} ends before it starts"
                )));
            }
        }
        match self
            .connection()
            .request(Frame::RequeueDead {
                dead_letter_topic: dead_letter_topic.to_string(),
                selection,
            })
            .await?
        {
            Frame::Requeued { requeued, skipped } => Ok((requeued, skipped)),
            other => Err(unexpected(&other, "REQUEUE_DEAD")),
        }
    }

    /// Round trip to the server.
    pub async fn ping(&self) -> Result<Duration> {
        let start = Instant::now();
        match self.connection().request(Frame::Ping).await? {
            Frame::Pong => Ok(start.elapsed()),
            other => Err(unexpected(&other, "PING")),
        }
    }

    /// Sends what is queued (acks, unsubscribes), closes the connection and waits for it to end
    /// (at most [`crate::config::CLOSE_FLUSH_TIMEOUT`]). Requests still awaiting an answer fail
    /// with [`Error::ConnectionClosed`]; every clone of this client is closed.
    pub async fn close(&self) -> Result<()> {
        self.connection().begin_close();
        self.connection().closed().await;
        match self.connection().closed_reason() {
            None | Some(Error::ConnectionClosed) => Ok(()),
            Some(reason) => Err(reason),
        }
    }

    pub(crate) async fn expect_ok(&self, frame: Frame) -> Result<()> {
        let what = frame.name();
        match self.connection().request(frame).await? {
            Frame::Ok => Ok(()),
            other => Err(unexpected(&other, what)),
        }
    }
}

pub(crate) fn unexpected(frame: &Frame, request: &str) -> Error {
    Error::UnexpectedResponse(format!("{} frame in answer to {request}", frame.name()))
}
