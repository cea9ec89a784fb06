//! The scales' section of latest.md: tables of figures under short headings, and the targets.
//! What each method is and how each column is measured is in docs/benchmark.md.

use chrono::{DateTime, Utc};

use super::{Scale, targets};
use crate::compare;
use crate::method::Method;
use crate::table::{Column, columns, f, facts, flat, mb, or_dash, percent, table};

/// The section's body: when and where, the templates, the writers alone, each job's methods
/// (rates, the writer beside them, their WAL and hops), the WAL budget, the targets, and the
/// two builds compared.
pub fn markdown(results: &[Scale], measured_at: &DateTime<Utc>, machine: &str) -> String {
    let when = format!("{}, {machine}", measured_at.format("%Y-%m-%d"));
    let mut md = facts(&[("measured", when)]);
    let (mut details, mut sessions) = (Vec::new(), Vec::new());
    for s in results {
        details.extend(s.methods.iter().map(|m| (s, m)));
        sessions.extend(s.session_methods.iter().map(|m| (s, m)));
    }
    let budgets: Vec<(&Scale, &Method)> = results
        .iter()
        .filter_map(|s| Some((s, &s.wal_budget.as_ref()?.method)))
        .collect();
    let mut sections = vec![
        ("Templates", columns(TEMPLATES, &flat(results))),
        (
            "Writers alone (idle baseline)",
            columns(IDLE, &flat(results)),
        ),
        ("Execution details", columns(DETAILS, &details)),
        (
            "Execution details: the writer beside",
            columns(BESIDE, &details),
        ),
        ("Execution details: WAL and hops", columns(WAL, &details)),
    ];
    if !budgets.is_empty() {
        sections.push((
            "Execution details under a WAL budget",
            columns(BUDGET, &budgets),
        ));
    }
    sections.extend([
        ("Sessions", columns(SESSIONS, &sessions)),
        (
            "Sessions: the appending writer beside",
            columns(BESIDE, &sessions),
        ),
        ("Sessions: WAL and hops", columns(WAL, &sessions)),
        ("Targets (SPEC §8)", targets_table(results)),
    ]);
    let compared: Vec<_> = results
        .iter()
        .flat_map(|s| s.before_after.clone())
        .collect();
    if !compared.is_empty() {
        sections.push(("Before and after", compare::markdown(&compared)));
    }
    for (heading, body) in sections {
        md.push_str(&format!("\n### {heading}\n\n{body}"));
    }
    md
}

/// A row per scale: what its template holds and what a pass removes.
const TEMPLATES: &[Column<(), Scale>] = &[
    ("scale", |_, s| s.scale.to_string()),
    ("runs", |_, s| s.runs.to_string()),
    ("owners", |_, s| s.owners.to_string()),
    ("detail rows", |_, s| s.detail_rows.to_string()),
    ("sessions", |_, s| s.sessions.to_string()),
    ("history rows", |_, s| s.session_rows.to_string()),
    ("seed s", |_, s| f(s.seed_seconds, 1)),
    ("rounds (median shown)", |_, s| s.rounds.to_string()),
    ("transaction target ms", |_, s| {
        f(s.transaction_target_ms, 0)
    }),
];

/// A row per scale: each writer alone on a copy, its latency and WAL rate.
const IDLE: &[Column<(), Scale>] = &[
    ("scale", |_, s| s.scale.to_string()),
    ("writer p50 / p99 / max ms", |_, s| s.idle_writer.ms()),
    ("writer WAL B/s", |_, s| f(s.idle_writer_wal_bytes_per_s, 0)),
    ("appender p50 / p99 / max ms", |_, s| s.idle_appender.ms()),
    ("appender WAL B/s", |_, s| {
        f(s.idle_appender_wal_bytes_per_s, 0)
    }),
];

/// A row per execution-details method and scale: its time and rates against the raw floor
/// and the naive delete.
const DETAILS: &[Column<Scale, Method>] = &[
    ("scale", |s, _| s.scale.to_string()),
    ("method", |_, m| m.name.clone()),
    ("s", |_, m| f(m.seconds, 2)),
    ("owners/s", |_, m| f(m.owners_per_s, 0)),
    ("rows/s", |_, m| f(m.rows_per_s, 0)),
    ("vs raw", |s, m| against(m, &s.methods, "raw")),
    ("vs naive", |s, m| against(m, &s.methods, "naive")),
];

/// A row per sessions method and scale: its time and rates against the raw cascade.
const SESSIONS: &[Column<Scale, Method>] = &[
    ("scale", |s, _| s.scale.to_string()),
    ("method", |_, m| m.name.clone()),
    ("s", |_, m| f(m.seconds, 2)),
    ("sessions/s", |_, m| f(m.owners_per_s, 0)),
    ("rows/s", |_, m| f(m.rows_per_s, 0)),
    ("vs raw", |s, m| {
        against(m, &s.session_methods, "sessions raw")
    }),
];

