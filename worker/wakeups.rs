//! One LISTEN connection per worker that wakes every queue's consumer when a job is pushed to
//! it. apalis' own `Pubsub` holds a pool connection per queue for as long as the worker runs;
//! with one queue per job kind that would eat the pool, so the notifications are shared here.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::channel::mpsc;
use sqlx::PgPool;
use sqlx::postgres::PgListener;

/// The channel apalis-postgres notifies on every insert, with `{"job_type": …, "id": …}`.
const CHANNEL: &str = "apalis::job::insert";

/// Who wants to hear of new jobs, by queue.
#[derive(Debug, Default)]
pub struct Wakeups {
    subscribers: Mutex<HashMap<String, Vec<mpsc::UnboundedSender<()>>>>,
}

impl Wakeups {
    /// A stream that yields once per job pushed to `queue` (while the listener is connected;
    /// the consumers' interval poll covers the gaps).
    pub fn subscribe(&self, queue: &str) -> mpsc::UnboundedReceiver<()> {
        let (tx, rx) = mpsc::unbounded();
        self.lock().entry(queue.to_owned()).or_default().push(tx);
        rx
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Vec<mpsc::UnboundedSender<()>>>> {
        self.subscribers.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn wake(&self, queue: &str) {
        if let Some(subscribers) = self.lock().get_mut(queue) {
            subscribers.retain(|tx| tx.unbounded_send(()).is_ok());
        }
    }

    /// Listens until the task is dropped, reconnecting with a growing pause (up to 10 s) when
    /// the connection is lost.
    pub async fn run(self: Arc<Self>, pool: PgPool) {
        let mut pause = Duration::from_millis(500);
        loop {
            let err = self.listen(&pool, &mut pause).await;
            tracing::warn!(error = %err, retry_in_ms = pause.as_millis() as u64, "job notifications lost; queues are polled meanwhile");
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_secs(10));
        }
    }

    /// Listens until the connection fails; a connection made resets `pause`.
    async fn listen(&self, pool: &PgPool, pause: &mut Duration) -> sqlx::Error {
        let mut listener = match PgListener::connect_with(pool).await {
            Ok(listener) => listener,
            Err(err) => return err,
        };
        if let Err(err) = listener.listen(CHANNEL).await {
            return err;
        }
        *pause = Duration::from_millis(500);
        loop {
            let notification = match listener.recv().await {
                Ok(notification) => notification,
                Err(err) => return err,
            };
            let event: serde_json::Value =
                serde_json::from_str(notification.payload()).unwrap_or_default();
            if let Some(queue) = event["job_type"].as_str() {
                self.wake(queue);
            }
        }
    }
}
