//! A fleet member (`sexton worker`): the schedule, the HTTP endpoints and one apalis worker per
//! queue, each under a monitor of its own, until SIGTERM/SIGINT — or, with `--exit-when-idle`, only the queue
//! workers, until the queue is empty.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context as _;
use apalis::layers::WorkerBuilderExt;
use apalis::prelude::{BackendExt, Monitor, Strategy, WorkerBuilder};
use sexton_jobs::job::Cadence;
use sqlx::PgPool;
use tokio::net::TcpListener;

use crate::clock::DatabaseClock;
use crate::config::Settings;
use crate::context::JobContext;
use crate::http::{self, Health};
use crate::registry;
use crate::telemetry::metrics;
use crate::tick;
use crate::wakeups::Wakeups;
use crate::{db, queue};

mod handler;

use handler::{Consumer, QueueWorker, handle};

/// This process's name in the fleet: the configured name (the pod's, in Kubernetes) or host
/// name and process id, then a suffix drawn at start. A process restarted under the same name —
/// a container restarted in its pod, where the process id is the same too — must not take over
/// its dead predecessor's registration: the jobs that one held would never look orphaned, and
/// never be rescued (FL-4).
pub fn worker_name(settings: &Settings) -> String {
    let base = if settings.queue.worker_name.is_empty() {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_owned())
            .unwrap_or_else(|_| "localhost".to_owned());
        format!("sexton-{host}-{}", std::process::id())
    } else {
        settings.queue.worker_name.clone()
    };
    let start = uuid::Uuid::new_v4().simple().to_string();
    format!("{base}.{}", &start[..8])
}

/// How a worker runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// A fleet member: schedule, HTTP endpoints, queue consumers until SIGTERM/SIGINT.
    Fleet,
    /// A one-shot run: queue consumers only, until no job is pending or running.
    UntilIdle,
}

/// How a worker's run ended, once it ended well.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ran {
    /// Jobs this process settled as failed for good (kept for inspection).
    pub failed_for_good: usize,
}

impl Ran {
    /// A run until idle that left jobs failed for good is a failure (OP-1: exit 1), saying how
    /// many.
    ///
    /// # Errors
    /// Some job this process ran failed for good.
    pub fn succeeded(self) -> anyhow::Result<()> {
        match self.failed_for_good {
            0 => Ok(()),
            n => Err(anyhow::anyhow!(
                "{n} {} this worker ran failed for good (kept for inspection: `sexton status` \
                 lists them with their last error)",
                if n == 1 { "job" } else { "jobs" }
            )),
        }
    }
}

/// Runs this process as a fleet member until SIGTERM/SIGINT, or until idle. While the database
/// takes no writes no queue is consumed; a run until idle then ends (ER-6).
///
/// # Errors
/// The database stayed unreachable at start or is behind a transaction pooler (ER-5), the HTTP
/// address cannot be bound, the monitor failed, or (running until idle) the database takes no
/// writes.
pub async fn run(settings: &Settings, mode: Mode) -> anyhow::Result<Ran> {
    let settings = Arc::new(settings.clone());
    let health = Arc::new(Health::default());
    let http = match mode {
        Mode::Fleet => Some(serve_http(&settings, &health).await?),
        Mode::UntilIdle => None,
    };

    reach_stores(&settings).await?;
    let pool = db::connect_with_retry(&settings.database, db::Access::Read).await?;
    health.connected(&pool);
    // Everything this replica times goes by the database's clock, not its host's (FL-2).
    let clock = Arc::new(DatabaseClock::default());
    match clock.measure(&pool).await {
        Ok(ahead) => crate::clock::report(ahead),
        Err(err) => tracing::warn!(error = %err, "could not read the database's clock"),
    }
    if mode == Mode::Fleet {
        crate::gauges::database_totals(&pool).await;
    }
    let ctx = JobContext::new(pool.clone(), settings.clone(), clock.clone());
    let wakeups = Arc::new(Wakeups::default());
    let background = start_background(&ctx, mode, clock, &health);

    let writable = db::Writable::new(&settings.database);
    let mut pause_first = false;
    let outcome = loop {
        // No consumer runs on a node that takes no writes (ER-6): apalis would fail to register,
        // heartbeat and rescue, and restart over and over. The check says why each interval.
        let hold = async {
            if pause_first {
                tokio::time::sleep(WRITABLE_INTERVAL).await;
            }
            while let Some(state) = writable.check().await {
                health.read_only(true);
                // A run until idle there would wait forever: it ends at once, saying why.
                if mode == Mode::UntilIdle {
                    return Some(state);
                }
                tokio::time::sleep(WRITABLE_INTERVAL).await;
            }
            None
        };
        tokio::select! {
            signal = shutdown_signal() => break signal.map_err(anyhow::Error::from),
            held = hold => if let Some(state) = held {
                break Err(read_only_error(state));
            },
        }
        health.read_only(false);
        match consume(&ctx, &wakeups, &health, mode, &writable).await {
            Ok(Ended::Stopped) => break Ok(()),
            Ok(Ended::ReadOnly(state)) if mode == Mode::UntilIdle => {
                break Err(read_only_error(state));
            }
            Ok(Ended::ReadOnly(_)) => {
                health.read_only(true);
                pause_first = true;
            }
            Err(err) => break Err(err),
        }
    };
    for task in background {
        task.abort();
    }
    if let Some((stop, http)) = http {
        let _ = stop.send(());
        http.await??;
    }
    outcome.map(|()| Ran {
        failed_for_good: ctx.failed_for_good.load(Ordering::SeqCst),
    })
}

