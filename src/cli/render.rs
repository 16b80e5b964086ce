//! `envbridge render`: a workflow to the objects to apply, or the `-o tasks` view.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, ValueEnum};
use envbridge::plan::templates::TemplateMap;
use envbridge::plan::{self, RenderRequest};
use envbridge::workflow::Sources;
use envbridge::workflow::store::ConfigStore;
use std::sync::Arc;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Output {
    /// A YAML stream: TaskSets, then the Environment.
    Yaml,
    /// A JSON array: TaskSets, then the Environment.
    Json,
    /// The fully resolved view, one element per task.
    Tasks,
}

#[derive(Args, Debug)]
pub struct RenderArgs {
    /// Workflow file (or name in --workflows).
    pub workflow: PathBuf,
    /// Seconds the render may take; a longer one is stopped with an error (exit 2).
    #[arg(long, default_value_t = 30)]
    pub deadline: u64,
    /// Directory of task classes (`<load>.yaml`).
    #[arg(long, value_name = "DIR")]
    pub tasks: PathBuf,
    /// Directory of workflows, for includes (default: the workflow's directory).
    #[arg(long, value_name = "DIR")]
    pub workflows: Option<PathBuf>,
    /// Site profile (variables the anchor keeps in its configuration store); repeatable.
    #[arg(long, value_name = "FILE")]
    pub defaults: Vec<PathBuf>,
    /// The site's configuration store, in the anchor's layout (site variables, inventory,
    /// component configuration); its variables win over `--defaults`.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// The site's mapping from task classes and control modes to TaskTemplates
    /// (docs/workflow-language.md).
    #[arg(long, value_name = "FILE")]
    pub templates: Option<PathBuf>,
    /// A variable, highest priority; repeatable.
    #[arg(long = "set", value_name = "KEY=VALUE", value_parser = parse_set)]
    pub sets: Vec<(String, String)>,
    /// Environment id (seeds every derived name).
    #[arg(long, value_name = "ID")]
    pub env_id: Option<String>,
    /// Namespace to put on the objects.
    #[arg(long, short = 'n')]
    pub namespace: Option<String>,
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value = "yaml")]
    pub output: Output,
    /// The repository's `jit/` directory of DPL commands (default: `jit` beside the
    /// workflows directory).
    #[arg(long = "jit", value_name = "DIR")]
    pub jit_dir: Option<PathBuf>,
    /// A program that generates a JIT workflow where the anchor runs the experiment's
    /// software (docs/workflow-language.md, "JIT workflows").
    #[arg(long, value_name = "PROGRAM")]
    pub jit_generator: Option<PathBuf>,
    /// Seconds one generation may take (default 10).
    #[arg(long, value_name = "SECONDS")]
    pub jit_generator_deadline: Option<u64>,
    /// Most bytes one generation may write (default 4194304).
    #[arg(long, value_name = "BYTES")]
    pub jit_generator_max_bytes: Option<usize>,
}

pub fn parse_set(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
        _ => Err(format!("`{s}` is not KEY=VALUE")),
    }
}

pub fn run(a: RenderArgs) -> ExitCode {
    let store = match &a.config {
        Some(path) => match ConfigStore::load(path) {
            Ok(s) => Arc::new(s),
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::from(2);
            }
        },
        None => Arc::new(ConfigStore::empty()),
    };
    let templates = match &a.templates {
        Some(path) => match TemplateMap::load(path) {
            Ok(m) => Arc::new(m),
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::from(2);
            }
        },
        None => Arc::default(),
    };
    let jit = match super::daemon::jit_options(
        a.jit_dir,
        a.jit_generator,
        a.jit_generator_deadline,
        a.jit_generator_max_bytes,
    ) {
        Ok(j) => j,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let req = RenderRequest {
        store,
        templates,
        jit,
        sources: Sources {
            tasks_dir: a.tasks,
            workflows_dir: a.workflows,
            defaults_files: a.defaults,
        },
        workflow: a.workflow,
        sets: a.sets,
        env_id: a.env_id,
        namespace: a.namespace,
        ..RenderRequest::default()
    };
    // Off the main thread, with a deadline: a runaway render is an error, never a hang.
    let deadline = std::time::Duration::from_secs(a.deadline.max(1));
    let (tx, rx) = std::sync::mpsc::channel();
    let spawned = std::thread::Builder::new()
        .name("render".into())
        .spawn(move || {
            let _ = tx.send(envbridge::objects::render(&req));
        });
    if let Err(e) = spawned {
        eprintln!("error: cannot start the render: {e}");
        return ExitCode::from(2);
    }
    let rendered = match rx.recv_timeout(deadline) {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
            eprintln!(
                "error: the render took longer than {}s (--deadline) and was stopped: a runaway expression?",
                deadline.as_secs()
            );
            return ExitCode::from(2);
        }
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
            eprintln!("error: the render stopped unexpectedly");
            return ExitCode::from(2);
        }
    };
    let text = match a.output {
        Output::Tasks => plan::tasks_json(rendered.tasks()),
        Output::Json => {
            let mut s =
                serde_json::to_string_pretty(&rendered.to_json_values()).unwrap_or_default();
            s.push('\n');
            s
        }
        Output::Yaml => {
            let mut s = String::new();
            for ts in &rendered.task_sets {
                s.push_str("---\n");
                s.push_str(&serde_saphyr::to_string(ts).unwrap_or_default());
            }
            s.push_str("---\n");
            s.push_str(&serde_saphyr::to_string(&rendered.environment).unwrap_or_default());
            s
        }
    };
    write_stdout(&text)
}

/// Writes to stdout; a closed pipe (`| head`) is not an error worth a panic.
pub fn write_stdout(text: &str) -> ExitCode {
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: writing output: {e}");
            ExitCode::FAILURE
        }
    }
}
