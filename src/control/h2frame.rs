//! HTTP/2 frames at the byte level (RFC 9113) and HPACK literals (RFC 7541), the little of
//! both that the control client's connection ([`super::conn`]) and the bare-path rewriter
//! ([`super::bare_path`]) need. Pure: bytes in, bytes out.

/// The client connection preface (RFC 9113, 3.4).
pub const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
pub const FRAME_HEADER_LEN: usize = 9;

pub const DATA: u8 = 0x0;
pub const HEADERS: u8 = 0x1;
pub const RST_STREAM: u8 = 0x3;
pub const SETTINGS: u8 = 0x4;
pub const PUSH_PROMISE: u8 = 0x5;
pub const PING: u8 = 0x6;
pub const GOAWAY: u8 = 0x7;
pub const WINDOW_UPDATE: u8 = 0x8;
pub const CONTINUATION: u8 = 0x9;

pub const END_STREAM: u8 = 0x1;
/// SETTINGS and PING acknowledgements.
pub const ACK: u8 = 0x1;
pub const END_HEADERS: u8 = 0x4;
pub const PADDED: u8 = 0x8;
pub const PRIORITY: u8 = 0x20;

pub const SETTINGS_HEADER_TABLE_SIZE: u16 = 0x1;
pub const SETTINGS_ENABLE_PUSH: u16 = 0x2;
pub const SETTINGS_MAX_CONCURRENT_STREAMS: u16 = 0x3;
pub const SETTINGS_INITIAL_WINDOW_SIZE: u16 = 0x4;
pub const SETTINGS_MAX_FRAME_SIZE: u16 = 0x5;

/// The initial flow-control window of a connection and of each stream.
pub const DEFAULT_WINDOW: i64 = 65_535;
/// Every peer accepts frames of this size (SETTINGS_MAX_FRAME_SIZE cannot be lower).
pub const OUT_FRAME_MAX: usize = 16_384;
/// A header block larger than this is refused rather than buffered without bound.
pub const BLOCK_MAX: usize = 1 << 20;

/// RST_STREAM / GOAWAY error codes used here.
pub const NO_ERROR: u32 = 0x0;
pub const CANCEL: u32 = 0x8;

/// (payload length, type, flags, stream id) of the frame starting `buf`, once its header is in.
pub fn frame_header(buf: &[u8]) -> Option<(usize, u8, u8, u32)> {
    let h = buf.get(..FRAME_HEADER_LEN)?;
    let len = (usize::from(h[0]) << 16) | (usize::from(h[1]) << 8) | usize::from(h[2]);
    let stream = u32::from_be_bytes([h[5], h[6], h[7], h[8]]) & 0x7fff_ffff;
    Some((len, h[3], h[4], stream))
}

pub fn write_frame_header(out: &mut Vec<u8>, len: usize, kind: u8, flags: u8, stream: u32) {
    let len = len as u32;
    out.extend_from_slice(&len.to_be_bytes()[1..]);
    out.push(kind);
    out.push(flags);
    out.extend_from_slice(&stream.to_be_bytes());
}

/// One whole frame.
pub fn write_frame(out: &mut Vec<u8>, kind: u8, flags: u8, stream: u32, payload: &[u8]) {
    write_frame_header(out, payload.len(), kind, flags, stream);
    out.extend_from_slice(payload);
}

/// A header block as HEADERS and as many CONTINUATION frames as it takes.
pub fn write_header_block(out: &mut Vec<u8>, stream: u32, block: &[u8], end_stream: bool) {
    let mut chunks: Vec<&[u8]> = block.chunks(OUT_FRAME_MAX).collect();
    if chunks.is_empty() {
        chunks.push(&[]); // an empty block still needs its HEADERS frame
    }
    let last = chunks.len() - 1;
    for (i, chunk) in chunks.into_iter().enumerate() {
        let mut flags = 0;
        if i == 0 && end_stream {
            flags |= END_STREAM;
        }
        if i == last {
            flags |= END_HEADERS;
        }
        let kind = if i == 0 { HEADERS } else { CONTINUATION };
        write_frame(out, kind, flags, stream, chunk);
    }
}

