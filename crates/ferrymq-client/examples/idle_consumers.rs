//! Opens many connections, each with one subscription, and holds them idle: the load behind the
//! "1 000 idle consumer connections" memory measurement (`bench/idle_connections.sh`).
//!
//!     cargo run --release -p ferrymq-client --example idle_consumers -- ADDR CONNECTIONS HOLD_SECS

use std::time::Duration;

use ferrymq_client::{Client, SubscribeOptions};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let addr = args
        .first()
        .cloned()
        .unwrap_or_else(|| "127.0.0.1:7070".into());
    let connections: usize = args.get(1).map_or(Ok(1000), |s| s.parse())?;
    let hold = Duration::from_secs(args.get(2).map_or(Ok(5), |s| s.parse())?);

    let mut held = Vec::with_capacity(connections);
    for i in 0..connections {
        let client = Client::connect(addr.clone()).await?;
        // Half share one work queue, half are plain subscribers with their own subscription.
        let options = if i % 2 == 0 {
            SubscribeOptions::new("idle").subscription("workers")
        } else {
            SubscribeOptions::new("idle")
        };
        let subscription = client.subscribe(options).await?;
        held.push((client, subscription));
    }
    println!("holding {connections} idle consumer connections for {hold:?}");
    tokio::time::sleep(hold).await;
    let stats = held[0].0.stats(Some("idle")).await?;
    println!("subscribers on topic 'idle': {}", stats[0].subscribers);
    Ok(())
}
