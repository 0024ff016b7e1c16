//! Names clients choose: topics, subscriptions and dead-letter topics.
//!
//! Every transport (binary protocol, HTTP, the embedded library) and every name the broker makes
//! itself (`<topic>.dlq`) passes through [`validate_name`], and a topic's directory can only be
//! derived from the [`ValidName`] it returns. Invariant: a valid name is exactly one normal path
//! component on every platform the broker runs on, so `topics/<name>` is a child of `topics/` and
//! never the directory itself, its parent, or a path with more than one component.
//!
//! The rule is the one names always had (1 to 255 bytes of ASCII letters, digits, `.`, `_` and
//! `-`: safe in file names, URLs and metric labels alike), minus the two names a file system reads
//! as a reference to a directory: `.` (the directory itself) and `..` (its parent). Every name valid
//! under the old rule and still valid maps to the same directory as before, so existing data dirs
//! open unchanged. 255 bytes is also the longest file name Linux file systems take.

use std::fmt;

use ferrymq_protocol::limits::NAME_BYTES_MAX;

use crate::error::BrokerError;

/// A name that passed [`validate_name`]: the only way to name a topic's directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ValidName<'a>(&'a str);

impl<'a> ValidName<'a> {
    pub fn as_str(&self) -> &'a str {
        self.0
    }
}

impl fmt::Display for ValidName<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }
}

/// Checks a topic or subscription name; `field` names it in the error. Names are 1 to 255 bytes
/// of ASCII letters, digits, `.`, `_` and `-`, and neither `.` nor `..`.
pub fn validate_name<'a>(field: &'static str, name: &'a str) -> Result<ValidName<'a>, BrokerError> {
    if name.is_empty() || name.len() > NAME_BYTES_MAX {
        return Err(BrokerError::invalid(
            field,
            format!("must be 1 to {NAME_BYTES_MAX} bytes long"),
        ));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        // Quoted with escapes: the name may hold control characters or NUL.
        return Err(BrokerError::invalid(
            field,
            format!("{name:?} contains {c:?}: use letters, digits, '.', '_' and '-'"),
        ));
    }
    if name == "." || name == ".." {
        return Err(BrokerError::invalid(
            field,
            format!("'{name}' is reserved: it names a directory, not a file, on every file system"),
        ));
    }
    Ok(ValidName(name))
}

#[cfg(test)]
mod tests {
    use std::path::{Component, Path};

    use proptest::prelude::*;

    use super::*;
    use crate::disk::DiskConfig;

    #[test]
    fn path_like_names_are_refused() {
        for name in [
            "", ".", "..", "/", "a/b", "../a", "a\\b", "a\0b", "a\nb", "\u{7f}", "a b", "é", "C:",
            "~",
        ] {
            assert!(
                validate_name("topic", name).is_err(),
                "{name:?} was accepted"
            );
        }
        assert!(validate_name("topic", &"a".repeat(NAME_BYTES_MAX + 1)).is_err());
    }

    #[test]
    fn names_valid_before_stay_valid() {
        for name in [
            "orders",
            "orders.dlq",
            "...",
            ".hidden",
            "a..b",
            "-",
            "0",
            "Upper_Case-1.2",
            &"a".repeat(NAME_BYTES_MAX),
        ] {
            assert_eq!(validate_name("topic", name).unwrap().as_str(), name);
        }
    }

    #[test]
    fn the_error_names_the_field_and_the_character() {
        let error = validate_name("subscription", "a\0b")
            .unwrap_err()
            .to_string();
        assert!(error.contains("subscription"), "{error}");
        assert!(error.contains("\\0"), "{error}");
        let error = validate_name("topic", "..").unwrap_err().to_string();
        assert!(error.contains("reserved"), "{error}");
    }

    /// A valid name's directories are inside `topics/`, one component below it, named by the
    /// name itself; and the same for the name with `.dlq` appended, when that is valid too.
    fn assert_inside_topics(name: &str) {
        let config = DiskConfig::new("/data");
        let topics = Path::new("/data/topics");
        let Ok(valid) = validate_name("topic", name) else {
            return;
        };
        let dir = config.topic_dir(valid);
        let relative = dir.strip_prefix(topics).expect("under topics/");
        let components: Vec<Component> = relative.components().collect();
        assert_eq!(components, [Component::Normal(name.as_ref())], "{name:?}");
        let partition = config.partition_dir(valid, 7);
        assert_eq!(partition.parent(), Some(dir.as_path()), "{name:?}");
        assert_eq!(partition.file_name(), Some("7".as_ref()));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        #[test]
        fn no_valid_name_resolves_outside_topics(name in any::<String>()) {
            assert_inside_topics(&name);
            assert_inside_topics(&format!("{name}.dlq"));
        }

        /// Names made of the characters that matter to paths, so that accepted ones are common.
        #[test]
        fn no_valid_path_like_name_resolves_outside_topics(name in "[./\\\\a_\\-\0:]{0,6}") {
            assert_inside_topics(&name);
            assert_inside_topics(&format!("{name}.dlq"));
        }
    }
}