/// The payload of a HEADERS or DATA frame with its padding (and a HEADERS frame's priority
/// fields) removed.
pub fn unpadded(kind: u8, flags: u8, payload: &[u8]) -> Result<&[u8], &'static str> {
    let mut p = payload;
    let mut pad = 0;
    if flags & PADDED != 0 {
        let (&n, rest) = p.split_first().ok_or("missing pad length")?;
        pad = usize::from(n);
        p = rest;
    }
    if kind == HEADERS && flags & PRIORITY != 0 {
        p = p.get(5..).ok_or("short priority fields")?;
    }
    let keep = p
        .len()
        .checked_sub(pad)
        .ok_or("padding longer than payload")?;
    Ok(&p[..keep])
}

/// HPACK literal header field without indexing, new name, no Huffman (RFC 7541, 6.2.2):
/// it leaves the receiver's dynamic table untouched.
pub fn encode_literal(name: &[u8], value: &[u8], out: &mut Vec<u8>) {
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

/// The (identifier, value) pairs of a SETTINGS payload (None: not a multiple of 6 bytes).
pub fn settings(payload: &[u8]) -> Option<Vec<(u16, u32)>> {
    if !payload.len().is_multiple_of(6) {
        return None;
    }
    Some(
        payload
            .chunks_exact(6)
            .map(|c| {
                (
                    u16::from_be_bytes([c[0], c[1]]),
                    u32::from_be_bytes([c[2], c[3], c[4], c[5]]),
                )
            })
            .collect(),
    )
}

/// The 31-bit value of a WINDOW_UPDATE payload, or the first word of RST_STREAM/GOAWAY.
pub fn word(payload: &[u8], at: usize) -> Option<u32> {
    let b = payload.get(at..at + 4)?;
    Some(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frame_header_reads_back() {
        let mut out = Vec::new();
        write_frame(&mut out, DATA, END_STREAM, 7, b"abc");
        assert_eq!(frame_header(&out), Some((3, DATA, END_STREAM, 7)));
        assert_eq!(&out[FRAME_HEADER_LEN..], b"abc");
        assert_eq!(frame_header(&out[..8]), None);
    }

    #[test]
    fn a_large_block_is_split_into_continuations() {
        let mut out = Vec::new();
        write_header_block(&mut out, 3, &vec![0u8; OUT_FRAME_MAX + 10], true);
        let (len, kind, flags, stream) = frame_header(&out).unwrap();
        assert_eq!(
            (len, kind, flags, stream),
            (OUT_FRAME_MAX, HEADERS, END_STREAM, 3)
        );
        let rest = &out[FRAME_HEADER_LEN + len..];
        assert_eq!(frame_header(rest), Some((10, CONTINUATION, END_HEADERS, 3)));
    }

    #[test]
    fn padding_and_priority_are_removed() {
        // pad length 2, priority 5 bytes, "hi", 2 padding bytes.
        let p = [2, 0, 0, 0, 0, 0, b'h', b'i', 0, 0];
        assert_eq!(unpadded(HEADERS, PADDED | PRIORITY, &p), Ok(&b"hi"[..]));
        assert_eq!(unpadded(DATA, PADDED, &[1, b'x', 0]), Ok(&b"x"[..]));
        assert!(unpadded(DATA, PADDED, &[9, b'x']).is_err());
    }

    #[test]
    fn settings_pairs() {
        let p = [0, 4, 0, 1, 0, 0, 0, 5, 0, 0, 0x40, 0];
        assert_eq!(settings(&p), Some(vec![(4, 65_536), (5, 16_384)]));
        assert_eq!(settings(&p[..5]), None);
    }

    #[test]
    fn integers_use_continuation_bytes_past_their_prefix() {
        let mut out = Vec::new();
        encode_integer(1337, 5, 0, &mut out);
        assert_eq!(out, [31, 154, 10]); // RFC 7541, C.1.2
    }
}
