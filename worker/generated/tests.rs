//! The marked blocks' reading and rewriting, on texts written here.

use super::*;

fn facts() -> Facts {
    Facts::defaults().expect("the defaults load")
}

#[test]
fn a_block_is_rewritten_and_the_text_around_it_kept() {
    // alerts.yml holds two blocks: this test rewrites the first; the second, as committed.
    let alerts = std::fs::read_to_string("deploy/prometheus/alerts.yml").unwrap();
    let start = alerts
        .find("        # generated: erasure-warn-days")
        .unwrap();
    let end =
        start + alerts[start..].find("# end generated\n").unwrap() + "# end generated\n".len();
    let tail = &alerts[start..end];
    let text = format!(
        "# Intro.\n  # generated: kinds-not-nightly\n  expr: stale\n  # end generated\nafter\n{tail}"
    );
    let (out, rendered) = regenerate("deploy/prometheus/alerts.yml", &text, &facts()).unwrap();
    assert_eq!(rendered.len(), 2);
    assert_eq!(rendered[0].committed, "  expr: stale\n");
    assert!(!rendered[0].is_current());
    let expr = missed_pass_expr(&facts());
    assert_eq!(
        out,
        format!(
            "# Intro.\n  # generated: kinds-not-nightly\n  {expr}\n  # end generated\nafter\n{tail}"
        )
    );
    let (again, rendered) = regenerate("deploy/prometheus/alerts.yml", &out, &facts()).unwrap();
    assert_eq!(again, out);
    assert!(rendered.iter().all(|r| r.is_current()));
}

#[test]
fn markdown_blocks_inline_and_on_lines_of_their_own() {
    let subjects = explain_subjects(&facts());
    let inline = "Subjects: <!-- generated: explain-subjects -->old<!-- end generated -->.\n";
    let (out, _) = regenerate("docs/jobs.md", inline, &facts()).unwrap();
    assert_eq!(
        out,
        format!(
            "Subjects: <!-- generated: explain-subjects -->{subjects}<!-- end generated -->.\n"
        )
    );
    let lines = "Subjects:\n<!-- generated: explain-subjects -->\nold\n<!-- end generated -->\n";
    let (out, _) = regenerate("docs/jobs.md", lines, &facts()).unwrap();
    assert_eq!(
        out,
        format!(
            "Subjects:\n<!-- generated: explain-subjects -->\n{subjects}\n<!-- end generated -->\n"
        )
    );
}

#[test]
fn unsound_markers_are_refused_naming_the_file_and_the_block() {
    let facts = facts();
    let refused =
        |file: &'static str, text: &str| regenerate(file, text, &facts).unwrap_err().to_string();
    let md = "docs/jobs.md";
    assert!(refused(md, "no block here").contains("no generated block \"explain-subjects\""));
    assert!(
        refused(md, "<!-- generated: explain-subjects -->x")
            .contains("has no \"<!-- end generated -->\"")
    );
    assert!(
        refused(md, "<!-- generated: widgets -->x<!-- end generated -->")
            .contains("unknown generated block \"widgets\"")
    );
    let twice = "<!-- generated: explain-subjects -->x<!-- end generated -->\n\
                 <!-- generated: explain-subjects -->y<!-- end generated -->";
    assert!(refused(md, twice).contains("appears twice"));
    assert!(refused(md, "x<!-- end generated -->").contains("closes no generated block"));
    let toml = "config/default.toml";
    assert!(refused(toml, "# generated: pool-budget\n# x\n").contains("has no"));
    assert!(refused(toml, "# end generated\n").contains("closes no generated block"));
    assert!(
        refused(toml, "# generated: pool-budget\n# generated: pool-budget\n")
            .starts_with("config/default.toml: generated block \"pool-budget\" has no")
    );
}

#[test]
fn comments_are_wrapped_at_the_width() {
    let text = "word ".repeat(60);
    let wrapped = comment(&text);
    assert!(wrapped.lines().count() > 2);
    assert!(
        wrapped
            .lines()
            .all(|line| line.len() <= WIDTH && line.starts_with("# "))
    );
    assert_eq!(
        wrapped.split_whitespace().filter(|w| *w == "word").count(),
        60
    );
}

#[test]
fn the_missed_pass_matcher_names_one_kind_or_several() {
    let mut facts = facts();
    facts.not_nightly = vec![];
    assert!(missed_pass_expr(&facts).contains("seconds) > 26"));
    facts.not_nightly = vec!["a"];
    assert!(missed_pass_expr(&facts).contains("{kind!=\"a\"}"));
    facts.not_nightly = vec!["a", "b"];
    assert!(missed_pass_expr(&facts).contains("{kind!~\"a|b\"}"));
}
