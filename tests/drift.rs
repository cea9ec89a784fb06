//! Figures and lists that documentation and deploy files repeat from the code, held to the
//! code: each is computed here from the registry, so that a job kind added, or a hop holding
//! one connection more, fails a test until the text says so too.

use std::collections::BTreeSet;
use std::path::Path;

use sexton::registry::{self, KINDS};
use sexton_jobs::job::Cadence;

use crate::common;

/// A file of the repository.
fn read(path: &str) -> String {
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join(path);
    std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()))
}

/// The part of `text` after `start` up to the next `end` (or the end of `text`).
fn between<'a>(text: &'a str, start: &str, end: &str) -> &'a str {
    let from = text
        .find(start)
        .unwrap_or_else(|| panic!("no {start:?} in the text"))
        + start.len();
    let rest = &text[from..];
    &rest[..rest.find(end).unwrap_or(rest.len())]
}

/// The number written right after `marker` in `text`.
fn number_after(text: &str, marker: &str) -> u64 {
    let at = text
        .find(marker)
        .unwrap_or_else(|| panic!("no {marker:?} in:\n{text}"))
        + marker.len();
    let digits: String = text[at..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits
        .parse()
        .unwrap_or_else(|_| panic!("no number after {marker:?} in:\n{text}"))
}

/// The number written right before `marker` in `text`.
fn number_before(text: &str, marker: &str) -> u64 {
    let at = text
        .find(marker)
        .unwrap_or_else(|| panic!("no {marker:?} in:\n{text}"));
    let digits: String = text[..at]
        .chars()
        .rev()
        .take_while(char::is_ascii_digit)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    digits
        .parse()
        .unwrap_or_else(|_| panic!("no number before {marker:?} in:\n{text}"))
}

/// How a spare count of connections is written.
fn spare_in_words(spare: u64) -> &'static str {
    ["no", "one", "two", "three", "four"]
        .get(spare as usize)
        .copied()
        .unwrap_or_else(|| panic!("{spare} connections spare: write the test's word for it"))
}

#[test]
fn fl6_the_pool_arithmetic_in_default_toml_and_the_readme_is_the_registrys() {
    let settings = registry::load_settings(None).expect("the defaults load");
    let budget = registry::pool_budget(settings.queue.concurrency);
    let (max, needed) = (
        u64::from(settings.database.max_connections),
        budget.needed(),
    );
    assert!(
        max >= needed,
        "the default pool is refused by its own check"
    );
    let spare = format!("leaves {} spare", spare_in_words(max - needed));
    let toml = read("config/default.toml");
    let comment = between(&toml, "[database]", "max_connections =");
    let said = (
        number_after(comment, "widest job kind ("),
        number_after(comment, "one per job kind: "),
        number_before(comment, " more ("),
        number_before(comment, " with the defaults"),
    );
    let computed = (
        u64::from(budget.per_hop),
        budget.queues,
        u64::from(sexton::config::FIXED_CONNECTIONS),
        needed,
    );
    assert_eq!(
        said, computed,
        "config/default.toml's [database] comment: (connections per hop, queues, fixed, needed)"
    );
    assert!(
        comment.contains(&spare),
        "config/default.toml says it {spare}"
    );

    let operating = read("docs/operating.md");
    let sizing = between(&operating, "## Sizing", "\n## ");
    let said = (
        number_after(sizing, "`database.max_connections` ("),
        number_after(sizing, "`queue.concurrency` ("),
        number_after(sizing, "the widest hop's connections ("),
        number_after(sizing, "each of the "),
        number_after(sizing, "+ `queues` + "),
        number_before(sizing, " with the defaults;"),
        number_after(sizing, "; the default "),
    );
    let computed = (
        max,
        settings.queue.concurrency as u64,
        u64::from(budget.per_hop),
        budget.queues,
        u64::from(sexton::config::FIXED_CONNECTIONS),
        needed,
        max,
    );
    assert_eq!(
        said, computed,
        "docs/operating.md's Sizing: (max_connections, concurrency, connections per hop, queues, fixed, \
         needed, max_connections again)"
    );
    assert!(
        sizing.contains(&spare),
        "docs/operating.md says the default {spare}"
    );
}

#[test]
fn op1_the_docs_list_every_subject_explain_knows() {
    let jobs = read("docs/jobs.md");
    let list = between(&jobs, "Subjects: ", ". It is read-only");
    let listed: BTreeSet<&str> = list.split('`').skip(1).step_by(2).collect();
    let registered: BTreeSet<&str> = KINDS
        .iter()
        .flat_map(|kind| kind.subjects().iter().copied())
        .collect();
    assert_eq!(
        listed, registered,
        "docs/jobs.md's explain subjects: {list}"
    );
}

/// The kinds `SextonNoSuccessfulPass` leaves out, as its expression's `kind!=` or `kind!~`
/// matcher names them.
fn left_out_of_the_nightly_alert(alerts: &str) -> BTreeSet<String> {
    let rule = between(alerts, "- alert: SextonNoSuccessfulPass", "- alert:");
    let expr = rule
        .lines()
        .find_map(|l| l.trim().strip_prefix("expr:"))
        .unwrap_or_else(|| panic!("no expr in:\n{rule}"));
    let mut left_out = BTreeSet::new();
    for (matcher, regex) in [("kind!=\"", false), ("kind!~\"", true)] {
        for (at, _) in expr.match_indices(matcher) {
            let value = &expr[at + matcher.len()..];
            let value = &value[..value.find('"').unwrap()];
            if regex {
                left_out.extend(value.split('|').map(str::to_owned));
            } else {
                left_out.insert(value.to_owned());
            }
        }
    }
    left_out
}

/// OP-5: the alert for a missed nightly pass leaves out exactly the kinds that do not run with
/// the nightly slot — a cadence of their own, or off — under the defaults or with every job
/// switched on: a kind given a cadence of its own would otherwise page every 26 hours, and a
/// nightly kind left out would never page.
#[test]
fn op5_the_missed_nightly_pass_alert_leaves_out_exactly_the_kinds_not_run_nightly() {
    let defaults = registry::load_settings(None).expect("the defaults load");
    let every_job = common::every_job(common::settings(Path::new("/nonexistent")));
    let not_nightly: BTreeSet<String> = KINDS
        .iter()
        .filter(|kind| {
            [&defaults, &every_job]
                .iter()
                .any(|settings| kind.cadence(settings) != Cadence::Nightly)
        })
        .map(|kind| kind.name().to_owned())
        .collect();
    let alerts = read("deploy/prometheus/alerts.yml");
    assert_eq!(
        left_out_of_the_nightly_alert(&alerts),
        not_nightly,
        "SextonNoSuccessfulPass in deploy/prometheus/alerts.yml must leave out exactly the \
         kinds not run nightly"
    );
}

#[test]
fn op5_the_alert_matcher_reader_reads_both_forms() {
    let alerts = "- alert: SextonNoSuccessfulPass\n  expr: max(x{kind!=\"a\", kind!~\"b|c\"})\n\
                  - alert: SextonNoPassEverRecorded\n  expr: absent(x{kind!=\"d\"})\n";
    assert_eq!(
        left_out_of_the_nightly_alert(alerts),
        ["a", "b", "c"].map(str::to_owned).into()
    );
}
