//! The FerryMQ message bus: typed messages, shards, senders, receivers and handlers, byte for
//! byte compatible with the Python `ferrymq.bus` through `protocol/bus-vectors.json`.
//!
//! ```no_run
//! use ferrymq_client::bus::{BusMessage, FieldType, Sender, Settings};
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Serialize, Deserialize)]
//! struct OrderPlaced { order_id: i64, customer: String }
//!
//! impl BusMessage for OrderPlaced {
//!     const TYPE_NAME: &'static str = "OrderPlaced";
//!     const FIELDS: &'static [(&'static str, FieldType)] =
//!         &[("order_id", FieldType::Int), ("customer", FieldType::String)];
//!     const KEY: &'static str = "order_id";
//! }
//!
//! # async fn demo() -> Result<(), ferrymq_client::bus::BusError> {
//! let client = ferrymq_client::Client::connect("127.0.0.1:7070").await?;
//! let sender = Sender::new(client, Settings::from_env()?);
//! sender.send(&OrderPlaced { order_id: 42, customer: "ada".into() }).await?;
//! # Ok(()) }
//! ```
//!
//! A message is a serde type with a declared field list (`FIELDS`, in declaration order; their
//! Protobuf numbers are 1, 2, ...) of the five bus types and one key field. A sender publishes it
//! to the topic of its type (its name, or `TOPIC`, or the settings' template) into the partition
//! equal to its shard; bus topics have as many partitions as the bus has shards. Headers name the
//! type, the serializer, the sending service, the shard, and the UTC milliseconds when the body
//! was prepared and sent.
//!
//! A receiver subscribes under its service identity to the listened shards. What happens to each
//! message is the same as in Python and TypeScript: an unknown type, unknown serializer or
//! unreadable body is dead-lettered at once with the reason; a message from a service not
//! listened to is acked unhandled; `before_handle` returning false acks it unhandled; `handle`
//! failing nacks it with the error as reason and a delay from the handler's [`RetryPolicy`]
//! (exponential backoff with jitter), and on its last attempt dead-letters it with that reason;
//! otherwise `after_handle` runs and it is acked.
//!
//! Up to [`ReceiverOptions::concurrency`] handlers run at once with a small prefetch ahead of
//! them; [`ReceiverOptions::ordered`] keeps one message per key in flight. A receiver connects
//! again and resubscribes when the connection is lost, and [`DrainHandle::drain`] stops it
//! cleanly: no new message is taken, the handlers in flight finish (within the drain timeout),
//! the prefetched messages no handler started go back with NACK's `release` flag (no attempt
//! counted), and it unsubscribes.

mod codec;
mod receiver;
mod retry;
mod shard;
#[cfg(test)]
mod tests;

use std::collections::HashSet;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::de::DeserializeOwned;
use serde::Serialize;

pub use codec::{deserialize, js_number, serialize};
pub use receiver::{
    Context, DrainHandle, Handler, HandlerError, MessageStats, Receiver, ReceiverOptions,
    RunSummary, CONCURRENCY_MAX, RELEASE_DELAY_MS,
};
pub use retry::{bounded, RetryPolicy, REASON_BYTES_MAX};
pub use shard::{parse_shards, partition_for_key, shard_for_key, BusKey};

use crate::{Client, Message, MessageId, Storage, TopicConfig};

pub const HEADER_TYPE: &str = "x-bus-type";
pub const HEADER_SERIALIZER: &str = "x-bus-serializer";
pub const HEADER_SENDER: &str = "x-bus-sender";
pub const HEADER_SHARD: &str = "x-bus-shard";
pub const HEADER_PREPARED: &str = "x-bus-prepared-ms";
pub const HEADER_SENT: &str = "x-bus-sent-ms";

/// Most shards: a bus topic has one partition per shard, and a topic at most 1024 partitions.
pub const SHARD_COUNT_MAX: u32 = 1024;

/// What went wrong on the bus.
#[derive(Debug, thiserror::Error)]
pub enum BusError {
    /// A type or value that does not fit its schema; nothing was sent.
    #[error("schema: {0}")]
    Schema(String),
    /// A serializer name this bus does not know.
    #[error("unknown serializer {0:?}; known: json, deflate-json, msgpack, protobuf")]
    UnknownSerializer(String),
    /// A body its serializer cannot read as the type its headers name.
    #[error("unreadable body: {0}")]
    UnreadableBody(String),
    /// Settings or topics that do not fit together (shard counts, shard ranges, identities).
    #[error("bus configuration: {0}")]
    Config(String),
    /// The broker connection failed or refused a request.
    #[error(transparent)]
    Client(#[from] crate::Error),
}

/// The field types of the bus. A UUID travels as its 36-character string.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldType {
    Int,
    Float,
    String,
    Bool,
    Uuid,
}

