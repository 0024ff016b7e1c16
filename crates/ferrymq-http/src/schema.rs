//! OpenAPI schemas that say exactly what the server accepts, where the Rust types that parse a
//! request are looser than the rules the handlers then check (a message id is a `String` to
//! serde, `<partition>-<offset>` to the handler). A request the document calls valid is one the
//! server takes; `tests/schemathesis.sh` holds the two to that.

use utoipa::openapi::schema::{
    AdditionalProperties, ArrayBuilder, ObjectBuilder, OneOfBuilder, Schema, Type,
};
use utoipa::openapi::{RefOr, SchemaFormat};
use utoipa::{PartialSchema, ToSchema};

/// A message id, `<partition>-<offset>`: a partition that fits a u32 and an offset that fits a
/// u64 (the pattern allows up to 9 and 19 digits, which always do).
pub struct MessageId;

pub const MESSAGE_ID_PATTERN: &str = "^[0-9]{1,9}-[0-9]{1,19}$";

impl PartialSchema for MessageId {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .pattern(Some(MESSAGE_ID_PATTERN))
            .examples(["0-17"])
            .description(Some("A message id, `<partition>-<offset>`"))
            .into()
    }
}

impl ToSchema for MessageId {}

/// Message ids of an ack or nack: one to 65536.
pub struct MessageIds;

impl PartialSchema for MessageIds {
    fn schema() -> RefOr<Schema> {
        ArrayBuilder::new()
            .items(MessageId::schema())
            .min_items(Some(1))
            .max_items(Some(ferrymq_protocol::limits::RANGES_COUNT_MAX as usize))
            .description(Some("Message ids, `<partition>-<offset>`, 1 to 65536"))
            .examples([serde_json::json!(["0-12", "0-13"])])
            .into()
    }
}

impl ToSchema for MessageIds {}

/// Record headers as `[name, value]` pairs, in the order stored (a name may repeat). Spelled
/// out because a Rust tuple derives to `prefixItems`, which validators of the OpenAPI 3.0 lineage
/// (schemathesis among them) read as an `items` list and refuse.
pub struct HeaderPairs;

impl PartialSchema for HeaderPairs {
    fn schema() -> RefOr<Schema> {
        let text = || ObjectBuilder::new().schema_type(Type::String);
        ArrayBuilder::new()
            .items(
                ArrayBuilder::new()
                    .items(text())
                    .min_items(Some(2))
                    .max_items(Some(2)),
            )
            .description(Some("`[name, value]` pairs in the order stored"))
            .examples([serde_json::json!([["trace", "abc"]])])
            .into()
    }
}

impl ToSchema for HeaderPairs {}

/// A topic or subscription name: 1 to 255 letters, digits, `.`, `_` and `-`.
pub struct Name;

pub const NAME_PATTERN: &str = "^[A-Za-z0-9._-]{1,255}$";

impl PartialSchema for Name {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .pattern(Some(NAME_PATTERN))
            .examples(["orders"])
            .into()
    }
}

impl ToSchema for Name {}

/// The state of a subscription's messages to list.
pub struct ListState;

impl PartialSchema for ListState {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .enum_values(Some(["pending", "in_flight", "acked", "dead_lettered"]))
            .into()
    }
}

impl ToSchema for ListState {}

/// An integer property of an object schema, with its bounds.
/// An integer with its bounds; without a maximum, its format's bounds.
fn integer(min: u64, max: Option<u64>, format: utoipa::openapi::KnownFormat) -> ObjectBuilder {
    ObjectBuilder::new()
        .schema_type(Type::Integer)
        .format(Some(SchemaFormat::KnownFormat(format)))
        .minimum(Some(min as f64))
        .maximum(max.map(|max| max as f64))
}

/// Which dead letters to requeue: exactly one of three shapes (the handler refuses anything
/// else, such as `{}` or `{"all": true, "id": "0-1"}`).
pub struct RequeueSelection;

