//! The runtime a command's future runs on, and how its outcome becomes an exit code.

use std::future::Future;
use std::process::ExitCode;

/// Runs `fut` on a multi-thread runtime (`threads` workers, default one per core). An error
/// is printed as `error: ...` and exits 1.
pub fn block_on<E: std::fmt::Display>(
    threads: Option<usize>,
    fut: impl Future<Output = Result<ExitCode, E>>,
) -> ExitCode {
    let mut b = tokio::runtime::Builder::new_multi_thread();
    if let Some(n) = threads {
        b.worker_threads(n.max(1));
    }
    let rt = match b.enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: tokio runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(fut) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
