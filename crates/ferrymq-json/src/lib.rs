//! The JSON documents FerryMQ prints the same way wherever they appear: the HTTP API answers
//! with them and the CLI prints them (`ferrymq stats --json` is `GET /stats`), so a script reads
//! one format. Each is a serde type with its conversion from the protocol type it shows.
//!
//! No I/O and no HTTP: the OpenAPI schemas (`utoipa::ToSchema`) are derived only with the
//! `schema` feature, which the HTTP crate enables.

mod stats;
mod topic;

pub use stats::{LatencyJson, StatsList, SubscriptionStatsJson, TopicStatsJson};
pub use topic::{overflow_name, storage_name, TopicJson, TopicList};
