use std::process::ExitCode;

use clap::Parser;

mod cli;

// Rendering and the watches allocate many small objects; mimalloc serves them faster than
// the system allocator (docs/benchmarks.md, Render).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    cli::run(cli::Cli::parse())
}
