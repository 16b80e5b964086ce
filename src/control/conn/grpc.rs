//! gRPC over HTTP/2 as the task control client speaks it: the request's header block, the
//! 5-byte message framing, the status in the trailers. Pure.

use std::time::Duration;

use super::super::h2frame::encode_literal;

/// The largest message accepted from a task (gRPC's usual default receive limit).
pub const MAX_MESSAGE: usize = 4 << 20;

/// How a call ended, when not OK: the gRPC code and message (or the transport's reason).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    pub code: tonic::Code,
    pub message: String,
}

impl Failure {
    pub fn new(code: tonic::Code, message: impl Into<String>) -> Self {
        Failure {
            code,
            message: message.into(),
        }
    }
}

/// The header block of a request (HPACK literals without indexing). `path` goes on the wire
/// as given, bare method names included (see [`super::super::bare_path`]).
pub fn request_headers(
    path: &str,
    authority: &str,
    content_type: &str,
    timeout: Option<Duration>,
) -> Vec<u8> {
    let mut out = Vec::with_capacity(128);
    encode_literal(b":method", b"POST", &mut out);
    encode_literal(b":scheme", b"http", &mut out);
    encode_literal(b":path", path.as_bytes(), &mut out);
    encode_literal(b":authority", authority.as_bytes(), &mut out);
    encode_literal(b"content-type", content_type.as_bytes(), &mut out);
    encode_literal(b"te", b"trailers", &mut out);
    if let Some(t) = timeout {
        encode_literal(b"grpc-timeout", timeout_value(t).as_bytes(), &mut out);
    }
    out
}

/// A `grpc-timeout` value: at most 8 digits and a unit, rounded up.
pub fn timeout_value(t: Duration) -> String {
    let ms = t.as_millis().max(1);
    if ms < 100_000_000 {
        format!("{ms}m")
    } else {
        format!("{}S", t.as_secs().clamp(1, 99_999_999))
    }
}

/// One message with its length prefix (uncompressed).
pub fn frame_message(msg: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(5 + msg.len());
    out.push(0);
    out.extend_from_slice(&(msg.len() as u32).to_be_bytes());
    out.extend_from_slice(msg);
    out
}

/// The whole messages at the start of `buf`, removed from it; what is left is the start of
/// the next one.
pub fn take_messages(buf: &mut Vec<u8>) -> Result<Vec<Vec<u8>>, Failure> {
    let mut out = Vec::new();
    let mut at = 0;
    while let Some(h) = buf.get(at..at + 5) {
        if h[0] != 0 {
            return Err(Failure::new(
                tonic::Code::Internal,
                "the task sent a compressed message, which was not asked for",
            ));
        }
        let len = u32::from_be_bytes([h[1], h[2], h[3], h[4]]) as usize;
        if len > MAX_MESSAGE {
            return Err(Failure::new(
                tonic::Code::ResourceExhausted,
                format!("the task sent a message of {len} bytes (limit {MAX_MESSAGE})"),
            ));
        }
        let Some(m) = buf.get(at + 5..at + 5 + len) else {
            break;
        };
        out.push(m.to_vec());
        at += 5 + len;
    }
    buf.drain(..at);
    Ok(out)
}

/// What a response header block says.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct ResponseHead {
    pub http_status: Option<u16>,
    pub grpc_status: Option<i32>,
    pub grpc_message: Option<String>,
}

impl ResponseHead {
    pub fn read(headers: &[(Vec<u8>, Vec<u8>)]) -> ResponseHead {
        let mut h = ResponseHead::default();
        for (name, value) in headers {
            let text = || String::from_utf8_lossy(value);
            match name.as_slice() {
                b":status" => h.http_status = text().trim().parse().ok(),
                b"grpc-status" => h.grpc_status = text().trim().parse().ok(),
                b"grpc-message" => h.grpc_message = Some(percent_decode(value)),
                _ => {}
            }
        }
        h
    }

    /// The call's outcome when this block ends the stream (trailers, or a trailers-only
    /// response).
    pub fn outcome(&self) -> Result<(), Failure> {
        match (self.http_status, self.grpc_status) {
            (_, Some(0)) => Ok(()),
            (_, Some(code)) => Err(Failure::new(
                tonic::Code::from_i32(code),
                self.grpc_message.clone().unwrap_or_default(),
            )),
            (Some(s), None) if s != 200 => Err(Failure::new(
                http_code(s),
                format!("HTTP status {s} without a gRPC status"),
            )),
            _ => Err(Failure::new(
                tonic::Code::Internal,
                "the response ended without a gRPC status",
            )),
        }
    }
}

