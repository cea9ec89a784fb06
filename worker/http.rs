//! The worker's HTTP endpoints (OP-3): `/metrics` in Prometheus text, `/healthz` (the process
//! is alive) and `/readyz` (connected to a database that takes writes and consuming the queue,
//! with no consumer failing in the last 30 seconds).

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use metrics_exporter_prometheus::PrometheusHandle;
use sqlx::PgPool;
use tokio::net::TcpListener;

/// What `/readyz` reports on.
#[derive(Debug, Default)]
pub struct Health {
    pool: OnceLock<PgPool>,
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

#[derive(Clone)]
struct AppState {
    metrics: PrometheusHandle,
    health: Arc<Health>,
}

/// Serves the endpoints on `listener` until `shutdown` resolves.
///
/// # Errors
/// An I/O error of the listener.
pub async fn serve(
    listener: TcpListener,
    metrics: PrometheusHandle,
    health: Arc<Health>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let app = Router::new()
        .route("/metrics", get(render_metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .with_state(AppState { metrics, health });
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
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
