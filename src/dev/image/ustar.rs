//! A minimal POSIX ustar writer. Written here rather than taken from a crate so that every
//! header byte is under our control: no host timestamps, owners or extended headers, hence
//! the same entries always give the same bytes (and the same layer digest).

use std::io::{self, Write};

const BLOCK: usize = 512;
/// Largest size an 11-digit octal field holds.
const MAX_SIZE: u64 = 0o77777777777;

pub enum Kind<'a> {
    File { mode: u32, size: u64 },
    Dir { mode: u32 },
    Symlink { target: &'a str },
}

/// Why a name cannot be written in a ustar header.
#[derive(Debug, PartialEq, Eq)]
pub enum HeaderError {
    NameTooLong,
    TargetTooLong,
    TooLarge,
}

impl HeaderError {
    pub fn reason(&self) -> &'static str {
        match self {
            Self::NameTooLong => "path does not fit a ustar header (name 100, prefix 155 bytes)",
            Self::TargetTooLong => "symlink target is longer than 100 bytes",
            Self::TooLarge => "file is larger than 8 GiB",
        }
    }
}

/// The 512-byte header of `name` (relative, directories ending in `/`).
pub fn header(name: &str, kind: &Kind, uid: u32, gid: u32) -> Result<[u8; BLOCK], HeaderError> {
    let mut h = [0u8; BLOCK];
    let (prefix, base) = split_name(name).ok_or(HeaderError::NameTooLong)?;
    h[..base.len()].copy_from_slice(base.as_bytes());
    h[345..345 + prefix.len()].copy_from_slice(prefix.as_bytes());
    let (mode, size, flag) = match kind {
        Kind::File { mode, size } => (*mode, *size, b'0'),
        Kind::Dir { mode } => (*mode, 0, b'5'),
        Kind::Symlink { target } => {
            if target.len() > 100 {
                return Err(HeaderError::TargetTooLong);
            }
            h[157..157 + target.len()].copy_from_slice(target.as_bytes());
            (0o777, 0, b'2')
        }
    };
    if size > MAX_SIZE {
        return Err(HeaderError::TooLarge);
    }
    octal(&mut h[100..108], u64::from(mode & 0o7777));
    octal(&mut h[108..116], u64::from(uid));
    octal(&mut h[116..124], u64::from(gid));
    octal(&mut h[124..136], size);
    octal(&mut h[136..148], 0); // mtime
    h[156] = flag;
    h[257..263].copy_from_slice(b"ustar\0");
    h[263..265].copy_from_slice(b"00");
    // The checksum is computed with its own field read as spaces.
    h[148..156].fill(b' ');
    let sum: u32 = h.iter().map(|&b| u32::from(b)).sum();
    octal(&mut h[148..155], u64::from(sum));
    Ok(h)
}

/// `name` as (prefix, name) fields: the name alone when it fits, else split at a `/`.
fn split_name(name: &str) -> Option<(&str, &str)> {
    if name.is_empty() {
        return None;
    }
    if name.len() <= 100 {
        return Some(("", name));
    }
    // A directory's trailing slash stays with the name part.
    let search = name.strip_suffix('/').unwrap_or(name);
    search
        .char_indices()
        .find(|&(i, c)| c == '/' && i > 0 && i <= 155 && name.len() - i - 1 <= 100)
        .map(|(i, _)| (&name[..i], &name[i + 1..]))
}

/// Zero-padded octal digits ending in NUL, filling `field`.
fn octal(field: &mut [u8], value: u64) {
    let digits = field.len() - 1;
    let s = format!("{value:0digits$o}");
    field[..digits].copy_from_slice(&s.as_bytes()[s.len() - digits..]);
    field[digits] = 0;
}

/// Bytes of padding after `size` bytes of content.
pub fn padding(size: u64) -> usize {
    (BLOCK - (size % BLOCK as u64) as usize) % BLOCK
}

/// Size of a member holding `size` bytes: header, content, padding.
pub fn member_size(size: u64) -> u64 {
    BLOCK as u64 + size + padding(size) as u64
}

/// The two zero blocks that end an archive.
pub const END_SIZE: u64 = 2 * BLOCK as u64;

/// Writes members in order, counting what it wrote.
pub struct Writer<W> {
    inner: W,
    written: u64,
}

impl<W: Write> Writer<W> {
    pub fn new(inner: W) -> Self {
        Self { inner, written: 0 }
    }

    pub fn written(&self) -> u64 {
        self.written
    }

    /// A header; for a file, its `size` bytes must follow through [`Self::content`] and
    /// then [`Self::pad`].
    pub fn header(&mut self, header: &[u8; BLOCK]) -> io::Result<()> {
        self.raw(header)
    }

    pub fn content(&mut self, data: &[u8]) -> io::Result<()> {
        self.raw(data)
    }

    pub fn pad(&mut self, size: u64) -> io::Result<()> {
        self.raw(&[0u8; BLOCK][..padding(size)])
    }

    pub fn finish(mut self) -> io::Result<W> {
        self.raw(&[0u8; 2 * BLOCK])?;
        self.inner.flush()?;
        Ok(self.inner)
    }

    fn raw(&mut self, data: &[u8]) -> io::Result<()> {
        self.inner.write_all(data)?;
        self.written += data.len() as u64;
        Ok(())
    }
}

/// A member's content may itself be an archive (the layer inside the OCI archive).
impl<W: Write> Write for Writer<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.written += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}
