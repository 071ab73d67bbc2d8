//! Feeds every vendored GABP 1.0 fixture and example through the codec and the envelope view.
//!
//! `CONFORMANCE/1.0/valid` must be accepted and `invalid` rejected in strict mode, each also
//! framed and split at every byte offset; the examples must be accepted from a mod (tolerant).

use std::path::{Path, PathBuf};

use bytes::BytesMut;
use gabp_proto::{encode_frame, GabpCodec, Mode, Parser};
use tokio_util::codec::Decoder;

fn fixtures(dir: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let root = Path::new(
        // `cargo test` sets it when running: a test binary shared through one target dir by
        // two clones must read the clone it runs in, not the one that compiled it.
        &std::env::var_os("CARGO_MANIFEST_DIR")
            .map_or_else(|| env!("CARGO_MANIFEST_DIR").into(), PathBuf::from),
    )
    .join("../schemas/gabp")
    .join(dir);
    let mut out = Vec::new();
    let mut stack = vec![root.clone()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap_or_else(|e| panic!("read {}: {e}", d.display())) {
            let path = entry.expect("dir entry").path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "json") {
                let bytes = std::fs::read(&path).expect("read fixture");
                out.push((path, bytes));
            }
        }
    }
    out.sort();
    assert!(!out.is_empty(), "no fixtures under {}", root.display());
    out
}

/// Frames `body`, splits the wire at `cut`, and decodes it back.
fn decode_split(body: &[u8], cut: usize) -> Vec<u8> {
    let mut wire = BytesMut::new();
    encode_frame(body, &mut wire);
    let mut codec = GabpCodec::default();
    let mut buf = BytesMut::from(&wire[..cut.min(wire.len())]);
    let mut got = codec.decode(&mut buf).expect("prefix is never an error");
    buf.extend_from_slice(&wire[cut.min(wire.len())..]);
    if got.is_none() {
        got = codec.decode(&mut buf).expect("whole frame");
    }
    got.expect("one frame").body.to_vec()
}

#[test]
fn valid_fixtures_are_accepted_at_every_split() {
    let mut parser = Parser::new();
    let all = fixtures("CONFORMANCE/1.0/valid");
    assert_eq!(all.len(), 9);
    for (path, body) in all {
        for cut in 0..body.len() + 80 {
            let got = decode_split(&body, cut);
            assert_eq!(got, body);
        }
        if let Err(e) = parser.parse(&body, Mode::Strict) {
            panic!("{} rejected: {e}", path.display());
        }
    }
}

#[test]
fn invalid_fixtures_are_rejected_at_every_split() {
    let mut parser = Parser::new();
    let all = fixtures("CONFORMANCE/1.0/invalid");
    assert_eq!(all.len(), 8);
    for (path, body) in all {
        for cut in 0..body.len() + 80 {
            assert_eq!(decode_split(&body, cut), body);
        }
        let err = parser
            .parse(&body, Mode::Strict)
            .expect_err(&path.display().to_string());
        let code = err.code().code();
        assert!(
            code == -32600 || code == -32602,
            "{}: {err} -> {code}",
            path.display()
        );
    }
}

#[test]
fn examples_are_accepted_from_a_mod() {
    let mut parser = Parser::new();
    for (path, body) in fixtures("EXAMPLES/1.0") {
        if let Err(e) = parser.parse(&body, Mode::Tolerant) {
            panic!("{} rejected: {e}", path.display());
        }
    }
}

#[test]
fn strict_and_tolerant_views_agree_on_valid_messages() {
    let (mut strict, mut tolerant) = (Parser::new(), Parser::new());
    for (path, body) in fixtures("CONFORMANCE/1.0/valid") {
        let a = strict.parse(&body, Mode::Strict).expect("strict");
        let b = tolerant.parse(&body, Mode::Tolerant).expect("tolerant");
        assert_eq!(a, b, "{}", path.display());
    }
}
