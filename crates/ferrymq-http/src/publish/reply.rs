//! A publish's reply, written without serde into the connection's reply buffer.

use axum::http::{header, HeaderValue, StatusCode};
use bytes::BufMut;
use ferrymq_broker::PublishReceipt;
use ferrymq_protocol::Durability;
use http_body_util::Full;
use serde::{Deserialize, Serialize};

use crate::Connection;

use super::ReplyBody;

pub(crate) fn durability_name(durability: Durability) -> &'static str {
    match durability {
        Durability::Memory => "memory",
        Durability::Written => "written",
        Durability::SyncedInterval => "synced_interval",
        Durability::Synced => "synced",
    }
}

/// What a publish got.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct PublishReply {
    /// The id of each message, `<partition>-<offset>`, in the order sent.
    #[schema(example = json!(["0-41"]))]
    pub ids: Vec<String>,
    /// `memory`, `written`, `synced_interval` or `synced`: what the broker promises about them.
    pub durability: String,
    /// The ids of the messages not stored because their deduplication id was seen within the
    /// topic's window: each is the id of the message stored first. Absent when none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schema(example = json!(["0-41"]))]
    pub duplicates: Vec<String>,
}

/// Replies bytes per message id at most: `"<partition>-<offset>",` with a u32 and a u64.
pub(super) const REPLY_ID_BYTES_MAX: usize = 34;

/// The reply to a publish, `{"ids":[...],"durability":"..."}`, written into the connection's
/// reply buffer: a keep-alive connection has sent its previous reply by the time it takes the
/// next request, so the buffer's space is reused and a reply allocates nothing.
pub(super) fn reply(
    connection: &Connection,
    receipt: &PublishReceipt,
    count: usize,
) -> http::Response<ReplyBody> {
    let durability = durability_name(receipt.durability);
    let body = {
        let mut out = connection.replies.lock();
        out.reserve(40 + count * REPLY_ID_BYTES_MAX);
        out.put_slice(b"{\"ids\":[");
        for (i, (partition, offset)) in receipt.ids().enumerate() {
            if i > 0 {
                out.put_u8(b',');
            }
            out.put_u8(b'"');
            out.put_slice(itoa::Buffer::new().format(partition).as_bytes());
            out.put_u8(b'-');
            out.put_slice(itoa::Buffer::new().format(offset).as_bytes());
            out.put_u8(b'"');
        }
        out.put_slice(b"],\"durability\":\"");
        out.put_slice(durability.as_bytes());
        out.put_u8(b'"');
        if !receipt.duplicates.is_empty() {
            let ids: Vec<(u32, u64)> = receipt.ids().collect();
            out.put_slice(b",\"duplicates\":[");
            for (i, &index) in receipt.duplicates.iter().enumerate() {
                if i > 0 {
                    out.put_u8(b',');
                }
                let (partition, offset) = ids[index];
                out.put_u8(b'"');
                out.put_slice(itoa::Buffer::new().format(partition).as_bytes());
                out.put_u8(b'-');
                out.put_slice(itoa::Buffer::new().format(offset).as_bytes());
                out.put_u8(b'"');
            }
            out.put_u8(b']');
        }
        out.put_u8(b'}');
        out.split().freeze()
    };
    let mut response = http::Response::new(http_body_util::Either::Left(Full::new(body)));
    *response.status_mut() = StatusCode::CREATED;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}