/// Reaches every object-store root, retrying as the database is retried at start (ER-2): a
/// store that does not answer yet is an outage, not a setting. /readyz says not ready
/// meanwhile (nothing is connected yet).
///
/// # Errors
/// The roots the store still did not answer for after `database.connect_attempts` tries.
async fn reach_stores(settings: &Settings) -> Result<(), crate::config::Unreachable> {
    let attempts = settings.database.connect_attempts;
    let mut delays = db::start_backoff();
    let mut attempt = 1;
    loop {
        match settings.reach_stores().await {
            Ok(()) => return Ok(()),
            Err(err) if attempt >= attempts => return Err(err),
            Err(err) => {
                tracing::warn!(
                    event = crate::event::OBJECT_STORE_UNREACHABLE,
                    attempt,
                    of = attempts,
                    error = %err,
                    "object store unreachable; retrying"
                );
                tokio::time::sleep(delays.next().unwrap_or(Duration::from_secs(10))).await;
                attempt += 1;
            }
        }
    }
}

/// How a run until idle ends on a node that takes no writes.
fn read_only_error(state: db::ReadOnly) -> anyhow::Error {
    anyhow::anyhow!("{state}: no job can run on it; {}", state.fix())
}

/// Why [`consume`] ended.
enum Ended {
    /// Signalled, or (running until idle) idle.
    Stopped,
    /// The database stopped taking writes: the consumers were stopped until it does again.
    ReadOnly(db::ReadOnly),
}

/// Consumes every queue, each under a monitor of its own, with a worker name of its own (and, in a fleet member,
/// runs the schedule), until signalled, idle (running until idle) or the database stops taking
/// writes.
///
/// # Errors
/// A consumer's monitor or the stop signal failed (apalis reports a monitor with a shutdown
/// grace as ended well, whatever its workers did).
async fn consume(
    ctx: &JobContext,
    wakeups: &Arc<Wakeups>,
    health: &Arc<Health>,
    mode: Mode,
    writable: &db::Writable,
) -> anyhow::Result<Ended> {
    let name = worker_name(&ctx.settings);
    let holding = Arc::new(AtomicBool::new(false));
    let monitors = monitors(ctx, wakeups, health, &name, &holding);
    let mut beside = match mode {
        Mode::Fleet => start_schedule(ctx),
        Mode::UntilIdle => Vec::new(),
    };
    // LISTEN is refused on a standby: the wake-ups run only beside the consumers they wake.
    beside.push(tokio::spawn(wakeups.clone().run(ctx.pool.clone())));
    tracing::info!(event = crate::event::WORKER_STARTED, worker = %name, queues = Consumer::all().count(), "worker started");
    health.consuming(true);
    let (ended, why) = tokio::sync::oneshot::channel();
    let (signal, watch) = stop_or_read_only(ctx, mode, writable, &holding, ended);
    // Each monitor on a task of its own: its restart pauses hold its thread (see `paced`),
    // never the watch beside it, nor another consumer's restart. The signal reaches them all.
    let (stopping, stopped) = tokio::sync::watch::channel(false);
    let signalled = tokio::spawn(async move {
        let result = signal.await;
        let _ = stopping.send(true);
        result
    });
    let mut outcome = run_monitors(monitors, stopped).await;
    // The monitors may all have ended before the signal told why: their consumers were not
    // restarted once the node stopped taking writes, which the signal is then about to say.
    if holding.load(Ordering::Relaxed) || signalled.is_finished() {
        match signalled.await {
            Ok(Ok(())) => {}
            Ok(Err(err)) => outcome = outcome.and(Err(err).context("waiting for the stop signal")),
            Err(err) => outcome = outcome.and(Err(anyhow::anyhow!("the stop signal ended: {err}"))),
        }
    } else {
        signalled.abort();
    }
    health.consuming(false);
    watch.abort();
    for task in beside {
        task.abort();
    }
    outcome?;
    tracing::info!(worker = %name, "worker stopped");
    Ok(why.await.unwrap_or(Ended::Stopped))
}