/// A field's value. `Str` holds both strings and UUIDs.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Int(i64),
    Float(f64),
    Bool(bool),
    Str(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Field {
    pub name: String,
    pub ty: FieldType,
    /// Protobuf field number.
    pub number: u32,
}

/// A message type's name, fields in declaration order, and key field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Schema {
    pub name: String,
    pub fields: Vec<Field>,
    pub key: String,
}

impl Schema {
    pub fn new(name: &str, fields: Vec<Field>, key: &str) -> Result<Schema, BusError> {
        if fields.is_empty() || fields.len() >= 16 {
            return Err(BusError::Schema(format!(
                "{name} has {} fields; a bus message has 1..=15",
                fields.len()
            )));
        }
        let key_field = fields.iter().find(|f| f.name == key).ok_or_else(|| {
            BusError::Schema(format!("{name} has no field {key:?} to be its key"))
        })?;
        if !matches!(
            key_field.ty,
            FieldType::Int | FieldType::String | FieldType::Uuid
        ) {
            return Err(BusError::Schema(format!(
                "{name}.{key}: a key is an int, a string or a UUID"
            )));
        }
        let numbers: HashSet<u32> = fields.iter().map(|f| f.number).collect();
        if numbers.len() != fields.len() || numbers.contains(&0) {
            return Err(BusError::Schema(format!(
                "{name}: Protobuf field numbers must be distinct and above 0"
            )));
        }
        Ok(Schema {
            name: name.to_string(),
            fields,
            key: key.to_string(),
        })
    }

    /// The key of these field values.
    pub fn key_of(&self, values: &[Value]) -> Result<BusKey, BusError> {
        let i = self
            .fields
            .iter()
            .position(|f| f.name == self.key)
            .expect("checked in new");
        Ok(match (self.fields[i].ty, &values[i]) {
            (FieldType::Int, Value::Int(v)) => BusKey::Int(*v),
            (FieldType::String, Value::Str(s)) => BusKey::Str(s.clone()),
            (FieldType::Uuid, Value::Str(s)) => {
                BusKey::Uuid(uuid::Uuid::parse_str(s).map_err(|_| {
                    BusError::Schema(format!("{}.{} is not a UUID: {s:?}", self.name, self.key))
                })?)
            }
            (_, v) => {
                return Err(BusError::Schema(format!(
                    "{}.{} does not hold a key: {v:?}",
                    self.name, self.key
                )))
            }
        })
    }
}

/// A typed bus message: a serde type that declares its fields and key.
pub trait BusMessage: Serialize + DeserializeOwned + Send + Sync {
    /// The type's name: the `x-bus-type` header, and by default its topic.
    const TYPE_NAME: &'static str;
    /// The fields in declaration order (Protobuf numbers 1, 2, ...).
    const FIELDS: &'static [(&'static str, FieldType)];
    /// The key field, an Int, String or Uuid field.
    const KEY: &'static str;
    /// A fixed topic instead of the settings' template.
    const TOPIC: Option<&'static str> = None;

    fn schema() -> Result<Schema, BusError> {
        let fields = Self::FIELDS
            .iter()
            .enumerate()
            .map(|(i, (name, ty))| Field {
                name: name.to_string(),
                ty: *ty,
                number: i as u32 + 1,
            })
            .collect();
        Schema::new(Self::TYPE_NAME, fields, Self::KEY)
    }
}

/// The field values of `message`, in declaration order.
pub fn values_of<T: BusMessage>(schema: &Schema, message: &T) -> Result<Vec<Value>, BusError> {
    let json = serde_json::to_value(message)
        .map_err(|e| BusError::Schema(format!("{}: {e}", schema.name)))?;
    let object = json.as_object().ok_or_else(|| {
        BusError::Schema(format!("{} does not serialize as a struct", schema.name))
    })?;
    schema
        .fields
        .iter()
        .map(|f| {
            let v = object.get(&f.name).ok_or_else(|| {
                BusError::Schema(format!(
                    "{}.{} is not a field of the type",
                    schema.name, f.name
                ))
            })?;
            let wrong = || {
                BusError::Schema(format!(
                    "{}.{} is declared {:?}, the type gives {v}",
                    schema.name, f.name, f.ty
                ))
            };
            Ok(match f.ty {
                FieldType::Int => Value::Int(v.as_i64().ok_or_else(wrong)?),
                FieldType::Float => Value::Float(v.as_f64().ok_or_else(wrong)?),
                FieldType::Bool => Value::Bool(v.as_bool().ok_or_else(wrong)?),
                FieldType::String | FieldType::Uuid => {
                    Value::Str(v.as_str().ok_or_else(wrong)?.to_string())
                }
            })
        })
        .collect()
}

