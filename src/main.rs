use std::process::ExitCode;

use clap::Parser;

mod cli;

// Rendering and the watches allocate many small objects; mimalloc serves them faster than
// the system allocator (docs/benchmarks.md, Render). The `system-allocator` feature keeps the
// C allocator, which heap profilers (heaptrack) see: for profiles only. Built without its
// transparent huge pages (Cargo.toml, `no_thp`): they were a fifth of the operator's RSS.
#[cfg(not(feature = "system-allocator"))]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    // In the envbridge image the anchor's command paths (/opt/o2/bin/StfBuilder ...) link
    // here: started under such a name, envbridge is that task's simulator.
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if args
        .first()
        .is_some_and(|a| envbridge::control::sim::as_task::is_anchor_command(a))
    {
        return envbridge::control::sim::as_task::run(args);
    }
    cli::run(cli::Cli::parse())
}