/// gRPC's mapping of an HTTP status without grpc-status to a code.
fn http_code(status: u16) -> tonic::Code {
    match status {
        400 => tonic::Code::Internal,
        401 => tonic::Code::Unauthenticated,
        403 => tonic::Code::PermissionDenied,
        404 => tonic::Code::Unimplemented,
        429 | 502 | 503 | 504 => tonic::Code::Unavailable,
        _ => tonic::Code::Unknown,
    }
}

/// gRPC's mapping of an HTTP/2 RST_STREAM error code.
pub fn reset_code(h2: u32) -> tonic::Code {
    match h2 {
        0x7 => tonic::Code::Unavailable,       // REFUSED_STREAM
        0x8 => tonic::Code::Cancelled,         // CANCEL
        0xb => tonic::Code::ResourceExhausted, // ENHANCE_YOUR_CALM
        0xc => tonic::Code::PermissionDenied,  // INADEQUATE_SECURITY
        _ => tonic::Code::Internal,
    }
}

/// `grpc-message` is percent-encoded (only `%XX` escapes; anything malformed stays as is).
fn percent_decode(v: &[u8]) -> String {
    let mut out = Vec::with_capacity(v.len());
    let mut i = 0;
    while i < v.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        if v[i] == b'%'
            && let (Some(h), Some(l)) = (
                v.get(i + 1).and_then(|&b| hex(b)),
                v.get(i + 2).and_then(|&b| hex(b)),
            )
        {
            out.push((h * 16 + l) as u8);
            i += 3;
            continue;
        }
        out.push(v[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(pairs: &[(&str, &str)]) -> Vec<(Vec<u8>, Vec<u8>)> {
        pairs
            .iter()
            .map(|(n, v)| (n.as_bytes().to_vec(), v.as_bytes().to_vec()))
            .collect()
    }

    #[test]
    fn messages_come_out_whole_and_the_rest_waits() {
        let mut buf = frame_message(b"one");
        buf.extend(frame_message(b""));
        buf.extend(&frame_message(b"three")[..4]);
        let got = take_messages(&mut buf).unwrap();
        assert_eq!(got, vec![b"one".to_vec(), Vec::new()]);
        assert_eq!(buf.len(), 4);
        buf.extend(&frame_message(b"three")[4..]);
        assert_eq!(take_messages(&mut buf).unwrap(), vec![b"three".to_vec()]);
        assert!(buf.is_empty());
    }

    #[test]
    fn compressed_or_oversized_messages_are_refused() {
        let mut buf = vec![1, 0, 0, 0, 1, b'x'];
        assert_eq!(
            take_messages(&mut buf).unwrap_err().code,
            tonic::Code::Internal
        );
        let mut buf = vec![0, 0xff, 0xff, 0xff, 0xff];
        let e = take_messages(&mut buf).unwrap_err();
        assert_eq!(e.code, tonic::Code::ResourceExhausted, "{e:?}");
    }

    #[test]
    fn the_status_comes_from_the_trailers() {
        let ok = ResponseHead::read(&h(&[("grpc-status", "0")]));
        assert_eq!(ok.outcome(), Ok(()));
        let failed = ResponseHead::read(&h(&[
            (":status", "200"),
            ("grpc-status", "12"),
            ("grpc-message", "no%20such%20method%"),
        ]));
        assert_eq!(
            failed.outcome(),
            Err(Failure::new(tonic::Code::Unimplemented, "no such method%"))
        );
        let http = ResponseHead::read(&h(&[(":status", "503")]));
        assert_eq!(http.outcome().unwrap_err().code, tonic::Code::Unavailable);
        let none = ResponseHead::read(&h(&[(":status", "200")]));
        assert_eq!(none.outcome().unwrap_err().code, tonic::Code::Internal);
    }

    #[test]
    fn timeouts_fit_eight_digits() {
        assert_eq!(timeout_value(Duration::from_millis(1500)), "1500m");
        assert_eq!(timeout_value(Duration::ZERO), "1m");
        assert_eq!(timeout_value(Duration::from_secs(200_000)), "200000S");
    }

    #[test]
    fn a_request_block_decodes_to_its_headers() {
        let block = request_headers(
            "GetState",
            "127.0.0.1:1",
            "application/grpc+json",
            Some(Duration::from_secs(2)),
        );
        let got = loona_hpack::Decoder::new().decode(&block).unwrap();
        let get = |n: &str| {
            got.iter()
                .find(|(k, _)| k == n.as_bytes())
                .map(|(_, v)| String::from_utf8(v.clone()).unwrap())
        };
        assert_eq!(get(":path").as_deref(), Some("GetState"));
        assert_eq!(get("grpc-timeout").as_deref(), Some("2000m"));
        assert_eq!(get("te").as_deref(), Some("trailers"));
    }
}