/// The signal that ends the consumers, and the task that watches the node: it resolves on
/// [`stop`], or once the database stops taking writes (from then on failed consumers are not
/// restarted), and sends `ended` why.
fn stop_or_read_only(
    ctx: &JobContext,
    mode: Mode,
    writable: &db::Writable,
    holding: &Arc<AtomicBool>,
    ended: tokio::sync::oneshot::Sender<Ended>,
) -> (
    impl std::future::Future<Output = std::io::Result<()>> + Send + 'static,
    tokio::task::JoinHandle<()>,
) {
    // The watch on a task of its own: a monitor, which polls the stop signal, can be held in its
    // consumer's restart pause (see `paced`) just when the node stops taking writes.
    let (read_only, became_read_only) = tokio::sync::oneshot::channel();
    let watch = {
        let (writable, holding) = (writable.clone(), holding.clone());
        tokio::spawn(async move {
            let state = writable.until_read_only(WRITABLE_INTERVAL).await;
            holding.store(true, Ordering::Relaxed);
            let _ = read_only.send(state);
        })
    };
    let ctx = ctx.clone();
    let signal = async move {
        tokio::select! {
            result = stop(ctx, mode) => {
                let _ = ended.send(Ended::Stopped);
                result
            }
            Ok(state) = became_read_only => {
                let _ = ended.send(Ended::ReadOnly(state));
                Ok(())
            }
        }
    };
    (signal, watch)
}

/// Runs each monitor on a task of its own until `stopped` turns true, and waits for them all.
async fn run_monitors(
    monitors: Vec<Monitor>,
    stopped: tokio::sync::watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let running: Vec<_> = monitors
        .into_iter()
        .map(|monitor| {
            let mut stopped = stopped.clone();
            tokio::spawn(monitor.run_with_signal(async move {
                let _ = stopped.wait_for(|stop| *stop).await;
                Ok(())
            }))
        })
        .collect();
    let mut outcome = Ok(());
    for monitor in running {
        let ended = match monitor.await {
            Ok(ended) => ended.context("a queue consumer's monitor failed"),
            Err(err) => Err(anyhow::anyhow!("a queue consumer's monitor ended: {err}")),
        };
        outcome = outcome.and(ended);
    }
    outcome
}

/// Resolves on SIGTERM or SIGINT or, running until idle, once idle; running hops are then told
/// to stop.
async fn stop(ctx: JobContext, mode: Mode) -> std::io::Result<()> {
    let result = tokio::select! {
        signal = shutdown_signal() => signal,
        idle = wait_until_idle(&ctx.pool, &ctx.handling), if mode == Mode::UntilIdle => idle,
    };
    // Running hops finish the owner in hand and hand the rest over (FL-5).
    ctx.stopping.store(true, Ordering::Relaxed);
    result
}

/// Serves /metrics, /healthz and /readyz on `http.listen` until the sender is used.
///
/// # Errors
/// The address cannot be bound.
async fn serve_http(
    settings: &Arc<Settings>,
    health: &Arc<Health>,
) -> anyhow::Result<(
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<std::io::Result<()>>,
)> {
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let listener = TcpListener::bind(settings.http.listen)
        .await
        .with_context(|| format!("http.listen: cannot listen on {}", settings.http.listen))?;
    tracing::info!(
        address = %listener.local_addr()?,
        status_page = settings.http.status_page,
        "serving /metrics, /healthz, /readyz, /status"
    );
    let handle = metrics::install();
    let kinds: Vec<_> = registry::KINDS.iter().map(|kind| kind.labels()).collect();
    let consumers: Vec<_> = Consumer::all().map(Consumer::job).collect();
    metrics::export_from_start(&kinds, &consumers);
    let pages = crate::status_page::routes(health.clone(), settings.clone());
    let serve = http::serve(listener, handle, health.clone(), pages, async {
        let _ = stopped.await;
    });
    Ok((stop, tokio::spawn(serve)))
}

/// The tasks a worker runs whether or not it consumes, aborted when it stops: the clock's
/// measurement; in a fleet member also the gauges (and the backlogs its status page shows).
fn start_background(
    ctx: &JobContext,
    mode: Mode,
    clock: Arc<DatabaseClock>,
    health: &Arc<Health>,
) -> Vec<tokio::task::JoinHandle<()>> {
    let mut background = vec![tokio::spawn(clock.keep(ctx.pool.clone()))];
    if mode == Mode::Fleet {
        background.push(tokio::spawn(crate::gauges::refresh(
            ctx.clone(),
            health.clone(),
        )));
    }
    background
}

