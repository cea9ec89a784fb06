//! One stored path, one key (OS-3).

use object_store::path::Path as Key;

/// The key `relative` names under `prefix` (OS-3): the prefix, a `/` and the path as it is.
///
/// # Errors
/// The path is empty, starts with `/`, has an empty, `.` or `..` segment, a backslash, a
/// percent-encoded `/` or `\`, or a control character: a spelling another key could share, or
/// one a store may read as another key.
pub fn key_of(prefix: &str, relative: &str) -> Result<Key, String> {
    let why = if relative.is_empty() {
        Some("is empty")
    } else if relative.starts_with('/') {
        Some("starts with `/`")
    } else if relative.contains('\\') {
        Some("holds a backslash")
    } else if relative.chars().any(char::is_control) {
        Some("holds a control character")
    } else if ["%2f", "%5c"]
        .iter()
        .any(|encoded| relative.to_ascii_lowercase().contains(encoded))
    {
        Some("holds a percent-encoded separator")
    } else if relative
        .split('/')
        .any(|segment| matches!(segment, "" | "." | ".."))
    {
        Some("has an empty, `.` or `..` segment")
    } else {
        None
    };
    if let Some(why) = why {
        return Err(format!(
            "path {relative:?} {why}: it names no key of its own"
        ));
    }
    let key = if prefix.is_empty() {
        relative.to_owned()
    } else {
        format!("{prefix}/{relative}")
    };
    Key::parse(&key).map_err(|err| format!("path {relative:?} names no key: {err}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn os3_each_ambiguous_spelling_is_refused_and_a_plain_path_is_one_key() {
        for path in [
            "",
            "/a/x.out",
            "a//x.out",
            "a/./x.out",
            "./a/x.out",
            "a/../x.out",
            "..",
            "a/x.out/",
            "a\\x.out",
            "a%2Fx.out",
            "a%2fx.out",
            "a%5Cx.out",
            "a/x\u{0}.out",
            "a/x\n.out",
            "a/x\u{7f}.out",
        ] {
            assert!(key_of("p", path).is_err(), "{path:?} was given a key");
        }
        assert_eq!(key_of("p/q", "a/x.out").unwrap().as_ref(), "p/q/a/x.out");
        assert_eq!(key_of("", "a/x.out").unwrap().as_ref(), "a/x.out");
        assert_eq!(
            key_of("p", "a/x y%20.out").unwrap().as_ref(),
            "p/a/x y%20.out"
        );
    }
}
