//! Running a site's JIT generator (see [`super::jit`]): the program in its own process
//! group, in an empty private directory, with the templated command on its standard input,
//! killed past its deadline; what it writes is read back within a bound.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::jit::{Generated, Generator, MAX_FILES, STDERR_TAIL, Source, is_entry_name};

pub(super) fn read_bounded(path: &Path, max: u64) -> std::result::Result<String, String> {
    let f = std::fs::File::open(path).map_err(|e| e.to_string())?;
    let mut buf = Vec::new();
    f.take(max + 1)
        .read_to_end(&mut buf)
        .map_err(|e| e.to_string())?;
    if buf.len() as u64 > max {
        return Err(format!("larger than {max} bytes"));
    }
    String::from_utf8(buf).map_err(|_| "not UTF-8 text".to_string())
}

/// A fresh private directory, removed when dropped.
struct WorkDir(PathBuf);

impl WorkDir {
    fn new() -> std::io::Result<Self> {
        static N: AtomicU64 = AtomicU64::new(0);
        let base = std::env::temp_dir();
        loop {
            let n = N.fetch_add(1, Ordering::Relaxed);
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.subsec_nanos())
                .unwrap_or(0);
            let p = base.join(format!("envbridge-jit-{}-{n}-{nanos}", std::process::id()));
            match std::fs::create_dir(&p) {
                Ok(()) => {
                    use std::os::unix::fs::PermissionsExt;
                    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o700))?;
                    return Ok(WorkDir(p));
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(e),
            }
        }
    }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Whether process `pid` (a child of ours) has ended, leaving it unreaped.
fn exited(pid: u32) -> std::io::Result<bool> {
    let id = libc::id_t::from(pid);
    // SAFETY: waitid(2) fills the zeroed siginfo it is given; WNOWAIT leaves the child to
    // `Child::wait`, WNOHANG makes it return at once.
    unsafe {
        let mut info: libc::siginfo_t = std::mem::zeroed();
        if libc::waitid(
            libc::P_PID,
            id,
            &mut info,
            libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
        ) != 0
        {
            return Err(std::io::Error::last_os_error());
        }
        Ok(info.si_pid() != 0)
    }
}

/// Kills a process group (the generator and whatever it started).
fn kill_group(pid: u32) {
    if let Ok(pid) = libc::pid_t::try_from(pid) {
        // SAFETY: kill(2) with a negative pid signals that process group; no memory involved.
        unsafe {
            libc::kill(-pid, libc::SIGKILL);
        }
    }
}

