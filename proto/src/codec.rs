//! LSP-style framing: `Content-Length: N\r\n` headers, a blank line, then N bytes of JSON.
//!
//! The decoder yields each body as [`Bytes`] split from the read buffer, so a frame travels to
//! subscribers and the recorder without a copy. It never trusts the peer's length: the length is
//! checked against the limit before any memory is reserved, and the header section is bounded.
//! It does not look inside the body; that is [`crate::envelope`]'s job. The one exception is
//! [`SkippingCodec`], which reads who a body too large to hold answers as it streams past.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use tokio_util::codec::{Decoder, Encoder};

use crate::error::FrameError;
use crate::scan::LooseScan;

/// Default maximum body size: 1 MiB.
pub const DEFAULT_MAX_BODY: usize = 1024 * 1024;
/// Default maximum size of the header section, blank line included.
pub const DEFAULT_MAX_HEADER: usize = 8 * 1024;

/// The header prefix written before every body, in the exact casing peers depend on.
const LENGTH_PREFIX: &[u8] = b"Content-Length: ";
const TYPE_AND_END: &[u8] = b"\r\nContent-Type: application/json\r\n\r\n";

/// One framed GABP message: the body bytes exactly as received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// The JSON body; cloning bumps a reference count.
    pub body: Bytes,
}

/// Decoder and encoder for GABP frames.
#[derive(Debug, Clone)]
pub struct GabpCodec {
    max_body: usize,
    max_header: usize,
}

impl Default for GabpCodec {
    fn default() -> Self {
        GabpCodec::new(DEFAULT_MAX_BODY)
    }
}

impl GabpCodec {
    /// A codec accepting bodies up to `max_body` bytes and the default header limit.
    pub fn new(max_body: usize) -> Self {
        GabpCodec {
            max_body,
            max_header: DEFAULT_MAX_HEADER,
        }
    }

    /// Overrides the header section limit.
    pub fn with_max_header(mut self, max_header: usize) -> Self {
        self.max_header = max_header;
        self
    }

    /// The header length and body length of the frame at the start of `src`, once its header
    /// is complete (the body may not be), with every limit checked. Readers that parse in
    /// place use this instead of [`Decoder::decode`].
    pub fn extent(&self, src: &[u8]) -> Result<Option<(usize, usize)>, FrameError> {
        match self.header(src)? {
            Some((_, len)) if len > self.max_body as u64 => Err(FrameError::TooLarge {
                len,
                limit: self.max_body,
            }),
            // Bounded by max_body above.
            Some((head, len)) => Ok(Some((head, len as usize))),
            None => Ok(None),
        }
    }

    /// The header length and the declared body length, once the header is complete, with the
    /// header's own limits checked but not the body's.
    fn header(&self, src: &[u8]) -> Result<Option<(usize, u64)>, FrameError> {
        if let Some(found) = canonical_header(src) {
            return Ok(Some(found));
        }
        let Some(head) = header_end(&src[..src.len().min(self.max_header)]) else {
            if src.len() >= self.max_header {
                return Err(FrameError::HeaderTooLarge {
                    limit: self.max_header,
                });
            }
            return Ok(None);
        };
        Ok(Some((head, content_length(&src[..head - 2])?)))
    }

    /// The configured body limit.
    pub fn max_body(&self) -> usize {
        self.max_body
    }
}

/// The searcher for the blank line ending a header section, built once per process.
static HEADER_END: std::sync::LazyLock<memchr::memmem::Finder<'static>> =
    std::sync::LazyLock::new(|| memchr::memmem::Finder::new(b"\r\n\r\n"));

/// Position just past the `\r\n\r\n` ending the header section, if present.
fn header_end(src: &[u8]) -> Option<usize> {
    HEADER_END.find(src).map(|i| i + 4)
}

