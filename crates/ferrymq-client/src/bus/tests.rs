//! The bus against `protocol/bus-vectors.json` (bodies under every serializer, headers, keys,
//! shards), and `peer`: the Rust side of the cross-language test that
//! `clients/python/tests/test_cross_language.py` drives.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value as Json;

use super::*;

fn vectors() -> Json {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../protocol/bus-vectors.json"
    );
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {path}: {e}"));
    serde_json::from_str(&text).expect("bus-vectors.json is JSON")
}

fn hex(text: &str) -> Vec<u8> {
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).expect("hex"))
        .collect()
}

/// An int is a JSON number or, beyond 2^53, a decimal string.
fn int(v: &Json) -> i64 {
    match v {
        Json::String(s) => s.parse().expect("a decimal int"),
        other => other.as_i64().expect("an int"),
    }
}

fn field_type(name: &str) -> FieldType {
    match name {
        "int" => FieldType::Int,
        "float" => FieldType::Float,
        "string" => FieldType::String,
        "bool" => FieldType::Bool,
        "uuid" => FieldType::Uuid,
        other => panic!("unknown field type {other}"),
    }
}

fn schema_of(v: &Json) -> Schema {
    let fields = v["fields"]
        .as_array()
        .expect("fields")
        .iter()
        .map(|f| Field {
            name: f["name"].as_str().expect("name").into(),
            ty: field_type(f["type"].as_str().expect("type")),
            number: f["number"].as_u64().expect("number") as u32,
        })
        .collect();
    Schema::new(
        v["name"].as_str().expect("name"),
        fields,
        v["key"].as_str().expect("key"),
    )
    .expect("a valid schema")
}

fn values(schema: &Schema, m: &Json) -> Vec<Value> {
    schema
        .fields
        .iter()
        .map(|f| {
            let v = &m["values"][&f.name];
            match f.ty {
                FieldType::Int => Value::Int(int(v)),
                FieldType::Float => Value::Float(v.as_f64().expect("a float")),
                FieldType::Bool => Value::Bool(v.as_bool().expect("a bool")),
                FieldType::String | FieldType::Uuid => {
                    Value::Str(v.as_str().expect("a string").into())
                }
            }
        })
        .collect()
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
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

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct UserRenamed {
    user_id: uuid::Uuid,
    name: String,
    version: i64,
}

impl BusMessage for UserRenamed {
    const TYPE_NAME: &'static str = "UserRenamed";
    const FIELDS: &'static [(&'static str, FieldType)] = &[
        ("user_id", FieldType::Uuid),
        ("name", FieldType::String),
        ("version", FieldType::Int),
    ];
    const KEY: &'static str = "user_id";
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct InvoiceIssued {
    invoice: String,
    amount_cents: i64,
    paid: bool,
    note: String,
    rate: f64,
}

impl BusMessage for InvoiceIssued {
    const TYPE_NAME: &'static str = "InvoiceIssued";
    const FIELDS: &'static [(&'static str, FieldType)] = &[
        ("invoice", FieldType::String),
        ("amount_cents", FieldType::Int),
        ("paid", FieldType::Bool),
        ("note", FieldType::String),
        ("rate", FieldType::Float),
    ];
    const KEY: &'static str = "invoice";
}

fn serializers() -> [Serializer; 4] {
    [
        Serializer::Json,
        Serializer::DeflateJson,
        Serializer::MsgPack,
        Serializer::Protobuf,
    ]
}

fn inflate(data: &[u8]) -> Vec<u8> {
    use std::io::Read;
    let mut out = Vec::new();
    flate2::read::DeflateDecoder::new(data)
        .read_to_end(&mut out)
        .expect("raw DEFLATE");
    out
}

#[test]
fn every_vector_body_both_ways() {
    let v = vectors();
    let schemas: Vec<Schema> = v["schemas"]
        .as_array()
        .expect("schemas")
        .iter()
        .map(schema_of)
        .collect();
    let mut checked = 0;
    for m in v["messages"].as_array().expect("messages") {
        let schema = schemas
            .iter()
            .find(|s| s.name == m["type"].as_str().unwrap())
            .expect("its schema");
        let values = values(schema, m);
        for ser in serializers() {
            let expected = hex(m["serialized"][ser.name()]["hex"].as_str().unwrap());
            let produced = serialize(schema, &values, ser).expect("serializes");
            if ser == Serializer::DeflateJson {
                // Compressors may choose other bytes: what counts is the JSON they inflate to.
                assert_eq!(
                    inflate(&produced),
                    m["json_utf8"].as_str().unwrap().as_bytes(),
                    "{}",
                    m["name"]
                );
                assert_eq!(
                    inflate(&expected),
                    m["json_utf8"].as_str().unwrap().as_bytes(),
                    "{}",
                    m["name"]
                );
            } else {
                assert_eq!(produced, expected, "{} under {}", m["name"], ser.name());
            }
            assert_eq!(
                deserialize(schema, &expected, ser).expect("reads"),
                values,
                "{} under {}",
                m["name"],
                ser.name()
            );
            checked += 1;
        }
    }
    assert_eq!(checked, 32);
}

