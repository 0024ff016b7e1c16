//! The table from a request frame to the code that answers it.

use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use ferrymq_broker::{Action, BrokerError};
use ferrymq_protocol::limits::CONSUMER_CREDIT_MAX;
use ferrymq_protocol::{ErrorCode, Frame, FrameHeader, RequeueSelection};

use super::outbound::reply_to;
use super::publish::published;
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
        if crate::admin::is_admin(&frame) {
            let result = crate::admin::handle(self.access(), frame).await;
            self.reply(id, result);
            return Flow::Continue;
        }
        match frame {
            Frame::Hello { .. } => self.reply_error(
                id,
                ErrorCode::InvalidArgument,
                "HELLO was already received on this connection",
            ),
            Frame::Ping => self.out.push(&Frame::Pong, id),
            Frame::Pong => {}
            Frame::CreateTopic {
                name,
                config,
                if_not_exists,
            } => {
                let result = self.allow(Action::Manage, &name).and_then(|_| {
                    self.broker
                        .create_topic(&name, config, if_not_exists)
                        .map(|_| Frame::Ok)
                });
                self.reply(id, result)
            }
            Frame::DeleteTopic { name } => {
                let result = self.allow(Action::Manage, &name).and_then(|_| {
                    self.publishing.remove(&name);
                    self.broker.delete_topic(&name).map(|_| Frame::Ok)
                });
                self.reply(id, result)
            }
            Frame::ListTopics => {
                let mut topics = self.broker.list_topics();
                let access = self.access();
                topics.retain(|t| access.sees(&t.name).unwrap_or(false));
                self.reply(id, Ok(Frame::TopicList { topics }))
            }
            Frame::DescribeTopic { name } => {
                let result = self
                    .allow(Action::Inspect, &name)
                    .and_then(|_| self.broker.describe_topic(&name).map(Frame::TopicInfo));
                self.reply(id, result)
            }
            Frame::Publish {
                topic,
                partition,
                records,
            } => {
                let started = self
                    .allow(Action::Publish, &topic)
                    .and_then(|_| self.publish_target(&topic))
                    .and_then(|target| self.broker.publish_start(&target, partition, records));
                match started {
                    Ok(pending) if !pending.is_done() => {
                        let out = self.out.clone();
                        let permit = self.waiting.clone().acquire_owned().await;
                        tokio::spawn(async move {
                            let result = pending.durable().await;
                            reply_to(&out, id, result.map(published));
                            out.flush();
                            drop(permit);
                        });
                    }
                    Ok(pending) => self.reply(id, pending.durable().await.map(published)),
                    Err(error) => self.reply(id, Err(error)),
                }
            }
            Frame::Subscribe(request) => {
                let result = self.allow(Action::Consume, &request.topic).and_then(|_| {
                    // Dead letters are published to the topic the subscription names.
                    match request.dead_letter_topic.is_empty() {
                        true => Ok(()),
                        false => self.allow(Action::Publish, &request.dead_letter_topic),
                    }
                });
                let result = result.and_then(|_| self.subscribe(id, &request));
                if let Err(error) = result {
                    self.reply(id, Err(error));
                }
            }
            Frame::Unsubscribe { consumer_id } => {
                let result = self
                    .consumers
                    .remove(&consumer_id)
                    .map(|_| Frame::Ok)
                    .ok_or(BrokerError::UnknownConsumer(consumer_id as u64));
                self.reply(id, result)
            }
            Frame::Credit {
                consumer_id,
                credit,
            } => {
                let result = self.consumer(consumer_id).map(|entry| {
                    let c = &entry.credit;
                    let now = c.available.load(Relaxed);
                    c.available
                        .store(now.saturating_add(credit).min(CONSUMER_CREDIT_MAX), Relaxed);
                    c.added.notify_one();
                    Frame::Ok
                });
                self.reply(id, result)
            }
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
                let delay = Duration::from_millis(delay_ms as u64);
                let result = self
                    .consumer_allowed(consumer_id)
                    .map(|_| ())
                    .and_then(|_| self.consumer(consumer_id))
                    .and_then(|entry| match (dead_letter, release) {
                        (true, _) => entry.consumer.dead_letter(&ranges, &reason),
                        (false, true) => entry.consumer.release(&ranges, delay),
                        (false, false) => entry.consumer.nack(&ranges, delay),
                    })
                    .map(|_| Frame::Ok);
                self.reply(id, result)
            }
            Frame::DeleteSubscription {
                topic,
                subscription,
            } => {
                let result = self.allow(Action::Manage, &topic).and_then(|_| {
                    self.broker
                        .delete_subscription(&topic, &subscription)
                        .map(|_| Frame::Ok)
                });
                self.reply(id, result)
            }
            Frame::Stats { topic } => {
                let name = (!topic.is_empty()).then_some(topic.as_str());
                let stats = match name {
                    Some(name) => self
                        .allow(Action::Inspect, name)
                        .and_then(|_| self.broker.stats(Some(name))),
                    None => self.broker.stats(None).map(|mut topics| {
                        let access = self.access();
                        topics.retain(|t| access.sees(&t.name).unwrap_or(false));
                        topics
                    }),
                };
                match stats {
                    Ok(_) if id == 0 => {}
                    Ok(topics) => {
                        let max = self.config.effective_frame_bytes_max();
                        let reply = Frame::StatsReply { topics };
                        if let Err(bytes) = self.out.push_within(&reply, id, max) {
                            self.reply_error(
                                id,
                                ErrorCode::FrameTooLarge,
                                match name {
                                    None => format!(
                                        "the statistics of every topic take {bytes} bytes, above \
                                         the frame limit of {max}: ask for one topic at a time"
                                    ),
                                    Some(name) => format!(
                                        "the statistics of topic '{name}' take {bytes} bytes, \
                                         above the frame limit of {max}"
                                    ),
                                },
                            );
                        }
                    }
                    Err(error) => self.reply(id, Err(error)),
                }
            }
            Frame::MessageStatus {
                topic,
                partition,
                offset,
            } => {
                let result = self.allow(Action::Inspect, &topic).and_then(|_| {
                    self.broker
                        .message_status(&topic, partition, offset)
                        .map(Frame::MessageStatusReply)
                });
                self.reply(id, result)
            }
            Frame::ListMessages {
                topic,
                subscription,
                kind,
                page,
                limit,
            } => {
                let result = self
                    .allow(Action::Inspect, &topic)
                    .and_then(|_| self.list_messages(&topic, &subscription, kind, &page, limit));
                self.reply(id, result)
            }
            Frame::RequeueDead {
                dead_letter_topic,
                selection,
            } => {
                if let Err(error) = self.allow(Action::Manage, &dead_letter_topic) {
                    self.reply(id, Err(error));
                    return Flow::Continue;
                }
                let range = match selection {
                    RequeueSelection::All => None,
                    RequeueSelection::Range {
                        partition,
                        first,
                        last,
                    } => Some((partition, first, last)),
                };
                // Requeueing publishes (and on disk topics syncs) every selected dead letter: it
                // runs beside the reader, like a publish waiting for its sync, holding a permit.
                let (out, broker) = (self.out.clone(), self.broker.clone());
                let permit = self.waiting.clone().acquire_owned().await;
                tokio::spawn(async move {
                    let result = broker
                        .requeue_dead_letters(&dead_letter_topic, range)
                        .await
                        .map(|outcome| Frame::Requeued {
                            requeued: outcome.requeued,
                            skipped: outcome.skipped,
                        });
                    reply_to(&out, id, result);
                    out.flush();
                    drop(permit);
                });
            }
            Frame::UserAdd { .. }
            | Frame::UserRemove { .. }
            | Frame::UserPasswd { .. }
            | Frame::UserList
            | Frame::Grant { .. }
            | Frame::Revoke { .. }
            | Frame::TokenCreate { .. }
            | Frame::TokenList { .. }
            | Frame::TokenRevoke { .. } => unreachable!("administration frames are handled above"),
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
            | Frame::TokenListReply { .. }) => {
                tracing::warn!(peer = %self.peer, frame = server_frame.name(), "closing connection: client sent a server frame");
                self.reply_error(
                    id,
                    ErrorCode::MalformedFrame,
                    format!("{} is sent by servers, not clients", server_frame.name()),
                );
                return Flow::Close;
            }
        }
        Flow::Continue
    }
}
