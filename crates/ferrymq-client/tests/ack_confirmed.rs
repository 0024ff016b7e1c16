//! `Subscription::ack_confirmed` against a scripted fake server: the ACK carries a request id,
//! goes out after the lazy acks queued before it, and the call returns only with the server's
//! answer (OK, ERROR, or the connection's end).

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::{within, FakeServer, Peer};
use ferrymq_client::protocol::limits::RANGES_COUNT_MAX;
use ferrymq_client::{Client, ClientConfig, Error, ErrorCode, OffsetRange, SubscribeOptions};
use ferrymq_protocol::Frame;

/// A client whose lazy acks would wait 10 s for company: anything written earlier than that was
/// taken along by a more urgent frame.
async fn connect(server: &FakeServer) -> (Client, Peer) {
    let mut config = ClientConfig::new(server.addr.clone());
    config.ack_flush_delay = Duration::from_secs(10);
    let (client, peer) = tokio::join!(Client::connect_with(config), server.accept_ready(5_000));
    (client.unwrap(), peer)
}

/// Answers the SUBSCRIBE with consumer id 7.
async fn accept_subscribe(peer: &mut Peer) {
    let (header, frame) = peer.recv_skipping_pings().await;
    assert!(matches!(frame, Frame::Subscribe(_)), "{}", frame.name());
    peer.send(
        &Frame::Subscribed {
            consumer_id: 7,
            subscription: "s".into(),
            partitions: 2,
        },
        header.request_id,
    )
    .await;
}

fn run(partition: u32, offset: u64, count: u32) -> OffsetRange {
    OffsetRange {
        partition,
        offset,
        count,
    }
}

