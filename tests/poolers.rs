//! ER-5: sexton through a real PgBouncer (Debian's `pgbouncer`, installed by scripts/test.sh) in
//! front of the test's database: in session mode a pass prunes exactly what it prunes on a
//! direct connection; in transaction or statement mode every command that opens the database
//! refuses at once, naming transaction pooling and the fix, and writes nothing; a session pool
//! too small for sexton's is named with the size it needs.

use std::time::Duration;

use sexton::db::session;
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;
use tokio::process::{Child, Command};

use crate::common::process::{Proc, free_port, poll_until};
use crate::common::{self, audit, fixture};

/// A PgBouncer on a free loopback port in front of the tests' PostgreSQL, ended on drop.
struct Bouncer {
    _child: Child,
    _dir: tempfile::TempDir,
    port: u16,
}

impl Bouncer {
    /// Starts one in `pool_mode` (session, transaction or statement), with a pool wide enough
    /// for a worker's `database.max_connections` and the tests' own connections.
    async fn start(pool_mode: &str) -> Bouncer {
        Self::start_sized(pool_mode, 60).await
    }

    /// Starts one in `pool_mode` whose pool holds `pool_size` server connections per database
    /// and user.
    async fn start_sized(pool_mode: &str, pool_size: u32) -> Bouncer {
        let base = std::env::var("DATABASE_URL").expect("DATABASE_URL is set for the tests");
        let Parts {
            user,
            password,
            host,
            port: server_port,
        } = Parts::of(&base);
        let host = if host == "localhost" {
            "127.0.0.1"
        } else {
            host
        };
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let auth = dir.path().join("userlist.txt");
        std::fs::write(&auth, format!("\"{user}\" \"{password}\"\n")).unwrap();
        let ini = dir.path().join("pgbouncer.ini");
        std::fs::write(
            &ini,
            format!(
                "[databases]\n* = host={host} port={}\n\n[pgbouncer]\nlisten_addr = 127.0.0.1\n\
                 listen_port = {port}\nunix_socket_dir =\nauth_type = plain\nauth_file = {}\n\
                 pool_mode = {pool_mode}\ndefault_pool_size = {pool_size}\nmax_client_conn = 300\n\
                 ignore_startup_parameters = extra_float_digits,options\n",
                server_port,
                auth.display()
            ),
        )
        .unwrap();
        let mut cmd = Command::new("pgbouncer");
        // PgBouncer refuses to run as root: it then drops to the postgres user, who must read
        // its files.
        if nix_is_root() {
            use std::os::unix::fs::PermissionsExt as _;
            for path in [dir.path(), &ini, &auth] {
                let mode = if path.is_dir() { 0o755 } else { 0o644 };
                std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
            }
            cmd.args(["-u", "postgres"]);
        }
        let child = cmd
            .arg(&ini)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("pgbouncer runs (Debian package pgbouncer; scripts/test.sh installs it)");
        poll_until(Duration::from_secs(30), || async {
            tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .is_ok()
        })
        .await;
        Bouncer {
            _child: child,
            _dir: dir,
            port,
        }
    }

    /// `url` (the test's database) through this pooler.
    fn url(&self, url: &str) -> String {
        let Parts { user, password, .. } = Parts::of(url);
        let database = url.rsplit_once('/').map_or("", |(_, db)| db);
        format!(
            "postgres://{user}:{password}@127.0.0.1:{}/{database}",
            self.port
        )
    }
}

/// The parts of a `postgres://user:password@host:port/database` URL the pooler needs.
struct Parts<'a> {
    user: &'a str,
    password: &'a str,
    host: &'a str,
    port: &'a str,
}

impl<'a> Parts<'a> {
    fn of(url: &'a str) -> Self {
        let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
        let (login, address) = rest
            .rsplit_once('@')
            .expect("the tests' DATABASE_URL names a user and password");
        let (user, password) = login.split_once(':').unwrap_or((login, ""));
        let address = address.split('/').next().unwrap_or(address);
        let (host, port) = address.rsplit_once(':').unwrap_or((address, "5432"));
        Parts {
            user,
            password,
            host,
            port,
        }
    }
}

fn nix_is_root() -> bool {
    std::process::Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|out| out.stdout.starts_with(b"0\n"))
}

#[sqlx::test]
async fn er5_the_probe_never_sees_pooling_on_a_direct_connection_and_always_behind_a_transaction_pooler(
    pool: PgPool,
) {
    for _ in 0..20 {
        assert_eq!(session::probe(&pool).await.unwrap(), None);
    }
    let url = common::database_url(&pool).await;
    let bouncer = Bouncer::start("transaction").await;
    let pooled = PgPoolOptions::new()
        .max_connections(5)
        .connect(&bouncer.url(&url))
        .await
        .unwrap();
    for _ in 0..20 {
        let seen = session::probe(&pooled).await.unwrap();
        assert!(seen.is_some(), "a transaction pooler goes unseen");
    }
    pooled.close().await;
}