/// The fast path for the two headers nearly every peer writes, `Content-Length: N` alone or
/// followed by `Content-Type: application/json` (what [`encode_header`] writes): (header length,
/// body length). Anything else (other headers, spacing or case, a partial header) takes the
/// general path, which decides the same way.
fn canonical_header(src: &[u8]) -> Option<(usize, u64)> {
    let rest = src.strip_prefix(LENGTH_PREFIX)?;
    let digits = rest
        .iter()
        .take(20)
        .take_while(|b| b.is_ascii_digit())
        .count();
    if digits == 0 || digits > 19 {
        return None;
    }
    let end = &rest[digits..];
    let tail = if end.starts_with(TYPE_AND_END) {
        TYPE_AND_END.len()
    } else if end.starts_with(b"\r\n\r\n") {
        4
    } else {
        return None;
    };
    let len = rest[..digits]
        .iter()
        .fold(0u64, |n, d| n * 10 + u64::from(d - b'0'));
    Some((LENGTH_PREFIX.len() + digits + tail, len))
}

/// Reads the body length from a header section (blank line excluded).
fn content_length(head: &[u8]) -> Result<u64, FrameError> {
    let mut length = None;
    for line in head.split(|&b| b == b'\n') {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.is_empty() {
            continue;
        }
        let colon = line
            .iter()
            .position(|&b| b == b':')
            .ok_or(FrameError::MalformedHeader)?;
        let (name, value) = (&line[..colon], &line[colon + 1..]);
        if !name.is_ascii() || name.is_empty() {
            return Err(FrameError::MalformedHeader);
        }
        if !name.eq_ignore_ascii_case(b"content-length") {
            continue; // unknown headers (Content-Type included) are ignored
        }
        if length.is_some() {
            return Err(FrameError::DuplicateLength);
        }
        length = Some(parse_length(value.trim_ascii())?);
    }
    length.ok_or(FrameError::MissingLength)
}

/// Room reserved ahead of a frame's body before much of it has arrived.
const RESERVE_AHEAD: usize = 64 * 1024;

/// Parses a plain decimal length: digits only, no sign, at most 19 digits (fits u64).
fn parse_length(digits: &[u8]) -> Result<u64, FrameError> {
    if digits.is_empty() || digits.len() > 19 || !digits.iter().all(u8::is_ascii_digit) {
        return Err(FrameError::InvalidLength);
    }
    Ok(digits
        .iter()
        .fold(0u64, |n, d| n * 10 + u64::from(d - b'0')))
}

/// The frame at the start of `src` once its body (`len` bytes after a `head`-byte header) is
/// all there; until then, room for more of it is reserved (the length was checked), but never
/// much more than has arrived: a peer that announces a large frame and sends little of it
/// holds little memory, and the room doubles as the body comes in.
fn take_frame(src: &mut BytesMut, head: usize, len: usize) -> Option<Frame> {
    if src.len() < head + len {
        let missing = head + len - src.len();
        src.reserve(missing.min(src.len().max(RESERVE_AHEAD)));
        return None;
    }
    src.advance(head);
    Some(Frame {
        body: src.split_to(len).freeze(),
    })
}

impl Decoder for GabpCodec {
    type Item = Frame;
    type Error = FrameError;

    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<Frame>, FrameError> {
        let Some((head, len)) = self.extent(src)? else {
            return Ok(None);
        };
        Ok(take_frame(src, head, len))
    }

    fn decode_eof(&mut self, src: &mut BytesMut) -> Result<Option<Frame>, FrameError> {
        match self.decode(src)? {
            Some(frame) => Ok(Some(frame)),
            None if src.is_empty() => Ok(None),
            None => Err(FrameError::Truncated),
        }
    }
}

/// What [`SkippingCodec`] reads: a frame, or word of one being skipped for exceeding the limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Read {
    /// A frame within the limit.
    Frame(Frame),
    /// A frame whose declared body exceeds the limit, passed over as it arrives, never held.
    /// Told as soon as its top-level `type` and `id` have gone by, or when it ends; `answers`
    /// is the pending request it may answer ([`crate::answer_id`]).
    Skipped {
        /// The declared body length.
        len: u64,
        /// Who the frame may answer, if what went by says.
        answers: Option<String>,
    },
}

