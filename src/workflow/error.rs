//! Errors of the workflow layer: every one names the place it comes from as `FILE:LINE:COLUMN`.

use std::fmt;
use std::sync::Arc;

/// A place in an input file (1-based line and column).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Loc {
    pub file: Arc<str>,
    pub line: u32,
    pub col: u32,
}

impl Loc {
    pub fn new(file: &Arc<str>, line: usize, col: usize) -> Self {
        Loc {
            file: file.clone(),
            line: u32::try_from(line).unwrap_or(u32::MAX),
            col: u32::try_from(col).unwrap_or(u32::MAX),
        }
    }

    /// The start of a file: for errors about the file as a whole.
    pub fn file_start(file: &Arc<str>) -> Self {
        Loc::new(file, 1, 1)
    }

    /// The same line, `n` columns further right.
    pub fn shifted(&self, n: usize) -> Self {
        Loc {
            file: self.file.clone(),
            line: self.line,
            col: self
                .col
                .saturating_add(u32::try_from(n).unwrap_or(u32::MAX)),
        }
    }
}

impl fmt::Display for Loc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}", self.file, self.line, self.col)
    }
}

/// An invalid input: where, and what is wrong. Displays as `FILE:LINE:COLUMN: message`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{loc}: {message}")]
pub struct Error {
    pub loc: Loc,
    pub message: String,
}

impl Error {
    pub fn new(loc: &Loc, message: impl Into<String>) -> Self {
        Error {
            loc: loc.clone(),
            message: message.into(),
        }
    }

    /// Adds the context of a use (e.g. `in task a.b.c`) after the message.
    pub fn context(mut self, context: impl fmt::Display) -> Self {
        self.message = format!("{} ({context})", self.message);
        self
    }
}

pub type Result<T> = std::result::Result<T, Error>;
