//! The short-lived records' section of latest.md: tables of figures under short headings.

use super::raw::RAW_LOCKED;
use super::{Expiry, ExpiryMethod, ExpiryTable};
use crate::compare;
use crate::table::{Column, columns, f, facts, flat, mb, measured, or_dash, percent, within};

/// The short-lived records' section of latest.md: the facts, each table's records and its
/// writer alone, then every method's rates, the writer beside it, and its hops.
pub fn markdown(e: &Expiry) -> String {
    let mut md = facts(&[
        (
            "measured",
            measured(&e.measured_at, &e.machine, !e.separate_run),
        ),
        ("expired rows per table", e.rows.to_string()),
        ("young rows per table", (e.rows / 10).to_string()),
        ("batch", e.batch_size.to_string()),
        ("writer per second", e.writer_rate.to_string()),
        ("template built in s", f(e.fill_seconds, 0)),
    ]);
    let methods = within(&e.tables, |t| &t.methods);
    let mut sections = vec![
        ("Tables", columns(TABLES, &flat(&e.tables))),
        ("Rates", columns(RATES, &methods)),
        ("The writer beside", columns(BESIDE, &methods)),
        ("Hops", columns(HOPS, &methods)),
    ];
    if !e.before_after.is_empty() {
        sections.push(("Before and after", compare::markdown(&e.before_after)));
    }
    for (heading, body) in sections {
        md.push_str(&format!("\n### {heading}\n\n{body}"));
    }
    md
}

/// A row per table: its job and age, what it holds, and the writer alone on a copy.
const TABLES: &[Column<(), ExpiryTable>] = &[
    ("table", |_, t| t.table.clone()),
    ("job", |_, t| t.job.clone()),
    ("age days", |_, t| t.days.to_string()),
    ("expired", |_, t| t.expired.to_string()),
    ("young", |_, t| t.young.to_string()),
    ("writer alone p50 / p99 / max ms", |_, t| t.idle_writer.ms()),
    ("its longest lock wait ms", |_, t| {
        f(t.idle_writer_longest_lock_wait_ms, 1)
    }),
];

/// A row per method: its time and rate against the raw floors.
const RATES: &[Column<ExpiryTable, ExpiryMethod>] = &[
    ("table", |t, _| t.table.clone()),
    ("method", |_, e| e.method.name.clone()),
    ("s", |_, e| f(e.method.seconds, 1)),
    ("deleted", |_, e| e.deleted.to_string()),
    ("left", |_, e| e.left.to_string()),
    ("rows/s", |_, e| f(e.method.rows_per_s, 0)),
    ("vs raw", |t, e| against(t, e, "raw")),
    ("vs raw+lock", |t, e| against(t, e, RAW_LOCKED)),
];

/// A row per method: what the writer beside it saw, and its longest write transaction.
const BESIDE: &[Column<ExpiryTable, ExpiryMethod>] = &[
    ("table", |t, _| t.table.clone()),
    ("method", |_, e| e.method.name.clone()),
    ("p50 / p99 / max ms", |_, e| e.method.writer.ms()),
    ("longest lock wait ms", |_, e| {
        f(e.method.writer_longest_lock_wait_ms, 1)
    }),
    ("longest write tx ms", |_, e| {
        f(e.method.longest_transaction_ms, 0)
    }),
];

/// A row per method: sexton's hops, its cost per row read, memory and the time outside the
/// batch statements.
const HOPS: &[Column<ExpiryTable, ExpiryMethod>] = &[
    ("table", |t, _| t.table.clone()),
    ("method", |_, e| e.method.name.clone()),
    ("hop median / p99 ms", |_, e| {
        or_dash(e.method.hop, |h| h.median_p99())
    }),
    ("µs/row read", |_, e| {
        or_dash(e.method.hop_us_per_candidate, |h| f(h.p50_ms, 1))
    }),
    ("peak RSS MB", |_, e| mb(e.method.peak_rss_kb)),
    ("outside batch statements", |_, e| {
        percent(e.method.share_outside_owner_transactions)
    }),
];

/// `e`'s rate over that of method `floor` of the same table.
fn against(t: &ExpiryTable, e: &ExpiryMethod, floor: &str) -> String {
    let floor = t.methods.iter().find(|m| m.method.name == floor);
    or_dash(floor, |floor| {
        format!("{:.2}×", e.method.rows_per_s / floor.method.rows_per_s)
    })
}