impl PartialSchema for RequeueSelection {
    fn schema() -> RefOr<Schema> {
        use utoipa::openapi::KnownFormat::{Int32, Int64};
        // Offsets are u64 to the broker; JSON Schema's int64 is the widest integer tools know.
        let offset = || integer(0, None, Int64);
        let all = ObjectBuilder::new()
            .title(Some("all"))
            .property(
                "all",
                ObjectBuilder::new()
                    .schema_type(Type::Boolean)
                    .enum_values(Some([true])),
            )
            .required("all")
            .additional_properties(Some(AdditionalProperties::FreeForm(false)));
        let one = ObjectBuilder::new()
            .title(Some("one"))
            .property("id", MessageId::schema())
            .required("id")
            .additional_properties(Some(AdditionalProperties::FreeForm(false)));
        let range = ObjectBuilder::new()
            .title(Some("range"))
            .property("partition", integer(0, None, Int32))
            .property("first", offset())
            .property(
                "last",
                offset().description(Some("Inclusive; default `first`; not below it")),
            )
            .required("partition")
            .required("first")
            .additional_properties(Some(AdditionalProperties::FreeForm(false)));
        OneOfBuilder::new()
            .item(all)
            .item(one)
            .item(range)
            .description(Some(
                "`{\"all\": true}`, `{\"id\": \"0-5\"}`, or `{\"partition\": 0, \"first\": 10, \"last\": 19}` (inclusive)",
            ))
            .into()
    }
}

impl ToSchema for RequeueSelection {}

/// A topic to create: a disk topic (`storage` `disk` or omitted) may set `fsync` and
/// `retention_ms`; a memory topic (`storage: "memory"`) may not, since neither applies to it.
pub struct CreateTopicSchema;

impl PartialSchema for CreateTopicSchema {
    // One builder expression over 70 lines on purpose: it reads as the JSON schema it produces,
    // property by property.
    fn schema() -> RefOr<Schema> {
        use utoipa::openapi::KnownFormat::{Int32, Int64};
        let common = |storage: &'static str| {
            let mut storage_schema = ObjectBuilder::new()
                .schema_type(Type::String)
                .enum_values(Some([storage]));
            storage_schema = if storage == "disk" {
                storage_schema.description(Some(
                    "`disk`, or omitted for the broker's default storage (disk when it has a data dir)",
                ))
            } else {
                storage_schema
            };
            ObjectBuilder::new()
                .title(Some(storage))
                .property("name", Name::schema())
                .required("name")
                .property(
                    "partitions",
                    integer(1, Some(ferrymq_protocol::limits::PARTITIONS_MAX as u64), Int32)
                        .description(Some("1 to 1024; default the broker's (1)")),
                )
                .property("storage", storage_schema)
                .property(
                    "overflow",
                    ObjectBuilder::new()
                        .schema_type(Type::String)
                        .enum_values(Some(["drop-oldest", "reject"]))
                        .description(Some("What a full topic does: `drop-oldest` (default) or `reject`")),
                )
                .property(
                    "max_messages",
                    integer(0, None, Int64).description(Some(
                        "Most messages retained, at least one per partition; 0 or omitted: the default",
                    )),
                )
                .property(
                    "max_bytes",
                    integer(0, None, Int64)
                        .description(Some("Most bytes retained; 0 or omitted: the default")),
                )
                .property(
                    "retention_policy",
                    ObjectBuilder::new()
                        .schema_type(Type::String)
                        .enum_values(Some(["stream", "work_queue"]))
                        .description(Some("`stream`: settled messages stay until the limits (default for disk topics); `work_queue`: they go once every subscription settled them (default for memory topics)")),
                )
                .property(
                    "dedup_window_ms",
                    integer(1, Some(ferrymq_broker::DEDUP_WINDOW_MS_MAX), Int64).description(Some(
                        "How long deduplication ids are remembered; omitted: the broker's default (2 minutes)",
                    )),
                )
                .property(
                    "replicas",
                    integer(1, Some(5), Int32).description(Some(
                        "Copies kept on the nodes of a cluster: 1, 3 or 5; omitted: the broker's default (1 on a single node)",
                    )),
                )
                .property(
                    "if_not_exists",
                    ObjectBuilder::new()
                        .schema_type(Type::Boolean)
                        .description(Some("Succeed (200 with the existing topic) when it exists")),
                )
                .additional_properties(Some(AdditionalProperties::FreeForm(false)))
        };
        let disk = common("disk")
            .property(
                "fsync",
                ObjectBuilder::new()
                    .schema_type(Type::String)
                    .pattern(Some("^(always|never|interval:[1-9][0-9]{0,8})$"))
                    .examples(["always"])
                    .description(Some("`always` (default), `interval:<ms>` or `never`")),
            )
            .property(
                "retention_ms",
                integer(0, None, Int64).description(Some(
                    "Messages older than this are deleted (whole segments); 0 or omitted: the default",
                )),
            );
        let memory = common("memory").required("storage");
        OneOfBuilder::new()
            .item(disk)
            .item(memory)
            .description(Some(
                "A topic to create. Omitted settings take the broker's defaults.",
            ))
            .into()
    }
}