fn prepare_any(type_name: &str, values: Vec<Value>, settings: &Settings) -> Prepared {
    match type_name {
        "OrderPlaced" => {
            let schema = OrderPlaced::schema().unwrap();
            Sender::prepare(
                settings,
                &from_values::<OrderPlaced>(&schema, values).unwrap(),
                None,
                None,
            )
            .unwrap()
        }
        "UserRenamed" => {
            let schema = UserRenamed::schema().unwrap();
            Sender::prepare(
                settings,
                &from_values::<UserRenamed>(&schema, values).unwrap(),
                None,
                None,
            )
            .unwrap()
        }
        "InvoiceIssued" => {
            let schema = InvoiceIssued::schema().unwrap();
            Sender::prepare(
                settings,
                &from_values::<InvoiceIssued>(&schema, values).unwrap(),
                None,
                None,
            )
            .unwrap()
        }
        other => panic!("no type {other}"),
    }
}

#[test]
fn typed_messages_get_the_vectors_headers_keys_and_shards() {
    let v = vectors();
    let schemas: Vec<Schema> = v["schemas"]
        .as_array()
        .unwrap()
        .iter()
        .map(schema_of)
        .collect();
    for m in v["messages"].as_array().unwrap() {
        let type_name = m["type"].as_str().unwrap();
        let schema = schemas.iter().find(|s| s.name == type_name).unwrap();
        for ser in serializers() {
            let settings = Settings {
                identity: m["sender"].as_str().unwrap().into(),
                shard_count: m["shard_count"].as_u64().unwrap() as u32,
                serializer: ser,
                ..Settings::default()
            };
            let p = prepare_any(type_name, values(schema, m), &settings);
            assert_eq!(p.topic, type_name);
            assert_eq!(
                p.shard as u64,
                m["shard"].as_u64().unwrap(),
                "{}",
                m["name"]
            );
            assert_eq!(
                p.message.key.as_deref(),
                Some(&hex(m["key_hex"].as_str().unwrap())[..])
            );
            let fixed: Vec<Json> = p
                .message
                .headers
                .iter()
                .filter(|(n, _)| n != HEADER_PREPARED)
                .map(|(n, v)| serde_json::json!([n, v]))
                .collect();
            assert_eq!(
                Json::Array(fixed),
                m["serialized"][ser.name()]["headers"],
                "{}",
                m["name"]
            );
            if ser != Serializer::DeflateJson {
                assert_eq!(
                    p.message.body.to_vec(),
                    hex(m["serialized"][ser.name()]["hex"].as_str().unwrap())
                );
            }
        }
    }
}

#[test]
fn the_shard_table() {
    let v = vectors();
    for e in v["shards"].as_array().unwrap() {
        let key = match e["kind"].as_str().unwrap() {
            "int" => BusKey::Int(int(&e["key"])),
            "string" => BusKey::Str(e["key"].as_str().unwrap().into()),
            _ => BusKey::Uuid(uuid::Uuid::parse_str(e["key"].as_str().unwrap()).unwrap()),
        };
        assert_eq!(key.bytes(), hex(e["key_hex"].as_str().unwrap()), "{key}");
        for (n, expected) in e["shards"].as_object().unwrap() {
            assert_eq!(
                shard_for_key(&key, n.parse().unwrap()).unwrap() as u64,
                expected.as_u64().unwrap(),
                "{key} mod {n}"
            );
        }
    }
}

