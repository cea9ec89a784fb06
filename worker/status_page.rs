//! The status page (OP-6): `/status`, an HTML page a person opens in a browser, and
//! `/status.json`, what `sexton status --json` prints — both from one read, [`status::read`]
//! with the default listing, bounded whatever the number of accounts (the backlogs are those
//! the worker's gauges last measured: a read of them is a read per account). The page is
//! rendered on the server with its style inline: no script, no font or style from elsewhere (a
//! fleet may have no internet), and a content security policy that forbids them. It shows counts
//! and ids: no account name, no error text, no hold's reason (those are `sexton status`'s, for
//! the operator at a terminal); every string it does show is escaped twice over — its control
//! and bidirectional characters shown as `\u{…}` ([`text::one_line`]), then HTML-escaped.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use chrono::{DateTime, SecondsFormat, Utc};

use crate::config::Settings;
use crate::http::Health;
use crate::status::{self, JobStatus, Listed, Status};
use crate::text;

mod lists;
use lists::{render_erasures, render_failed, render_holds, render_orphans, render_workers};

/// How long one read of the status may take before the page answers 503.
const READ_TIMEOUT: Duration = Duration::from_secs(10);

/// How many reads of the status run at once; more requests wait their turn (within
/// [`READ_TIMEOUT`]), so that reloads cannot pile queries on the database.
const READS_AT_ONCE: usize = 2;

#[derive(Clone)]
struct Page {
    health: Arc<Health>,
    settings: Arc<Settings>,
    reads: Arc<tokio::sync::Semaphore>,
}

/// `/status` and `/status.json`, or nothing when `[http] status_page` is off (both 404).
pub fn routes(health: Arc<Health>, settings: Arc<Settings>) -> Router {
    if !settings.http.status_page {
        return Router::new();
    }
    Router::new()
        .route("/status", get(html))
        .route("/status.json", get(json))
        .with_state(Page {
            health,
            settings,
            reads: Arc::new(tokio::sync::Semaphore::new(READS_AT_ONCE)),
        })
}

/// Why the status could not be read: the page says so, 503.
#[derive(Debug)]
struct Unavailable(String);

impl IntoResponse for Unavailable {
    fn into_response(self) -> Response {
        let mut response = (
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "the status could not be read: {}\n",
                text::one_line(&self.0)
            ),
        )
            .into_response();
        no_store(&mut response);
        response
    }
}

async fn read(page: &Page) -> Result<Status, Unavailable> {
    let pool = page
        .health
        .pool()
        .ok_or_else(|| Unavailable("not connected to the database yet".to_owned()))?;
    let read = async {
        let _turn = page.reads.acquire().await.expect("never closed");
        // The database's clock, as `sexton status` reads it (FL-2).
        let at: DateTime<Utc> = sqlx::query_scalar("SELECT now()").fetch_one(pool).await?;
        let backlogs = page.health.backlogs();
        status::read(
            pool,
            &page.settings,
            at,
            &Listed::default(),
            backlogs.as_ref(),
        )
        .await
    };
    match tokio::time::timeout(READ_TIMEOUT, read).await {
        Ok(Ok(status)) => Ok(status),
        Ok(Err(err)) => {
            tracing::warn!(error = format!("{err:#}"), "could not read the status page");
            Err(Unavailable(
                "a database error (see the worker's log)".to_owned(),
            ))
        }
        Err(_) => Err(Unavailable(format!(
            "no answer within {} s",
            READ_TIMEOUT.as_secs()
        ))),
    }
}

fn no_store(response: &mut Response) {
    let headers = response.headers_mut();
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
}

async fn json(State(page): State<Page>) -> Result<Response, Unavailable> {
    let status = read(&page).await?;
    let body = serde_json::to_string_pretty(&status)
        .map_err(|err| Unavailable(format!("could not encode the status: {err}")))?;
    let mut response = (
        [(header::CONTENT_TYPE, "application/json")],
        format!("{body}\n"),
    )
        .into_response();
    no_store(&mut response);
    Ok(response)
}

async fn html(State(page): State<Page>) -> Result<Response, Unavailable> {
    let status = read(&page).await?;
    let mut response = (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            // Nothing but the page's own inline style: no script, no image, no font, no
            // request anywhere, even if something slipped through the escaping.
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'none'; style-src 'unsafe-inline'; base-uri 'none'; \
                 form-action 'none'; frame-ancestors 'none'",
            ),
            (header::REFERRER_POLICY, "no-referrer"),
        ],
        render(&status),
    )
        .into_response();
    no_store(&mut response);
    Ok(response)
}

/// `text` shown, never obeyed: on one line with its control and bidirectional characters
/// escaped, then HTML-escaped.
fn esc(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for ch in text::one_line(text).chars() {
        match ch {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            _ => out.push(ch),
        }
    }
    out
}

