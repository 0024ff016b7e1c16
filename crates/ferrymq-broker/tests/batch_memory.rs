//! What a bounded memory topic keeps in memory when batches are larger than its bound: the
//! records that stay, not the whole batches they came in. Measured with a counting allocator, so
//! this binary holds this one test.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering::Relaxed};

use ferrymq_broker::{Broker, BrokerConfig};
use ferrymq_protocol::{Message, OverflowPolicy, TopicConfig};

struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Relaxed);
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(new_size as isize - layout.size() as isize, Relaxed);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

#[tokio::test]
async fn topics_bounded_below_the_batch_size_keep_only_what_stays() {
    const TOPICS: usize = 200;
    const BATCH: usize = 1000;
    const BOUND: u64 = 100;
    let broker = Broker::open(BrokerConfig::default());
    let batch: Vec<Message> = (0..BATCH)
        .map(|i| Message::new(format!("{i:0100}")))
        .collect();
    let before = LIVE.load(Relaxed);
    for t in 0..TOPICS {
        let name = format!("bounded-{t}");
        let config = TopicConfig {
            max_messages: BOUND,
            overflow: OverflowPolicy::DropOldest,
            ..Default::default()
        };
        broker.create_topic(&name, config, false).unwrap();
        broker.publish_messages(&name, &batch).await.unwrap();
    }
    let per_topic = (LIVE.load(Relaxed) - before) / TOPICS as isize;
    // Each topic keeps 100 records of about 110 bytes (11 KB), a log with slots for them and its
    // own structures: 17 KB here. Keeping the whole batches would add 99 KB per topic, and
    // storing the records that go before dropping them would grow the log's slots to the batch
    // (1024 × 40 bytes).
    assert!(
        per_topic < 30_000,
        "{per_topic} bytes per topic for {BOUND} messages of 100 bytes"
    );
    for t in [0, TOPICS - 1] {
        let info = broker.describe_topic(&format!("bounded-{t}")).unwrap();
        assert_eq!(info.messages, BOUND);
    }
}
