//! Arbitrary bytes as the credentials a client presents (an HTTP `Authorization` header) and as
//! the grant patterns, actions and roles an admin types. None may panic; a refusal never quotes
//! the secret it was given; whatever parses means what it says.
#![no_main]

use ferrymq_broker::auth::{
    actions_to_string, parse_actions, parse_roles, roles_to_string, Pattern,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    match ferrymq_http::fuzzing::authorization(data) {
        Ok((user, secret)) => {
            assert!(!user.contains(':'), "the user ends at the first ':'");
            let _ = secret;
        }
        Err(why) => {
            // A refusal is one of the fixed sentences, or names the scheme (the text before the
            // first space): never anything after it, where the secret is.
            const FIXED: [&str; 7] = [
                "not a header value",
                "malformed Authorization header: not visible ASCII",
                "malformed Authorization header: Bearer needs a token",
                "malformed Authorization header: Basic needs base64 of user:password",
                "malformed Authorization header: Basic credentials are not UTF-8",
                "malformed Authorization header: Basic needs user:password",
                "malformed Authorization header: Basic needs a user name",
            ];
            let scheme = String::from_utf8_lossy(data.split(|&b| b == b' ').next().unwrap_or(&[]));
            assert!(
                FIXED.contains(&why.as_str())
                    || why
                        == format!(
                            "unsupported Authorization scheme '{scheme}': use Basic or Bearer"
                        ),
                "an unexpected refusal: {why}"
            );
        }
    }

    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match Pattern::parse(text) {
        Ok(Pattern::Any) => assert_eq!(text, "*"),
        Ok(Pattern::Prefix(prefix)) => {
            assert_eq!(format!("{prefix}*"), text);
            let pattern = Pattern::Prefix(prefix.clone());
            assert!(pattern.matches(&format!("{prefix}x")));
            assert!(!pattern.matches(&prefix[..prefix.len() - 1]));
        }
        Ok(Pattern::Exact(name)) => {
            assert_eq!(name, text);
            assert!(Pattern::Exact(name.clone()).matches(text));
            assert!(!Pattern::Exact(name).matches(&format!("{text}x")));
        }
        Err(_) => {}
    }
    if let Ok(bits) = parse_actions(text) {
        assert_eq!(parse_actions(&actions_to_string(bits)).ok(), Some(bits));
    }
    if let Ok(bits) = parse_roles(text) {
        assert_eq!(parse_roles(&roles_to_string(bits)).ok(), Some(bits));
    }
});
