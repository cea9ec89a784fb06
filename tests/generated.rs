//! What the docs, `config/default.toml` and the alert rules repeat from the code is generated from
//! it (`worker/generated.rs`), never read back out of their prose: each rule's blocks, as
//! committed, are what the registry renders under the built-in defaults now, so that a kind
//! added, or a hop holding one connection more, fails here until the blocks are regenerated.

use std::path::Path;

use sexton::generated::{self, Facts, Rendered};
use sexton::registry::KINDS;
use sexton_jobs::job::Job as _;
use sexton_jobs::prune_execution_details::PruneExecutionDetails;
use sexton_jobs::trace_cleanup::TraceCleanup;

use crate::common;

/// The repository's root.
fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The committed blocks named `block`, each asserted to say what the code renders.
fn assert_generated(block: &str) -> Vec<Rendered> {
    let facts = Facts::defaults().expect("the defaults load");
    let blocks: Vec<Rendered> = generated::blocks(root(), &facts)
        .unwrap_or_else(|e| panic!("{e}"))
        .into_iter()
        .filter(|rendered| rendered.block == block)
        .collect();
    assert!(!blocks.is_empty(), "no generated block {block}");
    for rendered in &blocks {
        assert!(
            rendered.is_current(),
            "{}: the generated block {} is out of date: run `{}` and commit the result\n\
             --- committed:\n{}\n--- generated:\n{}",
            rendered.file,
            rendered.block,
            generated::COMMAND,
            rendered.committed,
            rendered.generated
        );
    }
    blocks
}

#[test]
fn fl6_the_pool_budget_in_default_toml_and_operating_md_is_generated_from_the_registry() {
    let blocks = assert_generated("pool-budget");
    let files: Vec<&str> = blocks.iter().map(|rendered| rendered.file).collect();
    assert_eq!(files, ["config/default.toml", "docs/operating.md"]);
    let facts = Facts::defaults().unwrap();
    assert!(
        u64::from(facts.max_connections) >= facts.budget.needed(),
        "the default pool is refused by its own check"
    );
    let sum = format!("= {};", facts.budget.needed());
    assert!(
        blocks
            .iter()
            .all(|rendered| rendered.generated.contains(&sum)),
        "each says what the pool needs"
    );
}

#[test]
fn op1_the_subjects_explain_knows_in_jobs_md_are_generated_from_the_registry() {
    let blocks = assert_generated("explain-subjects");
    for kind in KINDS {
        for subject in kind.subjects() {
            assert!(
                blocks[0].generated.contains(&format!("`{subject}`")),
                "{subject} is listed"
            );
        }
    }
}

/// OP-5: the alert for a missed nightly pass leaves out exactly the kinds that do not run with
/// the nightly slot — a cadence of their own, or off — whether under the defaults or with every
/// job switched on: a kind given a cadence of its own would otherwise page every 26 hours, and a
/// nightly kind left out would never page.
#[test]
fn op5_the_missed_nightly_pass_alert_leaves_out_exactly_the_kinds_not_run_nightly() {
    let blocks = assert_generated("kinds-not-nightly");
    assert_eq!(blocks[0].file, "deploy/prometheus/alerts.yml");
    let defaults = Facts::defaults().unwrap();
    let every_job = Facts::of(&common::every_job(common::settings(Path::new(
        "/nonexistent",
    ))));
    assert_eq!(
        every_job.not_nightly, defaults.not_nightly,
        "switched on, a kind runs nightly though the defaults leave it out of the alert, or the \
         reverse"
    );
    let left_out = blocks[0].generated.as_str();
    assert!(
        defaults.not_nightly.contains(&TraceCleanup::NAME)
            && left_out.contains(&format!("kind!~\"{}|", TraceCleanup::NAME)),
        "trace cleanup, on a cadence of its own, is left out: {left_out}"
    );
    assert!(
        !defaults.not_nightly.contains(&PruneExecutionDetails::NAME)
            && !left_out.contains(PruneExecutionDetails::NAME),
        "execution details, nightly, is not: {left_out}"
    );
}

