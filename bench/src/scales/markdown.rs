//! The scales' part of latest.md (and of what a run prints): its tables, notes and targets.

use super::{Scale, targets};
use crate::method::Method;

/// The scales' tables, at the top of latest.md: the execution-details methods, a note on their
/// WAL, the WAL budget, the targets held against the figures, and SessionRetention's methods.
pub fn markdown(results: &[Scale]) -> String {
    let mut md = String::new();
    methods_table(&mut md, results);
    wal_note(&mut md, results);
    budget_table(&mut md, results);
    targets_list(&mut md, results);
    sessions_table(&mut md, results);
    md
}

/// The execution-details methods' table, a row per method and scale.
fn methods_table(md: &mut String, results: &[Scale]) {
    md.push_str(
        "| scale | runs | owners | detail rows | method | seconds | owners/s | rows/s | vs raw | vs naive | WAL MB (writer's share) | WAL bytes per owner | writer p50 / p99 / max ms (idle) | writer longest lock wait ms | writes that waited | longest write tx ms | hop median / p99 ms | µs per candidate (median hop) | peak RSS MB | outside owner tx | outside hops |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for s in results {
        for m in &s.methods {
            md.push_str(&format!(
                "| {} | {} | {} | {} | {} | {:.1} | {:.0} | {:.0} | {} | {} | {} | {} | {:.1} / {:.1} / {:.1} ({:.1} / {:.1} / {:.1}) | {:.1} | {} | {:.0} | {} | {} | {} | {} | {} |\n",
                s.scale, s.runs, s.owners, s.detail_rows, m.name, m.seconds, m.owners_per_s, m.rows_per_s,
                ratio(m, targets::find(s, "raw")), ratio(m, targets::find(s, "naive")),
                wal_mb(m), wal_per_owner(m),
                m.writer.p50_ms, m.writer.p99_ms, m.writer.max_ms,
                s.idle_writer.p50_ms, s.idle_writer.p99_ms, s.idle_writer.max_ms,
                m.writer_longest_lock_wait_ms,
                m.waits(),
                m.longest_transaction_ms,
                m.hop.map_or("—".into(), |h| format!("{:.0} / {:.0}", h.p50_ms, h.p99_ms)),
                m.hop_us_per_candidate.map_or("—".into(), |h| format!("{:.0}", h.p50_ms)),
                m.peak_rss_kb.map_or("—".into(), |kb| format!("{:.1}", kb as f64 / 1024.0)),
                m.share_outside_owner_transactions.map_or("—".into(), |x| format!("{:.0}%", x * 100.0)),
                m.share_outside_hops.map_or("—".into(), |x| format!("{:.0}%", x * 100.0)),
            ));
        }
    }
}

/// How the WAL figures are measured, with the writer's idle rate at each scale.
fn wal_note(md: &mut String, results: &[Scale]) {
    let idle_rates: Vec<String> = results
        .iter()
        .map(|s| format!("{:.0} at scale {}", s.idle_writer_wal_bytes_per_s, s.scale))
        .collect();
    md.push_str(&format!(
        "\nWAL: the cluster's WAL position (`pg_current_wal_lsn()`, read on the bench's own connection) just before each method and right after it (for sexton, at the worker taking the nightly slot and at its last hop, the span its seconds time). \"WAL MB\" is that delta, the WAL of the writer beside the method included; in brackets the writer's estimated share, its rate alone in the idle baseline (bytes/s: {}; mostly whole pages it is the first to change after the copy's checkpoint, so a rough estimate) × the method's seconds. \"WAL bytes per owner\" is the delta net of that share, per owner pruned. Each copy starts right after the checkpoint of `CREATE DATABASE … STRATEGY FILE_COPY`, so every method writes whole pages (full-page writes) on its first change to each page alike; autovacuum's WAL during a method counts in its delta.\n",
        idle_rates.join(", ")
    ));
}

