//! The table from a request frame to the code that answers it: one arm per frame kind, each a
//! method in the file of its family (topics, publish, consume, inspect, handshake, admin).

use ferrymq_protocol::{ErrorCode, Frame, FrameHeader};

use tracing::Instrument;

use super::consume::Settle;
use super::{Flow, Session};

impl Session {
    pub(super) async fn handle(&mut self, header: FrameHeader, frame: Frame) -> Flow {
        let id = header.request_id;
        if !self.handshaken {
            return self.handshake(id, frame).await;
        }
        // Users, grants or tokens may have changed since the last request.
        if let Err(error) = self.access().refresh() {
            let who = self.access().identity().describe();
            tracing::info!(peer = %self.peer, %who, %error, "closing connection: credentials no longer valid");
            self.reply(id, Err(error));
            return Flow::Close;
        }
        // Administrative requests run in a span naming who acted, so that the broker's line
        // about each change ("user added", "topic deleted", ...) says it.
        if crate::admin::is_admin(&frame) {
            let span = self.admin_span(&frame);
            let version = self.out.version.load(std::sync::atomic::Ordering::Relaxed);
            let result = crate::admin::handle(self.access(), frame, version)
                .instrument(span)
                .await;
            self.reply(id, result);
            return Flow::Continue;
        }
        if crate::connection::operate::is_operator(&frame) {
            let span = self.admin_span(&frame);
            self.operate(id, frame).instrument(span).await;
            return Flow::Continue;
        }
        if changes_topics(&frame) {
            let span = self.admin_span(&frame);
            return self.dispatch(id, frame).instrument(span).await;
        }
        self.dispatch(id, frame).await
    }

    fn admin_span(&mut self, frame: &Frame) -> tracing::Span {
        let actor = self.access().identity().describe();
        tracing::info_span!("admin", %actor, via = "binary", peer = %self.peer, request = frame.name())
    }

    // One arm per frame kind, and the match stays exhaustive (no `_` arm), so a new frame
    // cannot compile until it is given its place here: the table is kept whole on purpose.
    async fn dispatch(&mut self, id: u32, frame: Frame) -> Flow {
        match frame {
            Frame::Hello { .. } => self.hello_again(id),
            Frame::Ping => self.out.push(&Frame::Pong, id),
            Frame::Pong => {}
            Frame::CreateTopic {
                name,
                config,
                if_not_exists,
            } => self.create_topic(id, &name, config, if_not_exists).await,
            Frame::DeleteTopic { name } => self.delete_topic(id, &name).await,
            Frame::ListTopics => self.list_topics(id),
            Frame::DescribeTopic { name } => self.describe_topic(id, &name),
            Frame::Publish {
                topic,
                partition,
                records,
            } => self.publish(id, &topic, partition, records).await,
            Frame::Subscribe(request) => self.subscribe_checked(id, &request),
            Frame::Unsubscribe { consumer_id } => self.unsubscribe(id, consumer_id),
            Frame::Credit {
                consumer_id,
                credit,
            } => self.add_credit(id, consumer_id, credit),
            Frame::Ack {
                consumer_id,
                ranges,
            } => self.ack(id, consumer_id, &ranges, None).await,
            Frame::AckResult {
                consumer_id,
                result,
                ranges,
            } => self.ack(id, consumer_id, &ranges, Some(&result)).await,
            Frame::Nack {
                consumer_id,
                delay_ms,
                dead_letter,
                release,
                reason,
                ranges,
            } => {
                let settle = Settle::from_nack(delay_ms, dead_letter, release, &reason);
                self.nack(id, consumer_id, &ranges, settle)
            }
            Frame::DeleteSubscription {
                topic,
                subscription,
            } => self.delete_subscription(id, &topic, &subscription),
            Frame::Stats { topic } => self.stats(id, &topic),
            Frame::MessageStatus {
                topic,
                partition,
                offset,
            } => self.message_status(id, &topic, partition, offset),
            list @ Frame::ListMessages { .. } => self.list_messages_frame(id, list),
            Frame::RequeueDead {
                dead_letter_topic,
                selection,
            } => self.requeue_dead(id, dead_letter_topic, selection).await,
            Frame::ClusterInfo => self.cluster_info(id),
            Frame::UserAdd { .. }
            | Frame::UserRemove { .. }
            | Frame::UserPasswd { .. }
            | Frame::UserList
            | Frame::Grant { .. }
            | Frame::Revoke { .. }
            | Frame::TokenCreate { .. }
            | Frame::TokenList { .. }
            | Frame::TokenRevoke { .. }
            | Frame::ListConnections { .. }
            | Frame::CloseConnection { .. }
            | Frame::PurgeTopic { .. }
            | Frame::PauseSubscription { .. } => {
                unreachable!("administration and operator frames are handled above")
            }
            server_frame @ (Frame::HelloOk { .. }
            | Frame::Ok
            | Frame::Error { .. }
            | Frame::Published { .. }
            | Frame::TopicList { .. }
            | Frame::TopicInfo(_)
            | Frame::Subscribed { .. }
            | Frame::Deliver { .. }
            | Frame::StatsReply { .. }
            | Frame::MessageStatusReply(_)
            | Frame::MessageList { .. }
            | Frame::Requeued { .. }
            | Frame::UserListReply { .. }
            | Frame::TokenCreated { .. }
            | Frame::TokenListReply { .. }
            | Frame::ClusterInfoReply(_)
            | Frame::ConnectionList { .. }
            | Frame::Purged { .. }) => return self.refuse_server_frame(id, &server_frame),
        }
        Flow::Continue
    }

    fn hello_again(&self, id: u32) {
        self.reply_error(
            id,
            ErrorCode::InvalidArgument,
            "HELLO was already received on this connection",
        )
    }

    fn refuse_server_frame(&self, id: u32, frame: &Frame) -> Flow {
        tracing::warn!(peer = %self.peer, frame = frame.name(), "closing connection: client sent a server frame");
        self.reply_error(
            id,
            ErrorCode::MalformedFrame,
            format!("{} is sent by servers, not clients", frame.name()),
        );
        Flow::Close
    }
}

/// The requests besides user administration that change what the broker holds.
fn changes_topics(frame: &Frame) -> bool {
    matches!(
        frame,
        Frame::CreateTopic { .. }
            | Frame::DeleteTopic { .. }
            | Frame::DeleteSubscription { .. }
            | Frame::RequeueDead { .. }
    )
}
