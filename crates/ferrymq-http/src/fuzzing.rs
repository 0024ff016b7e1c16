//! Entry points for the fuzz targets in `fuzz/` (feature `fuzzing`): the parsers of untrusted
//! HTTP input, reachable without a server. Not part of the crate's API.

use ferrymq_protocol::RecordBatch;

use crate::ApiResult;
use http::{header, HeaderMap, HeaderValue};

/// A JSON publish body parsed as `POST /topics/{topic}/messages` parses it, with no query
/// options: the batch it would store, or the error the client would get.
pub fn json_publish(body: &[u8]) -> ApiResult<RecordBatch> {
    crate::publish::json_batch(body, Default::default(), None).map(|outgoing| outgoing.batch)
}

/// An `Authorization` header value read as every route reads it: `(user, secret)` (the user is
/// empty for a bearer token, both are empty without the header), or why it is malformed.
pub fn authorization(value: &[u8]) -> Result<(String, String), String> {
    let mut headers = HeaderMap::new();
    let value = HeaderValue::from_bytes(value).map_err(|_| "not a header value".to_owned())?;
    headers.insert(header::AUTHORIZATION, value);
    crate::auth::credentials(&headers).map(|c| (c.user, c.secret))
}
