use super::*;
use std::time::Duration;

use crate::log::MemoryLog;

fn log_of(n: u64) -> MemoryLog {
    let mut log = MemoryLog::default();
    for i in 0..n {
        // Not real records: a first byte of 0 reads as priority 0.
        log.append(i, Bytes::from(format!("\0{i}")));
    }
    log
}

fn opts(auto_ack: bool, max_attempts: u32) -> CursorOptions {
    CursorOptions {
        name: "s".into(),
        auto_ack,
        max_attempts,
        ordered: false,
        history: 100,
    }
}

fn limits(count_max: u32) -> DeliverLimits {
    DeliverLimits {
        count_max,
        bytes_max: usize::MAX,
        in_flight_room: u32::MAX,
    }
}

fn take(
    c: &mut Cursor,
    log: &impl RecordSource,
    consumer: u64,
    n: u32,
    deadline: Instant,
) -> Vec<(u64, u16)> {
    let mut got = Vec::new();
    c.deliver(
        log,
        consumer,
        &limits(n),
        &clock_at(deadline),
        |o, _, a, _| got.push((o, a)),
    );
    got
}

/// A clock at `t` (Unix time 0 ms: nothing the tests publish at later times is due).
fn clock_at(t: Instant) -> DeliverClock {
    DeliverClock {
        now: t,
        unix_us: 0,
        deadline: t,
    }
}

#[test]
fn delivers_in_order_and_acks_advance_the_floor() {
    let log = log_of(5);
    let mut c = Cursor::new(1, opts(false, 5), 0);
    let t = Instant::now();
    assert_eq!(take(&mut c, &log, 7, 3, t), vec![(0, 1), (1, 1), (2, 1)]);
    assert_eq!(c.in_flight(), 3);
    assert_eq!(c.backlog(log.next_offset()), 2);
    assert_eq!(c.ack(7, 1, 2, 0, None), 1);
    assert_eq!(c.floor(), 0, "offset 0 still in flight");
    assert_eq!(c.ack(7, 0, 1, 0, None), 1);
    assert_eq!(c.floor(), 2);
    assert_eq!(c.ack(7, 0, 3, 0, None), 1);
    assert_eq!(c.floor(), 3);
    assert_eq!(c.in_flight(), 0);
}

#[test]
fn ack_from_another_consumer_or_twice_is_ignored() {
    let log = log_of(2);
    let mut c = Cursor::new(1, opts(false, 5), 0);
    take(&mut c, &log, 7, 2, Instant::now());
    assert_eq!(c.ack(8, 0, 2, 0, None), 0);
    assert_eq!(c.ack(7, 0, 1, 0, None), 1);
    assert_eq!(c.ack(7, 0, 1, 0, None), 0);
    assert_eq!(c.ack(7, 0, u64::MAX, 0, None), 1);
    assert_eq!(c.in_flight(), 0);
}

#[test]
fn expired_deliveries_come_back_with_the_next_attempt_first() {
    let log = log_of(4);
    let mut c = Cursor::new(1, opts(false, 5), 0);
    let t0 = Instant::now();
    take(&mut c, &log, 7, 2, t0 + Duration::from_millis(100));
    c.ack(7, 1, 2, 0, None);
    let mut expired_from = Vec::new();
    let r = c.fire_timers(t0 + Duration::from_millis(50), |who| expired_from.push(who));
    assert_eq!(r, Released::default());
    let r = c.fire_timers(t0 + Duration::from_millis(100), |who| {
        expired_from.push(who)
    });
    assert_eq!(r.requeued, 1);
    assert_eq!(expired_from, vec![7]);
    assert_eq!(
        take(&mut c, &log, 8, 2, t0 + Duration::from_secs(1)),
        vec![(0, 2), (2, 1)]
    );
    assert_eq!(
        c.ack(7, 0, 1, 0, None),
        0,
        "the old consumer's ack no longer counts"
    );
    assert_eq!(c.ack(8, 0, 1, 0, None), 1);
}

