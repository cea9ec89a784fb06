//! The erasure's section of latest.md: a row per size for PF-8's figures, the writer beside each
//! method, and where sexton's time went at the largest size.

use super::{Erasure, ErasureRun, TRANSACTION_TARGET_MS};
use crate::method::Method;
use crate::table::{Column, columns, f, facts, flat, mb, or_dash, percent, table};

/// The section: the facts, PF-8 per size, the methods, the nights and the profile.
pub fn markdown(e: &Erasure) -> String {
    let mut md = facts(&[
        (
            "measured",
            format!("{}, {}", e.measured_at.format("%Y-%m-%d"), e.machine),
        ),
        (
            "writer's bound",
            format!(
                "2 × transaction_target_ms = {:.0} ms",
                2.0 * TRANSACTION_TARGET_MS
            ),
        ),
    ]);
    let runs = flat(&e.runs);
    let methods: Vec<(&ErasureRun, &Method)> = e
        .runs
        .iter()
        .flat_map(|r| r.methods.iter().map(move |m| (r, m)))
        .collect();
    let mut sections = vec![
        ("PF-8", columns(PF8, &runs)),
        ("Sizes", columns(SIZES, &runs)),
        ("Methods", columns(METHODS, &methods)),
        ("The other accounts' night", columns(NIGHTS, &runs)),
    ];
    let compared: Vec<_> = e.runs.iter().flat_map(|r| r.before_after.clone()).collect();
    if !compared.is_empty() {
        sections.push(("Before and after", crate::compare::markdown(&compared)));
    }
    if let Some(largest) = e.runs.last() {
        let rows = largest
            .profile
            .iter()
            .map(|(step, share)| vec![step.clone(), percent(Some(*share))]);
        sections.push((
            "Where sexton's time went (largest size)",
            table(
                &[
                    "statement running (sampled every 50 ms)",
                    "share of samples",
                ],
                rows,
            ),
        ));
    }
    for (heading, body) in sections {
        md.push_str(&format!("\n### {heading}\n\n{body}"));
    }
    md
}

fn sexton(r: &ErasureRun) -> &Method {
    &r.methods[0]
}

fn floor(r: &ErasureRun) -> &Method {
    &r.methods[1]
}

/// "met" or "**not met**".
fn verdict(met: bool) -> String {
    if met { "met" } else { "**not met**" }.to_owned()
}

/// A row per size: PF-8's three figures and their verdicts.
const PF8: &[Column<(), ErasureRun>] = &[
    ("runs / sessions / files", |_, r| {
        format!(
            "{} / {} / {}",
            r.sizes.runs, r.sizes.sessions, r.account_files
        )
    }),
    ("sexton ÷ floor (≥ 1.0×)", |_, r| {
        let ratio = floor(r).seconds / sexton(r).seconds;
        format!("{ratio:.2}× {}", verdict(ratio >= 1.0))
    }),
    ("writer's longest wait beside sexton ms (≤ 20)", |_, r| {
        let ms = sexton(r).writer_longest_lock_wait_ms;
        format!("{ms:.1} {}", verdict(ms <= 2.0 * TRANSACTION_TARGET_MS))
    }),
    ("night beside ÷ alone (≤ 1.2×)", |_, r| {
        let ratio = r.night_beside.seconds / r.night_alone.seconds;
        format!("{ratio:.2}× {}", verdict(ratio <= 1.2))
    }),
    ("worker peak RSS MB: erasure / night / both", |_, r| {
        format!(
            "{} / {} / {}",
            mb(sexton(r).peak_rss_kb),
            mb(r.night_alone.worker_peak_rss_kb),
            mb(r.night_beside.worker_peak_rss_kb)
        )
    }),
];

/// A row per size: what was built.
const SIZES: &[Column<(), ErasureRun>] = &[
    ("measured", |_, r| {
        r.measured_at.format("%Y-%m-%d %H:%M").to_string()
    }),
    ("runs", |_, r| r.sizes.runs.to_string()),
    ("sessions", |_, r| r.sizes.sessions.to_string()),
    ("account's files", |_, r| r.account_files.to_string()),
    ("rows removed", |_, r| r.rows_removed.to_string()),
    ("other accounts", |_, r| r.sizes.others.to_string()),
    ("files in the tree", |_, r| r.tree_files.to_string()),
    ("template s", |_, r| f(r.fill_seconds, 0)),
    ("tree s", |_, r| f(r.tree_seconds, 1)),
    ("rounds (median shown)", |_, r| r.rounds.to_string()),
    ("same end state", |_, r| {
        if r.same_end { "yes" } else { "**no**" }.to_owned()
    }),
];

/// A row per method at each size: time, rates, the writer beside it, the longest write
/// transaction, sexton's hops and memory.
const METHODS: &[Column<ErasureRun, Method>] = &[
    ("runs", |r, _| r.sizes.runs.to_string()),
    ("method", |_, m| m.name.clone()),
    ("s", |_, m| f(m.seconds, 1)),
    ("runs/s", |_, m| f(m.owners_per_s, 0)),
    ("rows/s", |_, m| f(m.rows_per_s, 0)),
    ("writer p50 / p99 / max ms", |_, m| m.writer.ms()),
    ("longest lock wait ms", |_, m| {
        f(m.writer_longest_lock_wait_ms, 1)
    }),
    ("writes that waited", |_, m| m.waits()),
    ("longest write tx ms", |_, m| f(m.longest_transaction_ms, 0)),
    ("hops (median / p99 ms)", |r, m| {
        or_dash(m.hop, |h| format!("{} ({})", r.sexton_hops, h.median_p99()))
    }),
    ("outside hops", |_, m| percent(m.share_outside_hops)),
    ("peak RSS MB", |_, m| mb(m.peak_rss_kb)),
];

/// A row per size: the other accounts' night alone and beside the erasure.
const NIGHTS: &[Column<(), ErasureRun>] = &[
    ("other accounts", |_, r| r.sizes.others.to_string()),
    ("night alone s", |_, r| f(r.night_alone.seconds, 1)),
    ("beside the erasure s", |_, r| f(r.night_beside.seconds, 1)),
    ("ratio", |_, r| {
        format!("{:.2}×", r.night_beside.seconds / r.night_alone.seconds)
    }),
    ("jobs alone / beside", |_, r| {
        format!("{} / {}", r.night_alone.jobs, r.night_beside.jobs)
    }),
    ("the erasure beside it s", |_, r| {
        f(r.erasure_beside_seconds, 1)
    }),
    ("worker RSS MB alone / beside", |_, r| {
        format!(
            "{} / {}",
            mb(r.night_alone.worker_peak_rss_kb),
            mb(r.night_beside.worker_peak_rss_kb)
        )
    }),
];