/// A decoder for a trusted peer (the mod) whose frame over the body limit should not end the
/// connection: the framing is intact, so the body is passed over unread (memory stays bounded
/// by the read buffer, and a [`LooseScan`] reads who it answers as it goes by) and reported as
/// [`Read::Skipped`], in stream order. Every other error is [`GabpCodec`]'s.
#[derive(Debug, Clone)]
pub struct SkippingCodec {
    inner: GabpCodec,
    skipping: Option<Skip>,
}

#[derive(Debug, Clone)]
struct Skip {
    len: u64,
    left: u64,
    scan: LooseScan,
    told: bool,
}

impl SkippingCodec {
    /// A skipping decoder for bodies up to `max_body` bytes.
    pub fn new(max_body: usize) -> Self {
        SkippingCodec {
            inner: GabpCodec::new(max_body),
            skipping: None,
        }
    }

    /// Whether a frame being skipped still has bytes to come (the read buffer is empty then,
    /// yet the peer is mid-frame).
    pub fn is_mid_frame(&self) -> bool {
        self.skipping.is_some()
    }
}

impl Decoder for SkippingCodec {
    type Item = Read;
    type Error = FrameError;

    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<Read>, FrameError> {
        loop {
            if let Some(skip) = &mut self.skipping {
                let n = src
                    .len()
                    .min(usize::try_from(skip.left).unwrap_or(usize::MAX));
                if !skip.told {
                    skip.scan.feed(&src[..n]);
                }
                src.advance(n);
                skip.left -= n as u64;
                let done = skip.left == 0;
                // Type and id both read: what follows cannot change who it answers (short of
                // a duplicate).
                let told = (!skip.told && (done || skip.scan.found_all())).then(|| {
                    skip.told = true;
                    Read::Skipped {
                        len: skip.len,
                        answers: crate::envelope::answer_id(&skip.scan),
                    }
                });
                if done {
                    self.skipping = None;
                }
                match told {
                    Some(read) => return Ok(Some(read)),
                    None if done => continue,
                    None => return Ok(None),
                }
            }
            return match self.inner.header(src)? {
                Some((head, len)) if len > self.inner.max_body as u64 => {
                    src.advance(head);
                    self.skipping = Some(Skip {
                        len,
                        left: len,
                        scan: LooseScan::new(crate::envelope::ANSWER_KEYS),
                        told: false,
                    });
                    continue;
                }
                Some((head, len)) => Ok(take_frame(src, head, len as usize).map(Read::Frame)),
                None => Ok(None),
            };
        }
    }

    fn decode_eof(&mut self, src: &mut BytesMut) -> Result<Option<Read>, FrameError> {
        match self.decode(src)? {
            Some(read) => Ok(Some(read)),
            None if src.is_empty() && self.skipping.is_none() => Ok(None),
            None => Err(FrameError::Truncated),
        }
    }
}

/// The size of a whole wire frame (header and body) for a body of `len` bytes.
pub fn frame_len(len: usize) -> usize {
    let mut digits = [0u8; 20];
    LENGTH_PREFIX.len() + decimal(len as u64, &mut digits).len() + TYPE_AND_END.len() + len
}

/// Writes `n` in decimal into `buf` and returns the digits.
pub fn decimal(mut n: u64, buf: &mut [u8; 20]) -> &[u8] {
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            return &buf[i..];
        }
    }
}

/// Appends the header for a body of `len` bytes to `dst`, reserving room for the body too.
pub fn encode_header(len: usize, dst: &mut BytesMut) {
    let mut digits = [0u8; 20];
    let digits = decimal(len as u64, &mut digits);
    dst.reserve(LENGTH_PREFIX.len() + digits.len() + TYPE_AND_END.len() + len);
    dst.put_slice(LENGTH_PREFIX);
    dst.put_slice(digits);
    dst.put_slice(TYPE_AND_END);
}

/// Appends one frame (header and body) to `dst`.
pub fn encode_frame(body: &[u8], dst: &mut BytesMut) {
    encode_header(body.len(), dst);
    dst.put_slice(body);
}