#[test]
fn a_late_ack_after_timeout_and_redelivery_does_not_settle_the_new_delivery() {
    let log = log_of(1);
    let mut c = Cursor::new(1, opts(false, 5), 0);
    let t0 = Instant::now();
    take(&mut c, &log, 7, 1, t0);
    c.fire_timers(t0, |_| {});
    take(&mut c, &log, 7, 1, t0 + Duration::from_secs(1));
    // Same consumer got it again: an ack now settles the current delivery, once.
    assert_eq!(c.ack(7, 0, 1, 0, None), 1);
    assert_eq!(
        c.fire_timers(t0 + Duration::from_secs(5), |_| {}),
        Released::default()
    );
    assert_eq!(c.backlog(log.next_offset()), 0);
}

#[test]
fn gives_up_after_max_attempts() {
    let log = log_of(1);
    let mut c = Cursor::new(1, opts(false, 3), 0);
    let t0 = Instant::now();
    for attempt in 1..=3u16 {
        assert_eq!(take(&mut c, &log, 7, 1, t0), vec![(0, attempt)]);
        let r = c.nack(7, 0, 1, None, true);
        if attempt < 3 {
            assert_eq!(r.requeued, 1);
        } else {
            assert_eq!(r.gave_up, 1);
        }
    }
    // On its way to the dead-letter topic: not delivered again, not yet settled.
    assert!(take(&mut c, &log, 7, 1, t0).is_empty());
    assert_eq!(c.floor(), 0);
    assert_eq!(
        c.take_dead(),
        vec![GivenUp {
            offset: 0,
            attempts: 3
        }]
    );
    assert!(c.take_dead().is_empty());
    assert!(c.settle_dead(0, 0, "max_attempts", None));
    assert_eq!(c.floor(), 1);
    assert!(!c.settle_dead(0, 0, "max_attempts", None));
}

#[test]
fn messages_before_the_start_are_not_the_subscriptions() {
    let log = log_of(8);
    let mut c = Cursor::new(1, opts(false, 5), 5);
    let state = |c: &Cursor, offset| c.entry(offset, log.next_offset()).unwrap().state;
    assert_eq!(state(&c, 4), MessageState::BeforeStart);
    assert_eq!(state(&c, 5), MessageState::Pending);
    // A restored cursor knows only its floor until told where the subscription began.
    c = Cursor::restore(1, opts(false, 5), 6, &[], 0, 8);
    assert_eq!(state(&c, 4), MessageState::Settled);
    c.set_start(5);
    assert_eq!(state(&c, 4), MessageState::BeforeStart);
    assert_eq!(state(&c, 5), MessageState::Settled);
}

#[test]
fn a_release_does_not_count_an_attempt() {
    let log = log_of(2);
    let mut c = Cursor::new(1, opts(false, 1), 0);
    let t0 = Instant::now();
    // With max_attempts 1 a counted nack would give it up at once.
    for _ in 0..3 {
        assert_eq!(take(&mut c, &log, 7, 1, t0), vec![(0, 1)]);
        let r = c.nack(7, 0, 1, None, false);
        assert_eq!(
            r,
            Released {
                requeued: 1,
                gave_up: 0
            }
        );
    }
    assert!(c.take_dead().is_empty());
    assert_eq!(take(&mut c, &log, 7, 2, t0), vec![(0, 1), (1, 1)]);
    c.ack(7, 0, 2, 1, None);
    assert_eq!(c.floor(), 2);
}

#[test]
fn a_released_message_delivered_again_keeps_its_new_ack_deadline() {
    let log = log_of(1);
    let mut c = Cursor::new(1, opts(false, 5), 0);
    let t0 = Instant::now();
    let clock = |after_s: u64| DeliverClock {
        now: t0 + Duration::from_secs(after_s),
        unix_us: (1_000 + after_s) * 1_000_000,
        deadline: t0 + Duration::from_secs(after_s + 10),
    };
    let mut got = Vec::new();
    c.deliver(&log, 7, &limits(1), &clock(0), |o, _, a, _| {
        got.push((o, a))
    });
    c.nack(7, 0, 1, None, false);
    c.deliver(&log, 8, &limits(1), &clock(5), |o, _, a, _| {
        got.push((o, a))
    });
    // The same attempt twice: the first delivery's deadline must not expire the second.
    assert_eq!(got, vec![(0, 1), (0, 1)]);
    let mut expired = Vec::new();
    c.fire_timers(t0 + Duration::from_secs(10), |consumer| {
        expired.push(consumer)
    });
    assert!(expired.is_empty());
    assert_eq!(c.in_flight(), 1);
    c.fire_timers(t0 + Duration::from_secs(15), |consumer| {
        expired.push(consumer)
    });
    assert_eq!(expired, vec![8]);
}

