//! Metrics (OP-3): the Prometheus series that dashboards and alerts rely on. Names and labels
//! are a contract; labels are low-cardinality (kind, table, reason, outcome, state), never an id.
//! The job kind's label is `kind`, never `job`: a scrape owns `job` and `instance`, and renames
//! a scraped `job` label to `exported_job`.

use metrics::{counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use sexton_jobs::job::{Reason, Report};
use sqlx::PgPool;

use crate::ledger;

/// Installs the global recorder once; later calls return the same handle.
///
/// # Panics
/// Never in practice: the bucket list is a valid constant.
pub fn install() -> PrometheusHandle {
    static HANDLE: std::sync::OnceLock<PrometheusHandle> = std::sync::OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let handle = PrometheusBuilder::new()
                .set_buckets_for_metric(
                    Matcher::Full("sexton_hop_duration_seconds".into()),
                    &[0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0],
                )
                .expect("hop duration buckets are valid")
                .install_recorder()
                .expect("the metrics recorder is installed once");
            describe();
            handle
        })
        .clone()
}

fn describe() {
    describe_counter!(
        "sexton_owners_pruned_total",
        "Owners whose expired data was removed."
    );
    describe_counter!(
        "sexton_owners_retained_total",
        "Owners left in place this pass, by reason; revisited on the next pass."
    );
    describe_counter!("sexton_rows_deleted_total", "Rows deleted, by table.");
    describe_counter!("sexton_bytes_reclaimed_total", "Bytes of files deleted.");
    describe_counter!(
        "sexton_file_errors_total",
        "Files or objects left in place: refused (outside the root), or whose removal failed."
    );
    describe_counter!("sexton_hops_total", "Hops run, by outcome.");
    describe_histogram!("sexton_hop_duration_seconds", "Duration of one hop.");
    describe_counter!("sexton_job_runs_total", "Queue jobs run, by outcome.");
    describe_counter!(
        "sexton_throttled_total",
        "Hops that stopped early on a red health indicator, by kind and indicator."
    );
    describe_gauge!(
        "sexton_health_replication_lag_bytes",
        "The largest replication lag last read, in bytes of WAL."
    );
    describe_gauge!(
        "sexton_health_vacuums",
        "Vacuums running in this database when last read."
    );
    describe_gauge!(
        "sexton_last_success_timestamp_seconds",
        "The latest slot for which every pass of the job finished (Unix seconds)."
    );
    describe_counter!(
        "sexton_schedule_slots_total",
        "Nightly slots pushed by this process: enqueued, duplicate or caught_up."
    );
    describe_gauge!("sexton_queue_jobs", "Jobs in sexton's queues, by state.");
    describe_gauge!(
        "sexton_files_retrying",
        "Pending file deletions that failed and wait for the next drain, by root."
    );
    describe_gauge!(
        "sexton_files_quarantined",
        "Pending file deletions quarantined after their last attempt, by root."
    );
    describe_gauge!(
        "sexton_backlog_seconds",
        "How far past its cutoff the oldest eligible item is."
    );
    describe_gauge!(
        "sexton_holds_active",
        "Holds placed and not released (HD-5): what they cover stays."
    );
    describe_gauge!(
        "sexton_erasures",
        "Erasure requests by state (RQ-7): received, running, waiting, verifying, completed, failed."
    );
    describe_gauge!(
        "sexton_erasure_due_seconds",
        "Seconds until the earliest due date of an open erasure request, negative once overdue; \
         +Inf when none is open (RQ-7)."
    );
    describe_counter!(
        "sexton_orphans_total",
        "Files and directories no row owns that confirmed derivative cleanups found (DC-5), by \
         root and reason: no_row all of them, grace, legal_hold, row_appeared and changed those \
         that stayed. The database's totals, the same on every replica."
    );
    describe_counter!(
        "sexton_orphans_removed_total",
        "Files and directories no row owned that derivative cleanup removed (DC-5), by root. The \
         database's total, the same on every replica."
    );
    describe_counter!(
        "sexton_erasure_residues_total",
        "Residues erasure verification found, over every request (RQ-5): the database's total, \
         the same on every replica."
    );
}

/// Every value the labels of one registered kind's series can take (OP-3).
pub struct KindLabels {
    pub kind: &'static str,
    /// Its retain reasons (`sexton_owners_retained_total{reason}`).
    pub reasons: Vec<&'static str>,
    /// The tables its hops count deleted rows of (`sexton_rows_deleted_total{table}`).
    pub tables: &'static [&'static str],
    /// Every outcome of its hops, `failed` included (`sexton_hops_total{outcome}`).
    pub outcomes: Vec<&'static str>,
}

/// The outcomes of a queue job's end ([`job_run`]).
pub const JOB_RUN_OUTCOMES: [&str; 3] = ["succeeded", "failed", "rejected"];

/// The outcomes of a slot this process pushed ([`slot`]).
pub const SLOT_OUTCOMES: [&str; 3] = ["enqueued", "duplicate", "caught_up"];