/// A complete wire frame (header and body) as one shareable buffer.
pub fn frame_bytes(body: &[u8]) -> Bytes {
    // Exactly the frame's size: `Bytes` then takes the buffer as it is, where any spare room
    // would cost a second allocation (its shared header) per frame.
    let mut out = BytesMut::with_capacity(frame_len(body.len()));
    encode_frame(body, &mut out);
    out.freeze()
}

impl Encoder<Bytes> for GabpCodec {
    type Error = FrameError;

    fn encode(&mut self, body: Bytes, dst: &mut BytesMut) -> Result<(), FrameError> {
        encode_frame(&body, dst);
        Ok(())
    }
}

impl Encoder<&[u8]> for GabpCodec {
    type Error = FrameError;

    fn encode(&mut self, body: &[u8], dst: &mut BytesMut) -> Result<(), FrameError> {
        encode_frame(body, dst);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The general path alone, for comparison with the fast path.
    fn general(src: &[u8]) -> Option<(usize, u64)> {
        let head = header_end(src)?;
        content_length(&src[..head - 2]).ok().map(|len| (head, len))
    }

    #[test]
    fn frame_len_is_the_encoded_frames_length_at_every_digit_count() {
        for len in [0usize, 1, 9, 10, 99, 100, 255, 999, 1000, 65_535, 1 << 20] {
            let body = vec![b'x'; len];
            let mut dst = BytesMut::new();
            encode_frame(&body, &mut dst);
            assert_eq!(frame_len(len), dst.len(), "len {len}");
            assert_eq!(frame_bytes(&body)[..], dst[..], "len {len}");
        }
    }

    #[test]
    fn fast_header_path_agrees_with_the_general_one() {
        let cases: &[&[u8]] = &[
            b"Content-Length: 12\r\n\r\n{}",
            b"Content-Length: 0\r\nContent-Type: application/json\r\n\r\n",
            b"Content-Length: 0012\r\n\r\n",
            b"Content-Length: 9999999999999999999\r\n\r\n",
            b"Content-Length: 99999999999999999999\r\n\r\n",
            b"Content-Length: 12\r\nContent-Type: application/json\r\nX: y\r\n\r\n",
            b"content-length: 12\r\n\r\n",
            b"Content-Length: 12\r\n",
            b"Content-Length: 12\r\nContent-Type: app",
            b"Content-Length:\r\n\r\n",
            b"Content-Length: -1\r\n\r\n",
        ];
        for c in cases {
            if let Some(fast) = canonical_header(c) {
                assert_eq!(Some(fast), general(c), "{}", String::from_utf8_lossy(c));
            }
        }
        assert!(canonical_header(cases[0]).is_some());
        assert!(canonical_header(cases[1]).is_some());
        assert!(
            canonical_header(cases[5]).is_none(),
            "extra headers: general path"
        );
        assert!(
            canonical_header(cases[4]).is_none(),
            "20 digits: general path errs"
        );
    }

    fn decode_all(codec: &mut GabpCodec, input: &[u8]) -> Result<Vec<Bytes>, FrameError> {
        let mut buf = BytesMut::from(input);
        let mut out = Vec::new();
        while let Some(f) = codec.decode(&mut buf)? {
            out.push(f.body);
        }
        if let Some(f) = codec.decode_eof(&mut buf)? {
            out.push(f.body);
        }
        Ok(out)
    }

    #[test]
    fn writes_the_canonical_header() {
        let f = frame_bytes(b"{}");
        assert_eq!(
            &f[..],
            b"Content-Length: 2\r\nContent-Type: application/json\r\n\r\n{}"
        );
    }

    #[test]
    fn accepts_any_header_case_missing_type_and_unknown_headers() {
        let mut c = GabpCodec::default();
        for input in [
            &b"content-length: 2\r\n\r\n{}"[..],
            b"CONTENT-LENGTH:2\r\n\r\n{}",
            b"Content-Length: 2\r\nX-Other: yes\r\ncontent-type: application/json\r\n\r\n{}",
            b"Content-Type: application/json\r\nContent-Length:   2  \r\n\r\n{}",
        ] {
            assert_eq!(
                decode_all(&mut c, input).expect("valid"),
                vec![Bytes::from_static(b"{}")]
            );
        }
    }

    #[test]
    fn rejects_bad_lengths_as_framing_errors() {
        type Check = fn(&FrameError) -> bool;
        let cases: [(&[u8], Check); 7] = [
            (b"Content-Type: application/json\r\n\r\n{}", |e| {
                matches!(e, FrameError::MissingLength)
            }),
            (b"Content-Length: 2\r\nContent-Length: 2\r\n\r\n{}", |e| {
                matches!(e, FrameError::DuplicateLength)
            }),
            (b"Content-Length: two\r\n\r\n{}", |e| {
                matches!(e, FrameError::InvalidLength)
            }),
            (b"Content-Length: -2\r\n\r\n{}", |e| {
                matches!(e, FrameError::InvalidLength)
            }),
            (b"Content-Length: +2\r\n\r\n{}", |e| {
                matches!(e, FrameError::InvalidLength)
            }),
            (b"Content-Length: 99999999999999999999999\r\n\r\n", |e| {
                matches!(e, FrameError::InvalidLength)
            }),
            (b"garbage line\r\n\r\n{}", |e| {
                matches!(e, FrameError::MalformedHeader)
            }),
        ];
        for (input, ok) in cases {
            let err = decode_all(&mut GabpCodec::default(), input).expect_err("must fail");
            assert!(ok(&err), "{input:?} gave {err:?}");
        }
    }

    #[test]
    fn checks_length_before_reserving() {
        let mut c = GabpCodec::new(100);
        let mut buf = BytesMut::from(&b"Content-Length: 4000000000\r\n\r\n"[..]);
        let cap = buf.capacity();
        assert!(matches!(
            c.decode(&mut buf),
            Err(FrameError::TooLarge {
                len: 4_000_000_000,
                ..
            })
        ));
        assert_eq!(
            buf.capacity(),
            cap,
            "no memory reserved for a rejected length"
        );
    }

    #[test]
    fn reserves_for_an_announced_body_only_as_it_arrives() {
        let mut c = GabpCodec::new(16 << 20);
        let mut buf = BytesMut::from(&b"Content-Length: 16000000\r\n\r\n{"[..]);
        assert!(c.decode(&mut buf).expect("a valid header").is_none());
        assert!(buf.capacity() <= 2 * RESERVE_AHEAD, "{}", buf.capacity());
        // As the body comes in, the room grows with it, and the frame arrives whole.
        let body = vec![b' '; 16_000_000 - 2];
        for chunk in body.chunks(1 << 20) {
            buf.extend_from_slice(chunk);
            assert!(c.decode(&mut buf).expect("valid").is_none());
        }
        buf.extend_from_slice(b"}");
        let frame = c.decode(&mut buf).expect("valid").expect("whole");
        assert_eq!(frame.body.len(), 16_000_000);
    }

    #[test]
    fn bounds_the_header_section() {
        let mut c = GabpCodec::default();
        let mut buf = BytesMut::from(&vec![b'a'; DEFAULT_MAX_HEADER][..]);
        assert!(matches!(
            c.decode(&mut buf),
            Err(FrameError::HeaderTooLarge { .. })
        ));
        // Short of the limit an unfinished header is just partial.
        let mut buf = BytesMut::from(&b"Content-Length: 2\r\n"[..]);
        assert!(matches!(c.decode(&mut buf), Ok(None)));
    }

    #[test]
    fn short_body_then_close_is_truncated() {
        let err = decode_all(&mut GabpCodec::default(), b"Content-Length: 10\r\n\r\n{}")
            .expect_err("truncated");
        assert!(matches!(err, FrameError::Truncated));
    }

    #[test]
    fn decodes_identically_when_split_at_every_offset() {
        let mut wire = BytesMut::new();
        encode_frame(br#"{"a":1}"#, &mut wire);
        encode_frame(b"[]", &mut wire);
        let whole = decode_all(&mut GabpCodec::default(), &wire).expect("valid");
        for cut in 0..=wire.len() {
            let mut c = GabpCodec::default();
            let mut buf = BytesMut::from(&wire[..cut]);
            let mut got = Vec::new();
            while let Some(f) = c.decode(&mut buf).expect("valid prefix") {
                got.push(f.body);
            }
            buf.extend_from_slice(&wire[cut..]);
            while let Some(f) = c.decode(&mut buf).expect("valid rest") {
                got.push(f.body);
            }
            assert_eq!(got, whole, "split at {cut}");
        }
    }

    proptest! {
        #[test]
        fn encode_decode_round_trips(bodies in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..300), 1..6)) {
            let mut wire = BytesMut::new();
            for b in &bodies { encode_frame(b, &mut wire); }
            let got = decode_all(&mut GabpCodec::default(), &wire).expect("round trip");
            prop_assert_eq!(got.len(), bodies.len());
            for (g, b) in got.iter().zip(&bodies) { prop_assert_eq!(&g[..], &b[..]); }
        }

        #[test]
        fn arbitrary_input_never_panics_or_over_reserves(input in prop::collection::vec(any::<u8>(), 0..2048)) {
            let mut c = GabpCodec::new(512);
            let mut buf = BytesMut::from(&input[..]);
            while let Ok(Some(_)) = c.decode(&mut buf) {}
            // Whatever the peer declared, reservation never exceeds header + body limits.
            prop_assert!(buf.capacity() <= input.len().max(DEFAULT_MAX_HEADER + 512) + 64);
        }

        #[test]
        fn headers_with_noise_lines_decode(len_case in 0usize..3, body in prop::collection::vec(any::<u8>(), 0..64)) {
            let name = ["Content-Length", "content-length", "CONTENT-length"][len_case];
            let mut wire = format!("X-A: b\r\n{name}: {}\r\n\r\n", body.len()).into_bytes();
            wire.extend_from_slice(&body);
            let got = decode_all(&mut GabpCodec::default(), &wire).expect("valid");
            prop_assert_eq!(&got[0][..], &body[..]);
        }
    }

