//! The README's "As a library" example, word for word between the markers, so that it compiles
//! with the crate; `tests/readme.rs` checks that the README still shows exactly this and runs it.
//!
//!     cargo run -p ferrymq-broker --example readme_library

use ferrymq_broker::{Broker, BrokerConfig};
use ferrymq_protocol::{Message, OffsetRange, StartPosition, SubscribeRequest};

/// Runs the example and hands back its broker, for the test to look at.
pub async fn readme_example() -> Result<Broker, Box<dyn std::error::Error>> {
    // README: begin
    // Memory topics, inside a tokio runtime; for disk topics:
    // Broker::open_durable(config, ferrymq_broker::DiskConfig::new("./data"))?
    let broker = Broker::open(BrokerConfig::default());
    let consumer = broker.subscribe(&SubscribeRequest {
        topic: "jobs".into(),
        subscription: "workers".into(),
        start: StartPosition::Earliest,
        ..Default::default() // the server's defaults: ack timeout, attempts, every partition...
    })?;
    broker
        .publish_messages("jobs", &[Message::new("resize image 42")])
        .await?;
    for d in consumer.recv(100).await? {
        consumer.ack(&[OffsetRange::single(d.partition, d.offset)])?;
    }
    // README: end
    Ok(broker)
}

#[allow(dead_code)]
#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let broker = readme_example().await?;
    let stats = broker.stats(Some("jobs"))?;
    println!("acked: {}", stats[0].subscriptions[0].acked);
    Ok(())
}
