//! Byte-level rewrites of a received body: a new id in place, a new seq in one copy.
//!
//! The relay forwards what it received. To multiplex bridges onto one mod it swaps request ids
//! (same length, so in place), and to sequence events it replaces the mod's `seq` with its own
//! (the digit count may change, so one new buffer, shared by every subscriber). For a mod that
//! counts `Content-Length` in characters, a request's non-ASCII can be written as `\uXXXX`
//! escapes on the way to it ([`put_wire_ascii`]): the same JSON, in bytes both counts agree on.

use std::ops::Range;

use bytes::{BufMut, Bytes, BytesMut};

pub use crate::codec::decimal;

/// Overwrites the string value at `span` (quotes included) with `new_id`, which must have the
/// same length as the old value's contents. Returns false, leaving `body` untouched, otherwise.
pub fn rewrite_id_in_place(body: &mut [u8], span: Range<usize>, new_id: &[u8]) -> bool {
    if span.len() != new_id.len() + 2 || span.end > body.len() {
        return false;
    }
    body[span.start + 1..span.end - 1].copy_from_slice(new_id);
    true
}

/// A copy of `body` whose id value at `span` is replaced by the string `new_id` (any length).
pub fn with_id(body: &[u8], span: Range<usize>, new_id: &str) -> Bytes {
    let mut out = BytesMut::with_capacity(body.len() + new_id.len());
    out.put_slice(&body[..span.start]);
    out.put_u8(b'"');
    out.put_slice(new_id.as_bytes());
    out.put_u8(b'"');
    out.put_slice(&body[span.end..]);
    out.freeze()
}

/// Writes `body` into `out` with the value at `seq_span` replaced by `seq`; with no span, a
/// `"seq"` member is added before the closing brace.
pub fn put_with_seq(body: &[u8], seq_span: Option<Range<usize>>, seq: u64, out: &mut BytesMut) {
    let mut digits = [0u8; 20];
    put_with_digits(body, seq_span, decimal(seq, &mut digits), out);
}

/// [`put_with_seq`] with the seq already in decimal.
fn put_with_digits(body: &[u8], seq_span: Option<Range<usize>>, digits: &[u8], out: &mut BytesMut) {
    match seq_span {
        Some(span) => {
            // Exact (as `len_with_seq`): a caller that sized `out` to the frame gets no
            // reallocation.
            out.reserve(body.len().saturating_sub(span.len()) + digits.len());
            out.put_slice(&body[..span.start]);
            out.put_slice(digits);
            out.put_slice(&body[span.end..]);
        }
        None => {
            let close = body.iter().rposition(|&b| b == b'}').unwrap_or(body.len());
            out.reserve(body.len() + digits.len() + 7);
            out.put_slice(&body[..close]);
            out.put_slice(b",\"seq\":");
            out.put_slice(digits);
            out.put_slice(&body[close..]);
        }
    }
}

/// The length of `body` after [`put_with_seq`].
pub fn len_with_seq(body: &[u8], seq_span: Option<&Range<usize>>, seq: u64) -> usize {
    let mut digits = [0u8; 20];
    len_with_digits(body, seq_span, decimal(seq, &mut digits).len())
}

fn len_with_digits(body: &[u8], seq_span: Option<&Range<usize>>, digits: usize) -> usize {
    match seq_span {
        Some(span) => body.len() - span.len() + digits,
        None => body.len() + digits + 7,
    }
}

/// A complete wire frame (header and body) of `body` with its seq replaced: one copy.
pub fn wire_with_seq(body: &[u8], seq_span: Option<Range<usize>>, seq: u64) -> Bytes {
    // `encode_header` reserves exactly the frame's size: one allocation, the seq in decimal
    // once.
    let mut out = BytesMut::new();
    put_wire_with_seq(body, seq_span, seq, &mut out);
    out.freeze()
}

/// Appends the complete wire frame (header and body) of `body` with its seq replaced to
/// `out`: one copy.
pub fn put_wire_with_seq(
    body: &[u8],
    seq_span: Option<Range<usize>>,
    seq: u64,
    out: &mut BytesMut,
) {
    // The seq in decimal once, for the length and the copy.
    let mut digits = [0u8; 20];
    let digits = decimal(seq, &mut digits);
    let len = len_with_digits(body, seq_span.as_ref(), digits.len());
    crate::codec::encode_header(len, out);
    put_with_digits(body, seq_span, digits, out);
}

/// `body` with its seq replaced, as a new buffer.
pub fn with_seq(body: &[u8], seq_span: Option<Range<usize>>, seq: u64) -> Bytes {
    let mut out = BytesMut::new();
    put_with_seq(body, seq_span, seq, &mut out);
    out.freeze()
}

/// The length of `body` once every non-ASCII character in it is written as `\uXXXX` escapes
/// (one per UTF-16 unit: 6 bytes for a 2- or 3-byte sequence, 12 for a 4-byte one). A body
/// that is not UTF-8 is left as it is.
pub fn len_ascii_escaped(body: &[u8]) -> usize {
    if std::str::from_utf8(body).is_err() {
        return body.len();
    }
    // Each lead byte says how long its sequence is; continuation bytes add nothing more.
    body.iter().fold(body.len(), |len, &b| {
        len + match b {
            0xC0..=0xDF => 4,
            0xE0..=0xEF => 3,
            0xF0..=0xF7 => 8,
            _ => 0,
        }
    })
}

