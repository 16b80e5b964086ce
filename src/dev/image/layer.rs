//! The layer tarball: entries in path order with fixed headers, written twice (once to
//! hash it, once into the archive) rather than held in memory or in a temporary file.

use std::io::{self, Write};

use sha2::{Digest, Sha256};

use super::ustar::{self, Kind};
use super::{Entry, EntryKind, ImageError};

pub struct Layer<'a> {
    members: Vec<(&'a Entry, [u8; 512])>,
}

impl<'a> Layer<'a> {
    /// Checks every entry and fixes their order (by path), whatever order they came in.
    pub fn new(entries: &'a [Entry]) -> Result<Self, ImageError> {
        let mut sorted: Vec<&Entry> = entries.iter().collect();
        sorted.sort_by(|a, b| a.path.cmp(&b.path));
        if let Some(pair) = sorted.windows(2).find(|p| p[0].path == p[1].path) {
            return Err(bad(&pair[0].path, "appears more than once"));
        }
        let members = sorted
            .into_iter()
            .map(|e| Ok((e, member_header(e)?)))
            .collect::<Result<_, ImageError>>()?;
        Ok(Self { members })
    }

    /// Bytes of the tarball.
    pub fn size(&self) -> u64 {
        let content: u64 = self
            .members
            .iter()
            .map(|(e, _)| ustar::member_size(e.data().map_or(0, |d| d.len() as u64)))
            .sum();
        content + ustar::END_SIZE
    }

    /// `sha256:<hex>` of the tarball (it is uncompressed: digest and diff_id are one).
    pub fn digest(&self) -> String {
        let mut sink = HashSink(Sha256::new());
        self.write_to(&mut sink)
            .expect("writing into a hash cannot fail");
        format!("sha256:{}", hex::encode(sink.0.finalize()))
    }

    pub fn write_to<W: Write>(&self, out: W) -> io::Result<()> {
        let mut tar = ustar::Writer::new(out);
        for (entry, header) in &self.members {
            tar.header(header)?;
            if let Some(data) = entry.data() {
                tar.content(data)?;
                tar.pad(data.len() as u64)?;
            }
        }
        tar.finish()?;
        Ok(())
    }
}

/// The header of `entry`, its path made relative as in every image layer (`usr/bin/`).
fn member_header(entry: &Entry) -> Result<[u8; 512], ImageError> {
    let rel = check_path(&entry.path)?;
    let (name, kind) = match &entry.kind {
        EntryKind::Dir { mode } => (format!("{rel}/"), Kind::Dir { mode: *mode }),
        EntryKind::File { mode, data } => (
            rel.to_string(),
            Kind::File {
                mode: *mode,
                size: data.len() as u64,
            },
        ),
        EntryKind::Symlink { target } => {
            if target.is_empty() {
                return Err(bad(&entry.path, "symlink target is empty"));
            }
            (rel.to_string(), Kind::Symlink { target })
        }
    };
    ustar::header(&name, &kind, entry.uid, entry.gid).map_err(|e| bad(&entry.path, e.reason()))
}

/// `path` without its leading `/`, when it is absolute and normal.
fn check_path(path: &str) -> Result<&str, ImageError> {
    let rel = path
        .strip_prefix('/')
        .ok_or_else(|| bad(path, "is not absolute"))?;
    if rel
        .split('/')
        .any(|c| c.is_empty() || c == "." || c == "..")
    {
        return Err(bad(path, "has an empty, `.` or `..` component"));
    }
    Ok(rel)
}

fn bad(path: &str, reason: &'static str) -> ImageError {
    ImageError::Entry {
        path: path.to_string(),
        reason,
    }
}

struct HashSink(Sha256);

impl Write for HashSink {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.update(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}
