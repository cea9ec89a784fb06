//! The short-lived records' section of latest.md: tables of figures under short headings.

use super::raw::RAW_LOCKED;
use super::{Expiry, ExpiryMethod, ExpiryTable};
use crate::compare;
use crate::method::Method;
use crate::table::{
    Column, columns, f, facts, flat, mb, measured, or_dash, percent, table, within,
};

/// The short-lived records' section of latest.md: the facts, each table's records and its
/// writer alone, then every method's rates, the writer beside it, its hops, and PF-6 held to
/// them (the writer's bound `twice`: 2 × `transaction_target_ms`).
pub fn markdown(e: &Expiry, twice: f64) -> String {
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
        ("PF-6", pf6(e, twice)),
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

/// The method `name` of table `t`.
fn of<'a>(t: &'a ExpiryTable, name: &str) -> Option<&'a Method> {
    t.methods
        .iter()
        .find(|m| m.method.name == name)
        .map(|m| &m.method)
}

/// `e`'s rate over that of method `floor` of the same table.
fn against(t: &ExpiryTable, e: &ExpiryMethod, floor: &str) -> String {
    let floor = t.methods.iter().find(|m| m.method.name == floor);
    or_dash(floor, |floor| {
        format!("{:.2}×", e.method.rows_per_s / floor.method.rows_per_s)
    })
}

/// PF-6 for each table: sexton's rate against the raw keyset loop (the floor of its end state);
/// and the writer, pooled over the tables' passes: its longest lock wait beside sexton at most
/// `twice` and no longer than beside the loop that takes the writer's lock first
/// (`raw+lock`). The plain loop's wait is shown for throughput's sake only.
fn pf6(e: &Expiry, twice: f64) -> String {
    let verdict = |met: bool| if met { "met" } else { "**not met**" }.to_owned();
    let mut rows = Vec::new();
    for t in &e.tables {
        if let (Some(sexton), Some(raw)) = (of(t, "sexton"), of(t, "raw")) {
            let ratio = sexton.rows_per_s / raw.rows_per_s;
            rows.push(vec![
                t.table.clone(),
                format!(
                    "sexton {:.0} ÷ raw {:.0} rows/s = {ratio:.2}×",
                    sexton.rows_per_s, raw.rows_per_s
                ),
                "≥ 1.00×".to_owned(),
                verdict(ratio >= 1.0),
            ]);
        }
    }
    // The longest wait beside `name` over every table's pass, and how many passes.
    let longest = |name: &str| {
        let waits: Vec<f64> = e
            .tables
            .iter()
            .filter_map(|t| Some(of(t, name)?.writer_longest_lock_wait_ms))
            .collect();
        let max = waits.iter().copied().reduce(f64::max)?;
        Some((max, waits.len()))
    };
    if let Some((beside, n)) = longest("sexton") {
        let locked = longest(RAW_LOCKED);
        let bound = locked.map_or(twice, |(wait, _)| twice.min(wait));
        let said = |name: &str, (wait, n): (f64, usize)| format!("{name} {wait:.1} ({n} passes)");
        rows.push(vec![
            "every table".to_owned(),
            format!(
                "writer's longest lock wait ms, pooled: {}{}{}",
                said("sexton", (beside, n)),
                locked.map_or(String::new(), |w| format!(", {}", said(RAW_LOCKED, w))),
                longest("raw").map_or(String::new(), |w| format!(
                    "; {} for throughput only",
                    said("raw", w)
                )),
            ),
            format!("≤ 2 × transaction_target_ms = {twice:.0} ms and ≤ beside {RAW_LOCKED}"),
            verdict(beside <= bound),
        ]);
    }
    table(&["table", "measured", "bound", "verdict"], rows)
}
