//! Telemetry: logs (OP-4), structured tracing to stderr as text for people or JSON for
//! pipelines; and metrics (OP-3).

mod fields;
pub mod metrics;

use std::path::Path;
use std::sync::Mutex;

use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::writer::BoxMakeWriter;

use crate::config::{LogFormat, LogSettings};

/// Installs the global subscriber, writing to stderr or, if given, to the end of `file`;
/// `RUST_LOG`, when set, overrides the configured level.
///
/// # Errors
/// The log file cannot be opened.
pub fn init(settings: &LogSettings, file: Option<&Path>) -> std::io::Result<()> {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(&settings.level));
    let writer = match file {
        Some(path) => {
            let file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .map_err(|e| {
                    std::io::Error::new(e.kind(), format!("log file {}: {e}", path.display()))
                })?;
            BoxMakeWriter::new(Mutex::new(file))
        }
        None => BoxMakeWriter::new(std::io::stderr),
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer)
        .with_ansi(file.is_none());
    match settings.format {
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .init(),
        LogFormat::Text => builder.fmt_fields(fields::Escaped).init(),
    }
    Ok(())
}
