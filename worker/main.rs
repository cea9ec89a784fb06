//! `sexton`: the retention worker fleet's one binary.
//!
//! config (with every registered job's section) → telemetry → command (database, jobs, queue,
//! schedule) → exit code.
//! Exit codes (OP-1): 0 success, 2 bad usage or configuration, 1 failure.

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use sexton::cli::{Cli, Command};

/// How long the end of the process waits for tasks still running on the runtime.
const SHUTDOWN_WAIT: Duration = Duration::from_secs(1);

fn main() -> ExitCode {
    let cli = Cli::parse();
    let settings = match sexton::registry::load_settings(cli.config.as_deref()) {
        Ok(settings) => settings,
        Err(err) => {
            eprintln!("sexton: {err}");
            return ExitCode::from(2);
        }
    };
    // The demo prints a report; its worker's logs go to a file the report names.
    let log_file = matches!(cli.command, Command::Demo { .. }).then(sexton::demo::log_file);
    if let Err(err) = sexton::telemetry::init(&settings.log, log_file.as_deref()) {
        eprintln!("sexton: {err}");
        return ExitCode::FAILURE;
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("sexton: could not start the async runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    let outcome = runtime.block_on(sexton::cli::run(cli.command, settings));
    // A queue consumer pausing before its restart holds a thread of its own (see
    // `worker::monitor`): the process ends without waiting for it.
    runtime.shutdown_timeout(SHUTDOWN_WAIT);
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("sexton: {err:#}");
            ExitCode::from(sexton::cli::exit_code(&err))
        }
    }
}