fn time(at: Option<DateTime<Utc>>) -> String {
    at.map_or_else(
        || "–".to_owned(),
        |t| {
            format!(
                "<time datetime=\"{0}\">{0}</time>",
                t.to_rfc3339_opts(SecondsFormat::Secs, true)
            )
        },
    )
}

/// The anchor of a job kind's section.
fn anchor(job: &str) -> String {
    format!("kind-{}", esc(job))
}

/// The page's style, inline: no request leaves the page (OP-6).
const STYLE: &str = include_str!("status_page.css");

/// A table's cell: its column's label, for the stacked layout on a narrow screen.
fn cell(out: &mut String, label: &str, class: &str, content: &str) {
    let _ = write!(out, "<td data-label=\"{label}\"");
    if !class.is_empty() {
        let _ = write!(out, " class=\"{class}\"");
    }
    let _ = write!(out, ">{content}</td>");
}

fn head(out: &mut String, columns: &[(&str, bool)]) {
    out.push_str("<thead><tr>");
    for (column, numeric) in columns {
        let _ = write!(
            out,
            "<th{}>{column}</th>",
            if *numeric { " class=\"n\"" } else { "" }
        );
    }
    out.push_str("</tr></thead><tbody>");
}

fn count(n: i64, class_when_any: &str) -> (String, &str) {
    (n.to_string(), if n > 0 { class_when_any } else { "n" })
}

