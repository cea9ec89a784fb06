//! A cleaning pass: the walk, the plan, the live sessions' traces kept, the removals; and
//! `sexton explain trace`.

use std::collections::BTreeMap;
use std::io;
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use chrono::{DateTime, Utc};
use sqlx::PgConnection;
use uuid::Uuid;

use crate::cutoff::days_before;
use crate::explain::{Explanation, Reason as ExplainReason, Verdict as ExplainVerdict};
use crate::files::object::ObjectRoot;
use crate::files::{Root, Store};
use crate::job::{Inspect, Job, Look};

use super::objects::Objects;
use super::plan::{Histogram, Pass, Plan, QuotaLine, finer_shift};
use super::walk::{Tree, Walk, first_line, line_of, signature, time_ns};
use super::{
    Error, FIRST_LINE_LIMIT, Lease, Limits, Observer, Planned, Preview, Quiet, Reason,
    TraceCleanup, TraceReport, TraceSettings,
};

/// Why each of `traces` (agent, session) stays whatever the limits, in their order: `legal_hold`
/// when a hold covers its session, its agent or their account (HD-2), `live_session` when its
/// session is an agent's current or main session (TR-3), through the indexes on both columns.
pub(super) async fn kept(
    conn: &mut PgConnection,
    traces: &[(&str, Uuid)],
) -> Result<Vec<Option<&'static str>>, sqlx::Error> {
    let (agents, sessions): (Vec<Option<Uuid>>, Vec<Uuid>) = traces
        .iter()
        .map(|(agent, session)| (agent_uuid(agent), *session))
        .unzip();
    let kept: Vec<Option<String>> = sqlx::query_scalar(
        "SELECT CASE WHEN EXISTS (SELECT 1 FROM sexton.trace_holds(t.agent, t.session))
                     THEN 'legal_hold'
                     WHEN EXISTS (SELECT 1 FROM agents WHERE current_session_id = t.session)
                       OR EXISTS (SELECT 1 FROM agents WHERE main_session_id = t.session)
                     THEN 'live_session' END
         FROM unnest($1::uuid[], $2::uuid[]) WITH ORDINALITY AS t (agent, session, n)
         ORDER BY t.n",
    )
    .bind(&agents)
    .bind(&sessions)
    .fetch_all(conn)
    .await?;
    Ok(kept
        .into_iter()
        .map(|reason| match reason.as_deref() {
            Some("legal_hold") => Some(crate::explain::LEGAL_HOLD),
            Some(_) => Some("live_session"),
            None => None,
        })
        .collect())
}

/// A signature's agent as the holds know it: its id when it is a UUID in the hyphenated form
/// (either case), as `sexton.jsonb_uuid` reads one, else none. Read here rather than in the
/// statement: there, inlined into the holds' lookup, a small agents table's scan re-ran the
/// regex per agent row and per trace (half a millisecond a trace at a hundred agents).
fn agent_uuid(agent: &str) -> Option<Uuid> {
    (agent.len() == 36)
        .then(|| Uuid::try_parse(agent).ok())
        .flatten()
}