impl ToSchema for CreateTopicSchema {}

#[cfg(test)]
mod tests {
    #[test]
    fn the_id_pattern_admits_what_the_parser_takes() {
        // Whatever the pattern admits parses, at its longest.
        let longest = format!("{}-{}", "9".repeat(9), "9".repeat(19));
        assert!(crate::messages::parse_id(&longest, "id").is_ok());
        assert!(crate::messages::parse_id("0-0", "id").is_ok());
    }
}

/// Rules across the fields of one object, which the derived schemas cannot state, added to the
/// document as JSON Schema keywords:
/// - a JSON message has exactly one of `body` and `body_base64`;
/// - a dead-lettering nack has no `delay_ms` (a dead letter is not delivered again);
/// - a grant names a topic pattern with at least one action, or only roles;
/// - user and token names are names, passwords 8 to 1024 bytes, actions and roles known words.
pub fn refine(document: &mut serde_json::Value) {
    use serde_json::json;
    let name = json!({"type": "string", "pattern": NAME_PATTERN});
    // Characters, where the limits are bytes: at least 8 characters are at least 8 bytes, and
    // 256 characters are at most 1024 bytes whatever they are.
    let password = json!({
        "type": "string",
        "minLength": ferrymq_broker::auth::PASSWORD_BYTES_MIN,
        "maxLength": ferrymq_broker::auth::PASSWORD_BYTES_MAX / 4,
    });
    let actions = json!({"type": "array", "items": {"enum": [
        "publish", "consume", "inspect", "manage", "purge", "pause", "all"
    ]}});
    let roles = json!({"type": "array", "items": {"enum": ["admin", "monitor"]}});
    // Once the broker has users every route but these needs credentials and the right on what
    // it touches (docs/security.md), so every other operation can answer 401 and 403.
    const OPEN_PATHS: [&str; 4] = ["/ping", "/openapi.json", "/livez", "/readyz"];
    let error_body =
        json!({"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}});
    if let Some(paths) = document["paths"].as_object_mut() {
        for (path, item) in paths.iter_mut() {
            if OPEN_PATHS.contains(&path.as_str()) {
                continue;
            }
            let Some(operations) = item.as_object_mut() else {
                continue;
            };
            for operation in operations.values_mut() {
                let Some(responses) = operation
                    .get_mut("responses")
                    .and_then(serde_json::Value::as_object_mut)
                else {
                    continue;
                };
                responses.entry("401").or_insert_with(|| {
                    json!({
                        "description": "`authentication_failed`: the broker has users and the request has no valid credentials",
                        "content": error_body.clone(),
                    })
                });
                responses.entry("403").or_insert_with(|| {
                    json!({
                        "description": "`forbidden`: the user lacks the right",
                        "content": error_body.clone(),
                    })
                });
            }
        }
    }
    let schemas = &mut document["components"]["schemas"];
    if let Some(user) = schemas.get_mut("NewUser") {
        user["properties"]["name"] = name.clone();
        user["properties"]["password"] = password.clone();
        user["properties"]["roles"] = roles.clone();
    }
    if let Some(change) = schemas.get_mut("NewPassword") {
        change["properties"]["password"] = password;
    }
    if let Some(token) = schemas.get_mut("NewToken") {
        token["properties"]["name"] = name;
    }
    if let Some(grant) = schemas.get_mut("GrantChange") {
        grant["properties"]["actions"] = actions;
        grant["properties"]["roles"] = roles;
        grant["oneOf"] = json!([
            {
                "required": ["pattern", "actions"],
                "properties": {
                    "pattern": {"pattern": "^(\\*|[A-Za-z0-9._-]{1,255}\\*?)$"},
                    "actions": {"minItems": 1},
                },
            },
            {
                "required": ["roles"],
                "properties": {
                    "pattern": {"maxLength": 0},
                    "actions": {"maxItems": 0},
                    "roles": {"minItems": 1},
                },
            },
        ]);
    }
    if let Some(message) = schemas.get_mut("JsonMessage") {
        message["oneOf"] = json!([{"required": ["body"]}, {"required": ["body_base64"]}]);
    }
    if let Some(nack) = schemas.get_mut("NackRequest") {
        nack["if"] = json!({
            "required": ["dead_letter"],
            "properties": {"dead_letter": {"const": true}},
        });
        nack["then"] = json!({"properties": {"delay_ms": {"enum": [0, null]}}});
        // Characters, where the limit is bytes: this many are within it whatever they are.
        nack["properties"]["reason"]["maxLength"] =
            json!(ferrymq_protocol::limits::ERROR_MESSAGE_BYTES_MAX / 4);
    }
}

/// Integers of request bodies as JSON Schema reads them: `2.0` is the integer 2 (JSON has one
/// number type, and the OpenAPI document, JSON Schema 2020-12, calls `2.0` an integer), so the
/// server takes it as `2`. A fraction, a negative number for an unsigned field, or a number out of
/// the field's range is refused naming the value. Query strings reach the same fields as text.
pub mod whole {
    use std::fmt;
    use std::marker::PhantomData;

    use serde::de::{Deserializer, Error, Visitor};

    pub fn option<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
    where
        D: Deserializer<'de>,
        T: TryFrom<u64>,
    {
        deserializer.deserialize_option(OptionVisitor(PhantomData))
    }

    /// A required whole number (see the module).
    pub fn number<'de, D, T>(deserializer: D) -> Result<T, D::Error>
    where
        D: Deserializer<'de>,
        T: TryFrom<u64>,
    {
        deserializer.deserialize_any(WholeVisitor(PhantomData))
    }

    struct OptionVisitor<T>(PhantomData<T>);

    impl<'de, T: TryFrom<u64>> Visitor<'de> for OptionVisitor<T> {
        type Value = Option<T>;

        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a whole number, or null")
        }

        fn visit_none<E: Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }

        fn visit_unit<E: Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }

        fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
            d.deserialize_any(WholeVisitor(PhantomData)).map(Some)
        }
    }

    struct WholeVisitor<T>(PhantomData<T>);

    impl<T: TryFrom<u64>> WholeVisitor<T> {
        fn fit<E: Error>(value: u64) -> Result<T, E> {
            T::try_from(value).map_err(|_| {
                E::custom(format_args!(
                    "{value} is out of range for {}",
                    std::any::type_name::<T>()
                ))
            })
        }
    }

    impl<T: TryFrom<u64>> Visitor<'_> for WholeVisitor<T> {
        type Value = T;

        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a whole number")
        }

        fn visit_u64<E: Error>(self, value: u64) -> Result<T, E> {
            Self::fit(value)
        }

        fn visit_i64<E: Error>(self, value: i64) -> Result<T, E> {
            let value =
                u64::try_from(value).map_err(|_| E::custom(format_args!("{value} is negative")))?;
            Self::fit(value)
        }

        fn visit_f64<E: Error>(self, value: f64) -> Result<T, E> {
            // Below 2^53 a float holds every integer exactly; above, `2.0e19` may not be the
            // integer its writer meant.
            if value.fract() != 0.0 || !(0.0..=9_007_199_254_740_992.0).contains(&value) {
                return Err(E::custom(format_args!(
                    "{value} is not a whole number from 0 to 2^53"
                )));
            }
            Self::fit(value as u64)
        }

        fn visit_str<E: Error>(self, value: &str) -> Result<T, E> {
            let parsed: u64 = value
                .parse()
                .map_err(|_| E::custom(format_args!("'{value}' is not a whole number")))?;
            Self::fit(parsed)
        }
    }

    #[cfg(test)]
    mod tests {
        #[derive(serde::Deserialize)]
        struct Field {
            #[serde(default, deserialize_with = "super::option")]
            n: Option<u32>,
        }

        fn parse(json: &str) -> Result<Option<u32>, String> {
            serde_json::from_str::<Field>(json)
                .map(|f| f.n)
                .map_err(|e| e.to_string())
        }

        #[test]
        fn whole_numbers_in_any_spelling() {
            assert_eq!(parse(r#"{"n": 7}"#), Ok(Some(7)));
            assert_eq!(parse(r#"{"n": 7.0}"#), Ok(Some(7)));
            assert_eq!(parse(r#"{"n": 7e2}"#), Ok(Some(700)));
            assert_eq!(parse(r#"{"n": null}"#), Ok(None));
            assert_eq!(parse("{}"), Ok(None));
            // A query string's values are text; a JSON string is taken the same way.
            assert_eq!(parse(r#"{"n": "7"}"#), Ok(Some(7)));
            for bad in [
                r#"{"n": 7.5}"#,
                r#"{"n": -1}"#,
                r#"{"n": 4294967296}"#,
                r#"{"n": "x"}"#,
            ] {
                assert!(parse(bad).is_err(), "{bad}");
            }
            let query: Field = serde_urlencoded::from_str("n=12").unwrap();
            assert_eq!(query.n, Some(12));
        }
    }
}
