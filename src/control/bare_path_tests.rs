use super::*;
use loona_hpack::Encoder;

type Headers = Vec<(Vec<u8>, Vec<u8>)>;
/// (type, flags, stream, payload) of one frame.
type Frame = (u8, u8, u32, Vec<u8>);

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut f = Vec::new();
    write_frame_header(&mut f, payload.len(), kind, flags, stream);
    f.extend_from_slice(payload);
    f
}

fn request(path: &str) -> Vec<(&'static [u8], Vec<u8>)> {
    vec![
        (b":method", b"POST".to_vec()),
        (b":scheme", b"http".to_vec()),
        (b":path", path.as_bytes().to_vec()),
        (b":authority", b"127.0.0.1:47100".to_vec()),
        (b"content-type", b"application/grpc+json".to_vec()),
        (b"te", b"trailers".to_vec()),
    ]
}

fn encode(enc: &mut Encoder, headers: &[(&'static [u8], Vec<u8>)]) -> Vec<u8> {
    enc.encode(headers.iter().map(|(n, v)| (*n, v.as_slice())))
}

/// Splits `out` into frames, decoding header blocks with one decoder for the connection.
fn read_frames(out: &[u8]) -> (Vec<Frame>, Vec<Headers>) {
    assert!(out.starts_with(PREFACE), "preface kept");
    let mut rest = &out[PREFACE.len()..];
    let mut frames = Vec::new();
    let mut blocks = Vec::new();
    let mut dec = Decoder::new();
    let mut pending = Vec::new();
    while let Some((len, kind, flags, stream)) = frame_header(rest) {
        let payload = rest[FRAME_HEADER_LEN..FRAME_HEADER_LEN + len].to_vec();
        if matches!(kind, HEADERS | CONTINUATION) {
            assert_eq!(flags & (PADDED | PRIORITY), 0, "output is never padded");
            pending.extend_from_slice(&payload);
            if flags & END_HEADERS != 0 {
                blocks.push(dec.decode(&pending).expect("output decodes"));
                pending.clear();
            }
        }
        frames.push((kind, flags, stream, payload));
        rest = &rest[FRAME_HEADER_LEN + len..];
    }
    assert!(rest.is_empty(), "output ends on a frame boundary");
    (frames, blocks)
}

fn path_of(h: &Headers) -> String {
    let (_, v) = h.iter().find(|(n, _)| n == b":path").expect(":path");
    String::from_utf8(v.clone()).expect("utf8")
}

#[test]
fn the_path_rules_touch_only_bare_method_names() {
    let strip = Rewrite::StripSlash;
    assert_eq!(strip.apply(b"/GetState").as_deref(), Some(&b"GetState"[..]));
    assert_eq!(strip.apply(b"/occ_pb.Occ/GetState"), None);
    assert_eq!(strip.apply(b"/"), None);
    assert_eq!(strip.apply(b"GetState"), None);
    let add = Rewrite::AddSlash;
    assert_eq!(add.apply(b"GetState").as_deref(), Some(&b"/GetState"[..]));
    assert_eq!(add.apply(b"/occ_pb.Occ/GetState"), None);
    assert_eq!(add.apply(b"*"), None);
    assert_eq!(add.apply(b""), None);
}

#[test]
fn indexed_headers_across_requests_are_rewritten_and_other_frames_pass_unchanged() {
    // The sender indexes headers (as h2 does): the second and third requests refer to its
    // dynamic table, which the rewriter must follow.
    let mut enc = Encoder::new();
    let mut input = PREFACE.to_vec();
    let settings = frame(0x4, 0, 0, &[0, 4, 0, 0, 0xff, 0xff]);
    input.extend_from_slice(&settings);
    let paths = ["/GetState", "/Transition", "/occ_pb.Occ/GetState"];
    let mut data_frames = Vec::new();
    for (i, p) in paths.iter().enumerate() {
        let stream = 1 + 2 * i as u32;
        input.extend(frame(
            HEADERS,
            END_HEADERS,
            stream,
            &encode(&mut enc, &request(p)),
        ));
        let data = frame(0x0, END_STREAM, stream, b"\0\0\0\0\x02{}");
        input.extend_from_slice(&data);
        data_frames.push(data);
    }
    // Fed in awkward pieces: every split point must give the same result.
    for piece in [1, 3, 7, 10, 64, input.len()] {
        let mut rw = PathRewriter::new(Rewrite::StripSlash);
        let mut out = Vec::new();
        for chunk in input.chunks(piece) {
            rw.feed(chunk, &mut out).expect("feed");
        }
        let (frames, blocks) = read_frames(&out);
        let got: Vec<String> = blocks.iter().map(path_of).collect();
        assert_eq!(
            got,
            ["GetState", "Transition", "/occ_pb.Occ/GetState"],
            "piece {piece}"
        );
        assert_eq!(blocks[0].len(), 6, "no header lost");
        assert_eq!(
            blocks[2][4],
            (b"content-type".to_vec(), b"application/grpc+json".to_vec())
        );
        // SETTINGS and DATA frames are byte-identical.
        assert!(out[PREFACE.len()..].starts_with(&settings));
        for d in &data_frames {
            assert!(
                out.windows(d.len()).any(|w| w == d.as_slice()),
                "data frame kept"
            );
        }
        assert_eq!(frames.len(), 7);
    }
}

#[test]
fn padded_prioritised_and_continued_blocks_become_one_plain_block() {
    let mut enc = Encoder::new();
    let block = encode(&mut enc, &request("GetState"));
    let (a, b) = block.split_at(block.len() / 2);
    let mut payload = vec![3u8]; // pad length
    payload.extend_from_slice(&[0, 0, 0, 0, 16]); // priority: dependency + weight
    payload.extend_from_slice(a);
    payload.extend_from_slice(&[0, 0, 0]);
    let mut input = PREFACE.to_vec();
    input.extend(frame(HEADERS, PADDED | PRIORITY | END_STREAM, 5, &payload));
    input.extend(frame(CONTINUATION, END_HEADERS, 5, b));
    let mut rw = PathRewriter::new(Rewrite::AddSlash);
    let mut out = Vec::new();
    rw.feed(&input, &mut out).expect("feed");
    let (frames, blocks) = read_frames(&out);
    assert_eq!(frames.len(), 1);
    assert_eq!(frames[0].0, HEADERS);
    assert_eq!(frames[0].1, END_STREAM | END_HEADERS, "END_STREAM kept");
    assert_eq!(frames[0].2, 5);
    assert_eq!(path_of(&blocks[0]), "/GetState");
}

#[test]
fn a_large_block_is_split_into_frames_every_peer_accepts() {
    let mut enc = Encoder::new();
    let mut headers = request("/GetState");
    headers.push((b"x-big", vec![b'a'; 40_000]));
    let mut input = PREFACE.to_vec();
    input.extend(frame(HEADERS, END_HEADERS, 1, &encode(&mut enc, &headers)));
    let mut out = Vec::new();
    PathRewriter::new(Rewrite::StripSlash)
        .feed(&input, &mut out)
        .expect("feed");
    let (frames, blocks) = read_frames(&out);
    assert!(frames.len() >= 3);
    assert!(frames.iter().all(|f| f.3.len() <= OUT_FRAME_MAX));
    assert_eq!(frames[0].0, HEADERS);
    assert!(frames[1..].iter().all(|f| f.0 == CONTINUATION));
    assert_eq!(path_of(&blocks[0]), "GetState");
    assert_eq!(blocks[0][6].1.len(), 40_000);
}

#[test]
fn garbage_is_an_error_not_a_panic() {
    let mut out = Vec::new();
    assert_eq!(
        PathRewriter::new(Rewrite::AddSlash).feed(b"GET / HTTP/1.1\r\n", &mut out),
        Err(RewriteError::Preface)
    );
    let mut input = PREFACE.to_vec();
    input.extend(frame(HEADERS, END_HEADERS, 1, &[0xff, 0xff, 0xff]));
    let r = PathRewriter::new(Rewrite::AddSlash).feed(&input, &mut out);
    assert!(
        matches!(r, Err(RewriteError::Hpack { stream: 1, .. })),
        "{r:?}"
    );
    let mut input = PREFACE.to_vec();
    input.extend(frame(CONTINUATION, END_HEADERS, 1, &[0x82]));
    let r = PathRewriter::new(Rewrite::AddSlash).feed(&input, &mut out);
    assert!(matches!(r, Err(RewriteError::Frame { .. })), "{r:?}");
    let mut input = PREFACE.to_vec();
    input.extend(frame(HEADERS, END_HEADERS | PADDED, 1, &[9, 0x82]));
    let r = PathRewriter::new(Rewrite::AddSlash).feed(&input, &mut out);
    assert!(matches!(r, Err(RewriteError::Frame { .. })), "{r:?}");
    // Arbitrary bytes after a valid preface never panic.
    let mut seed = 0x9e37_79b9_u32;
    for _ in 0..200 {
        let mut input = PREFACE.to_vec();
        for _ in 0..64 {
            seed ^= seed << 13;
            seed ^= seed >> 17;
            seed ^= seed << 5;
            input.push((seed & 0xff) as u8);
        }
        let _ = PathRewriter::new(Rewrite::StripSlash).feed(&input, &mut Vec::new());
    }
}
