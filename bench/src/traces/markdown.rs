//! The run traces' section of latest.md: the facts, each size's tree, every method's figures
//! against its floor, what sexton kept, and its memory from the fewest files to the most.

use super::{TraceMethod, TraceScale, Traces};
use crate::compare;
use crate::table::{Column, columns, f, facts, flat, mb, measured, or_dash, table, within};

/// The section's body.
pub fn markdown(t: &Traces) -> String {
    let bodies = if t.small_bodies {
        "the signature line alone"
    } else {
        "a signature line and 1–4 KiB"
    };
    let mut md = facts(&[
        (
            "measured",
            measured(&t.measured_at, &t.machine, !t.separate_run),
        ),
        ("page cache", t.cache.clone()),
        ("1-minute load before / after", t.load_average.clone()),
        ("age limit days", t.age_days.to_string()),
        ("each file", bodies.to_owned()),
        ("agents table", t.agent_rows.clone()),
    ]);
    let methods = within(&t.scales, |s| &s.methods);
    let kept: Vec<_> = methods
        .iter()
        .copied()
        .filter(|(_, m)| !m.kept.is_empty())
        .collect();
    let mut sections = vec![
        ("Trees", columns(TREES, &flat(&t.scales))),
        ("Methods", columns(METHODS, &methods)),
        ("Kept by sexton", columns(KEPT, &kept)),
    ];
    let throttled: Vec<_> = methods
        .iter()
        .copied()
        .filter(|(_, m)| m.throttle.is_some())
        .collect();
    if !throttled.is_empty() {
        let body = columns(THROTTLED, &throttled);
        sections.push(("Behind a store that throttles (PF-7)", body));
    }
    let stopped: Vec<Vec<String>> = t
        .scales
        .iter()
        .filter_map(|s| Some(vec![s.files.to_string(), s.object_store.clone()?]))
        .collect();
    if !stopped.is_empty() {
        sections.push(("Object store not run", table(&["files", "why"], stopped)));
    }
    if let Some(growth) = growth(t) {
        sections.push(("sexton's peak RSS, most files ÷ fewest", growth));
    }
    if !t.before_after.is_empty() {
        sections.push(("Before and after", compare::markdown(&t.before_after)));
    }
    for (heading, body) in sections {
        md.push_str(&format!("\n### {heading}\n\n{body}"));
    }
    md
}

/// A row per size: what its tree holds, and how long writing it took.
const TREES: &[Column<(), TraceScale>] = &[
    ("files", |_, s| s.files.to_string()),
    ("agents", |_, s| s.agents.to_string()),
    ("examined", |_, s| s.examined.to_string()),
    ("candidates", |_, s| s.candidates.to_string()),
    ("live", |_, s| s.live.to_string()),
    ("bad signature", |_, s| s.bad_signature.to_string()),
    ("symlinks", |_, s| s.symlinks.to_string()),
    ("allocated MB", |_, s| {
        f(s.allocated_bytes as f64 / 1_048_576.0, 0)
    }),
    ("written in s", |_, s| f(s.generate_seconds, 1)),
    ("rounds (median shown)", |_, s| s.rounds.to_string()),
];

/// A row per method and size: its time, rates, floor, CPU and memory.
const METHODS: &[Column<TraceScale, TraceMethod>] = &[
    ("files", |s, _| s.files.to_string()),
    ("method", |_, m| m.name.clone()),
    ("s", |_, m| f(m.seconds, 1)),
    ("examined/s", |_, m| f(m.examined_per_s, 0)),
    ("deleted", |_, m| m.deleted.to_string()),
    ("deleted/s", |_, m| f(m.deleted_per_s, 0)),
    ("vs floor", against),
    ("CPU s (process / database)", |_, m| {
        let cpu = |s: Option<f64>| or_dash(s, |s| f(s, 1));
        format!("{} / {}", cpu(m.cpu_seconds), cpu(m.db_cpu_seconds))
    }),
    ("peak RSS MB", |_, m| mb(m.peak_rss_kb)),
];

/// A row per sexton method and size: what it kept, by reason.
const KEPT: &[Column<TraceScale, TraceMethod>] = &[
    ("files", |s, _| s.files.to_string()),
    ("method", |_, m| m.name.clone()),
    ("kept, by reason", |_, m| {
        let kept: Vec<String> = m.kept.iter().map(|(k, n)| format!("{k} {n}")).collect();
        kept.join(", ")
    }),
];

/// A row per run behind the throttling proxy: the rate it allowed, what it let through and
/// answered `503`, and the rate sexton sustained against the bound of 90 %.
const THROTTLED: &[Column<TraceScale, TraceMethod>] = &[
    ("files", |s, _| s.files.to_string()),
    ("rate allowed/s", |_, m| {
        or_dash(m.throttle.as_ref(), |t| t.rate.to_string())
    }),
    ("forwarded", |_, m| {
        or_dash(m.throttle.as_ref(), |t| t.forwarded.to_string())
    }),
    ("answered 503", |_, m| {
        or_dash(m.throttle.as_ref(), |t| t.slowed_down.to_string())
    }),
    ("achieved/s", |_, m| {
        or_dash(m.throttle.as_ref(), |t| f(t.achieved_per_s, 0))
    }),
    ("of the rate", |_, m| {
        or_dash(m.throttle.as_ref(), |t| {
            let met = if t.of_rate >= 0.9 {
                "met"
            } else {
                "**not met**"
            };
            format!("{:.2} ({met})", t.of_rate)
        })
    }),
];

/// `m` against its floor on the same backend at its size: sexton's age run against the walk
/// that reaches its end state (PF-6), on the object store against the listing that reads the
/// signatures (PF-7), that floor against the list-and-delete loop, the rest against `find`; "—"
/// for the loops themselves and the throttled run (its own table).
fn against(s: &TraceScale, m: &TraceMethod) -> String {
    let floor = match m.name.as_str() {
        "find age" | "list-delete s3" | "sexton age throttled s3" => None,
        "sexton age" => Some("walk+sig age"),
        "sexton age s3" => Some("list+sig s3"),
        name if name.ends_with(" s3") => Some("list-delete s3"),
        _ => Some("find age"),
    };
    let against = floor.and_then(|floor| {
        let of = s.methods.iter().find(|f| f.name == floor)?;
        Some(format!(
            "{:.2}× {floor}",
            m.examined_per_s / of.examined_per_s
        ))
    });
    or_dash(against, |a| a)
}

/// sexton's peak RSS at the most files over that at the fewest, by age and by quota, against
/// the bound of 2×; none with a single size.
fn growth(t: &Traces) -> Option<String> {
    let fewest = t.scales.iter().map(|s| s.files).min()?;
    let most = t.scales.iter().map(|s| s.files).max()?;
    if fewest == most {
        return None;
    }
    let row = |run: &str, ratio: Option<f64>| {
        let within = |r: f64| if r <= 2.0 { "yes" } else { "**no**" };
        vec![
            run.to_owned(),
            format!("{fewest} → {most}"),
            or_dash(ratio, |r| format!("{r:.2}×")),
            or_dash(ratio, |r| within(r).to_owned()),
        ]
    };
    let rows = [row("age", t.rss_ratio_age), row("quota", t.rss_ratio_quota)];
    Some(table(&["run", "files", "ratio", "within 2×"], rows))
}
