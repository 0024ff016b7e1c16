//! A consumer that wants a few messages asks for no more, and gives back what it did not take
//! without costing them an attempt (against a scripted fake server).

mod common;

use common::{within, FakeServer};
use ferrymq_client::{Client, Delivery, DeliveryBatch, Message, OffsetRange, SubscribeOptions};
use ferrymq_protocol::Frame;

fn delivery(offset: u64) -> Delivery {
    Delivery {
        partition: 0,
        offset,
        timestamp_ms: 1_700_000_000_000,
        attempt: 1,
        message: Message::new(format!("m{offset}")),
    }
}

#[tokio::test]
async fn a_limited_subscription_asks_for_no_more_and_releases_what_it_did_not_take() {
    let server = FakeServer::bind().await;
    let (client, peer) = tokio::join!(
        Client::connect(server.addr.clone()),
        server.accept_ready(5_000)
    );
    let client = client.unwrap();
    let mut peer = peer;

    let server_side = async {
        let (header, frame) = peer.recv_skipping_pings().await;
        let Frame::Subscribe(request) = frame else {
            panic!("expected SUBSCRIBE")
        };
        assert_eq!(request.credit, 5, "the window shrinks to the limit");
        let subscribed = Frame::Subscribed {
            consumer_id: 3,
            subscription: "work".into(),
            partitions: 1,
        };
        peer.send(&subscribed, header.request_id).await;
        let deliveries: Vec<Delivery> = (0..5).map(delivery).collect();
        let deliver = Frame::Deliver {
            consumer_id: 3,
            deliveries: DeliveryBatch::from_deliveries(&deliveries).unwrap(),
        };
        peer.send(&deliver, 0).await;

        // No CREDIT comes first: the limit was granted whole at the start.
        let (header, frame) = peer.recv_skipping_pings().await;
        assert_eq!(
            frame,
            Frame::Nack {
                consumer_id: 3,
                delay_ms: 0,
                dead_letter: false,
                release: true,
                reason: String::new(),
                ranges: vec![OffsetRange {
                    partition: 0,
                    offset: 2,
                    count: 3
                }],
            }
        );
        assert_ne!(header.request_id, 0, "a release waits for its answer");
        peer.send(&Frame::Ok, header.request_id).await;
        let (header, frame) = peer.recv_skipping_pings().await;
        assert_eq!(frame, Frame::Unsubscribe { consumer_id: 3 });
        peer.send(&Frame::Ok, header.request_id).await;
    };
    let client_side = async {
        let options = SubscribeOptions::new("jobs")
            .subscription("work")
            .credit(8)
            .limit(5);
        let mut subscription = client.subscribe(options).await.unwrap();
        for expected in 0..2 {
            let taken = subscription.next().await.unwrap().unwrap();
            assert_eq!(taken.offset, expected);
        }
        subscription.close_releasing(&[]).await.unwrap()
    };
    let ((), released) = within(async { tokio::join!(server_side, client_side) }).await;
    assert_eq!(released, 3);
}

#[tokio::test]
async fn a_limit_of_no_messages_is_refused() {
    let server = FakeServer::bind().await;
    let (client, _peer) = tokio::join!(
        Client::connect(server.addr.clone()),
        server.accept_ready(5_000)
    );
    let error = client
        .unwrap()
        .subscribe(SubscribeOptions::new("jobs").limit(0))
        .await
        .unwrap_err();
    assert!(error.to_string().contains("limit of 0"), "{error}");
}