#[test]
fn delayed_nack_waits_for_its_due_time() {
    let log = log_of(1);
    let mut c = Cursor::new(1, opts(false, 5), 0);
    let t0 = Instant::now();
    take(&mut c, &log, 7, 1, t0 + Duration::from_secs(60));
    c.nack(7, 0, 1, Some((t0 + Duration::from_secs(2), 0)), true);
    assert!(!c.has_ready(log.next_offset()));
    assert_eq!(c.backlog(log.next_offset()), 1);
    c.fire_timers(t0 + Duration::from_secs(1), |_| {});
    assert!(take(&mut c, &log, 7, 1, t0).is_empty());
    c.fire_timers(t0 + Duration::from_secs(2), |_| {});
    assert_eq!(take(&mut c, &log, 7, 1, t0), vec![(0, 2)]);
}

#[test]
fn a_leaving_consumer_returns_only_its_own_messages() {
    let log = log_of(4);
    let mut c = Cursor::new(1, opts(false, 5), 0);
    let t = Instant::now();
    take(&mut c, &log, 7, 2, t);
    take(&mut c, &log, 8, 2, t);
    let r = c.release_consumer(7);
    assert_eq!(r.requeued, 2);
    assert_eq!(c.in_flight(), 2);
    assert_eq!(take(&mut c, &log, 8, 10, t), vec![(0, 2), (1, 2)]);
}

#[test]
fn respects_count_bytes_and_in_flight_room() {
    let log = log_of(10);
    let mut c = Cursor::new(1, opts(false, 5), 0);
    let t = Instant::now();
    let d = c.deliver(
        &log,
        7,
        &DeliverLimits {
            count_max: 10,
            bytes_max: 4,
            in_flight_room: 10,
        },
        &clock_at(t),
        |_, _, _, _| {},
    );
    assert_eq!(d.count, 2, "two 2-byte records fit in 4 bytes");
    let d = c.deliver(
        &log,
        7,
        &DeliverLimits {
            count_max: 10,
            bytes_max: 1,
            in_flight_room: 10,
        },
        &clock_at(t),
        |_, _, _, _| {},
    );
    assert_eq!(
        d.count, 1,
        "one record always goes even if over the byte budget"
    );
    let d = c.deliver(
        &log,
        7,
        &DeliverLimits {
            count_max: 10,
            bytes_max: 100,
            in_flight_room: 4,
        },
        &clock_at(t),
        |_, _, _, _| {},
    );
    assert_eq!(d.count, 4);
}

#[test]
fn auto_ack_keeps_no_state() {
    let log = log_of(3);
    let mut c = Cursor::new(1, opts(true, 5), 0);
    assert_eq!(take(&mut c, &log, 7, 10, Instant::now()).len(), 3);
    assert_eq!(c.floor(), 3);
    assert_eq!(c.in_flight(), 0);
    assert!(!c.has_timers());
}

#[test]
fn dropping_below_the_floor_loses_unsettled_messages_and_frees_in_flight() {
    let log = log_of(6);
    let mut c = Cursor::new(1, opts(false, 5), 0);
    let t = Instant::now();
    take(&mut c, &log, 7, 2, t);
    c.ack(7, 0, 1, 0, None);
    let mut freed = Vec::new();
    // offsets: 0 settled, 1 in flight, 2..6 never delivered; drop below 4.
    let lost = c.drop_below(4, |who| freed.push(who));
    assert_eq!(lost, 2, "2 and 3 were never received; 1 was");
    assert_eq!(freed, vec![7]);
    assert_eq!(c.floor(), 4);
    assert_eq!(c.in_flight(), 0);
}