/// The page.
pub fn render(status: &Status) -> String {
    let mut out = String::with_capacity(16 * 1024);
    let _ = write!(
        out,
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>sexton status</title><style>{STYLE}</style></head><body>\
         <header><h1>sexton status</h1><p>at {} (the database's time) · \
         <a href=\"status.json\">status.json</a></p><nav>",
        time(Some(status.at))
    );
    for job in &status.jobs {
        let _ = write!(out, "<a href=\"#{}\">{}</a>", anchor(job.job), esc(job.job));
    }
    out.push_str(
        "<a href=\"#failed\">failed jobs</a><a href=\"#holds\">holds</a>\
                  <a href=\"#erasures\">erasures</a><a href=\"#orphans\">orphans</a>\
                  <a href=\"#workers\">workers</a></nav>\
                  </header><main>",
    );
    render_summary(&mut out, status);
    for job in &status.jobs {
        render_job(&mut out, job);
    }
    render_failed(&mut out, status);
    render_holds(&mut out, status);
    render_erasures(&mut out, status);
    render_orphans(&mut out, status);
    render_workers(&mut out, status);
    out.push_str("</main></body></html>\n");
    out
}

/// One row per job kind: its latest slot and passes, its backlog and failures.
fn render_summary(out: &mut String, status: &Status) {
    out.push_str("<h2 id=\"jobs\">Jobs</h2><table>");
    head(
        out,
        &[
            ("kind", false),
            ("last complete slot", false),
            ("latest slot", false),
            ("passes finished", true),
            ("not finished", true),
            ("backlog", true),
            ("hops failed", true),
            ("failed for good", true),
        ],
    );
    for job in &status.jobs {
        let s = &job.pass_states;
        let unfinished = s.pending + s.running + s.failed;
        let _ = write!(out, "<tr id=\"row-{}\">", anchor(job.job));
        cell(
            out,
            "kind",
            "",
            &format!("<a href=\"#{}\">{}</a>", anchor(job.job), esc(job.job)),
        );
        cell(out, "last complete slot", "", &time(job.last_success_slot));
        cell(
            out,
            "latest slot",
            "",
            &job.fan_out.as_ref().map_or_else(
                || "no slot yet".to_owned(),
                |f| {
                    format!(
                        "{}{}",
                        time(Some(f.slot)),
                        if f.complete {
                            ""
                        } else {
                            " <span class=\"warn\">(fanning out)</span>"
                        }
                    )
                },
            ),
        );
        cell(out, "passes finished", "n", &s.finished.to_string());
        cell(
            out,
            "not finished",
            if unfinished > 0 { "n warn" } else { "n" },
            &format!("{unfinished}{}", if s.capped { "+" } else { "" }),
        );
        cell(
            out,
            "backlog",
            "n",
            &job.backlog_seconds
                .map_or_else(|| "not measured".to_owned(), seconds),
        );
        let (failed, class) = count(i64::try_from(s.failed).unwrap_or(i64::MAX), "n warn");
        cell(out, "hops failed", class, &failed);
        let (failed, class) = count(job.queue.failed, "n bad");
        cell(out, "failed for good", class, &failed);
        out.push_str("</tr>");
    }
    out.push_str("</tbody></table>");
    out.push_str("<p>");
    let _ = write!(
        out,
        "Queue: {} pending, {} running, {} done, {} failed for good.",
        status.queue.pending, status.queue.running, status.queue.done, status.queue.failed
    );
    let _ = write!(out, " Backlogs as of {}.", time(Some(status.backlogs_at)));
    if status.retrying_files.is_empty() && status.quarantined_files.is_empty() {
        out.push_str(" No file deletion failed or was quarantined.");
    }
    out.push_str("</p>");
    if !(status.retrying_files.is_empty() && status.quarantined_files.is_empty()) {
        out.push_str("<h3 id=\"files\">File deletions</h3><table>");
        head(
            out,
            &[("root", false), ("retrying", true), ("quarantined", true)],
        );
        let roots: std::collections::BTreeSet<&String> = status
            .retrying_files
            .keys()
            .chain(status.quarantined_files.keys())
            .collect();
        for root in roots {
            out.push_str("<tr>");
            cell(out, "root", "", &format!("<code>{}</code>", esc(root)));
            let (n, class) = count(
                status.retrying_files.get(root).copied().unwrap_or(0),
                "n warn",
            );
            cell(out, "retrying", class, &n);
            let (n, class) = count(
                status.quarantined_files.get(root).copied().unwrap_or(0),
                "n bad",
            );
            cell(out, "quarantined", class, &n);
            out.push_str("</tr>");
        }
        out.push_str("</tbody></table>");
    }
}

fn seconds(s: f64) -> String {
    if s < 1.0 {
        "none".to_owned()
    } else if s < 3600.0 {
        format!("{s:.0} s")
    } else if s < 172_800.0 {
        format!("{:.1} h", s / 3600.0)
    } else {
        format!("{:.1} d", s / 86_400.0)
    }
}

/// A job kind's section: its fan-out, queue and the passes that did not finish.
fn render_job(out: &mut String, job: &JobStatus) {
    let _ = write!(
        out,
        "<section id=\"{}\"><h2>{}</h2><p class=\"muted\">{}</p>",
        anchor(job.job),
        esc(job.job),
        if job.scope == "global" {
            "one global pass per slot"
        } else {
            "one pass per account per slot"
        }
    );
    match &job.fan_out {
        Some(f) => {
            let _ = write!(
                out,
                "<p>Slot {}: {} accounts looked at{}, {} passes started, {} with nothing due.</p>",
                time(Some(f.slot)),
                f.accounts,
                if f.complete { "" } else { " so far" },
                f.passes_started,
                f.nothing_due
            );
        }
        None => out.push_str("<p>No slot fanned out yet.</p>"),
    }
    let s = &job.pass_states;
    let _ = write!(
        out,
        "<p>Passes of that slot: {} finished, {} running, {} pending, {} failed{}. \
         Queue: {} pending, {} running, {} done, {} failed for good.</p>",
        s.finished,
        s.running,
        s.pending,
        s.failed,
        if s.capped { " (counted so far)" } else { "" },
        job.queue.pending,
        job.queue.running,
        job.queue.done,
        job.queue.failed
    );
    if job.passes.is_empty() {
        out.push_str("<p class=\"ok\">Every latest pass finished.</p></section>");
        return;
    }
    let _ = write!(
        out,
        "<h3>Passes that did not finish{}</h3><table>",
        if job.passes.len() as i64 >= status::PASSES_SHOWN {
            " (the newest; <code>sexton status --all</code> lists every one)"
        } else {
            ""
        }
    );
    head(
        out,
        &[
            ("account", false),
            ("slot", false),
            ("state", false),
            ("last hop", false),
            ("hops", true),
            ("started", false),
        ],
    );
    for pass in &job.passes {
        out.push_str("<tr>");
        cell(
            out,
            "account",
            "id",
            &pass
                .account_id
                .map_or_else(|| "global".to_owned(), |id| id.to_string()),
        );
        cell(out, "slot", "", &time(Some(pass.slot)));
        cell(
            out,
            "state",
            if pass.state == "failed" { "bad" } else { "" },
            &esc(&pass.state),
        );
        cell(out, "last hop", "", &esc(&pass.outcome));
        cell(out, "hops", "n", &pass.hops.to_string());
        cell(out, "started", "", &time(pass.started_at));
        out.push_str("</tr>");
    }
    out.push_str("</tbody></table></section>");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn op6_strings_are_escaped_for_html_and_shown_not_obeyed() {
        assert_eq!(
            esc("<script>alert('x')</script>&\"\u{202e}\n"),
            "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;&amp;&quot;\\u{202e}\\u{a}"
        );
        // Control: plain ids and names stay as they are.
        assert_eq!(
            esc("LIT-2026-001 sexton.nightly"),
            "LIT-2026-001 sexton.nightly"
        );
    }
}
