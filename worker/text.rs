//! Text for people's terminals: what comes from the database (account names, errors) is shown,
//! never obeyed.

/// `text` with every control character but the line break escaped (`\u{1b}` for ESC), so that
/// stored strings cannot move the cursor, retitle the terminal or hide lines (OP-1).
pub fn printable(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for ch in text.chars() {
        if ch.is_control() && ch != '\n' {
            out.extend(ch.escape_unicode());
        } else {
            out.push(ch);
        }
    }
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
}
