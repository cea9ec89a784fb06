//! Derivative cleanup's section of latest.md: the facts, each tree, every method's files/s
//! against its floor on the same tree, and sexton's memory from the fewest files to the most.

use super::{Measured, Orphans, Scale};
use crate::table::{Column, columns, f, facts, flat, mb, measured, or_dash, within};

/// The section's body.
pub fn markdown(o: &Orphans) -> String {
    let mut md = facts(&[
        (
            "measured",
            measured(&o.measured_at, &o.machine, !o.separate_run),
        ),
        ("page cache", o.cache.clone()),
        ("1-minute load before / after", o.load_average.clone()),
        (
            "each tree",
            format!(
                "outputs root: {} files per run directory, one no row names; every file {} days \
                 old (the grace is 7)",
                super::PER_RUN,
                super::AGE_DAYS
            ),
        ),
        (
            "sexton's peak RSS, most files ÷ fewest (disk)",
            or_dash(o.rss_ratio, |r| format!("{r:.2}×")),
        ),
    ]);
    md.push_str(&format!(
        "\n### Trees\n\n{}\n### Methods\n\n{}",
        columns(TREES, &flat(&o.scales)),
        columns(METHODS, &within(&o.scales, |s| &s.methods))
    ));
    md
}

const TREES: &[Column<(), Scale>] = &[
    ("store", |_, s| s.store.clone()),
    ("files", |_, s| s.files.to_string()),
    ("orphans", |_, s| s.orphans.to_string()),
    ("written in s", |_, s| f(s.fill_seconds, 1)),
];

const METHODS: &[Column<Scale, Measured>] = &[
    ("store", |s, _| s.store.clone()),
    ("files", |s, _| s.files.to_string()),
    ("method", |_, m| m.name.clone()),
    ("s (median round)", |_, m| f(m.seconds, 1)),
    ("rounds s", |_, m| {
        if m.rounds.is_empty() {
            "—".to_owned()
        } else {
            let each: Vec<String> = m.rounds.iter().map(|s| f(*s, 1)).collect();
            each.join(" / ")
        }
    }),
    ("files/s", |_, m| f(m.files_per_second, 0)),
    ("removed", |_, m| m.removed.to_string()),
    ("vs floor", against),
    ("peak RSS MB", |_, m| mb(m.peak_rss_kb)),
    ("command", |_, m| format!("`{}`", m.command)),
];

/// sexton's files/s over its floor's on the same tree (the floor's own row: 1.00×).
fn against(s: &Scale, m: &Measured) -> String {
    let floor = s.methods.iter().find(|m| !m.name.starts_with("sexton"));
    or_dash(floor, |floor| {
        format!("{:.2}×", m.files_per_second / floor.files_per_second)
    })
}