#[test]
fn a_restored_cursor_redelivers_exactly_what_was_not_settled() {
    let log = log_of(10);
    let mut c = Cursor::new(1, opts(false, 5), 0);
    let t = Instant::now();
    take(&mut c, &log, 7, 8, t);
    c.ack(7, 0, 2, 0, None);
    c.ack(7, 3, 4, 0, None);
    c.ack(7, 5, 7, 0, None);
    assert_eq!(c.floor(), 2);
    assert_eq!(c.settled_runs(), vec![(3, 4), (5, 7)]);
    let mut r = Cursor::restore(1, opts(false, 5), c.floor(), &c.settled_runs(), 0, 10);
    assert_eq!(r.floor(), 2);
    let got: Vec<u64> = take(&mut r, &log, 9, 100, t).iter().map(|g| g.0).collect();
    assert_eq!(got, vec![2, 4, 7, 8, 9]);
}

#[test]
fn a_restored_cursor_is_clamped_to_what_the_log_holds() {
    // The log lost its tail (8..) and retention moved its start to 3.
    let r = Cursor::restore(1, opts(false, 5), 1, &[(5, 12)], 3, 8);
    assert_eq!(r.floor(), 3);
    assert_eq!(r.backlog(8), 2, "3 and 4 are ready, 5..8 settled");
    let r = Cursor::restore(1, opts(false, 5), 20, &[], 3, 8);
    assert_eq!(r.floor(), 8);
}

#[test]
fn truncating_forgets_offsets_beyond_the_new_end() {
    let log = log_of(10);
    let mut c = Cursor::new(1, opts(false, 5), 0);
    take(&mut c, &log, 7, 10, Instant::now());
    c.ack(7, 0, 3, 0, None);
    let mut released = Vec::new();
    c.truncate_to(6, |consumer| released.push(consumer));
    assert_eq!(released, vec![7; 4]);
    assert_eq!(c.in_flight(), 3);
    assert_eq!(c.backlog(6), 0);
    c.truncate_to(1, |_| {});
    assert_eq!(c.floor(), 1);
    assert_eq!(c.in_flight(), 0);
}

/// A log of real records published at Unix ms 1000, with the given delays.
fn delayed_log(delays: &[Option<u64>]) -> MemoryLog {
    let mut log = MemoryLog::default();
    for (i, delay) in delays.iter().enumerate() {
        let message = ferrymq_protocol::Message {
            deliver_after_ms: *delay,
            ..ferrymq_protocol::Message::new(format!("m{i}"))
        };
        let batch = ferrymq_protocol::RecordBatch::from_messages(&[message]).unwrap();
        log.append(1_000_000, batch.bytes().clone());
    }
    log
}

fn deliver_at(c: &mut Cursor, log: &MemoryLog, now: Instant, unix_ms: u64) -> Vec<(u64, u16)> {
    let clock = DeliverClock {
        now,
        unix_us: unix_ms * 1000,
        deadline: now + Duration::from_secs(30),
    };
    let mut got = Vec::new();
    c.deliver(log, 7, &limits(100), &clock, |o, _, a, _| got.push((o, a)));
    got
}

#[test]
fn a_delayed_message_waits_for_its_time_and_the_ones_behind_it_flow() {
    let log = delayed_log(&[Some(100), None, Some(50), None]);
    for auto_ack in [false, true] {
        let mut c = Cursor::new(1, opts(auto_ack, 5), 0);
        let t = Instant::now();
        assert_eq!(deliver_at(&mut c, &log, t, 1000), vec![(1, 1), (3, 1)]);
        assert!(c.has_timers());
        assert_eq!(c.backlog(4), 2, "two delayed messages wait");
        assert_eq!(c.floor(), 0);
        assert!(!c.has_ready(4), "nothing to poll for until a delay passes");
        c.fire_timers(t + Duration::from_millis(49), |_| {});
        assert!(deliver_at(&mut c, &log, t, 1049).is_empty());
        c.fire_timers(t + Duration::from_millis(50), |_| {});
        assert_eq!(deliver_at(&mut c, &log, t, 1050), vec![(2, 1)]);
        c.fire_timers(t + Duration::from_millis(100), |_| {});
        assert_eq!(deliver_at(&mut c, &log, t, 1100), vec![(0, 1)]);
        if auto_ack {
            assert_eq!(c.floor(), 4, "auto-ack settles each as it goes");
        } else {
            assert_eq!(c.in_flight(), 4);
            c.ack(7, 0, 4, 0, None);
            assert_eq!(c.floor(), 4);
        }
        assert!(!c.has_timers());
    }
}

