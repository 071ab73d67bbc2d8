//! Byte-level rewrites of a received body: a new id in place, a new seq in one copy.
//!
//! The relay forwards what it received. To multiplex bridges onto one mod it swaps request ids
//! (same length, so in place), and to sequence events it replaces the mod's `seq` with its own
//! (the digit count may change, so one new buffer, shared by every subscriber).

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
}