/// A typed message from its field values.
pub fn from_values<T: BusMessage>(schema: &Schema, values: Vec<Value>) -> Result<T, BusError> {
    let mut map = serde_json::Map::new();
    for (f, v) in schema.fields.iter().zip(values) {
        let json = match v {
            Value::Int(i) => serde_json::Value::from(i),
            Value::Float(x) => serde_json::Number::from_f64(x)
                .map(serde_json::Value::Number)
                .ok_or_else(|| {
                    BusError::UnreadableBody(format!("{}.{} is not finite", schema.name, f.name))
                })?,
            Value::Bool(b) => serde_json::Value::Bool(b),
            Value::Str(s) => serde_json::Value::String(s),
        };
        map.insert(f.name.clone(), json);
    }
    serde_json::from_value(serde_json::Value::Object(map))
        .map_err(|e| BusError::UnreadableBody(format!("{} could not be built: {e}", schema.name)))
}

/// The serializers, named in the `x-bus-serializer` header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Serializer {
    Json,
    DeflateJson,
    MsgPack,
    Protobuf,
}

impl Serializer {
    pub fn name(self) -> &'static str {
        match self {
            Serializer::Json => "json",
            Serializer::DeflateJson => "deflate-json",
            Serializer::MsgPack => "msgpack",
            Serializer::Protobuf => "protobuf",
        }
    }

    pub fn from_name(name: &str) -> Result<Serializer, BusError> {
        Ok(match name {
            "json" => Serializer::Json,
            "deflate-json" => Serializer::DeflateJson,
            "msgpack" => Serializer::MsgPack,
            "protobuf" => Serializer::Protobuf,
            other => return Err(BusError::UnknownSerializer(other.to_string())),
        })
    }
}

/// Who this service is and how the bus is laid out; the same settings as Python's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    pub addr: String,
    pub identity: String,
    pub shard_count: u32,
    /// Sender services to receive from; empty = every sender.
    pub listen_services: Vec<String>,
    /// Shards to receive as inclusive ranges; empty = every shard.
    pub listen_shards: Vec<(u32, u32)>,
    pub serializer: Serializer,
    /// `{type}` is the type's name, `{sender}` the sending service.
    pub topic_template: String,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            addr: crate::ADDR_DEFAULT.to_string(),
            identity: "NoIdentification".into(),
            shard_count: 10,
            listen_services: Vec::new(),
            listen_shards: Vec::new(),
            serializer: Serializer::Json,
            topic_template: "{type}".into(),
        }
    }
}

impl Settings {
    /// Reads `FERRYMQ_ADDR`, `FERRYMQ_BUS_IDENTITY`, `FERRYMQ_BUS_SHARDS`,
    /// `FERRYMQ_BUS_LISTEN_SERVICES`, `FERRYMQ_BUS_LISTEN_SHARDS` and `FERRYMQ_BUS_SERIALIZER`.
    pub fn from_env() -> Result<Settings, BusError> {
        Settings::from_vars(|name| std::env::var(name).ok())
    }

    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Settings, BusError> {
        let mut s = Settings::default();
        if let Some(v) = var("FERRYMQ_ADDR").filter(|v| !v.is_empty()) {
            s.addr = v;
        }
        if let Some(v) = var("FERRYMQ_BUS_IDENTITY").filter(|v| !v.is_empty()) {
            s.identity = v;
        }
        if let Some(v) = var("FERRYMQ_BUS_SHARDS") {
            s.shard_count = v.trim().parse().map_err(|_| {
                BusError::Config(format!("FERRYMQ_BUS_SHARDS is a number, got {v:?}"))
            })?;
        }
        if let Some(v) = var("FERRYMQ_BUS_LISTEN_SERVICES") {
            s.listen_services = v
                .split(',')
                .map(str::trim)
                .filter(|x| !x.is_empty())
                .map(String::from)
                .collect();
        }
        if let Some(v) = var("FERRYMQ_BUS_LISTEN_SHARDS").filter(|v| !v.is_empty()) {
            s.listen_shards = parse_shards(&v)?;
        }
        if let Some(v) = var("FERRYMQ_BUS_SERIALIZER").filter(|v| !v.is_empty()) {
            s.serializer = Serializer::from_name(&v)?;
        }
        s.check()?;
        Ok(s)
    }

    pub fn check(&self) -> Result<(), BusError> {
        if self.shard_count == 0 || self.shard_count > SHARD_COUNT_MAX {
            return Err(BusError::Config(format!(
                "the shard count is 1..={SHARD_COUNT_MAX}, got {}",
                self.shard_count
            )));
        }
        if self.identity.is_empty() || self.identity.len() > 200 {
            return Err(BusError::Config("the identity is 1..=200 bytes".into()));
        }
        if let Some((_, last)) = self
            .listen_shards
            .iter()
            .find(|(_, last)| *last >= self.shard_count)
        {
            return Err(BusError::Config(format!(
                "shard {last} is not below the shard count {}",
                self.shard_count
            )));
        }
        Ok(())
    }