#[test]
fn a_restored_cursor_keeps_a_delay_that_has_not_passed() {
    let log = delayed_log(&[None, Some(1000), None]);
    // Offset 0 was settled, 1 held, 2 settled before the restart.
    let mut c = Cursor::restore(1, opts(false, 5), 0, &[(0, 1), (2, 3)], 0, 3);
    let t = Instant::now();
    assert!(deliver_at(&mut c, &log, t, 1500).is_empty());
    assert!(c.has_timers());
    c.fire_timers(t + Duration::from_millis(500), |_| {});
    assert_eq!(deliver_at(&mut c, &log, t, 2000), vec![(1, 1)]);
}

#[test]
fn latencies_run_from_publish_or_the_end_of_a_delay_to_first_delivery_and_to_ack() {
    use ferrymq_protocol::latency_bucket;
    // Published at Unix µs 1 000 000; the third one is delayed by 100 ms.
    let log = delayed_log(&[None, None, Some(100)]);
    let mut c = Cursor::new(1, opts(false, 5), 0);
    let t = Instant::now();
    let clock = |unix_us| DeliverClock {
        now: t,
        unix_us,
        deadline: t + Duration::from_secs(30),
    };
    let mut got = Vec::new();
    let mut take = |c: &mut Cursor, unix_us| {
        got.clear();
        c.deliver(&log, 7, &limits(10), &clock(unix_us), |o, _, a, _| {
            got.push((o, a))
        });
        got.clone()
    };
    assert_eq!(take(&mut c, 1_000_250), vec![(0, 1), (1, 1)]);
    // A redelivery is not a first delivery: it adds nothing to the deliver latency.
    c.nack(7, 1, 2, None, true);
    assert_eq!(take(&mut c, 1_000_400), vec![(1, 2)]);
    c.fire_timers(t + Duration::from_millis(100), |_| {});
    // Due at 1 100 000 µs, delivered 30 µs later: its 100 ms delay is not latency.
    assert_eq!(take(&mut c, 1_100_030), vec![(2, 1)]);
    let deliver = c.latencies().deliver.to_latency();
    let one = |us: u64| latency_bucket(us) as u16;
    assert_eq!(deliver.buckets, vec![(one(30), 1), (one(250), 2)]);
    assert_eq!(deliver.sum_us, 530);

    assert_eq!(c.ack(7, 0, 3, 1_101_000, None), 3);
    let ack = c.latencies().ack.to_latency();
    // 0 and 1: published 101 ms before the ack (1 redelivered meanwhile); 2: due 1 ms before.
    assert_eq!(ack.buckets, vec![(one(1_000), 1), (one(101_000), 2)]);
    assert_eq!(ack.sum_us, 203_000);
    // An ack of what is no longer in flight records nothing.
    assert_eq!(c.ack(7, 0, 3, 1_200_000, None), 0);
    assert_eq!(c.latencies().ack.to_latency().count(), 3);
}

/// A log of records with the given keys and priorities, published at Unix ms 1000.
fn keyed_log(messages: &[(Option<&str>, u8)]) -> MemoryLog {
    let mut log = MemoryLog::default();
    for (i, (key, priority)) in messages.iter().enumerate() {
        let message = ferrymq_protocol::Message {
            key: key.map(|k| Bytes::copy_from_slice(k.as_bytes())),
            priority: *priority,
            ..ferrymq_protocol::Message::new(format!("m{i}"))
        };
        let batch = ferrymq_protocol::RecordBatch::from_messages(&[message]).unwrap();
        log.append(1_000_000, batch.bytes().clone());
    }
    log
}

fn ordered() -> CursorOptions {
    CursorOptions {
        ordered: true,
        ..opts(false, 5)
    }
}

fn offsets(got: Vec<(u64, u16)>) -> Vec<u64> {
    got.into_iter().map(|(o, _)| o).collect()
}

#[test]
fn higher_priority_goes_first_and_equal_priority_keeps_publish_order() {
    let log = keyed_log(&[(None, 0), (None, 5), (None, 0), (None, 9), (None, 5)]);
    for auto_ack in [false, true] {
        let mut c = Cursor::new(1, opts(auto_ack, 5), 0);
        let got = offsets(take(&mut c, &log, 7, 2, Instant::now()));
        assert_eq!(got, vec![3, 1]);
        let got = offsets(take(&mut c, &log, 7, 10, Instant::now()));
        assert_eq!(got, vec![4, 0, 2]);
    }
}

