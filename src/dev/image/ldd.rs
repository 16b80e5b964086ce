//! The shared libraries (and the dynamic loader) an ELF file needs, as `ldd` reports them.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::ImageError;

/// Absolute paths of the objects `binary` loads, the loader included; empty for a static file.
pub fn libraries(binary: &Path) -> Result<Vec<String>, ImageError> {
    let command = format!("ldd {}", binary.display());
    let out = Command::new("ldd")
        .arg(binary)
        .env("LC_ALL", "C")
        .output()
        .map_err(|source| ImageError::Spawn {
            command: command.clone(),
            source,
        })?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    // glibc's ldd exits 1 for a static executable; that is not an error here.
    if is_static(&stdout) || is_static(&stderr) {
        return Ok(Vec::new());
    }
    if !out.status.success() {
        return Err(ImageError::Command {
            command,
            status: out.status,
            stderr: stderr.trim().to_string(),
        });
    }
    parse(&stdout).map_err(|e| match e {
        Unparsed::Missing(library) => ImageError::LibraryNotFound {
            binary: PathBuf::from(binary),
            library,
        },
        Unparsed::Line(line) => ImageError::Output { command, line },
    })
}

fn is_static(text: &str) -> bool {
    text.contains("not a dynamic executable") || text.contains("statically linked")
}

#[derive(Debug, PartialEq, Eq)]
pub(super) enum Unparsed {
    Missing(String),
    Line(String),
}

/// The paths in `ldd` output. Lines are `name => /path (0x…)`, `/loader (0x…)`, or a
/// virtual object without a file (`linux-vdso.so.1 (0x…)`), which is skipped.
pub(super) fn parse(stdout: &str) -> Result<Vec<String>, Unparsed> {
    let mut paths = Vec::new();
    for line in stdout.lines().map(str::trim).filter(|l| !l.is_empty()) {
        // Drop the load address.
        let object = match line.rfind(" (0x") {
            Some(i) if line.ends_with(')') => &line[..i],
            _ => line,
        }
        .trim_end();
        let path = match object.split_once(" =>") {
            Some((name, " not found")) => return Err(Unparsed::Missing(name.to_string())),
            // Old glibc gives the vDSO as `name =>  (0x…)`.
            Some((_, "")) => continue,
            Some((_, path)) => path.trim_start(),
            None if object.starts_with('/') => object,
            None if object.contains(' ') => return Err(Unparsed::Line(line.to_string())),
            None => continue,
        };
        if !path.starts_with('/') {
            return Err(Unparsed::Line(line.to_string()));
        }
        paths.push(path.to_string());
    }
    Ok(paths)
}
