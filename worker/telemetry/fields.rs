//! The fields of a text log line, written with every control and bidirectional control in
//! their values escaped (OP-4): a stored path, account name or error holding a line break
//! cannot start a forged log line, nor a U+202E reorder the line around it. The layout is
//! tracing's own (`name=value`, the message bare); only values change.

use std::fmt;

use sexton_jobs::shown::Shown;
use tracing::field::{Field, Visit};
use tracing_subscriber::field::{MakeVisitor, VisitFmt, VisitOutput};
use tracing_subscriber::fmt::format::{DefaultVisitor, Writer};

/// The text format's fields, escaped: `fmt().fmt_fields(Escaped)`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Escaped;

impl<'a> MakeVisitor<Writer<'a>> for Escaped {
    type Visitor = EscapedVisitor<'a>;

    fn make_visitor(&self, target: Writer<'a>) -> Self::Visitor {
        EscapedVisitor(DefaultVisitor::new(target, true))
    }
}

/// tracing's default visitor, given each value escaped.
pub struct EscapedVisitor<'a>(DefaultVisitor<'a>);

/// A value already written out and escaped, passed on as it is.
struct Written(String);

impl fmt::Debug for Written {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl Visit for EscapedVisitor<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.0.record_str(field, &Shown(value).to_string());
        } else {
            // Quoted by `Debug`, which escapes line breaks and bidirectional controls itself.
            self.0.record_str(field, value);
        }
    }

    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        let mut text = value.to_string();
        let mut source = value.source();
        while let Some(error) = source {
            text.push_str(": ");
            text.push_str(&error.to_string());
            source = error.source();
        }
        self.0
            .record_debug(field, &Written(Shown(&text).to_string()));
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        // `%value` fields reach here as their `Display`, unescaped.
        let text = format!("{value:?}");
        self.0
            .record_debug(field, &Written(Shown(&text).to_string()));
    }
}

impl VisitOutput<fmt::Result> for EscapedVisitor<'_> {
    fn finish(self) -> fmt::Result {
        self.0.finish()
    }
}

impl VisitFmt for EscapedVisitor<'_> {
    fn writer(&mut self) -> &mut dyn fmt::Write {
        self.0.writer()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// What a subscriber with these fields writes for the events `emit` logs.
    fn logged(emit: impl FnOnce()) -> String {
        #[derive(Clone, Default)]
        struct Buffer(Arc<Mutex<Vec<u8>>>);
        impl std::io::Write for Buffer {
            fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(bytes);
                Ok(bytes.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let buffer = Buffer::default();
        let sink = buffer.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || sink.clone())
            .with_ansi(false)
            .without_time()
            .fmt_fields(Escaped)
            .finish();
        tracing::subscriber::with_default(subscriber, emit);
        String::from_utf8(buffer.0.lock().unwrap().clone()).unwrap()
    }

    #[test]
    fn op4_a_stored_line_break_or_bidi_control_forges_no_log_line() {
        let path = "runs/a.out\n WARN sexton: forged \u{202e}txt.exe";
        let log = logged(|| {
            let span = tracing::info_span!("hop", account = %"acme\nINFO x");
            let _entered = span.enter();
            tracing::warn!(path = %path, plain = path, error = %path, "file {path} not deleted");
            // Control: a line of its own, written as it is.
            tracing::info!(path = %"runs/b.out", "done");
        });
        assert_eq!(log.lines().count(), 2, "{log}");
        assert!(!log.contains('\u{202e}'), "{log}");
        assert!(
            log.contains(r"path=runs/a.out\u{a} WARN sexton: forged \u{202e}txt.exe"),
            "{log}"
        );
        assert!(log.contains(r#"account=acme\u{a}INFO x"#), "{log}");
        assert!(
            log.lines().nth(1).unwrap().contains("done path=runs/b.out"),
            "{log}"
        );
    }
}