/// Appends the complete wire frame (header and body) of `body` with every non-ASCII character
/// written as a `\uXXXX` escape. In valid JSON non-ASCII occurs only inside strings, where the
/// escape means the same character, so the frame says what `body` says in ASCII alone, and a
/// peer counting `Content-Length` in characters reads it whole. A body that is not UTF-8 is
/// framed as it is.
pub fn put_wire_ascii(body: &[u8], out: &mut BytesMut) {
    let Ok(text) = std::str::from_utf8(body) else {
        crate::codec::encode_frame(body, out);
        return;
    };
    crate::codec::encode_header(len_ascii_escaped(body), out);
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut rest = text;
    while let Some(at) = rest.bytes().position(|b| !b.is_ascii()) {
        out.put_slice(&rest.as_bytes()[..at]);
        let c = rest[at..].chars().next().expect("a character starts here");
        let mut units = [0u16; 2];
        for &u in c.encode_utf16(&mut units).iter() {
            out.put_slice(b"\\u");
            for shift in [12, 8, 4, 0] {
                out.put_u8(HEX[usize::from((u >> shift) & 0xF)]);
            }
        }
        rest = &rest[at + c.len_utf8()..];
    }
    out.put_slice(rest.as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::envelope::{Mode, Parser};

    #[test]
    fn id_rewrite_in_place_keeps_length() {
        let mut b = br#"{"id":"aaaa","x":1}"#.to_vec();
        assert!(rewrite_id_in_place(&mut b, 6..12, b"bbbb"));
        assert_eq!(&b, br#"{"id":"bbbb","x":1}"#);
        assert!(!rewrite_id_in_place(&mut b, 6..12, b"ccc"));
        assert_eq!(&with_id(&b, 6..12, "zz")[..], br#"{"id":"zz","x":1}"#);
    }

    #[test]
    fn seq_replacement_changes_digit_count_and_stays_valid() {
        let body =
            br#"{"v":"gabp/1","id":"e","type":"event","channel":"c","seq":9,"payload":{"seq":9}}"#;
        let mut p = Parser::new();
        let view = p.parse(body, Mode::Tolerant).expect("valid");
        let out = with_seq(body, view.seq_span.clone(), 10);
        let again = p.parse(&out, Mode::Tolerant).expect("still valid");
        assert_eq!(again.seq, Some(10));
        assert_eq!(&out[again.payload.expect("payload")], br#"{"seq":9}"#);
        let missing = br#"{"v":"gabp/1","type":"event","channel":"c","payload":1}"#;
        let out = with_seq(missing, None, 3);
        assert_eq!(p.parse(&out, Mode::Tolerant).expect("valid").seq, Some(3));
    }

    #[test]
    fn wire_with_seq_frames_the_rewritten_body() {
        use crate::codec::GabpCodec;
        use tokio_util::codec::Decoder;
        for (body, span) in [
            (&br#"{"seq":7,"x":1}"#[..], Some(7..8)),
            (&br#"{"x":1}"#[..], None),
        ] {
            let wire = wire_with_seq(body, span.clone(), 12345);
            let mut buf = BytesMut::from(&wire[..]);
            let got = GabpCodec::default()
                .decode(&mut buf)
                .expect("frame")
                .expect("whole");
            assert_eq!(got.body, with_seq(body, span, 12345));
            assert!(buf.is_empty());
        }
    }

    #[test]
    fn decimal_digits() {
        let mut b = [0; 20];
        assert_eq!(decimal(0, &mut b), b"0");
        assert_eq!(decimal(u64::MAX, &mut b), b"18446744073709551615");
    }

    #[test]
    fn ascii_frames_escape_every_non_ascii_character_and_keep_the_meaning() {
        use crate::codec::GabpCodec;
        use tokio_util::codec::Decoder;
        for body in [
            r#"{"a":"h\u00e9llo"}"#.to_string(),
            r#"{"a":"héllo","b":"€ 🎮 \u2028","é":["ü",1]}"#.to_string(),
            r#"{"plain":"ascii only"}"#.to_string(),
        ] {
            let mut wire = BytesMut::new();
            put_wire_ascii(body.as_bytes(), &mut wire);
            let frame = GabpCodec::default()
                .decode(&mut wire)
                .expect("framed")
                .expect("whole");
            assert!(frame.body.is_ascii(), "{:?}", frame.body);
            assert_eq!(frame.body.len(), len_ascii_escaped(body.as_bytes()));
            let was: serde_json::Value = serde_json::from_str(&body).expect("JSON");
            let now: serde_json::Value = serde_json::from_slice(&frame.body).expect("JSON");
            assert_eq!(was, now, "the same JSON");
        }
        let mut wire = BytesMut::new();
        put_wire_ascii("\"é🎮\"".as_bytes(), &mut wire);
        assert!(wire.ends_with(br#""\u00e9\ud83c\udfae""#), "{wire:?}");
        // Not UTF-8: framed as it is.
        assert_eq!(len_ascii_escaped(b"\xff\xfe"), 2);
    }
}