#[sqlx::test]
async fn er5_a_pass_through_a_session_pooler_prunes_exactly_what_a_direct_one_does(pool: PgPool) {
    let common::Backlog {
        dir,
        settings,
        before,
        url,
    } = common::seeded_backlog(&pool, 5).await;
    let bouncer = Bouncer::start("session").await;
    let pooled = bouncer.url(&url);

    let mut tick = common::sexton(&pooled, dir.path());
    // The default schedule, whose slot at the pass start is the pass start itself.
    tick.args(["tick", "--at", &fixture::pass_start().to_rfc3339()])
        .env("SEXTON_SCHEDULE__CRON", "0 3 * * *");
    let (status, lines) = Proc::spawn(tick).finish(Duration::from_secs(60)).await;
    assert_eq!(status.code(), Some(0), "{lines:?}");
    let mut worker = common::sexton(&pooled, dir.path());
    worker.args(["worker", "--exit-when-idle"]);
    let (status, lines) = Proc::spawn(worker).finish(Duration::from_secs(180)).await;
    assert_eq!(status.code(), Some(0), "{lines:?}");

    // The same audit as a direct pass's: everything due went, everything kept stayed.
    assert!(audit::pruned_count(&pool).await > 0, "{lines:#?}");
    audit::verify(&pool, &settings.paths.output_root, &before, true).await;
}

#[sqlx::test]
async fn er5_transaction_and_statement_pooling_are_refused_by_every_command_with_exit_2(
    pool: PgPool,
) {
    common::migrate(&pool).await;
    let dir = tempfile::tempdir().unwrap();
    let url = common::database_url(&pool).await;
    let account = fixture::account(&pool, Some(30)).await;
    let conversation = fixture::conversation(&pool, account).await;
    let due = fixture::run(
        &pool,
        &dir.path().join("outputs"),
        fixture::RunSpec::conversation(account, conversation, 40.0),
    )
    .await;
    for mode in ["transaction", "statement"] {
        let bouncer = Bouncer::start(mode).await;
        for command in [
            &["worker"][..],
            &["worker", "--exit-when-idle"],
            &["tick"],
            &["status"],
        ] {
            let mut cmd = common::sexton(&bouncer.url(&url), dir.path());
            cmd.args(command);
            let (status, lines) = Proc::spawn(cmd).finish(Duration::from_secs(60)).await;
            assert_eq!(status.code(), Some(2), "{mode} {command:?}: {lines:?}");
            let said = |needle: &str| lines.iter().any(|l| l.contains(needle));
            assert!(
                said("transaction- or statement-mode pooler")
                    && said("pool_mode = session")
                    && said("a DATABASE_URL for sexton beside the platform's pooled one"),
                "{mode} {command:?} names transaction pooling and the fix: {lines:?}"
            );
        }
    }
    // Nothing was pushed or run: no slot, no hop, the due run untouched.
    let jobs: i64 = sqlx::query_scalar("SELECT count(*) FROM apalis.jobs")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(jobs, 0);
    assert!(!fixture::is_pruned(&pool, due.id).await);
    assert!(fixture::has_detail(&pool, due.id).await);
}

#[sqlx::test]
async fn er5_a_session_pool_smaller_than_sextons_is_named_with_the_size_it_needs_and_the_setting(
    pool: PgPool,
) {
    common::migrate(&pool).await;
    let dir = tempfile::tempdir().unwrap();
    let url = common::database_url(&pool).await;
    // sexton's pool: the default database.max_connections, and the writable check's connection.
    let needed = sexton::registry::load_settings(None)
        .unwrap()
        .database
        .max_connections
        + 1;
    let small = Bouncer::start_sized("session", 2).await;
    // Control: a pool as wide as sexton's, through the same kind of pooler.
    let wide = Bouncer::start_sized("session", needed).await;
    for command in [
        &["worker"][..],
        &["worker", "--exit-when-idle"],
        &["status"],
    ] {
        let run = |bouncer: &Bouncer| {
            let mut cmd = common::sexton(&bouncer.url(&url), dir.path());
            cmd.args(command)
                .env("SEXTON_DATABASE__ACQUIRE_TIMEOUT_MS", "2000");
            Proc::spawn(cmd).finish(Duration::from_secs(60))
        };
        let (status, lines) = run(&small).await;
        assert_eq!(status.code(), Some(2), "{command:?}: {lines:?}");
        let said = |needle: &str| lines.iter().any(|l| l.contains(needle));
        assert!(
            said("through PgBouncer, whose pool gave sexton no connection")
                && said("pool timed out")
                && said(&format!("database.max_connections + 1 = {needed}"))
                && said(&format!(
                    "default_pool_size (or pool_size on the database's line) to at least {needed}"
                ))
                && said("max_client_conn"),
            "{command:?} names the pooler, the size it needs and the setting: {lines:?}"
        );
        assert!(!said("invalid configuration"), "{lines:?}");

        if command == ["status"] {
            let (status, lines) = run(&wide).await;
            assert_eq!(status.code(), Some(0), "through a wide pool: {lines:?}");
        }
    }
}

#[sqlx::test]
async fn op7_doctor_names_transaction_pooling_as_a_finding_and_passes_a_session_pooler(
    pool: PgPool,
) {
    common::migrate(&pool).await;
    let dir = tempfile::tempdir().unwrap();
    let url = common::database_url(&pool).await;
    for (mode, code) in [("transaction", 1), ("session", 0)] {
        let bouncer = Bouncer::start(mode).await;
        let output = common::sexton(&bouncer.url(&url), dir.path())
            .args(["doctor", "--json"])
            .output()
            .await
            .unwrap();
        let checks: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
        let findings: Vec<&str> = checks["checks"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|c| c["ok"] == false)
            .map(|c| c["check"].as_str().unwrap())
            .collect();
        assert_eq!(output.status.code(), Some(code), "{mode}: {checks}");
        let expected: &[&str] = if mode == "transaction" {
            &["pooler"]
        } else {
            &[]
        };
        assert_eq!(findings, expected, "{mode}: {checks}");
    }
}