    pub fn topic(&self, type_name: &str, fixed: Option<&str>, sender: &str) -> String {
        match fixed {
            Some(t) => t.to_string(),
            None => self
                .topic_template
                .replace("{type}", type_name)
                .replace("{sender}", sender),
        }
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

async fn ensure_topic(client: &Client, topic: &str, shard_count: u32) -> Result<(), BusError> {
    let config = TopicConfig {
        partitions: shard_count,
        storage: Storage::Disk,
        ..TopicConfig::default()
    };
    client.create_topic(topic, config, true).await?;
    let info = client.describe_topic(topic).await?;
    if info.config.partitions != shard_count {
        return Err(BusError::Config(format!(
            "topic {topic:?} has {} partitions but the bus has {shard_count} shards: every service must use the same shard count",
            info.config.partitions
        )));
    }
    Ok(())
}

/// A custom shard rule: `(key, shard_count) -> shard`, replacing [`shard_for_key`].
pub type ShardResolver = dyn Fn(&BusKey, u32) -> u32;

/// A message ready to publish: its topic, shard, and broker message.
#[derive(Debug, Clone, PartialEq)]
pub struct Prepared {
    pub topic: String,
    pub shard: u32,
    pub message: Message,
}

/// Publishes typed messages.
pub struct Sender {
    client: Client,
    settings: Settings,
    create_topics: bool,
    ready: tokio::sync::Mutex<HashSet<String>>,
}

impl Sender {
    pub fn new(client: Client, settings: Settings) -> Sender {
        Sender {
            client,
            settings,
            create_topics: true,
            ready: tokio::sync::Mutex::new(HashSet::new()),
        }
    }

    /// False never creates or inspects topics, so that `publish` on them is the only right
    /// the sender needs; they must then exist with one partition per shard.
    pub fn create_topics(mut self, create: bool) -> Sender {
        self.create_topics = create;
        self
    }

    /// The topic, shard and message of `message` under the settings' serializer and the default
    /// shard rule (or `resolver`, which gets the key and the shard count).
    pub fn prepare<T: BusMessage>(
        settings: &Settings,
        message: &T,
        serializer: Option<Serializer>,
        resolver: Option<&ShardResolver>,
    ) -> Result<Prepared, BusError> {
        let schema = T::schema()?;
        let values = values_of(&schema, message)?;
        let key = schema.key_of(&values)?;
        let n = settings.shard_count;
        let shard = match resolver {
            None => shard_for_key(&key, n)?,
            Some(resolve) => {
                let s = resolve(&key, n);
                if s >= n {
                    return Err(BusError::Config(format!(
                        "the shard resolver returned {s} for {key}: a shard is 0..{}",
                        n - 1
                    )));
                }
                s
            }
        };
        let serializer = serializer.unwrap_or(settings.serializer);
        let body = serialize(&schema, &values, serializer)?;
        let mut m = Message::new(body).with_key(key.bytes());
        m.headers = vec![
            (HEADER_TYPE.into(), schema.name.clone()),
            (HEADER_SERIALIZER.into(), serializer.name().into()),
            (HEADER_SENDER.into(), settings.identity.clone()),
            (HEADER_SHARD.into(), shard.to_string()),
            (HEADER_PREPARED.into(), now_ms().to_string()),
        ];
        Ok(Prepared {
            topic: settings.topic(&schema.name, T::TOPIC, &settings.identity),
            shard,
            message: m,
        })
    }

    pub async fn send<T: BusMessage>(&self, message: &T) -> Result<MessageId, BusError> {
        self.send_prepared(Sender::prepare(&self.settings, message, None, None)?)
            .await
    }

    pub async fn send_prepared(&self, mut prepared: Prepared) -> Result<MessageId, BusError> {
        if self.create_topics {
            let mut ready = self.ready.lock().await;
            if !ready.contains(&prepared.topic) {
                ensure_topic(&self.client, &prepared.topic, self.settings.shard_count).await?;
                ready.insert(prepared.topic.clone());
            }
        }
        prepared
            .message
            .headers
            .push((HEADER_SENT.into(), now_ms().to_string()));
        let receipt = self
            .client
            .publish_batch(&prepared.topic, Some(prepared.shard), &[prepared.message])
            .await?;
        receipt.first_id().ok_or_else(|| {
            BusError::Client(crate::Error::UnexpectedResponse(
                "a receipt without ids".into(),
            ))
        })
    }
}