/// Cleans the traces root `store` by `limits` at `now`: plans every file (each shown to
/// `observer`) and, holding the root's `lease` (a confirmed run), deletes them; without one it
/// only plans. When `stop` is raised the run ends after the batch in hand; what is left waits for
/// the next run.
///
/// # Errors
/// [`Error::Root`] when the root cannot be opened or read, [`Error::Store`] when an object
/// root's listing fails, [`Error::Database`] when the live sessions cannot be read,
/// [`Error::LeaseLost`] when another cleaner took the lease over.
pub async fn clean(
    conn: &mut PgConnection,
    store: &Store,
    limits: Limits,
    now: DateTime<Utc>,
    lease: Option<&mut Lease>,
    observer: &mut dyn Observer,
    stop: &AtomicBool,
) -> Result<TraceReport, Error> {
    let source = Source::of(store)?;
    let age_cutoff_ns = (limits.max_age_days > 0)
        .then(|| days_before(now, limits.max_age_days))
        .flatten()
        .map(time_ns);
    let mut plan = Plan {
        conn,
        report: TraceReport {
            confirmed: lease.is_some(),
            ..TraceReport::default()
        },
        candidates: Vec::new(),
        pending: Vec::new(),
        observer,
        lease,
        age_cutoff_ns,
        live_bytes: 0,
        stop,
        stopped: false,
    };
    // With no quota, what is younger than the age limit cannot go: it is not read.
    let unread_from = (limits.max_bytes == 0).then_some(age_cutoff_ns).flatten();
    let mut age = Pass::Age(Histogram::default());
    plan.walk(&mut source.walk(unread_from)?, &mut age).await?;
    let Pass::Age(histogram) = age else {
        return Ok(plan.report);
    };
    // Live traces count toward the quota; only the others can go to meet it.
    let excess = (histogram.total + plan.live_bytes).saturating_sub(limits.max_bytes);
    if limits.max_bytes == 0 || excess == 0 || plan.stopped {
        return Ok(plan.report);
    }
    let Some((first_bucket, first_before)) = histogram.line(excess) else {
        // Not even every other trace would bring the total within the quota: all of them go.
        let all = QuotaLine::Ties(i128::MAX, 0);
        plan.walk(
            &mut source.walk(None)?,
            &mut Pass::Quota {
                line: all,
                taken: 0,
            },
        )
        .await?;
        return Ok(plan.report);
    };
    let start = (histogram.shift, first_bucket, first_before);
    let Some(line) = boundary(&mut plan, &source, start, excess).await? else {
        return Ok(plan.report);
    };
    plan.walk(&mut source.walk(None)?, &mut Pass::Quota { line, taken: 0 })
        .await?;
    Ok(plan.report)
}

/// A traces root to walk, again for each pass: a directory (as given, and canonical) or an
/// object root.
enum Source {
    Tree { given: PathBuf, canonical: PathBuf },
    Objects(Arc<ObjectRoot>),
}

impl Source {
    /// # Errors
    /// [`Error::Root`] when a directory root cannot be resolved.
    fn of(store: &Store) -> Result<Source, Error> {
        Ok(match store {
            Store::Local(given) => Source::Tree {
                given: given.clone(),
                canonical: given.canonicalize().map_err(|source| Error::Root {
                    path: given.clone(),
                    source,
                })?,
            },
            Store::Object(objects) => Source::Objects(objects.clone()),
        })
    }

    /// A walk of the root, the traces modified at or after `unread_from` unread.
    ///
    /// # Errors
    /// [`Error::Root`] when a directory root cannot be opened or read.
    fn walk(&self, unread_from: Option<i128>) -> Result<Walk, Error> {
        match self {
            Source::Objects(objects) => {
                Ok(Walk::Objects(Objects::new(objects.clone(), unread_from)))
            }
            Source::Tree { given, canonical } => {
                let root_error = |source: io::Error| Error::Root {
                    path: given.clone(),
                    source,
                };
                let fd = crate::files::open_root(canonical).map_err(root_error)?;
                Ok(Walk::Tree(Box::new(
                    Tree::new(canonical, fd, unread_from).map_err(root_error)?,
                )))
            }
        }
    }
}

