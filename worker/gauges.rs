//! The gauges a worker keeps current between scrapes: the queue, each kind's backlog, the last
//! success, quarantined file deletions, active holds, erasure requests and the database's health
//! (OP-3, HD-5, RQ-7).

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::context::JobContext;
use crate::http::{Backlogs, Health};
use crate::telemetry::metrics;
use crate::{holds, queue, registry};

/// Keeps the queue, backlog, last-success, quarantine, holds and erasure gauges current (OP-3,
/// HD-5, RQ-7), and the backlogs the status page shows (`http`'s [`Health`], OP-6).
pub async fn refresh(ctx: JobContext, http: Arc<Health>) {
    loop {
        match queue::counts(&ctx.pool).await {
            Ok(counts) => counts.publish(),
            Err(err) => tracing::warn!(error = %err, "could not count queue jobs"),
        }
        let at = ctx.clock.now();
        let mut backlogs = BTreeMap::new();
        for kind in registry::KINDS {
            match kind.backlog(&ctx.pool, &ctx.settings, at).await {
                Ok(Some(seconds)) => {
                    metrics::backlog(kind.name(), seconds);
                    backlogs.insert(kind.name(), seconds);
                }
                Ok(None) => {}
                Err(err) => {
                    tracing::warn!(
                        job = kind.name(),
                        error = format!("{err:#}"),
                        "could not measure the backlog"
                    )
                }
            }
        }
        http.backlogs_measured(Backlogs {
            at,
            seconds: backlogs,
        });
        metrics::publish_last_success(&ctx.pool).await;
        match sexton_jobs::files::failing(&ctx.pool).await {
            Ok(failing) => metrics::failing(&failing),
            Err(err) => tracing::warn!(error = %err, "could not count failed file deletions"),
        }
        match holds::active_count(&ctx.pool).await {
            Ok(n) => metrics::holds_active(n),
            Err(err) => tracing::warn!(
                error = format!("{:#}", anyhow::Error::new(err)),
                "could not count active holds"
            ),
        }
        database_totals(&ctx.pool).await;
        if let Some(readings) = ctx.health.last() {
            metrics::health(&readings);
        }
        tokio::time::sleep(ctx.settings.http.refresh_interval).await;
    }
}

/// The series that are the database's totals rather than this process's counts: the erasure
/// requests (with the residues verification found) and what derivative cleanup found and removed
/// (RQ-7, DC-5). Read once before the worker takes a job and then with the other gauges, so that
/// they are exported from the start with what they total (OP-3).
pub async fn database_totals(pool: &sqlx::PgPool) {
    match erasures(pool).await {
        Ok(tally) => metrics::erasures(&tally),
        Err(err) => tracing::warn!(error = %err, "could not count the erasure requests"),
    }
    match sexton_jobs::orphans::totals(pool).await {
        Ok(totals) => metrics::orphans(&totals),
        Err(err) => tracing::warn!(error = %err, "could not count the orphans removed"),
    }
}

/// The erasure requests as the gauges show them.
async fn erasures(
    pool: &sqlx::PgPool,
) -> Result<sexton_jobs::erasure::visible::Tally, sqlx::Error> {
    let mut conn = pool.acquire().await?;
    sexton_jobs::erasure::visible::tally(&mut conn).await
}