#[test]
fn a_redelivery_keeps_its_priority() {
    let log = keyed_log(&[(None, 0), (None, 0), (None, 7), (None, 0)]);
    let mut c = Cursor::new(1, opts(false, 5), 0);
    let t = Instant::now();
    assert_eq!(offsets(take(&mut c, &log, 7, 10, t)), vec![2, 0, 1, 3]);
    c.nack(7, 0, 4, None, true);
    assert_eq!(
        take(&mut c, &log, 7, 10, t),
        vec![(2, 2), (0, 2), (1, 2), (3, 2)]
    );
}

#[test]
fn without_priorities_nothing_is_taken_ahead() {
    let log = log_of(100);
    let mut c = Cursor::new(1, opts(false, 5), 0);
    take(&mut c, &log, 7, 2, Instant::now());
    assert_eq!(c.slots.len(), 2, "the window holds only what was delivered");
    assert!(c.ready.is_empty());
}

#[test]
fn ordered_keeps_one_message_per_key_in_flight_and_other_keys_flow() {
    // A0 A1 B0 A2 B1 C0 N0 N1 (N: no key)
    let log = keyed_log(&[
        (Some("a"), 0),
        (Some("a"), 0),
        (Some("b"), 0),
        (Some("a"), 0),
        (Some("b"), 0),
        (Some("c"), 0),
        (None, 0),
        (None, 0),
    ]);
    let mut c = Cursor::new(1, ordered(), 0);
    let t = Instant::now();
    assert_eq!(offsets(take(&mut c, &log, 7, 100, t)), vec![0, 2, 5, 6]);
    assert_eq!(c.backlog(8), 4, "A1, A2, B1 and N1 wait behind their keys");
    assert!(
        take(&mut c, &log, 8, 100, t).is_empty(),
        "another consumer gets none of them"
    );
    assert!(!c.has_ready(8));
    c.ack(7, 0, 1, 0, None);
    assert_eq!(c.take_promoted(), 1);
    assert_eq!(offsets(take(&mut c, &log, 8, 100, t)), vec![1]);
    // B0 comes back (nack): B1 still waits for it.
    c.nack(7, 2, 3, None, true);
    assert_eq!(take(&mut c, &log, 8, 100, t), vec![(2, 2)]);
    c.ack(8, 2, 3, 0, None);
    c.ack(7, 6, 7, 0, None);
    assert_eq!(offsets(take(&mut c, &log, 7, 100, t)), vec![4, 7]);
    c.ack(8, 1, 2, 0, None);
    assert_eq!(offsets(take(&mut c, &log, 7, 100, t)), vec![3]);
    c.ack(7, 0, 8, 0, None);
    assert_eq!(c.floor(), 8);
    assert!(c.ordered.as_ref().unwrap().keys.is_empty());
    assert!(c.ordered.as_ref().unwrap().owner_of.is_empty());
}

#[test]
fn ordered_redelivery_after_a_timeout_keeps_the_key() {
    let log = keyed_log(&[(Some("a"), 0), (Some("a"), 0)]);
    let mut c = Cursor::new(1, ordered(), 0);
    let t0 = Instant::now();
    assert_eq!(take(&mut c, &log, 7, 10, t0), vec![(0, 1)]);
    c.fire_timers(t0, |_| {});
    // The late ack of the first delivery changes nothing; the redelivery goes first.
    assert_eq!(c.ack(7, 0, 1, 0, None), 0);
    assert_eq!(take(&mut c, &log, 8, 10, t0), vec![(0, 2)]);
    assert_eq!(c.ack(8, 0, 1, 0, None), 1);
    assert_eq!(take(&mut c, &log, 8, 10, t0), vec![(1, 1)]);
}

