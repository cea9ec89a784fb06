//! The worker's HTTP endpoints (OP-3): `/metrics` in Prometheus text, `/healthz` (the process
//! is alive) and `/readyz` (connected to a database that takes writes and consuming the queue,
//! with no consumer failing in the last 30 seconds), beside the pages the runtime adds (the
//! status page, OP-6). Every connection is bounded: a request head larger than 16 KiB is
//! refused, one not sent within 15 seconds closes its connection, and at most 256 connections
//! are served at once (more wait to be accepted), so that a slow or hostile client cannot
//! tie up the process.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use chrono::{DateTime, Utc};
use metrics_exporter_prometheus::PrometheusHandle;
use sqlx::PgPool;
use tokio::net::TcpListener;

/// What `/readyz` reports on, and what the gauges measured for the status page.
#[derive(Debug, Default)]
pub struct Health {
    pool: OnceLock<PgPool>,
    /// Each kind's backlog as the gauges last measured it.
    backlogs: Mutex<Option<Backlogs>>,
    consuming: AtomicBool,
    /// The database takes no writes (ER-6): the worker takes no job.
    read_only: AtomicBool,
    /// When a queue consumer last failed.
    consumer_failed_at: Mutex<Option<Instant>>,
}

/// A worker whose consumers failed this recently is not ready.
const FAILING_FOR: Duration = Duration::from_secs(30);

impl Health {
    /// The database is reachable through this pool.
    pub fn connected(&self, pool: &PgPool) {
        let _ = self.pool.set(pool.clone());
    }

    /// The queue consumers run (or, on shutdown, no longer do).
    pub fn consuming(&self, consuming: bool) {
        self.consuming.store(consuming, Ordering::Relaxed);
    }

    /// The database takes no writes (or, again, takes them).
    pub fn read_only(&self, read_only: bool) {
        self.read_only.store(read_only, Ordering::Relaxed);
    }

    /// The database's pool, once connected.
    pub fn pool(&self) -> Option<&PgPool> {
        self.pool.get()
    }

    /// The gauges measured every kind's backlog (those that measure one) anew.
    pub fn backlogs_measured(&self, backlogs: Backlogs) {
        *self.backlogs.lock().unwrap_or_else(|e| e.into_inner()) = Some(backlogs);
    }

    /// The backlogs the gauges last measured, once they have.
    pub fn backlogs(&self) -> Option<Backlogs> {
        self.backlogs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// A queue consumer failed (it is restarted after a pause).
    pub fn consumer_failed(&self) {
        *self
            .consumer_failed_at
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
    }

    async fn ready(&self) -> bool {
        let Some(pool) = self.pool.get() else {
            return false;
        };
        if !self.consuming.load(Ordering::Relaxed) || self.read_only.load(Ordering::Relaxed) {
            return false;
        }
        let failed_at = *self
            .consumer_failed_at
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if failed_at.is_some_and(|at| at.elapsed() < FAILING_FOR) {
            return false;
        }
        let ping = sqlx::query("SELECT 1").execute(pool);
        matches!(
            tokio::time::timeout(Duration::from_secs(2), ping).await,
            Ok(Ok(_))
        )
    }
}

/// Each kind's backlog in seconds, by its name, as measured at `at` (a kind that measures none,
/// or whose measurement failed, is not in it). A backlog is read per account (OP-3): the status
/// page shows the gauges' figures rather than reading them again at every request (OP-6).
#[derive(Debug, Clone)]
pub struct Backlogs {
    pub at: DateTime<Utc>,
    pub seconds: BTreeMap<&'static str, f64>,
}

#[derive(Clone)]
struct AppState {
    metrics: PrometheusHandle,
    health: Arc<Health>,
}

/// The longest a client may take to send a request's head (each one, on a kept-alive
/// connection); a slower one is disconnected.
const HEAD_TIMEOUT: Duration = Duration::from_secs(15);

/// The largest request head read; a larger one is answered 431 and its connection closed.
const MAX_HEAD_BYTES: usize = 16 * 1024;

/// How many connections are served at once; more wait in the listen backlog.
const MAX_CONNECTIONS: usize = 256;

/// Serves the endpoints, and `pages` beside them, on `listener` until `shutdown` resolves; then
/// lets the requests under way finish.
///
/// # Errors
/// An I/O error of the listener.
pub async fn serve(
    listener: TcpListener,
    metrics: PrometheusHandle,
    health: Arc<Health>,
    pages: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let app = Router::new()
        .route("/metrics", get(render_metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .with_state(AppState { metrics, health })
        .merge(pages);
    let mut shutdown = std::pin::pin!(shutdown);
    let (closing, closed) = tokio::sync::watch::channel(());
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    let mut connections = tokio::task::JoinSet::new();
    loop {
        let slot = tokio::select! {
            () = &mut shutdown => break,
            slot = slots.clone().acquire_owned() => slot.expect("the semaphore is never closed"),
        };
        let stream = tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                // Out of file descriptors, a connection reset before it was accepted: the
                // listener itself is fine.
                Err(err) => {
                    tracing::warn!(error = %err, "could not accept an HTTP connection");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let service = hyper_util::service::TowerToHyperService::new(app.clone());
        let mut closed = closed.clone();
        connections.spawn(async move {
            let _slot = slot;
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(HEAD_TIMEOUT)
                .max_buf_size(MAX_HEAD_BYTES);
            let connection =
                builder.serve_connection(hyper_util::rt::TokioIo::new(stream), service);
            let mut connection = std::pin::pin!(connection);
            tokio::select! {
                _ = connection.as_mut() => return,
                _ = closed.changed() => connection.as_mut().graceful_shutdown(),
            }
            let _ = connection.await;
        });
        while connections.try_join_next().is_some() {}
    }
    drop(closing);
    while connections.join_next().await.is_some() {}
    Ok(())
}

async fn render_metrics(State(state): State<AppState>) -> String {
    state.metrics.render()
}

async fn readyz(State(state): State<AppState>) -> (StatusCode, &'static str) {
    if state.health.ready().await {
        (StatusCode::OK, "ready\n")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready\n")
    }
}