/// Narrows the quota's line from the histogram's bucket `start` (its shift, the bucket, the
/// bytes before it) until the boundary's files fit in memory and are sorted (TR-4): where the
/// traces that go to bring the root within `excess` end. `None` when the cleaner stopped.
async fn boundary(
    plan: &mut Plan<'_>,
    source: &Source,
    start: (u32, i128, u64),
    excess: u64,
) -> Result<Option<QuotaLine>, Error> {
    let (mut shift, mut bucket, mut before) = start;
    let line = loop {
        let mut boundary = Pass::Boundary {
            shift,
            bucket,
            files: Vec::new(),
            overflow: false,
            finer: BTreeMap::new(),
        };
        plan.walk(&mut source.walk(None)?, &mut boundary).await?;
        if plan.stopped {
            return Ok(None);
        }
        let Pass::Boundary {
            mut files,
            overflow,
            finer,
            ..
        } = boundary
        else {
            return Ok(None);
        };
        let bucket_end = (bucket + 1) << shift;
        if !overflow {
            files.sort();
            let mut covered = before;
            let mut line = None;
            for (mtime_ns, path, bytes) in files {
                covered += bytes;
                line = Some(QuotaLine::Upto(mtime_ns, path));
                if covered >= excess {
                    break;
                }
            }
            // The bucket's files changed since they were counted: take all it held.
            break line.unwrap_or(QuotaLine::Ties(bucket_end, 0));
        }
        if shift == 0 {
            // Too many files of one and the same mtime to sort: any of them will do.
            break QuotaLine::Ties(bucket, excess.saturating_sub(before));
        }
        let narrower = Histogram {
            shift: finer_shift(shift),
            buckets: finer,
            total: 0,
        };
        match narrower.line(excess.saturating_sub(before)) {
            Some((finer_bucket, finer_before)) => {
                before += finer_before;
                bucket = finer_bucket;
                shift = narrower.shift;
            }
            None => break QuotaLine::Ties(bucket_end, 0),
        }
    };
    Ok(Some(line))
}

/// Watches one path in a dry run: what the cleaner planned or kept it for.
pub(super) struct Watch<'a> {
    path: &'a str,
    planned: Option<Planned>,
    kept: Option<&'static str>,
}

impl Observer for Watch<'_> {
    fn planned(&mut self, file: &Planned) {
        if file.raw == self.path.as_bytes() {
            self.planned = Some(file.clone());
        }
    }

    fn kept(&mut self, path: &Path, reason: &'static str) {
        if path.as_os_str().as_bytes() == self.path.as_bytes() {
            self.kept = Some(reason);
        }
    }
}

/// Measuring a backlog would mean walking the whole tree at every refresh of the gauge: the
/// cleaner reports none.
impl Inspect for TraceCleanup {
    const SUBJECTS: &'static [&'static str] = &["trace"];

    type Preview = Preview;

    fn parse_id(_subject: &str, id: &str) -> Result<(), String> {
        (!id.trim().is_empty())
            .then_some(())
            .ok_or_else(|| "expected a path under the traces root".to_owned())
    }

    async fn explain(
        look: Look<'_, TraceSettings>,
        _subject: &'static str,
        id: &str,
    ) -> Result<Option<Explanation>, Error> {
        explain_trace(look, id).await
    }

    async fn preview(
        look: Look<'_, TraceSettings>,
        _accounts: Option<&[Uuid]>,
    ) -> Result<Vec<Preview>, Error> {
        let Look {
            conn,
            settings,
            paths,
            now,
        } = look;
        let report = clean(
            conn,
            &paths.store(Root::Traces),
            settings.limits,
            now,
            None,
            &mut Quiet,
            &AtomicBool::new(false),
        )
        .await?;
        Ok(vec![Preview {
            enabled: settings.enabled,
            limits: settings.limits,
            report,
        }])
    }
}

