//! Bare method names on the wire: rewriting the HTTP/2 `:path` of the client-to-server byte
//! stream.
//!
//! FairMQ devices (the OCClite plugin, gRPC C++) register their methods as `"GetState"`,
//! `"Transition"`, ... and match the request's `:path` against that string exactly; the
//! anchor's Go client sends it so. The Rust HTTP stack (the `http` crate under tonic, hyper and
//! h2) refuses any path that does not start with `/`, on both sides (see [`super::wire`]). So
//! the path is rewritten below that stack, on the bytes of the connection:
//!
//! * [`Rewrite::StripSlash`] (the client, towards a device): `/GetState` becomes `GetState`;
//!   paths with a service part (`/occ_pb.Occ/GetState`) are left alone.
//! * [`Rewrite::AddSlash`] (the simulator, from any client): `GetState` becomes `/GetState`, so
//!   tonic can route it.
//!
//! Only header blocks are touched. Each block is decoded (HPACK, keeping the sender's dynamic
//! table in step) and re-encoded as literals without indexing, which keeps the receiver's
//! dynamic table empty and therefore consistent whatever the sender indexed. Every other frame
//! passes through byte for byte. This module is pure: bytes in, bytes out.

use loona_hpack::Decoder;

use super::h2frame::{
    BLOCK_MAX, CONTINUATION, END_HEADERS, END_STREAM, FRAME_HEADER_LEN, HEADERS, PREFACE,
    encode_literal, frame_header, unpadded, write_header_block,
};
#[cfg(test)]
use super::h2frame::{OUT_FRAME_MAX, PADDED, PRIORITY, write_frame_header};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rewrite {
    StripSlash,
    AddSlash,
}

impl Rewrite {
    /// The rewritten `:path`, or `None` to keep it.
    pub fn apply(self, path: &[u8]) -> Option<Vec<u8>> {
        match self {
            Rewrite::StripSlash => {
                let rest = path.strip_prefix(b"/")?;
                (!rest.is_empty() && !rest.contains(&b'/')).then(|| rest.to_vec())
            }
            Rewrite::AddSlash => {
                let keep = path.is_empty() || path.starts_with(b"/") || path == b"*";
                (!keep).then(|| [b"/", path].concat())
            }
        }
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RewriteError {
    #[error("not an HTTP/2 connection preface")]
    Preface,
    #[error("header block on stream {stream} cannot be decoded: {reason}")]
    Hpack { stream: u32, reason: String },
    #[error("frame of type {kind:#x} on stream {stream} is malformed: {reason}")]
    Frame {
        kind: u8,
        stream: u32,
        reason: &'static str,
    },
}

/// A header block being collected (HEADERS followed by CONTINUATION frames).
struct Block {
    stream: u32,
    end_stream: bool,
    fragment: Vec<u8>,
}

/// Rewrites one direction (client to server) of one HTTP/2 connection.
pub struct PathRewriter {
    rewrite: Rewrite,
    preface_seen: usize,
    input: Vec<u8>,
    block: Option<Block>,
    decoder: Decoder<'static>,
}

impl PathRewriter {
    pub fn new(rewrite: Rewrite) -> Self {
        PathRewriter {
            rewrite,
            preface_seen: 0,
            input: Vec::new(),
            block: None,
            decoder: Decoder::new(),
        }
    }

    /// Consumes `bytes` of the stream and appends what the peer should receive to `out`.
    /// Incomplete frames are kept until the rest arrives.
    pub fn feed(&mut self, bytes: &[u8], out: &mut Vec<u8>) -> Result<(), RewriteError> {
        let mut bytes = bytes;
        if self.preface_seen < PREFACE.len() {
            let n = (PREFACE.len() - self.preface_seen).min(bytes.len());
            if bytes[..n] != PREFACE[self.preface_seen..self.preface_seen + n] {
                return Err(RewriteError::Preface);
            }
            out.extend_from_slice(&bytes[..n]);
            self.preface_seen += n;
            bytes = &bytes[n..];
        }
        if bytes.is_empty() {
            return Ok(());
        }
        self.input.extend_from_slice(bytes);
        let mut at = 0;
        while let Some((len, kind, flags, stream)) = frame_header(&self.input[at..]) {
            let end = at + FRAME_HEADER_LEN + len;
            if self.input.len() < end {
                break;
            }
            let payload = &self.input[at + FRAME_HEADER_LEN..end];
            match kind {
                HEADERS => {
                    let fragment = unpadded(HEADERS, flags, payload)
                        .map_err(|reason| frame_error(HEADERS, stream, reason))?;
                    self.block = Some(Block {
                        stream,
                        end_stream: flags & END_STREAM != 0,
                        fragment: fragment.to_vec(),
                    });
                }
                CONTINUATION => match self.block.as_mut() {
                    Some(b) if b.stream == stream => b.fragment.extend_from_slice(payload),
                    _ => return Err(frame_error(kind, stream, "CONTINUATION without HEADERS")),
                },
                _ => out.extend_from_slice(&self.input[at..end]),
            }
            if matches!(kind, HEADERS | CONTINUATION) {
                let size = self.block.as_ref().map_or(0, |b| b.fragment.len());
                if size > BLOCK_MAX {
                    return Err(frame_error(kind, stream, "header block over 1 MiB"));
                }
                if flags & END_HEADERS != 0
                    && let Some(block) = self.block.take()
                {
                    self.emit(block, out)?;
                }
            }
            at = end;
        }
        self.input.drain(..at);
        Ok(())
    }

    fn emit(&mut self, block: Block, out: &mut Vec<u8>) -> Result<(), RewriteError> {
        let headers = self
            .decoder
            .decode(&block.fragment)
            .map_err(|e| RewriteError::Hpack {
                stream: block.stream,
                reason: format!("{e:?}"),
            })?;
        let mut encoded = Vec::with_capacity(block.fragment.len() + 16);
        for (name, value) in &headers {
            let value = match name.as_slice() {
                b":path" => self.rewrite.apply(value).unwrap_or_else(|| value.clone()),
                _ => value.clone(),
            };
            encode_literal(name, &value, &mut encoded);
        }
        write_header_block(out, block.stream, &encoded, block.end_stream);
        Ok(())
    }
}

fn frame_error(kind: u8, stream: u32, reason: &'static str) -> RewriteError {
    RewriteError::Frame {
        kind,
        stream,
        reason,
    }
}

#[cfg(test)]
#[path = "bare_path_tests.rs"]
mod tests;