/// The WAL budget's pass and its table, if a scale ran it.
fn budget_table(md: &mut String, results: &[Scale]) {
    if let Some((s, b)) = results
        .iter()
        .find_map(|s| s.wal_budget.as_ref().map(|b| (s, b)))
    {
        let m = &b.method;
        md.push_str(&format!(
            "\nWAL budget, at scale {}: sexton as in the table (`queue.concurrency` 2) once more on a fresh copy, with `SEXTON_HEALTH__MAX_WAL_BYTES_PER_SECOND` at a quarter of the rate its unbudgeted pass wrote at (WAL delta ÷ seconds, as in the table); the other health indicators stay off. The pace (`WalPace`, jobs/src/health.rs) holds the whole process to the budget by the cluster's WAL position, each byte counted once whichever hop reads it: the writer's WAL (about {:.0} bytes/s alone) counts against the budget too. The achieved rate is measured as in the table: the WAL delta over the pass, the writer's included, ÷ its seconds.\n\n| scale | budget bytes/s | achieved bytes/s | achieved / budget | seconds | owners/s | WAL bytes per owner | writer p50 / p99 / max ms | writer longest lock wait ms | longest write tx ms |\n|---|---|---|---|---|---|---|---|---|---|\n| {} | {} | {:.0} | {:.2} | {:.1} | {:.0} | {} | {:.1} / {:.1} / {:.1} | {:.1} | {:.0} |\n",
            s.scale, s.idle_writer_wal_bytes_per_s,
            s.scale, b.budget_bytes_per_s, b.achieved_bytes_per_s, b.ratio, m.seconds, m.owners_per_s,
            wal_per_owner(m),
            m.writer.p50_ms, m.writer.p99_ms, m.writer.max_ms,
            m.writer_longest_lock_wait_ms,
            m.longest_transaction_ms,
        ));
    }
}

/// The targets of SPEC §8, each met or not.
fn targets_list(md: &mut String, results: &[Scale]) {
    let targets = targets(results);
    md.push_str("\nTargets (SPEC §8), from this run's figures:\n\n");
    for t in &targets {
        let at = match t.from_scale {
            Some(from) => format!("from scale {from} to {}", t.scale),
            None => format!("at scale {}", t.scale),
        };
        let verdict = if t.met { "met" } else { "not met" };
        md.push_str(&format!(
            "- **{}** {at}: {}: **{verdict}**\n",
            t.id, t.check
        ));
    }
    if !targets.iter().any(|t| t.id == "PF-3") {
        md.push_str("- **PF-3**: not measured (needs a scale of 10 or more and a larger one)\n");
    }
}

/// SessionRetention's table, a row per method and scale.
fn sessions_table(md: &mut String, results: &[Scale]) {
    md.push_str(
        "\nSessionRetention: the same sessions deleted by a nightly pass through the queue and by a raw batched delete (100 per transaction, cascading); `sessions raw+dirs` also removes each batch's session directories after its commit (sexton's end state), `sessions raw+dirs+locks` first takes SessionRetention's locks in each batch (the agents `FOR SHARE`, then the sessions `FOR UPDATE`). WAL as above, the appending writer's share from its own idle baseline.\n\n| scale | sessions | history rows | method | seconds | sessions/s | rows/s | vs raw | WAL MB (writer's share) | WAL bytes per session | writer p50 / p99 / max ms (idle) | writer longest lock wait ms | writes that waited | longest write tx ms | hop median / p99 ms | peak RSS MB |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for s in results {
        let raw = s.session_methods.iter().find(|m| m.name == "sessions raw");
        for m in &s.session_methods {
            md.push_str(&format!(
                "| {} | {} | {} | {} | {:.2} | {:.0} | {:.0} | {} | {} | {} | {:.1} / {:.1} / {:.1} ({:.1} / {:.1} / {:.1}) | {:.1} | {} | {:.0} | {} | {} |\n",
                s.scale, s.sessions, s.session_rows, m.name, m.seconds, m.owners_per_s, m.rows_per_s,
                ratio(m, raw),
                wal_mb(m), wal_per_owner(m),
                m.writer.p50_ms, m.writer.p99_ms, m.writer.max_ms,
                s.idle_appender.p50_ms, s.idle_appender.p99_ms, s.idle_appender.max_ms,
                m.writer_longest_lock_wait_ms,
                m.waits(),
                m.longest_transaction_ms,
                m.hop.map_or("—".into(), |h| format!("{:.0} / {:.0}", h.p50_ms, h.p99_ms)),
                m.peak_rss_kb.map_or("—".into(), |kb| format!("{:.1}", kb as f64 / 1024.0)),
            ));
        }
    }
}

/// `m`'s rate over that of the method `of`, or "—" when that one was not measured
/// (`--methods`).
fn ratio(m: &Method, of: Option<&Method>) -> String {
    of.map_or("—".into(), |of| {
        format!("{:.2}×", m.owners_per_s / of.owners_per_s)
    })
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
fn wal_per_owner(m: &Method) -> String {
    m.wal_bytes_per_owner
        .map_or("—".into(), |bytes| format!("{bytes:.0}"))
}
