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

/// The client connection preface (RFC 9113, 3.4).
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const FRAME_HEADER_LEN: usize = 9;
const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;
/// Every peer accepts frames of this size (SETTINGS_MAX_FRAME_SIZE cannot be lower).
const OUT_FRAME_MAX: usize = 16_384;
/// A header block larger than this is refused rather than buffered without bound.
const BLOCK_MAX: usize = 1 << 20;

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
                    let fragment = headers_fragment(flags, stream, payload)?;
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
        let mut chunks: Vec<&[u8]> = encoded.chunks(OUT_FRAME_MAX).collect();
        if chunks.is_empty() {
            chunks.push(&[]); // an empty block still needs its HEADERS frame
        }
        let last = chunks.len() - 1;
        for (i, chunk) in chunks.into_iter().enumerate() {
            let mut flags = 0;
            if i == 0 && block.end_stream {
                flags |= END_STREAM;
            }
            if i == last {
                flags |= END_HEADERS;
            }
            let kind = if i == 0 { HEADERS } else { CONTINUATION };
            write_frame_header(out, chunk.len(), kind, flags, block.stream);
            out.extend_from_slice(chunk);
        }
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

/// (payload length, type, flags, stream id) of the frame starting `buf`, once its header is in.
fn frame_header(buf: &[u8]) -> Option<(usize, u8, u8, u32)> {
    let h = buf.get(..FRAME_HEADER_LEN)?;
    let len = (usize::from(h[0]) << 16) | (usize::from(h[1]) << 8) | usize::from(h[2]);
    let stream = u32::from_be_bytes([h[5], h[6], h[7], h[8]]) & 0x7fff_ffff;
    Some((len, h[3], h[4], stream))
}

fn write_frame_header(out: &mut Vec<u8>, len: usize, kind: u8, flags: u8, stream: u32) {
    let len = len as u32;
    out.extend_from_slice(&len.to_be_bytes()[1..]);
    out.push(kind);
    out.push(flags);
    out.extend_from_slice(&stream.to_be_bytes());
}

/// The header block fragment of a HEADERS payload (padding and priority removed).
fn headers_fragment(flags: u8, stream: u32, payload: &[u8]) -> Result<&[u8], RewriteError> {
    let mut p = payload;
    let mut pad = 0;
    if flags & PADDED != 0 {
        let (&n, rest) = p
            .split_first()
            .ok_or_else(|| frame_error(HEADERS, stream, "missing pad length"))?;
        pad = usize::from(n);
        p = rest;
    }
    if flags & PRIORITY != 0 {
        p = p
            .get(5..)
            .ok_or_else(|| frame_error(HEADERS, stream, "short priority fields"))?;
    }
    let keep = p
        .len()
        .checked_sub(pad)
        .ok_or_else(|| frame_error(HEADERS, stream, "padding longer than payload"))?;
    Ok(&p[..keep])
}

/// HPACK literal header field without indexing, new name, no Huffman (RFC 7541, 6.2.2).
fn encode_literal(name: &[u8], value: &[u8], out: &mut Vec<u8>) {
    out.push(0x00);
    encode_string(name, out);
    encode_string(value, out);
}

fn encode_string(s: &[u8], out: &mut Vec<u8>) {
    encode_integer(s.len(), 7, 0x00, out);
    out.extend_from_slice(s);
}

/// HPACK integer with an `prefix`-bit prefix (RFC 7541, 5.1).
fn encode_integer(mut value: usize, prefix: u8, first_byte_flags: u8, out: &mut Vec<u8>) {
    let max = (1usize << prefix) - 1;
    if value < max {
        out.push(first_byte_flags | value as u8);
        return;
    }
    out.push(first_byte_flags | max as u8);
    value -= max;
    while value >= 128 {
        out.push((value % 128) as u8 | 0x80);
        value /= 128;
    }
    out.push(value as u8);
}

#[cfg(test)]
#[path = "bare_path_tests.rs"]
mod tests;
