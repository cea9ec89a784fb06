//! Text for people's terminals: what comes from the database (account names, errors, paths,
//! holds' case references) is shown, never obeyed. The escaping is the jobs crate's
//! [`sexton_jobs::shown`], the one the logs use.

use sexton_jobs::shown::{is_escaped, write_escaped};

/// `text` with every control character but the line break, and every bidirectional control
/// (U+202E and its kin), escaped (`\u{1b}` for ESC), so that stored strings cannot move the
/// cursor, retitle the terminal, hide lines or reorder what is shown around them (OP-1).
pub fn printable(text: &str) -> String {
    escaped(text, |ch| ch != '\n' && is_escaped(ch))
}

/// `text` on one line: [`printable`] with line breaks escaped too, for one field among others
/// (a cell of a table, a value on a line of its own).
pub fn one_line(text: &str) -> String {
    escaped(text, is_escaped)
}

fn escaped(text: &str, escape: impl Fn(char) -> bool) -> String {
    let mut out = String::with_capacity(text.len());
    write_escaped(&mut out, text, escape).expect("a String takes every write");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn op1_escape_sequences_are_shown_not_obeyed() {
        assert_eq!(
            printable("acme\u{1b}]0;PWNED\u{7}\nnext"),
            "acme\\u{1b}]0;PWNED\\u{7}\nnext"
        );
    }

    #[test]
    fn op1_bidi_controls_are_shown_not_obeyed() {
        assert_eq!(
            printable("case \u{202e}fdp.exe\u{2069}\nnext"),
            "case \\u{202e}fdp.exe\\u{2069}\nnext"
        );
        assert_eq!(one_line("a\nb\u{200f}"), "a\\u{a}b\\u{200f}");
        // Control: text in any script, and spaces, stay as they are.
        assert_eq!(one_line("dossier شسي 7"), "dossier شسي 7");
    }
}