#[tokio::test]
async fn lazy_acks_go_first_and_the_call_waits_for_ok() {
    let server = FakeServer::bind().await;
    let (client, mut peer) = connect(&server).await;
    let returned = AtomicBool::new(false);
    let server_side = async {
        accept_subscribe(&mut peer).await;
        let (header, frame) = peer.recv_skipping_pings().await;
        assert_eq!(header.request_id, 0, "the lazy acks carry no request id");
        assert_eq!(
            frame,
            Frame::Ack {
                consumer_id: 7,
                ranges: vec![run(0, 0, 2)]
            }
        );
        let (header, frame) = peer.recv_skipping_pings().await;
        assert_ne!(header.request_id, 0, "the confirmed ack asks for an answer");
        assert_eq!(
            frame,
            Frame::Ack {
                consumer_id: 7,
                ranges: vec![run(0, 2, 3), run(1, 0, 1)]
            },
            "not merged into the lazy frame before it"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(
            !returned.load(Ordering::SeqCst),
            "ack_confirmed returned before the server answered"
        );
        peer.send(&Frame::Ok, header.request_id).await;
    };
    let client_side = async {
        let subscription = client
            .subscribe(SubscribeOptions::new("t").subscription("s"))
            .await
            .unwrap();
        subscription
            .ack_ranges(&[OffsetRange::single(0, 0)])
            .await
            .unwrap();
        subscription
            .ack_ranges(&[OffsetRange::single(0, 1)])
            .await
            .unwrap();
        subscription
            .ack_confirmed(&[run(0, 2, 3), run(1, 0, 1)])
            .await
            .unwrap();
        returned.store(true, Ordering::SeqCst);
        subscription
    };
    let ((), _subscription) = within(async { tokio::join!(server_side, client_side) }).await;
    assert_eq!(client.async_error_count(), 0);
}

#[tokio::test]
async fn a_refused_confirmed_ack_returns_the_server_error() {
    let server = FakeServer::bind().await;
    let (client, mut peer) = connect(&server).await;
    let server_side = async {
        accept_subscribe(&mut peer).await;
        let (header, frame) = peer.recv_skipping_pings().await;
        assert!(matches!(frame, Frame::Ack { .. }), "{}", frame.name());
        peer.send(
            &Frame::error(ErrorCode::StorageUnavailable, "disk full"),
            header.request_id,
        )
        .await;
        // The connection stays usable: the next confirmed ack gets its own answer.
        let (header, frame) = peer.recv_skipping_pings().await;
        assert!(matches!(frame, Frame::Ack { .. }), "{}", frame.name());
        peer.send(&Frame::Ok, header.request_id).await;
    };
    let client_side = async {
        let subscription = client
            .subscribe(SubscribeOptions::new("t").subscription("s"))
            .await
            .unwrap();
        let error = subscription
            .ack_confirmed(&[OffsetRange::single(0, 5)])
            .await
            .expect_err("the server refused");
        assert_eq!(error.code(), Some(ErrorCode::StorageUnavailable), "{error}");
        subscription
            .ack_confirmed(&[OffsetRange::single(0, 5)])
            .await
            .unwrap();
        assert!(
            subscription.ack_confirmed(&[]).await.is_ok(),
            "nothing to ack is done at once"
        );
        subscription
    };
    let ((), _subscription) = within(async { tokio::join!(server_side, client_side) }).await;
    assert_eq!(
        client.async_error_count(),
        0,
        "the refusal went to the caller, not to the async error count"
    );
}

#[tokio::test]
async fn connection_loss_while_waiting_is_a_connection_error() {
    let server = FakeServer::bind().await;
    let (client, mut peer) = connect(&server).await;
    let server_side = async {
        accept_subscribe(&mut peer).await;
        let (_, frame) = peer.recv_skipping_pings().await;
        assert!(matches!(frame, Frame::Ack { .. }), "{}", frame.name());
        drop(peer);
    };
    let client_side = async {
        let subscription = client
            .subscribe(SubscribeOptions::new("t").subscription("s"))
            .await
            .unwrap();
        let error = subscription
            .ack_confirmed(&[OffsetRange::single(1, 9)])
            .await
            .expect_err("no answer can come");
        assert!(error.is_connection_error(), "{error}");
        subscription
    };
    let ((), _subscription) = within(async { tokio::join!(server_side, client_side) }).await;
}

#[tokio::test]
async fn more_ranges_than_one_frame_holds_need_every_frame_confirmed() {
    let server = FakeServer::bind().await;
    let (client, mut peer) = connect(&server).await;
    let total = RANGES_COUNT_MAX as usize + 3;
    // Every other offset, so that no two ranges merge.
    let ranges: Vec<OffsetRange> = (0..total as u64)
        .map(|i| OffsetRange::single(0, i * 2))
        .collect();
    let server_side = async {
        accept_subscribe(&mut peer).await;
        let mut seen = Vec::new();
        let mut ids = Vec::new();
        while seen.len() < total {
            let (header, frame) = peer.recv_skipping_pings().await;
            let Frame::Ack {
                consumer_id,
                ranges,
            } = frame
            else {
                panic!("expected ACK, got {}", frame.name())
            };
            assert_eq!(consumer_id, 7);
            assert_ne!(header.request_id, 0);
            seen.extend(ranges);
            ids.push(header.request_id);
        }
        assert_eq!(ids.len(), 2, "one frame per {RANGES_COUNT_MAX} ranges");
        assert_ne!(ids[0], ids[1]);
        assert_eq!(seen, ranges);
        // Answered out of order: the call waits for both.
        peer.send(&Frame::Ok, ids[1]).await;
        peer.send(&Frame::Ok, ids[0]).await;
    };
    let client_side = async {
        let subscription = client
            .subscribe(SubscribeOptions::new("t").subscription("s"))
            .await
            .unwrap();
        subscription.ack_confirmed(&ranges).await.unwrap();
        subscription
    };
    let ((), _subscription) = within(async { tokio::join!(server_side, client_side) }).await;
}

#[tokio::test]
async fn one_refused_frame_of_many_fails_the_call() {
    let server = FakeServer::bind().await;
    let (client, mut peer) = connect(&server).await;
    let total = RANGES_COUNT_MAX as usize + 1;
    let ranges: Vec<OffsetRange> = (0..total as u64)
        .map(|i| OffsetRange::single(1, i * 2))
        .collect();
    let server_side = async {
        accept_subscribe(&mut peer).await;
        let mut ids = Vec::new();
        let mut count = 0;
        while count < total {
            let (header, frame) = peer.recv_skipping_pings().await;
            let Frame::Ack { ranges, .. } = frame else {
                panic!("expected ACK, got {}", frame.name())
            };
            count += ranges.len();
            ids.push(header.request_id);
        }
        peer.send(&Frame::Ok, ids[0]).await;
        peer.send(&Frame::error(ErrorCode::Internal, "could not save"), ids[1])
            .await;
    };
    let client_side = async {
        let subscription = client
            .subscribe(SubscribeOptions::new("t").subscription("s"))
            .await
            .unwrap();
        let error = subscription
            .ack_confirmed(&ranges)
            .await
            .expect_err("the second frame was refused");
        assert!(
            matches!(
                &error,
                Error::Server {
                    code: ErrorCode::Internal,
                    ..
                }
            ),
            "{error}"
        );
        subscription
    };
    let ((), _subscription) = within(async { tokio::join!(server_side, client_side) }).await;
}