/// RQ-7: `SextonErasureOverdue` warns `[erasure] warn_days` before an open request's due date,
/// the threshold written from the default; a changed default is out of date until rewritten.
#[test]
fn rq7_the_erasure_alert_warns_from_the_default_warn_days() {
    let blocks = assert_generated("erasure-warn-days");
    assert_eq!(blocks[0].file, "deploy/prometheus/alerts.yml");
    let defaults = Facts::defaults().unwrap();
    assert_eq!(defaults.erasure_warn_days, 7, "the documented default");
    assert!(
        blocks[0]
            .generated
            .contains("min(sexton_erasure_due_seconds) < 7 * 86400"),
        "{}",
        blocks[0].generated
    );
    // The control: another default, another threshold.
    let dir = tempfile::tempdir().unwrap();
    let file = "deploy/prometheus/alerts.yml";
    for file in generated::files() {
        let copy = dir.path().join(file);
        std::fs::create_dir_all(copy.parent().unwrap()).unwrap();
        std::fs::copy(root().join(file), &copy).unwrap();
    }
    let changed = Facts {
        erasure_warn_days: 3,
        ..defaults
    };
    generated::write(dir.path(), &changed).unwrap();
    let alerts = std::fs::read_to_string(dir.path().join(file)).unwrap();
    assert!(
        alerts.contains("min(sexton_erasure_due_seconds) < 3 * 86400")
            && !alerts.contains("< 7 * 86400"),
        "{alerts}"
    );
}

/// A fact changed in the code leaves every block saying it out of date until `generate`
/// rewrites them, and rewriting them back restores the files byte for byte.
#[test]
fn generated_a_fact_changed_in_the_code_is_stale_until_rewritten() {
    let dir = tempfile::tempdir().unwrap();
    for file in generated::files() {
        let copy = dir.path().join(file);
        std::fs::create_dir_all(copy.parent().unwrap()).unwrap();
        std::fs::copy(root().join(file), &copy).unwrap();
    }
    // Whether the committed blocks are current is the rule tests' to say: this one starts from
    // current copies.
    let facts = Facts::defaults().unwrap();
    generated::write(dir.path(), &facts).unwrap();
    let current: Vec<String> = generated::files()
        .into_iter()
        .map(|file| std::fs::read_to_string(dir.path().join(file)).unwrap())
        .collect();
    generated::check(dir.path(), &facts).expect("current");
    assert!(generated::write(dir.path(), &facts).unwrap().is_empty());

    let mut changed = facts.clone();
    changed.max_connections += 1;
    changed.subjects.push(("widget", None));
    changed.not_nightly.push("widget_cleanup");
    changed.erasure_warn_days += 1;
    let err = generated::check(dir.path(), &changed).unwrap_err();
    let text = err.to_string();
    for rendered in generated::blocks(dir.path(), &facts).unwrap() {
        assert!(
            text.contains(&format!("{}: {}", rendered.file, rendered.block)),
            "{text}"
        );
    }
    assert!(text.contains(generated::COMMAND), "{text}");

    assert_eq!(
        generated::write(dir.path(), &changed).unwrap(),
        generated::files()
    );
    generated::check(dir.path(), &changed).expect("rewritten");
    let alerts = std::fs::read_to_string(dir.path().join("deploy/prometheus/alerts.yml")).unwrap();
    assert!(
        alerts.contains("{kind!~\"trace_cleanup|orphans|erasure|widget_cleanup\"}"),
        "{alerts}"
    );

    generated::write(dir.path(), &facts).unwrap();
    for (file, current) in generated::files().into_iter().zip(current) {
        assert_eq!(
            std::fs::read_to_string(dir.path().join(file)).unwrap(),
            current,
            "{file} is restored"
        );
    }
}
