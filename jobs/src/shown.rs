//! Text from the database or a file tree as people read it, in logs and on terminals: shown,
//! never obeyed. A stored path, account name or case reference may hold a line break (which
//! would forge a log line), a terminal escape, or a bidirectional control that reorders what is
//! displayed around it (U+202E shows `fdp.exe` for `exe.pdf`); each is written as its escape.

use std::fmt;

/// Whether `ch` is a bidirectional formatting control: the embeddings and overrides
/// (U+202A–U+202E), the isolates (U+2066–U+2069) and the marks (U+200E, U+200F, U+061C).
pub fn is_bidi_control(ch: char) -> bool {
    matches!(
        ch,
        '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}' | '\u{200E}' | '\u{200F}' | '\u{061C}'
    )
}

/// Whether `ch` is shown as its escape rather than written: every control character (the line
/// break included) and every bidirectional control.
pub fn is_escaped(ch: char) -> bool {
    ch.is_control() || is_bidi_control(ch)
}

/// Writes `text` to `out` with every character `escaped` says to escape written as
/// `\u{…}`.
///
/// # Errors
/// Those of `out`.
pub fn write_escaped(
    out: &mut impl fmt::Write,
    text: &str,
    escaped: impl Fn(char) -> bool,
) -> fmt::Result {
    let mut rest = text;
    while let Some(at) = rest.find(&escaped) {
        out.write_str(&rest[..at])?;
        let ch = rest[at..].chars().next().expect("found at a char boundary");
        for part in ch.escape_unicode() {
            out.write_char(part)?;
        }
        rest = &rest[at + ch.len_utf8()..];
    }
    out.write_str(rest)
}

/// A string displayed on one line with every control and bidirectional control escaped: for
/// log fields that come from the database or a file tree (`path = %Shown(&claimed.path)`).
#[derive(Debug, Clone, Copy)]
pub struct Shown<'a>(pub &'a str);

impl fmt::Display for Shown<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_escaped(f, self.0, is_escaped)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn op4_line_breaks_escapes_and_bidi_controls_are_shown_not_obeyed() {
        assert_eq!(
            Shown("a/b\n2026-12-01T03:00:00Z  INFO forged\u{1b}[2J\u{202e}fdp.exe\u{2066}é")
                .to_string(),
            "a/b\\u{a}2026-12-01T03:00:00Z  INFO forged\\u{1b}[2J\\u{202e}fdp.exe\\u{2066}é"
        );
        for ch in [
            '\u{202a}', '\u{202e}', '\u{2066}', '\u{2069}', '\u{200e}', '\u{200f}', '\u{61c}',
        ] {
            assert!(is_escaped(ch), "{:?}", ch);
        }
        // Control: ordinary text, right-to-left letters included, is written as it is.
        assert_eq!(Shown("runs/ab c/شسي.out").to_string(), "runs/ab c/شسي.out");
    }
}
