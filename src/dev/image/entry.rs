//! One file-system object of the image's layer.

/// A path in the image (absolute, `/usr/local/bin/envbridge`) and what it is.
/// Owner and group default to root; nothing carries a host timestamp.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub path: String,
    pub kind: EntryKind,
    pub uid: u32,
    pub gid: u32,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EntryKind {
    Dir { mode: u32 },
    File { mode: u32, data: Vec<u8> },
    Symlink { target: String },
}

impl Entry {
    pub fn dir(path: &str, mode: u32) -> Self {
        Self::root(path, EntryKind::Dir { mode })
    }

    pub fn file(path: &str, mode: u32, data: Vec<u8>) -> Self {
        Self::root(path, EntryKind::File { mode, data })
    }

    pub fn symlink(path: &str, target: &str) -> Self {
        Self::root(
            path,
            EntryKind::Symlink {
                target: target.to_string(),
            },
        )
    }

    /// The same entry owned by `uid:gid`.
    pub fn owned(mut self, uid: u32, gid: u32) -> Self {
        self.uid = uid;
        self.gid = gid;
        self
    }

    fn root(path: &str, kind: EntryKind) -> Self {
        Self {
            path: path.to_string(),
            kind,
            uid: 0,
            gid: 0,
        }
    }

    /// File content, when it is a regular file.
    pub fn data(&self) -> Option<&[u8]> {
        match &self.kind {
            EntryKind::File { data, .. } => Some(data),
            _ => None,
        }
    }
}
