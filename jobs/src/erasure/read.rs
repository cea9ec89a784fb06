//! What the erasure kind reads without deleting: `sexton preview` (the open requests).

use std::fmt;

use serde::Serialize;
use uuid::Uuid;

use super::{Erase, ErasureSettings};
use crate::job::{Inspect, Look};
use crate::owner_loop::Error;

/// The open requests by state, and the earliest due date.
#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct Preview {
    pub received: i64,
    pub running: i64,
    pub waiting: i64,
    pub verifying: i64,
    pub failed: i64,
    pub earliest_due: Option<chrono::DateTime<chrono::Utc>>,
}

impl fmt::Display for Preview {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "erasure (RQ-1 … RQ-8): {} received, {} running, {} waiting, {} verifying, {} failed",
            self.received, self.running, self.waiting, self.verifying, self.failed
        )?;
        if let Some(due) = self.earliest_due {
            write!(f, "; earliest due {}", due.to_rfc3339())?;
        }
        Ok(())
    }
}

impl Inspect for Erase {
    type Preview = Preview;

    async fn preview(
        look: Look<'_, ErasureSettings>,
        _accounts: Option<&[Uuid]>,
    ) -> Result<Vec<Preview>, Error> {
        let preview = sqlx::query_as(
            "SELECT count(*) FILTER (WHERE state = 'received') AS received,
                    count(*) FILTER (WHERE state = 'running') AS running,
                    count(*) FILTER (WHERE state = 'waiting') AS waiting,
                    count(*) FILTER (WHERE state = 'verifying') AS verifying,
                    count(*) FILTER (WHERE state = 'failed') AS failed,
                    min(due_at) AS earliest_due
             FROM sexton.erasures WHERE state <> 'completed'",
        )
        .fetch_one(look.conn)
        .await?;
        Ok(vec![preview])
    }
}
