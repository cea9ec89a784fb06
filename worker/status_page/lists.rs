//! The status page's lists (OP-6): the jobs failed for good, the active holds, the open erasure
//! requests, the last derivative cleanup's counts and the fleet's workers, each a section of its
//! own.

use std::fmt::Write as _;

use super::{cell, esc, head, time};
use crate::status::Status;

pub(super) fn render_failed(out: &mut String, status: &Status) {
    out.push_str("<section id=\"failed\"><h2>Jobs failed for good</h2>");
    if status.failed_jobs.is_empty() {
        out.push_str("<p class=\"ok\">None.</p></section>");
        return;
    }
    out.push_str(
        "<p>Kept for inspection, newest first; <code>sexton status</code> shows their last \
         error.</p><table>",
    );
    head(
        out,
        &[
            ("job", false),
            ("queue", false),
            ("status", false),
            ("attempts", true),
            ("due", false),
        ],
    );
    for job in &status.failed_jobs {
        out.push_str("<tr>");
        cell(out, "job", "id", &esc(&job.id));
        cell(out, "queue", "", &esc(&job.queue));
        cell(out, "status", "bad", &esc(&job.status));
        cell(
            out,
            "attempts",
            "n",
            &format!("{}/{}", job.attempts, job.max_attempts),
        );
        cell(out, "due", "", &time(Some(job.run_at)));
        out.push_str("</tr>");
    }
    out.push_str("</tbody></table></section>");
}

pub(super) fn render_holds(out: &mut String, status: &Status) {
    out.push_str("<section id=\"holds\"><h2>Active holds</h2>");
    match (status.holds_active, &status.holds_error) {
        (_, Some(_)) => {
            out.push_str(
                "<p class=\"bad\">The holds could not be read: no job removes anything \
                 meanwhile (HD-3). <code>sexton status</code> says why.</p></section>",
            );
            return;
        }
        (None | Some(0), None) => {
            out.push_str("<p>No active hold.</p></section>");
            return;
        }
        (Some(n), None) => {
            let _ = write!(
                out,
                "<p>{n} active hold{}{}: what they cover stays. \
                 <code>sexton holds list</code> lists every one.</p><table>",
                if n == 1 { "" } else { "s" },
                if (status.holds.len() as i64) < n {
                    format!(", the newest {}", status.holds.len())
                } else {
                    String::new()
                }
            );
        }
    }
    head(
        out,
        &[
            ("case", false),
            ("scope", false),
            ("id", false),
            ("placed", false),
            ("hold", false),
        ],
    );
    for hold in &status.holds {
        out.push_str("<tr>");
        cell(out, "case", "", &esc(&hold.case_ref));
        cell(out, "scope", "", &esc(hold.scope.as_str()));
        cell(out, "id", "id", &hold.scope_id.to_string());
        cell(out, "placed", "", &time(Some(hold.placed_at)));
        cell(out, "hold", "id", &hold.id.to_string());
        out.push_str("</tr>");
    }
    out.push_str("</tbody></table></section>");
}

/// The open erasure requests (RQ-7, OP-6): ids, scope kinds, states, due dates and what each
/// withholds by reason and hold — never the subject's id, the ticket or who asked.
pub(super) fn render_erasures(out: &mut String, status: &Status) {
    out.push_str("<section id=\"erasures\"><h2>Open erasure requests</h2>");
    let n = status.erasures_open;
    if n == 0 {
        out.push_str("<p>No open erasure request.</p></section>");
        return;
    }
    let overdue = status.erasures.iter().filter(|r| r.overdue).count();
    let _ = write!(
        out,
        "<p>{n} open request{}{}, the earliest due first{}. \
         <code>sexton erase status ID</code> says more of each.</p><table>",
        if n == 1 { "" } else { "s" },
        if overdue > 0 {
            format!(", <span class=\"bad\">{overdue} overdue</span>")
        } else {
            String::new()
        },
        if (status.erasures.len() as i64) < n {
            format!(" (the first {})", status.erasures.len())
        } else {
            String::new()
        }
    );
    head(
        out,
        &[
            ("request", false),
            ("scope", false),
            ("state", false),
            ("due", false),
            ("withheld", false),
            ("holds", false),
        ],
    );
    for request in &status.erasures {
        let _ = write!(out, "<tr id=\"erasure-{}\">", request.id);
        cell(out, "request", "id", &request.id.to_string());
        cell(out, "scope", "", &esc(request.scope.as_str()));
        cell(
            out,
            "state",
            if request.state.as_str() == "failed" {
                "bad"
            } else {
                ""
            },
            &esc(request.state.as_str()),
        );
        cell(
            out,
            "due",
            if request.overdue { "bad" } else { "" },
            &format!(
                "{}{}",
                time(Some(request.due_at)),
                if request.overdue { " (overdue)" } else { "" }
            ),
        );
        let withheld: Vec<String> = request
            .withheld
            .0
            .iter()
            .map(|(reason, n)| format!("{} {n}", esc(reason)))
            .collect();
        cell(
            out,
            "withheld",
            if withheld.is_empty() { "" } else { "warn" },
            &if withheld.is_empty() {
                "none".to_owned()
            } else {
                withheld.join(", ")
            },
        );
        let holds: Vec<String> = request.holds.iter().map(ToString::to_string).collect();
        cell(
            out,
            "holds",
            "id",
            &if holds.is_empty() {
                "–".to_owned()
            } else {
                holds.join(" ")
            },
        );
        out.push_str("</tr>");
    }
    out.push_str("</tbody></table></section>");
}