/// The cleaner's verdict on one file: a dry run of the cleaner itself — the same
/// walk, signature check, live-session check, age and quota — watching that path. `path` is
/// relative to the traces root, or absolute under it (for an object root, its URL and the key's
/// path under it).
async fn explain_trace(
    look: Look<'_, TraceSettings>,
    path: &str,
) -> Result<Option<Explanation>, Error> {
    let Look {
        conn,
        settings,
        paths,
        now,
    } = look;
    let store = paths.store(Root::Traces);
    let Some(found) = Found::look(&store, path).await? else {
        return Ok(None);
    };
    let mut watch = Watch {
        path: &found.relative,
        planned: None,
        kept: None,
    };
    let limits = settings.limits;
    if limits.any() {
        let stop = AtomicBool::new(false);
        clean(conn, &store, limits, now, None, &mut watch, &stop).await?;
    }
    let mut explanation = Explanation {
        job: TraceCleanup::NAME,
        subject: "trace",
        id: found.relative.clone(),
        account_id: None,
        policy: format!(
            "[traces] enabled = {}, max_age_days = {}, max_bytes = {}",
            settings.enabled, limits.max_age_days, limits.max_bytes
        ),
        measured_from: Some("the file's modification time".into()),
        age_at: found.mtime,
        cutoff: (limits.max_age_days > 0)
            .then(|| days_before(now, limits.max_age_days))
            .flatten(),
        verdict: ExplainVerdict::Retained,
        reasons: Vec::new(),
        removed_at: None,
        removed_by: None,
    };
    if watch.kept == Some(crate::explain::LEGAL_HOLD) {
        // Every hold that keeps it, by its signature's agent and session (HD-5).
        if let Some((agent, session)) = signature(&found.first_line(&store).await?) {
            let agent = agent_uuid(&agent)
                .map(|id| id.to_string())
                .unwrap_or_default();
            let session = session.to_string();
            let holds = "sexton.trace_holds(NULLIF($1, '')::uuid, $2::uuid)";
            let holds = crate::explain::holds(conn, holds, &[&agent, &session]).await?;
            explanation.reasons.extend(holds);
        }
    }
    judge(&mut explanation, watch, settings, &found);
    Ok(Some(explanation))
}

/// The file `explain trace` was asked about, as found under the traces root.
struct Found {
    /// Relative to the root.
    relative: String,
    mtime: Option<DateTime<Utc>>,
    /// A regular file, or an object.
    is_file: bool,
}

impl Found {
    /// What is at `path` under `store`; `None` when nothing is, or the path is not under it.
    ///
    /// # Errors
    /// [`Error::Root`] or [`Error::Store`] when the root cannot be read.
    async fn look(store: &Store, path: &str) -> Result<Option<Found>, Error> {
        match store {
            Store::Local(given) => {
                let root = given.canonicalize().map_err(|source| Error::Root {
                    path: given.clone(),
                    source,
                })?;
                let Some(relative) = under_root(&root, given, path) else {
                    return Ok(None);
                };
                let Ok(meta) = std::fs::symlink_metadata(root.join(&relative)) else {
                    return Ok(None);
                };
                Ok(Some(Found {
                    relative,
                    mtime: meta.modified().ok().map(DateTime::<Utc>::from),
                    is_file: meta.is_file(),
                }))
            }
            Store::Object(objects) => {
                let url = format!("{objects}/");
                let relative = path.strip_prefix(url.as_str()).unwrap_or(path);
                let Ok(key) = objects.key(relative) else {
                    return Ok(None);
                };
                let meta = objects.meta(&key).await.map_err(|why| Error::Store {
                    root: objects.to_string(),
                    why,
                })?;
                Ok(meta.map(|meta| Found {
                    relative: relative.to_owned(),
                    mtime: Some(meta.last_modified),
                    is_file: true,
                }))
            }
        }
    }

    /// Its first line.
    ///
    /// # Errors
    /// [`Error::Root`] or [`Error::Store`] when it cannot be read.
    async fn first_line(&self, store: &Store) -> Result<Vec<u8>, Error> {
        match store {
            Store::Local(given) => {
                let root_error = |source: io::Error| Error::Root {
                    path: given.clone(),
                    source,
                };
                let dir = crate::files::open_root(&given.canonicalize().map_err(root_error)?)
                    .map_err(root_error)?;
                let name = std::ffi::CString::new(self.relative.as_bytes())
                    .map_err(|e| root_error(e.into()))?;
                first_line(&dir, &name).map_err(root_error)
            }
            Store::Object(objects) => {
                let store_error = |why: String| Error::Store {
                    root: objects.to_string(),
                    why,
                };
                let key = objects.key(&self.relative).map_err(store_error)?;
                let meta = objects.meta(&key).await.map_err(store_error)?;
                let size = meta.map_or(0, |meta| meta.size);
                let first = objects
                    .first_bytes(&key, size, FIRST_LINE_LIMIT as u64)
                    .await
                    .map_err(store_error)?;
                Ok(line_of(first))
            }
        }
    }
}

