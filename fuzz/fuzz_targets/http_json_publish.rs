//! Arbitrary bytes as the body of a JSON publish (`POST /topics/{topic}/messages` with
//! `Content-Type: application/json`), the largest parser an HTTP client reaches. It must never
//! panic; a refusal is a client error (4xx) with a message; an accepted batch holds at least one
//! message, every record of it decodes, and a message object whose `body` is a string stores
//! exactly that string's bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    match ferrymq_http::fuzzing::json_publish(data) {
        Ok(batch) => {
            let count = batch.count() as usize;
            assert!(count >= 1, "an accepted batch is never empty");
            let messages: Vec<_> = batch.messages().collect();
            assert_eq!(messages.len(), count, "every stored record decodes");
            let parsed: Option<serde_json::Value> = serde_json::from_slice(data).ok();
            if let Some(serde_json::Value::Object(object)) = &parsed {
                if let Some(serde_json::Value::String(body)) = object.get("body") {
                    assert_eq!(
                        &messages[0].body[..],
                        body.as_bytes(),
                        "a string body is stored as its text"
                    );
                }
            }
        }
        Err(error) => {
            assert!(
                error.status.is_client_error(),
                "{}: {}",
                error.status,
                error.message
            );
            assert!(!error.message.is_empty());
        }
    }
});