/// What pushes jobs in a fleet member, beside its consumers and for as long as they run (not
/// while the database takes no writes): the nightly schedule (with its catch-up) and the timer
/// of every kind on a cadence of its own.
fn start_schedule(ctx: &JobContext) -> Vec<tokio::task::JoinHandle<()>> {
    let mut timers = vec![tokio::spawn(tick::run_schedule(
        ctx.pool.clone(),
        ctx.settings.clone(),
        ctx.clock.clone(),
    ))];
    for kind in registry::KINDS {
        if let Cadence::Every(period) = kind.cadence(&ctx.settings) {
            timers.push(tokio::spawn(tick::run_every(ctx.clone(), *kind, period)));
        }
    }
    timers
}

/// One apalis worker per queue, each under a monitor of its own, which stops claiming on
/// shutdown and waits up to the grace for running jobs (FL-5). A consumer that fails once
/// `holding` is set is not restarted (the database took no writes).
fn monitors(
    ctx: &JobContext,
    wakeups: &Arc<Wakeups>,
    health: &Arc<Health>,
    name: &str,
    holding: &Arc<AtomicBool>,
) -> Vec<Monitor> {
    let poll = ctx.settings.queue.poll_interval;
    let (concurrency, grace) = (
        ctx.settings.queue.concurrency,
        ctx.settings.queue.shutdown_grace,
    );
    // One pacer for them all: it logs the whole worker's failures once per interval.
    let pacer = Arc::new(Mutex::new(crate::restarts::RestartPacer::default()));
    let mut monitors = Vec::new();
    for consumer in Consumer::all() {
        let ctx = ctx.clone();
        let wakeups = wakeups.clone();
        let worker = format!("{name}.{}", consumer.job());
        let monitor = Monitor::new().register(move |restarts| {
            let queue = consumer.queue();
            let backend = queue::storage(&ctx.pool, queue, &ctx.settings.queue).poll_with_strategy(
                Strategy::new()
                    .stream(wakeups.subscribe(queue))
                    .interval(poll),
            );
            // A restarted worker takes a new name, so that the jobs its predecessor held are
            // seen as orphans and rescued (a live name never has its own jobs rescued).
            let name = match restarts {
                0 => worker.clone(),
                n => format!("{worker}.r{n}"),
            };
            WorkerBuilder::new(name)
                .backend(backend)
                .data(QueueWorker {
                    ctx: ctx.clone(),
                    consumer,
                })
                .concurrency(concurrency)
                .build(handle)
        });
        monitors.push(paced(monitor, grace, health, holding, &pacer));
    }
    monitors
}

/// `monitor` restarting its consumer when its backend fails (the database went away, ER-2),
/// after a pause: an error that repeats at once (a role without grants) must not become a hot
/// loop. /readyz says not ready while consumers keep failing.
fn paced(
    monitor: Monitor,
    grace: Duration,
    health: &Arc<Health>,
    holding: &Arc<AtomicBool>,
    pacer: &Arc<Mutex<crate::restarts::RestartPacer>>,
) -> Monitor {
    let (health, holding, pacer) = (health.clone(), holding.clone(), pacer.clone());
    monitor
        .should_restart(move |worker, err| {
            if holding.load(Ordering::Relaxed) {
                return false;
            }
            health.consumer_failed();
            let pause = pacer
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .failed(worker.name(), &err.to_string());
            // A monitor restarts synchronously: the pause holds its thread, not the runtime, nor
            // the other consumers' monitors; running jobs go on, each on a task of its own (see
            // `handle`).
            tokio::task::block_in_place(|| std::thread::sleep(pause));
            true
        })
        .shutdown_timeout(grace)
}

/// How often a worker checks whether the database takes writes (ER-6).
const WRITABLE_INTERVAL: Duration = Duration::from_secs(5);

/// Resolves on SIGTERM or SIGINT.
async fn shutdown_signal() -> std::io::Result<()> {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = term.recv() => Ok(()),
        result = tokio::signal::ctrl_c() => result,
    }
}

/// Resolves once this process handles no job and no job of any sexton queue is pending or
/// running, read in that order: a job handled after the first reading is in the queue at the
/// second, and so is whatever a job handled before it pushed.
async fn wait_until_idle(pool: &PgPool, handling: &AtomicUsize) -> std::io::Result<()> {
    let mut said = false;
    loop {
        let handled = handling.load(Ordering::SeqCst);
        match queue::counts(pool).await {
            Ok(counts) if handled == 0 && counts.idle() => return Ok(()),
            Ok(counts) if counts.idle() && !said => {
                tracing::info!(
                    event = crate::event::WAITING_FOR_OWN_JOBS,
                    jobs = handled,
                    "the queue holds no job, but this worker still handles some (their rows \
                     gone?): waiting for them, as they may push more"
                );
                said = true;
            }
            Ok(_) => {}
            Err(err) => tracing::warn!(error = %err, "could not read the queue"),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