/// The cleaner's verdict on `relative`, from what its dry run `watch` saw, and every reason for
/// it, into `explanation`.
fn judge(explanation: &mut Explanation, watch: Watch<'_>, settings: &TraceSettings, found: &Found) {
    let limits = settings.limits;
    let reason = |code: &'static str, detail: String| ExplainReason::new("TR-3", code, detail);
    if !limits.any() {
        explanation.reasons.push(ExplainReason::new(
            "TR-1",
            "no_limit",
            "neither traces.max_age_days nor traces.max_bytes is set: nothing goes",
        ));
    } else if let Some(planned) = watch.planned {
        explanation.verdict = ExplainVerdict::Eligible;
        let (rule, detail) = match planned.reason {
            Reason::Age => ("TR-2", "older than traces.max_age_days".to_owned()),
            Reason::Quota => (
                "TR-2",
                format!(
                    "among the oldest traces over traces.max_bytes ({} bytes allocated)",
                    planned.bytes
                ),
            ),
        };
        explanation
            .reasons
            .push(ExplainReason::new(rule, planned.reason.as_str(), detail));
        if !settings.enabled {
            explanation.reasons.push(ExplainReason::new(
                "TR-4",
                "background_off",
                "background cleaning is off: `sexton traces clean --confirm` would delete it",
            ));
        }
    } else if let Some(kept) = watch.kept {
        explanation.reasons.push(reason(
            kept,
            match kept {
                "bad_signature" => {
                    "its first line is not a run-trace/1 signature with string agent_id and a \
                     session_id that is a UUID"
                        .into()
                }
                "live_session" => "its session is an agent's current or main session".into(),
                "legal_hold" => {
                    "a hold covers its session, its agent or their account (HD-2)".into()
                }
                "outside_root" => "a symlink leading out of the traces root: never followed".into(),
                "not_regular" => "not a regular file (a symlink, a directory, a device)".into(),
                _ => "it cannot be read".into(),
            },
        ));
    } else if !found.relative.ends_with(".trace.jsonl") || !found.is_file {
        explanation.reasons.push(reason(
            "not_a_trace",
            "only regular files named *.trace.jsonl are traces".into(),
        ));
    } else {
        explanation.reasons.push(ExplainReason::new(
            "TR-2",
            "within_limits",
            "younger than the age limit, and not among the oldest over the quota",
        ));
    }
}

/// `path` relative to the traces root (found at `root` once its symlinks are resolved, at
/// `given` as configured), when it is relative already or absolute under it.
fn under_root(root: &Path, given: &Path, path: &str) -> Option<String> {
    let path_of = Path::new(path);
    if !path_of.is_absolute() {
        return Some(path.to_owned());
    }
    path_of
        .strip_prefix(root)
        .or_else(|_| path_of.strip_prefix(given))
        .ok()
        .map(|relative| relative.to_string_lossy().into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hd2_a_signature_agent_is_a_uuid_only_in_the_form_the_database_reads_as_one() {
        let id = "0b6f3a52-6f1e-4c1a-9d55-3e2f0c9a7b10";
        assert_eq!(agent_uuid(id), Uuid::try_parse(id).ok());
        assert_eq!(agent_uuid(&id.to_uppercase()), Uuid::try_parse(id).ok());
        for not_one in [
            "0b6f3a526f1e4c1a9d553e2f0c9a7b10",
            "{0b6f3a52-6f1e-4c1a-9d55-3e2f0c9a7b10}",
            "urn:uuid:0b6f3a52-6f1e-4c1a-9d55-3e2f0c9a7b10",
            "0b6f3a52-6f1e-4c1a-9d55-3e2f0c9a7b1g",
            "0b6f3a52+6f1e-4c1a-9d55-3e2f0c9a7b10",
            "agent-7",
            "",
        ] {
            assert_eq!(agent_uuid(not_one), None, "{not_one}");
        }
    }
}