#[test]
fn unreadable_bodies_and_unknown_serializers_are_refused() {
    let schema = OrderPlaced::schema().unwrap();
    for (ser, body) in [
        (Serializer::Json, &b"{not json"[..]),
        (
            Serializer::Json,
            &br#"{"order_id":"x","customer":"","total":1,"express":true}"#[..],
        ),
        (Serializer::DeflateJson, &b"not deflate"[..]),
        (Serializer::MsgPack, &b"\xc1"[..]),
        (Serializer::MsgPack, &b"\x81\xa1x"[..]),
        (Serializer::Protobuf, &b"\xff\xff\xff"[..]),
        (Serializer::Protobuf, &b"\x0a\x05ab"[..]),
    ] {
        assert!(
            matches!(
                deserialize(&schema, body, ser),
                Err(BusError::UnreadableBody(_))
            ),
            "{body:?} under {ser:?}"
        );
    }
    assert!(matches!(
        Serializer::from_name("xml"),
        Err(BusError::UnknownSerializer(_))
    ));
    let settings = Settings::from_vars(|name| match name {
        "FERRYMQ_BUS_IDENTITY" => Some("svc".into()),
        "FERRYMQ_BUS_SHARDS" => Some("16".into()),
        "FERRYMQ_BUS_LISTEN_SHARDS" => Some("1,2,4-7".into()),
        "FERRYMQ_BUS_SERIALIZER" => Some("msgpack".into()),
        _ => None,
    })
    .unwrap();
    assert_eq!(
        (settings.identity.as_str(), settings.shard_count),
        ("svc", 16)
    );
    assert_eq!(settings.listen_shards, vec![(1, 1), (2, 2), (4, 7)]);
    assert_eq!(settings.serializer, Serializer::MsgPack);
    assert!(Settings::from_vars(|n| (n == "FERRYMQ_BUS_SHARDS").then(|| "ten".into())).is_err());
    assert!(
        Settings::from_vars(|n| (n == "FERRYMQ_BUS_LISTEN_SHARDS").then(|| "9-12".into())).is_err()
    );
}

#[test]
fn js_numbers() {
    for (x, s) in [
        (12.5, "12.5"),
        (0.1, "0.1"),
        (1e-7, "1e-7"),
        (1e21, "1e+21"),
        (5.0, "5"),
        (-3.25, "-3.25"),
        (1e-6, "0.000001"),
        (123456789012345680000.0, "123456789012345680000"),
        (0.0, "0"),
    ] {
        assert_eq!(js_number(x), s);
    }
}

struct Collect {
    seen: std::sync::Mutex<Vec<(OrderPlaced, Context)>>,
}

impl Handler<OrderPlaced> for Collect {
    async fn handle(&self, message: &OrderPlaced, context: &Context) -> Result<(), String> {
        self.seen
            .lock()
            .unwrap()
            .push((message.clone(), context.clone()));
        Ok(())
    }
}

/// The Rust side of the cross-language test, run by the Python suite:
/// `FERRYMQ_BUS_PEER=send|receive FERRYMQ_ADDR=... cargo test -p ferrymq-client --lib
/// bus::tests::peer -- --ignored --exact`. It sends or receives `FERRYMQ_BUS_PEER_COUNT`
/// OrderPlaced messages, one per serializer in turn, and prints each as a `PEER` JSON line.
#[tokio::test]
#[ignore = "driven by clients/python/tests/test_cross_language.py"]
async fn peer() {
    let role = std::env::var("FERRYMQ_BUS_PEER").expect("FERRYMQ_BUS_PEER=send or receive");
    let count: i64 = std::env::var("FERRYMQ_BUS_PEER_COUNT").map_or(12, |v| v.parse().unwrap());
    let settings = Settings::from_env().expect("bus settings");
    let client = Client::connect(settings.addr.clone())
        .await
        .expect("connects");
    if role == "send" {
        let sender = Sender::new(client.clone(), settings.clone());
        for i in 0..count {
            let ser = serializers()[i as usize % 4];
            let order = OrderPlaced {
                order_id: i * 7919 - 3,
                customer: format!("rust ✓ {i}"),
                total: i as f64 + 0.25,
                express: i % 2 == 0,
            };
            let p = Sender::prepare(&settings, &order, Some(ser), None).unwrap();
            let shard = p.shard;
            let id = sender.send_prepared(p).await.unwrap();
            println!(
                "PEER {}",
                serde_json::json!({"order_id": order.order_id, "customer": order.customer, "total": order.total, "express": order.express, "shard": shard, "serializer": ser.name(), "id": id.to_string()})
            );
        }
    } else {
        let handler = std::sync::Arc::new(Collect {
            seen: std::sync::Mutex::new(Vec::new()),
        });
        let options = ReceiverOptions {
            retry: RetryPolicy::attempts(3),
            ..ReceiverOptions::default()
        };
        let mut receiver = Receiver::subscribe(&client, settings, handler.clone(), options)
            .await
            .expect("subscribes");
        let drain = receiver.drain_handle();
        let mut handled = 0;
        let run = receiver.run(|s| {
            handled += (s.outcome == "handled") as i64;
            if handled >= count {
                drain.drain();
            }
        });
        tokio::time::timeout(Duration::from_secs(30), run)
            .await
            .expect("all messages within 30 s")
            .unwrap();
        for (m, c) in handler.seen.lock().unwrap().iter() {
            println!(
                "PEER {}",
                serde_json::json!({"order_id": m.order_id, "customer": m.customer, "total": m.total, "express": m.express, "shard": c.shard, "partition": c.partition, "serializer": c.serializer, "sender": c.sender})
            );
        }
    }
    client.close().await.ok();
}
