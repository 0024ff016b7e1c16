//! The Rust side of the other clients' cross-language bus tests (the Go client's `cross_test.go`
//! runs it): sends or receives OrderPlaced messages with the Rust bus, with every serializer it
//! has, and prints each as a `PEER {json}` line, after a `SERIALIZERS a,b,...` line.
//!
//! `bus_peer probe|send|receive ADDR COUNT SHARDS`

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ferrymq_client::bus::{
    BusMessage, Context, FieldType, Handler, Receiver, ReceiverOptions, Sender, Serializer,
    Settings,
};
use serde::{Deserialize, Serialize};
use serde_json::json;

#[derive(Serialize, Deserialize, Clone)]
struct OrderPlaced {
    order_id: i64,
    customer: String,
    total: f64,
    express: bool,
}

impl BusMessage for OrderPlaced {
    const TYPE_NAME: &'static str = "OrderPlaced";
    const FIELDS: &'static [(&'static str, FieldType)] = &[
        ("order_id", FieldType::Int),
        ("customer", FieldType::String),
        ("total", FieldType::Float),
        ("express", FieldType::Bool),
    ];
    const KEY: &'static str = "order_id";
}

const SERIALIZERS: [Serializer; 4] = [
    Serializer::Json,
    Serializer::DeflateJson,
    Serializer::MsgPack,
    Serializer::Protobuf,
];

#[derive(Default)]
struct Collect {
    seen: Mutex<Vec<serde_json::Value>>,
}

impl Handler<OrderPlaced> for Collect {
    async fn handle(&self, m: &OrderPlaced, c: &Context) -> Result<(), String> {
        self.seen.lock().unwrap().push(json!({
            "order_id": m.order_id,
            "customer": m.customer,
            "total": m.total,
            "express": m.express,
            "serializer": c.serializer,
            "sender": c.sender,
            "shard": c.shard,
            "partition": c.partition,
        }));
        Ok(())
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [role, addr, count, shards] = &args[..] else {
        return Err("usage: bus_peer probe|send|receive ADDR COUNT SHARDS".into());
    };
    let (count, shard_count): (usize, u32) = (count.parse()?, shards.parse()?);
    let names: Vec<&str> = SERIALIZERS.iter().map(|s| s.name()).collect();
    println!("SERIALIZERS {}", names.join(","));
    if role == "probe" {
        return Ok(());
    }
    let client = ferrymq_client::Client::connect(addr.clone()).await?;
    let settings = |identity: &str, serializer: Serializer| Settings {
        addr: addr.clone(),
        identity: identity.into(),
        shard_count,
        serializer,
        ..Settings::default()
    };
    match role.as_str() {
        "send" => {
            for i in 0..count {
                let serializer = SERIALIZERS[i % SERIALIZERS.len()];
                let sender = Sender::new(client.clone(), settings("rs-checkout", serializer));
                let o = OrderPlaced {
                    order_id: i as i64 * 7_727 - 60,
                    customer: format!("rust \u{2713} \"{i}\"\n"),
                    total: i as f64 / 16.0,
                    express: i % 4 == 1,
                };
                sender.send(&o).await?;
                println!(
                    "PEER {}",
                    json!({"order_id": o.order_id, "customer": o.customer, "total": o.total,
                           "express": o.express, "serializer": serializer.name()})
                );
            }
        }
        "receive" => {
            let collect = Arc::new(Collect::default());
            let mut receiver = Receiver::subscribe(
                &client,
                settings("rs-billing", Serializer::Json),
                collect.clone(),
                ReceiverOptions::default(),
            )
            .await?;
            let drain = receiver.drain_handle();
            let watched = collect.clone();
            let watch = tokio::spawn(async move {
                let end = Instant::now() + Duration::from_secs(30);
                while watched.seen.lock().unwrap().len() < count && Instant::now() < end {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                drain.drain();
            });
            receiver.run(|_| {}).await?;
            watch.await?;
            for seen in collect.seen.lock().unwrap().iter() {
                println!("PEER {seen}");
            }
        }
        other => return Err(format!("unknown role {other:?}").into()),
    }
    client.close().await?;
    Ok(())
}