#[test]
fn ordered_key_moves_on_when_its_message_is_given_up() {
    let log = keyed_log(&[(Some("a"), 0), (Some("a"), 0)]);
    let mut c = Cursor::new(
        1,
        CursorOptions {
            max_attempts: 1,
            ..ordered()
        },
        0,
    );
    let t = Instant::now();
    take(&mut c, &log, 7, 10, t);
    let r = c.nack(7, 0, 1, None, true);
    assert_eq!(r.gave_up, 1);
    assert_eq!(r.requeued, 1, "the next message of the key became ready");
    assert_eq!(offsets(take(&mut c, &log, 7, 10, t)), vec![1]);
    let mut c2 = Cursor::new(1, ordered(), 0);
    take(&mut c2, &log, 7, 10, t);
    assert_eq!(c2.give_up(7, 0, 1), 1);
    assert_eq!(offsets(take(&mut c2, &log, 7, 10, t)), vec![1]);
}

#[test]
fn order_within_a_key_wins_over_priority() {
    // A0 (0), A1 (9), B0 (5)
    let log = keyed_log(&[(Some("a"), 0), (Some("a"), 9), (Some("b"), 5)]);
    let mut c = Cursor::new(1, ordered(), 0);
    let t = Instant::now();
    assert_eq!(offsets(take(&mut c, &log, 7, 10, t)), vec![2, 0]);
    c.ack(7, 0, 1, 0, None);
    assert_eq!(offsets(take(&mut c, &log, 7, 10, t)), vec![1]);
}

#[test]
fn dropping_below_an_ordered_window_hands_the_key_on() {
    let log = keyed_log(&[(Some("a"), 0), (Some("a"), 0), (Some("a"), 0)]);
    let mut c = Cursor::new(1, ordered(), 0);
    let t = Instant::now();
    take(&mut c, &log, 7, 10, t);
    let mut freed = Vec::new();
    assert_eq!(
        c.drop_below(2, |who| freed.push(who)),
        1,
        "offset 1 was never received"
    );
    assert_eq!(freed, vec![7]);
    assert_eq!(offsets(take(&mut c, &log, 7, 10, t)), vec![2]);
}

#[test]
fn status_tells_each_state_and_the_history_is_bounded() {
    let log = log_of(6);
    let mut c = Cursor::new(
        1,
        CursorOptions {
            history: 2,
            ..opts(false, 5)
        },
        0,
    );
    let t = Instant::now();
    let clock = DeliverClock {
        now: t,
        unix_us: 5_000_000,
        deadline: t + Duration::from_secs(30),
    };
    c.deliver(&log, 7, &limits(4), &clock, |_, _, _, _| {});
    c.ack(7, 0, 1, 6_000_000, Some(b"done"));
    c.nack(7, 2, 3, Some((t + Duration::from_secs(9), 14_000)), true);
    let e = c.entry(0, 6).unwrap();
    assert_eq!(e.state, MessageState::Acked);
    assert_eq!(&e.result[..], b"done");
    assert_eq!(
        (e.attempts, e.first_delivered_ms, e.settled_ms),
        (1, 5_000, 6_000)
    );
    let e = c.entry(1, 6).unwrap();
    assert_eq!((e.state, e.due_ms), (MessageState::InFlight, 35_000));
    let e = c.entry(2, 6).unwrap();
    assert_eq!(
        (e.state, e.due_ms, e.attempts),
        (MessageState::Delayed, 14_000, 1)
    );
    assert_eq!(c.entry(5, 6).unwrap().state, MessageState::Pending);
    assert!(c.entry(6, 6).is_none());

    let (pending, more) = c.list_window(false, 0, 2, 6);
    assert_eq!(
        pending.iter().map(|e| e.offset).collect::<Vec<_>>(),
        vec![2, 4]
    );
    assert_eq!(more, Some(5));
    let (pending, more) = c.list_window(false, 5, 2, 6);
    assert_eq!(
        pending.iter().map(|e| e.offset).collect::<Vec<_>>(),
        vec![5]
    );
    assert_eq!(more, None);
    let (flying, _) = c.list_window(true, 0, 10, 6);
    assert_eq!(
        flying.iter().map(|e| e.offset).collect::<Vec<_>>(),
        vec![1, 3]
    );

    c.ack(7, 1, 2, 7_000, None);
    c.ack(7, 3, 4, 8_000, None);
    let history: Vec<u64> = c.history(false).iter().map(|e| e.offset).collect();
    assert_eq!(history, vec![3, 1], "newest first, two kept");
    assert_eq!(c.entry(0, 6).unwrap().state, MessageState::Settled);

    c.fire_timers(t + Duration::from_secs(9), |_| {});
    take(&mut c, &log, 7, 1, t);
    assert_eq!(c.give_up(7, 2, 3), 1);
    assert_eq!(c.entry(2, 6).unwrap().state, MessageState::DeadLettered);
    assert!(c.settle_dead(2, 9_000, "bad input", Some((0, 41))));
    let e = c.entry(2, 6).unwrap();
    assert_eq!(
        (e.state, e.attempts, e.settled_ms),
        (MessageState::DeadLettered, 2, 9_000)
    );
    assert_eq!(
        (e.reason.as_str(), e.dead_letter),
        ("bad input", Some((0, 41)))
    );
    assert_eq!(c.history(true).len(), 1);
}