/// Runs the generator: `command` on its stdin, `ENVBRIDGE_JIT_NAME`, `ENVBRIDGE_JIT_ENTRY`
/// and `ENVBRIDGE_JIT_ENV_VARS` in its environment, an empty directory with `workflows/` and
/// `tasks/` as its working directory. It must write `workflows/<name>.yaml` there.
pub(super) fn run_generator(
    g: &Generator,
    name: &str,
    entry: &str,
    command: &str,
    env_vars: &str,
) -> std::result::Result<Generated, String> {
    use std::os::unix::process::CommandExt;
    let dir = WorkDir::new().map_err(|e| format!("cannot make its directory: {e}"))?;
    for sub in ["workflows", "tasks"] {
        std::fs::create_dir(dir.0.join(sub))
            .map_err(|e| format!("cannot make its directory: {e}"))?;
    }
    let mut child = Command::new(&g.program)
        .current_dir(&dir.0)
        .env("ENVBRIDGE_JIT_NAME", name)
        .env("ENVBRIDGE_JIT_ENTRY", entry)
        .env("ENVBRIDGE_JIT_ENV_VARS", env_vars)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .map_err(|e| format!("cannot start it: {e}"))?;
    let pid = child.id();
    let mut stdin = child.stdin.take();
    let input = command.as_bytes().to_vec();
    let writer = std::thread::spawn(move || {
        if let Some(s) = stdin.as_mut() {
            let _ = s.write_all(&input);
        }
        // Closing stdin ends its input.
        drop(stdin);
    });
    let stderr = child.stderr.take();
    let reader = std::thread::spawn(move || {
        let mut tail: Vec<u8> = Vec::new();
        if let Some(mut s) = stderr {
            let mut buf = [0u8; 4096];
            while let Ok(n) = s.read(&mut buf) {
                if n == 0 {
                    break;
                }
                tail.extend_from_slice(&buf[..n]);
                if tail.len() > STDERR_TAIL {
                    tail.drain(..tail.len() - STDERR_TAIL);
                }
            }
        }
        String::from_utf8_lossy(&tail).trim().to_string()
    });
    let start = Instant::now();
    // Polled without reaping it: while it is unreaped its process group id stays its own,
    // so killing the group below cannot reach an unrelated process.
    let timed_out = loop {
        match exited(pid) {
            Ok(true) => break false,
            Ok(false) if start.elapsed() >= g.deadline => break true,
            Ok(false) => std::thread::sleep(Duration::from_millis(5)),
            Err(e) => {
                kill_group(pid);
                let _ = child.wait();
                return Err(format!("cannot wait for it: {e}"));
            }
        }
    };
    // Whatever it left running goes with it (and lets the pipes close).
    kill_group(pid);
    let status = child.wait();
    let _ = writer.join();
    let stderr = reader.join().unwrap_or_default();
    let with_stderr = |msg: String| {
        if stderr.is_empty() {
            msg
        } else {
            format!("{msg}; its stderr ends: {stderr}")
        }
    };
    let status = match status {
        Ok(_) if timed_out => {
            return Err(with_stderr(format!(
                "it took longer than its deadline of {} ms and was stopped",
                g.deadline.as_millis()
            )));
        }
        Ok(s) => s,
        Err(e) => return Err(format!("cannot wait for it: {e}")),
    };
    if !status.success() {
        return Err(with_stderr(format!("it exited with {status}")));
    }
    collect(&dir.0, name, g.max_bytes)
}

/// Reads what a generator wrote: `workflows/<name>.yaml` and every `tasks/*.yaml`, within
/// `max_bytes` together.
fn collect(dir: &Path, name: &str, max_bytes: usize) -> std::result::Result<Generated, String> {
    let mut total = 0usize;
    let mut files = 0usize;
    let mut read = |path: &Path, label: String| -> std::result::Result<Source, String> {
        files += 1;
        if files > MAX_FILES {
            return Err(format!("it wrote more than {MAX_FILES} files"));
        }
        let meta = std::fs::symlink_metadata(path).map_err(|e| format!("{label}: {e}"))?;
        if !meta.is_file() {
            return Err(format!("{label} is not a plain file"));
        }
        let left = max_bytes.saturating_sub(total);
        let text = read_bounded(path, left as u64)
            .map_err(|e| format!("{label}: {e} (its output may hold at most {max_bytes} bytes)"))?;
        total += text.len();
        Ok(Source {
            label: Arc::from(label),
            text: Arc::from(text),
        })
    };
    let wf_path = dir.join("workflows").join(format!("{name}.yaml"));
    if std::fs::symlink_metadata(&wf_path).is_err() {
        return Err(format!("it wrote no workflows/{name}.yaml"));
    }
    let workflow = read(&wf_path, format!("<jit>/workflows/{name}.yaml"))?;
    let mut classes = Vec::new();
    let mut entries: Vec<_> = std::fs::read_dir(dir.join("tasks"))
        .map_err(|e| format!("tasks/: {e}"))?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    entries.sort();
    for file in entries {
        let Some(id) = file.strip_suffix(".yaml") else {
            continue;
        };
        if !is_entry_name(id) {
            continue;
        }
        let src = read(
            &dir.join("tasks").join(&file),
            format!("<jit>/tasks/{file}"),
        )?;
        classes.push((id.to_string(), src));
    }
    Ok(Generated {
        name: name.to_string(),
        workflow,
        classes,
    })
}