/// A row per method and scale: what the application writer beside it saw, and the method's
/// longest write transaction.
const BESIDE: &[Column<Scale, Method>] = &[
    ("scale", |s, _| s.scale.to_string()),
    ("method", |_, m| m.name.clone()),
    ("p50 / p99 / max ms", |_, m| m.writer.ms()),
    ("longest lock wait ms", |_, m| {
        f(m.writer_longest_lock_wait_ms, 1)
    }),
    ("writes that waited", |_, m| m.waits()),
    ("longest write tx ms", |_, m| f(m.longest_transaction_ms, 0)),
];

/// A row per method and scale: its WAL (per owner or session, net of the writer), and for
/// sexton its hops, memory and where the time went.
const WAL: &[Column<Scale, Method>] = &[
    ("scale", |s, _| s.scale.to_string()),
    ("method", |_, m| m.name.clone()),
    ("WAL MB (writer's)", |_, m| wal_mb(m)),
    ("WAL B/item", |_, m| wal_per_item(m)),
    ("hop median / p99 ms", |_, m| {
        or_dash(m.hop, |h| h.median_p99())
    }),
    ("µs/candidate", |_, m| {
        or_dash(m.hop_us_per_candidate, |h| f(h.p50_ms, 0))
    }),
    ("peak RSS MB", |_, m| mb(m.peak_rss_kb)),
    ("outside owner tx", |_, m| {
        percent(m.share_outside_owner_transactions)
    }),
    ("outside hops", |_, m| percent(m.share_outside_hops)),
];

/// The WAL budget's pass: its budget, the rate it held, and the writer beside it.
const BUDGET: &[Column<Scale, Method>] = &[
    ("scale", |s, _| s.scale.to_string()),
    ("budget B/s", |s, _| {
        budget(s, |b| b.budget_bytes_per_s.to_string())
    }),
    ("achieved B/s", |s, _| {
        budget(s, |b| f(b.achieved_bytes_per_s, 0))
    }),
    ("achieved ÷ budget", |s, _| budget(s, |b| f(b.ratio, 2))),
    ("s", |_, m| f(m.seconds, 1)),
    ("owners/s", |_, m| f(m.owners_per_s, 0)),
    ("WAL B/owner", |_, m| wal_per_item(m)),
    ("writer p50 / p99 / max ms", |_, m| m.writer.ms()),
    ("longest lock wait ms", |_, m| {
        f(m.writer_longest_lock_wait_ms, 1)
    }),
    ("longest write tx ms", |_, m| f(m.longest_transaction_ms, 0)),
];

/// A figure of scale `s`'s WAL budget.
fn budget(s: &Scale, figure: impl FnOnce(&super::WalBudget) -> String) -> String {
    or_dash(s.wal_budget.as_ref(), figure)
}

/// `m`'s rate over that of method `floor` among `methods`, or "—" when that one was not
/// measured (`--methods`).
fn against(m: &Method, methods: &[Method], floor: &str) -> String {
    let floor = methods.iter().find(|of| of.name == floor);
    or_dash(floor, |of| {
        format!("{:.2}×", m.owners_per_s / of.owners_per_s)
    })
}

/// The targets of SPEC §8, each with its figures, its bound and whether it was met.
fn targets_table(results: &[Scale]) -> String {
    let targets = targets(results);
    let mut rows: Vec<Vec<String>> = targets
        .iter()
        .map(|t| {
            let at = match t.from_scale {
                Some(from) => format!("{from} → {}", t.scale),
                None => t.scale.to_string(),
            };
            let verdict = if t.met { "met" } else { "**not met**" };
            let (id, check, bound) = (t.id.to_owned(), t.check.clone(), t.target.clone());
            vec![id, at, check, bound, verdict.to_owned()]
        })
        .collect();
    if !targets.iter().any(|t| t.id == "PF-3") {
        let why = "not measured: needs a scale of 10 or more and a larger one";
        rows.push(["PF-3", "—", why, "—", "—"].map(str::to_owned).to_vec());
    }
    table(&["target", "scale", "measured", "bound", "verdict"], rows)
}

/// A method's WAL in MB, with the writer's estimated share in brackets.
fn wal_mb(m: &Method) -> String {
    const MB: f64 = 1024.0 * 1024.0;
    match (m.wal_bytes, m.wal_bytes_writer) {
        (Some(bytes), Some(writer)) => format!("{:.1} ({:.1})", bytes as f64 / MB, writer / MB),
        _ => "—".into(),
    }
}

/// A method's WAL net of the writer, per owner (session).
fn wal_per_item(m: &Method) -> String {
    or_dash(m.wal_bytes_per_owner, |bytes| format!("{bytes:.0}"))
}