#[test]
fn the_history_survives_its_encoding_and_refuses_garbage() {
    let log = log_of(4);
    let mut c = Cursor::new(1, opts(false, 5), 0);
    let t = Instant::now();
    take(&mut c, &log, 7, 4, t);
    c.ack(7, 0, 1, 100_000, Some(b"ok"));
    c.ack(7, 1, 2, 200_999, None);
    c.give_up(7, 2, 3);
    c.settle_dead(2, 300, "bad", Some((0, 9)));
    let saved = c.encode_history();
    let mut r = Cursor::restore(1, opts(false, 5), 3, &[], 0, 4);
    assert!(r.restore_history(&saved));
    assert_eq!(r.encode_history(), saved);
    let e = r.entry(0, 4).unwrap();
    assert_eq!(
        (e.state, &e.result[..], e.settled_ms),
        (MessageState::Acked, &b"ok"[..], 100)
    );
    let e = r.entry(2, 4).unwrap();
    assert_eq!(
        (e.state, e.reason.as_str()),
        (MessageState::DeadLettered, "bad")
    );
    for cut in 0..saved.len() {
        assert!(!r.restore_history(&saved[..cut]), "cut at {cut}");
    }
    let mut longer = saved.clone();
    longer.push(0);
    assert!(!r.restore_history(&longer));
}

#[test]
fn a_requeued_dead_letter_goes_only_to_its_subscription() {
    let mut log = MemoryLog::default();
    for target in [None, Some("other"), Some("s")] {
        let mut message = ferrymq_protocol::Message::new("x");
        if let Some(target) = target {
            message
                .headers
                .push((crate::headers::HEADER_REQUEUE_FOR.into(), target.into()));
        }
        let batch = ferrymq_protocol::RecordBatch::from_messages(&[message]).unwrap();
        log.append(1_000_000, batch.bytes().clone());
    }
    let mut c = Cursor::new(1, opts(false, 5), 0);
    assert_eq!(
        offsets(take(&mut c, &log, 7, 10, Instant::now())),
        vec![0, 2]
    );
    let mut other = Cursor::new(
        2,
        CursorOptions {
            name: "other".into(),
            ..opts(false, 5)
        },
        0,
    );
    assert_eq!(
        offsets(take(&mut other, &log, 7, 10, Instant::now())),
        vec![0, 1]
    );
    other.ack(7, 0, 2, 0, None);
    assert_eq!(other.floor(), 3, "the one meant for 's' is settled here");
}

#[test]
fn a_restored_cursor_keeps_its_settled_runs_until_it_passes_them() {
    let r = Cursor::restore(1, opts(false, 5), 2, &[(4, 6), (8, 9)], 0, 10);
    assert_eq!(r.settled_runs(), vec![(4, 6), (8, 9)]);
    let r2 = Cursor::restore(1, opts(false, 5), r.floor(), &r.settled_runs(), 0, 10);
    assert_eq!(r2.settled_runs(), vec![(4, 6), (8, 9)]);
}

#[test]
fn a_restored_cursor_delivers_by_priority_again() {
    let log = keyed_log(&[(None, 0), (None, 0), (None, 9)]);
    let mut c = Cursor::restore(1, opts(false, 5), 0, &[(1, 2)], 0, 3);
    assert_eq!(
        offsets(take(&mut c, &log, 7, 10, Instant::now())),
        vec![2, 0]
    );
}