/// The last derivative cleanup (DC-5): per root, what no row owned, why some of it stayed, what
/// went and what could not.
pub(super) fn render_orphans(out: &mut String, status: &Status) {
    out.push_str("<section id=\"orphans\"><h2>Orphans</h2>");
    let Some(scan) = &status.orphans else {
        out.push_str(
            "<p>No derivative cleanup has run: <code>sexton orphans scan</code> lists what no \
             row owns.</p></section>",
        );
        return;
    };
    let _ = write!(
        out,
        "<p>The last scan, {} by {}, {}.</p><table>",
        time(Some(scan.finished_at)),
        esc(&scan.by),
        if scan.confirmed {
            "confirmed: what no row owned past the grace went"
        } else {
            "a dry run: nothing was removed"
        }
    );
    let mut columns = vec![("root", false), ("state", false)];
    columns.extend(
        sexton_jobs::orphans::REASONS
            .iter()
            .map(|reason| (*reason, true)),
    );
    columns.extend([("removed", true), ("bytes", true), ("failed", true)]);
    head(out, &columns);
    for (root, counts) in scan.roots.as_object().into_iter().flatten() {
        let number = |path: &[&str]| {
            path.iter()
                .try_fold(counts, |value, key| value.get(key))
                .and_then(serde_json::Value::as_u64)
                .unwrap_or(0)
        };
        let state = counts.get("state").and_then(|s| s.as_str()).unwrap_or("");
        out.push_str("<tr>");
        cell(out, "root", "", &esc(root));
        cell(
            out,
            "state",
            if state == "scanned" { "" } else { "bad" },
            &esc(state),
        );
        for reason in sexton_jobs::orphans::REASONS {
            let n = number(&["counts", reason]);
            let class = match reason {
                _ if n == 0 => "n muted",
                "legal_hold" | "row_appeared" | "changed" => "n warn",
                _ => "n",
            };
            cell(out, reason, class, &n.to_string());
        }
        cell(out, "removed", "n", &number(&["gone"]).to_string());
        cell(
            out,
            "bytes",
            "n",
            &number(&["removed", "bytes"]).to_string(),
        );
        let failed = number(&["removed", "errors"]);
        cell(
            out,
            "failed",
            if failed == 0 { "n muted" } else { "n bad" },
            &failed.to_string(),
        );
        out.push_str("</tr>");
    }
    out.push_str("</tbody></table></section>");
}

pub(super) fn render_workers(out: &mut String, status: &Status) {
    out.push_str("<section id=\"workers\"><h2>Workers</h2>");
    if status.workers.is_empty() {
        out.push_str("<p class=\"warn\">No worker has registered with the queue.</p></section>");
        return;
    }
    let _ = write!(
        out,
        "<p>{} worker process{}, the most recently heard from first{}.</p><table>",
        status.workers_total,
        if status.workers_total == 1 { "" } else { "es" },
        if status.workers_total > status.workers.len() as i64 {
            format!(" (the newest {})", status.workers.len())
        } else {
            String::new()
        }
    );
    head(
        out,
        &[
            ("worker", false),
            ("consumers", true),
            ("last heartbeat", false),
            ("started", false),
        ],
    );
    for worker in &status.workers {
        let quiet = (status.at - worker.last_heartbeat).num_seconds() > 120;
        out.push_str("<tr>");
        cell(out, "worker", "id", &esc(&worker.name));
        cell(out, "consumers", "n", &worker.consumers.to_string());
        cell(
            out,
            "last heartbeat",
            if quiet { "muted" } else { "" },
            &time(Some(worker.last_heartbeat)),
        );
        cell(out, "started", "", &time(worker.started_at));
        out.push_str("</tr>");
    }
    out.push_str("</tbody></table></section>");
}