/// The states of sexton's queue jobs ([`queue_jobs`]).
pub const QUEUE_STATES: [&str; 4] = ["pending", "running", "done", "failed"];

/// The states of erasure requests ([`erasures`]).
pub const ERASURE_STATES: [&str; 6] = [
    "received",
    "running",
    "waiting",
    "verifying",
    "completed",
    "failed",
];

/// The roots of pending file deletions ([`failing`]).
const ROOTS: [&str; 4] = ["outputs", "sessions", "attachments", "traces"];

/// Exports every counter and gauge from the worker's start, at 0 for each registered kind and
/// each outcome, reason, table, state or root it can take, and each queue consumer (the `kind`
/// labels of `sexton_job_runs_total`, the nightly slot's among them) (OP-3): a series that appeared only
/// with its first increment would hide that increment from `increase()` and `rate()`, and a
/// replica that has run nothing would look like a missing one. Nothing already counted changes.
///
/// Two gauges are left until they are known, because 0 would be a false reading rather than
/// none yet: `sexton_last_success_timestamp_seconds` (0 reads as a last success in 1970, which
/// fires the missed-pass alert on every fresh fleet and hides the `absent()` of the never-ran
/// alert) and `sexton_backlog_seconds` (a kind that measures no backlog exports none). The
/// counters that are the database's totals rather than this process's counts
/// (`sexton_erasure_residues_total`, `sexton_orphans_total`, `sexton_orphans_removed_total`) are
/// exported once read, which the worker does as soon as it reaches the database, before it
/// takes any job ([`crate::gauges::database_totals`]): 0 and then the total would count every
/// residue and orphan ever found again in `increase()` on every restart.
/// `sexton_erasure_due_seconds` starts at +Inf, what it reads with no open request: no due
/// date, nothing to warn of, until the first read says otherwise.
pub fn export_from_start(kinds: &[KindLabels], consumers: &[&'static str]) {
    for labels in kinds {
        let kind = labels.kind;
        for name in [
            "sexton_owners_pruned_total",
            "sexton_bytes_reclaimed_total",
            "sexton_file_errors_total",
        ] {
            counter!(name, "kind" => kind).increment(0);
        }
        for reason in &labels.reasons {
            counter!("sexton_owners_retained_total", "kind" => kind, "reason" => *reason)
                .increment(0);
        }
        for table in labels.tables {
            counter!("sexton_rows_deleted_total", "kind" => kind, "table" => *table).increment(0);
        }
        for outcome in &labels.outcomes {
            counter!("sexton_hops_total", "kind" => kind, "outcome" => *outcome).increment(0);
        }
        for indicator in sexton_jobs::health::Indicator::ALL {
            counter!("sexton_throttled_total", "kind" => kind, "indicator" => indicator.as_str())
                .increment(0);
        }
        // Registered with no observation: its count and buckets read 0.
        let _ = histogram!("sexton_hop_duration_seconds", "kind" => kind);
    }
    for consumer in consumers {
        for outcome in JOB_RUN_OUTCOMES {
            counter!("sexton_job_runs_total", "kind" => *consumer, "outcome" => outcome)
                .increment(0);
        }
    }
    for outcome in SLOT_OUTCOMES {
        counter!("sexton_schedule_slots_total", "outcome" => outcome).increment(0);
    }
    // A gauge's `increment(0.0)` registers it and keeps a value already set.
    for state in QUEUE_STATES {
        gauge!("sexton_queue_jobs", "state" => state).increment(0.0);
    }
    for root in ROOTS {
        for name in ["sexton_files_retrying", "sexton_files_quarantined"] {
            gauge!(name, "root" => root).increment(0.0);
        }
    }
    for name in [
        "sexton_holds_active",
        "sexton_health_replication_lag_bytes",
        "sexton_health_vacuums",
    ] {
        gauge!(name).increment(0.0);
    }
    for state in ERASURE_STATES {
        gauge!("sexton_erasures", "state" => state).increment(0.0);
    }

    // Once: a later call (another worker in this process) keeps what a read set.
    static DUE: std::sync::Once = std::sync::Once::new();
    DUE.call_once(|| gauge!("sexton_erasure_due_seconds").set(f64::INFINITY));
}

/// One hop of `kind`.
pub fn hop<R: Reason>(kind: &'static str, report: &Report<R>, seconds: f64) {
    committed(kind, report);
    counter!("sexton_hops_total", "kind" => kind, "outcome" => report.outcome.as_str())
        .increment(1);
    histogram!("sexton_hop_duration_seconds", "kind" => kind).record(seconds);
}

/// What a hop of `kind` did: its owners, rows and bytes (also for a hop that failed after
/// committing some).
pub fn committed<R: Reason>(kind: &'static str, report: &Report<R>) {
    counter!("sexton_owners_pruned_total", "kind" => kind).increment(report.pruned);
    for (reason, n) in &report.retained {
        let reason = reason.as_str();
        counter!("sexton_owners_retained_total", "kind" => kind, "reason" => reason).increment(*n);
    }
    for (table, rows) in &report.rows {
        counter!("sexton_rows_deleted_total", "kind" => kind, "table" => *table).increment(*rows);
    }
    counter!("sexton_bytes_reclaimed_total", "kind" => kind).increment(report.files.bytes);
    counter!("sexton_file_errors_total", "kind" => kind).increment(report.files.errors);
}

/// A hop that failed (it will be retried, or was failed for good).
pub fn hop_failed(kind: &'static str, seconds: f64) {
    counter!("sexton_hops_total", "kind" => kind, "outcome" => "failed").increment(1);
    histogram!("sexton_hop_duration_seconds", "kind" => kind).record(seconds);
}

/// Sets `sexton_last_success_timestamp_seconds` of every job from the pass ledger, the same on
/// every replica (OP-3); a failure is logged and the gauge keeps its value.
pub async fn publish_last_success(pool: &PgPool) {
    match ledger::last_success(pool).await {
        Ok(jobs) => {
            for (kind, slot) in jobs {
                gauge!("sexton_last_success_timestamp_seconds", "kind" => kind)
                    .set(slot.timestamp() as f64);
            }
        }
        Err(err) => tracing::warn!(error = %err, "could not read the last successful passes"),
    }
}

/// A queue job's end: `succeeded`, `failed` (retried) or `rejected` (bad payload).
pub fn job_run(kind: &'static str, outcome: &'static str) {
    counter!("sexton_job_runs_total", "kind" => kind, "outcome" => outcome).increment(1);
}

/// A slot this process pushed: `enqueued`, `duplicate` or `caught_up`.
pub fn slot(outcome: &'static str) {
    counter!("sexton_schedule_slots_total", "outcome" => outcome).increment(1);
}

/// Jobs of sexton's queues in `state` (pending, running, done, failed).
pub fn queue_jobs(state: &'static str, jobs: i64) {
    gauge!("sexton_queue_jobs", "state" => state).set(jobs as f64);
}

/// Pending file deletions that failed, by root: retrying (OS-4: a key the store refused) and
/// quarantined (ER-3); roots with none read 0.
pub fn failing(failing: &sexton_jobs::files::Failing) {
    for root in ROOTS {
        for (name, counts) in [
            ("sexton_files_retrying", &failing.retrying),
            ("sexton_files_quarantined", &failing.quarantined),
        ] {
            let n = counts.get(root).copied().unwrap_or_default();
            gauge!(name, "root" => root).set(n as f64);
        }
    }
}

/// A job's backlog in seconds.
pub fn backlog(kind: &'static str, seconds: f64) {
    gauge!("sexton_backlog_seconds", "kind" => kind).set(seconds);
}

/// Holds placed and not released.
pub fn holds_active(holds: i64) {
    gauge!("sexton_holds_active").set(holds as f64);
}

/// The erasure requests (RQ-7): per state; the seconds until the earliest due date of an open
/// one (negative once overdue, +Inf with none open, so that `< threshold` never holds); and the
/// residues verification found, the database's total, which never goes down (a read lower than
/// the last, which requests never deleted cannot give, leaves it as it was).
pub fn erasures(tally: &sexton_jobs::erasure::visible::Tally) {
    for (state, n) in &tally.states {
        gauge!("sexton_erasures", "state" => state.as_str()).set(*n as f64);
    }
    gauge!("sexton_erasure_due_seconds").set(tally.due_seconds.unwrap_or(f64::INFINITY));
    counter!("sexton_erasure_residues_total").absolute(u64::try_from(tally.residues).unwrap_or(0));
}

/// What confirmed derivative cleanups found and removed (DC-5), per root and label, as the
/// database totals them (`sexton_jobs::orphans::totals`): set as they read, the same on every
/// replica, every root and reason among them (a pair no scan counted reads its total, 0).
pub fn orphans(totals: &[(String, String, i64)]) {
    let total = |root: &str, label: &str| {
        totals
            .iter()
            .find(|(r, l, _)| r == root && l == label)
            .map_or(0, |(_, _, n)| u64::try_from(*n).unwrap_or(0))
    };
    for root in ROOTS {
        counter!("sexton_orphans_removed_total", "root" => root).absolute(total(root, "removed"));
        for reason in sexton_jobs::orphans::REASONS {
            counter!("sexton_orphans_total", "root" => root, "reason" => reason)
                .absolute(total(root, reason));
        }
    }
}

/// A hop that stopped early on a red health indicator.
pub fn throttled(kind: &'static str, indicator: &'static str) {
    counter!("sexton_throttled_total", "kind" => kind, "indicator" => indicator).increment(1);
}

/// The last readings of the health indicators.
pub fn health(readings: &sexton_jobs::health::Readings) {
    gauge!("sexton_health_replication_lag_bytes").set(readings.replication_lag_bytes as f64);
    gauge!("sexton_health_vacuums").set(readings.vacuuming.len() as f64);
}
