//! Credit is a bound the server keeps: a consumer is never sent more messages than it was
//! granted, however its grants interleave with the deliveries already under way. A client that
//! counts (the Rust client does) ends a subscription that oversteps, so an over-grant turns into
//! a consumer that stops for no reason of its own.

mod common;

use common::{Raw, TestServer};
use ferrymq_protocol::{Frame, Message, SubscribeRequest, TopicConfig};

/// Many small grants, each racing the delivery of the messages granted before it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn deliveries_never_exceed_the_credit_granted_while_grants_race_them() {
    const MESSAGES: u64 = 30_000;
    const WINDOW: u32 = 64;
    let server = TestServer::default().await;
    server
        .broker
        .create_topic("t", TopicConfig::default(), false)
        .unwrap();
    let batch: Vec<Message> = (0..1000).map(|i| Message::new(format!("m{i}"))).collect();
    for _ in 0..MESSAGES / 1000 {
        server.broker.publish_messages("t", &batch).await.unwrap();
    }
    let mut raw = Raw::hello(server.addr).await;
    let mut request = SubscribeRequest::earliest("t", "s");
    request.credit = WINDOW;
    request.auto_ack = true;
    let (_, reply) = raw.request(2, &Frame::Subscribe(request)).await;
    let Frame::Subscribed { consumer_id, .. } = reply else {
        panic!("{reply:?}");
    };
    let (mut granted, mut received) = (WINDOW as u64, 0u64);
    // Bounded: every message is delivered once (auto-ack), and `recv` times out.
    while received < MESSAGES {
        let (_, frame) = raw.recv().await.expect("connection open");
        let Frame::Deliver { deliveries, .. } = frame else {
            assert!(matches!(frame, Frame::Ping), "{frame:?}");
            continue;
        };
        received += deliveries.count() as u64;
        assert!(
            received <= granted,
            "{received} messages delivered against {granted} of credit granted"
        );
        for _ in 0..deliveries.count() {
            raw.send(
                &Frame::Credit {
                    consumer_id,
                    credit: 1,
                },
                0,
            )
            .await;
            granted += 1;
        }
    }
    server.shutdown().await;
}