    #[test]
    fn a_skipping_decoder_passes_over_an_oversized_body_and_reads_on() {
        let id = "550e8400-e29b-41d4-a716-446655440000";
        let big = format!(
            r#"{{"v":"gabp/1","id":"{id}","type":"response","result":"{}"}}"#,
            "x".repeat(5000)
        );
        let mut wire = BytesMut::new();
        encode_frame(b"{\"a\":1}", &mut wire);
        encode_frame(big.as_bytes(), &mut wire);
        encode_frame(b"{\"b\":2}", &mut wire);
        // Fed a few bytes at a time: the skipped body is never held whole.
        for step in [1, 7, 100, 4096, usize::MAX] {
            let mut codec = SkippingCodec::new(1024);
            let mut src = BytesMut::new();
            let mut got = Vec::new();
            for chunk in wire.chunks(step.min(wire.len())) {
                src.extend_from_slice(chunk);
                while let Some(read) = codec.decode(&mut src).expect("decodes") {
                    got.push(read);
                }
                assert!(
                    src.len() <= 1024 + 64 + step.min(wire.len()),
                    "{step}: {}",
                    src.len()
                );
            }
            assert_eq!(codec.decode_eof(&mut src).expect("eof"), None);
            assert_eq!(
                got,
                vec![
                    Read::Frame(Frame {
                        body: Bytes::from_static(b"{\"a\":1}")
                    }),
                    Read::Skipped {
                        len: big.len() as u64,
                        answers: Some(id.into())
                    },
                    Read::Frame(Frame {
                        body: Bytes::from_static(b"{\"b\":2}")
                    }),
                ],
                "{step}"
            );
        }
        // Cut off mid-skip: the stream ended mid-frame.
        let mut codec = SkippingCodec::new(1024);
        let mut src = BytesMut::from(&wire[..wire.len() - 200]);
        while codec.decode(&mut src).expect("decodes").is_some() {}
        assert!(matches!(
            codec.decode_eof(&mut src),
            Err(FrameError::Truncated)
        ));
    }
}
