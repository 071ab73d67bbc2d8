//! GABP framing as a checker reads and writes it. Unlike the relay's codec, which refuses a
//! broken stream, this reader says how it broke: a `Content-Length` counted in characters (the
//! body parses once as many characters as the header said are taken), a header inside a body
//! or a body where a header belongs (header and body written apart and interleaved with
//! another frame), header lines ending in a bare LF, a body that is no JSON. It then finds the
//! next header and goes on. Every read ends at a deadline, so a peer that hangs becomes a
//! verdict, never a hang of the checker.
//!
//! Writes choose their header form ([`Header`]) and go out byte for byte as given: what a
//! check sends (raw UTF-8, padding) is exactly what the peer gets.

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use gabp_rt::net::{BoxRead, BoxWrite, Conn};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::Instant;

/// The largest body a peer may declare before the header counts as broken.
pub const MAX_BODY: usize = 64 << 20;
/// The longest header section read before it counts as broken.
const MAX_HEADER: usize = 8 * 1024;
/// How many framing problems one connection keeps.
const MAX_PROBLEMS: usize = 100;

/// How a frame went wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Problem {
    /// The body parses only when as many characters as `Content-Length` said are taken: the
    /// peer counted characters (`declared`), not bytes (`bytes`).
    CharCounted {
        /// What the header said.
        declared: usize,
        /// The body's length in bytes.
        bytes: usize,
    },
    /// A header inside a body, or a body where a header belongs: a header and its body were
    /// written apart and another frame came between them.
    Interleaved(String),
    /// Header lines end in a bare LF, not CRLF.
    BareLf,
    /// A header section without a readable `Content-Length`.
    BadHeader(String),
    /// A body that is not JSON (and not one of the above).
    NotJson(String),
    /// The connection ended inside a frame.
    Truncated,
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Problem::CharCounted { declared, bytes } => write!(
                f,
                "Content-Length: {declared} for a body of {bytes} bytes ({declared} characters): counted in characters, not bytes"
            ),
            Problem::Interleaved(what) => write!(f, "{what}: a header and its body were written apart and another frame came between them"),
            Problem::BareLf => write!(f, "header lines end in a bare LF, not CRLF"),
            Problem::BadHeader(what) => write!(f, "unreadable header: {what}"),
            Problem::NotJson(what) => write!(f, "a body that is not JSON: {what}"),
            Problem::Truncated => write!(f, "the connection ended inside a frame"),
        }
    }
}

/// What a connection's peer wrote, counted.
#[derive(Debug, Clone, Default)]
pub struct Seen {
    /// Frames read whole.
    pub frames: u64,
    /// Of those, frames with raw non-ASCII bytes, framed by their byte count.
    pub raw_utf8: u64,
    /// The largest body read.
    pub largest: usize,
    /// The header forms seen (their field names in order), counted.
    pub header_forms: BTreeMap<String, u64>,
    /// What went wrong, in order (bounded).
    pub problems: Vec<Problem>,
}

impl Seen {
    /// Adds another connection's counts.
    pub fn merge(&mut self, other: Seen) {
        self.frames += other.frames;
        self.raw_utf8 += other.raw_utf8;
        self.largest = self.largest.max(other.largest);
        for (k, n) in other.header_forms {
            *self.header_forms.entry(k).or_default() += n;
        }
        for p in other.problems {
            if self.problems.len() < MAX_PROBLEMS {
                self.problems.push(p);
            }
        }
    }

    fn problem(&mut self, p: Problem) {
        if self.problems.len() < MAX_PROBLEMS {
            self.problems.push(p);
        }
    }
}

/// One frame read.
#[derive(Debug, Clone)]
pub struct Frame {
    /// The body.
    pub body: Bytes,
    /// The body as JSON.
    pub msg: Value,
    /// Its `Content-Length` counted characters ([`Problem::CharCounted`]); the body is whole.
    pub char_counted: bool,
    /// Its header's field names, in order (`Content-Length + Content-Type`).
    pub header: String,
}

/// What a read got.
#[derive(Debug)]
pub enum Got {
    /// A frame.
    Frame(Frame),
    /// Bytes that make no frame; the reader has moved past them.
    Broken(Problem),
    /// The peer closed the connection.
    Closed,
    /// Nothing (more) arrived before the deadline.
    TimedOut,
}

/// How a frame's header is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Header {
    /// `Content-Length: N` then `Content-Type: application/json`: what the relay writes.
    Relay,
    /// `Content-Length: N` alone, as many bridges write.
    LengthOnly,
    /// `content-length: N`: header names are case-insensitive.
    Lowercase,
    /// `Content-Type: application/json; charset=utf-8` first, then `Content-Length: N`.
    TypeFirst,
}

impl Header {
    /// Every form, the relay's first.
    pub const ALL: [Header; 4] = [
        Header::Relay,
        Header::LengthOnly,
        Header::Lowercase,
        Header::TypeFirst,
    ];

    /// How the form is said in a report.
    pub fn name(self) -> &'static str {
        match self {
            Header::Relay => "Content-Length + Content-Type",
            Header::LengthOnly => "Content-Length alone",
            Header::Lowercase => "content-length (lower case)",
            Header::TypeFirst => "Content-Type first, with charset",
        }
    }

    /// The header section for a body of `len` bytes, blank line included.
    pub fn bytes(self, len: usize) -> Vec<u8> {
        match self {
            Header::Relay => {
                format!("Content-Length: {len}\r\nContent-Type: application/json\r\n\r\n")
            }
            Header::LengthOnly => format!("Content-Length: {len}\r\n\r\n"),
            Header::Lowercase => format!("content-length: {len}\r\n\r\n"),
            Header::TypeFirst => format!(
                "Content-Type: application/json; charset=utf-8\r\nContent-Length: {len}\r\n\r\n"
            ),
        }
        .into_bytes()
    }
}

/// A connection read and written frame by frame.
pub struct Wire {
    read: BoxRead,
    write: BoxWrite,
    buf: BytesMut,
    eof: bool,
    /// What the peer wrote so far.
    pub seen: Seen,
}

impl std::fmt::Debug for Wire {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Wire").field("seen", &self.seen).finish()
    }
}

/// The outcome of looking at the buffer.
enum Step {
    Got(Got),
    More,
}

impl Wire {
    /// Reads and writes `conn`.
    pub fn new(conn: Conn) -> Wire {
        Wire {
            read: conn.read,
            write: conn.write,
            buf: BytesMut::with_capacity(64 * 1024),
            eof: false,
            seen: Seen::default(),
        }
    }

    /// Writes `bytes` as they are, within `wait`.
    pub async fn send_raw(&mut self, bytes: &[u8], wait: Duration) -> std::io::Result<()> {
        let write = async {
            self.write.write_all(bytes).await?;
            self.write.flush().await
        };
        tokio::time::timeout(wait, write).await.map_err(|_| {
            std::io::Error::new(std::io::ErrorKind::TimedOut, "the peer reads nothing")
        })?
    }

    /// Writes one frame of `body` with the `header` form, in one write.
    pub async fn send(
        &mut self,
        body: &[u8],
        header: Header,
        wait: Duration,
    ) -> std::io::Result<()> {
        let mut wire = header.bytes(body.len());
        wire.extend_from_slice(body);
        self.send_raw(&wire, wait).await
    }

    /// Closes the writing half (the peer reads the end of the stream).
    pub async fn close(&mut self) {
        let _ = tokio::time::timeout(Duration::from_secs(1), self.write.shutdown()).await;
    }

    /// The next frame, or why there is none, by `deadline`.
    pub async fn next(&mut self, deadline: Instant) -> Got {
        loop {
            if let Step::Got(g) = self.step() {
                return g;
            }
            if self.eof {
                if self.buf.is_empty() {
                    return Got::Closed;
                }
                self.buf.clear();
                self.seen.problem(Problem::Truncated);
                return Got::Broken(Problem::Truncated);
            }
            match tokio::time::timeout_at(deadline, self.read.read_buf(&mut self.buf)).await {
                Err(_) => return Got::TimedOut,
                Ok(Ok(0)) | Ok(Err(_)) => self.eof = true,
                Ok(Ok(_)) => {}
            }
        }
    }

    /// Looks at what is buffered: a frame, a problem moved past, or a need for more bytes.
    fn step(&mut self) -> Step {
        if self.buf.is_empty() {
            return Step::More;
        }
        if matches!(self.buf[0], b'{' | b'[' | b'"') {
            return self.broken(
                Problem::Interleaved("a JSON body where a header was expected".into()),
                1,
            );
        }
        let window = &self.buf[..self.buf.len().min(MAX_HEADER)];
        let crlf = memchr::memmem::find(window, b"\r\n\r\n");
        let lf = memchr::memmem::find(window, b"\n\n");
        let (text_end, head) = match (crlf, lf) {
            (Some(c), Some(l)) if l < c => (l, l + 2),
            (Some(c), _) => (c, c + 4),
            (None, Some(l)) => (l, l + 2),
            (None, None) if self.buf.len() >= MAX_HEADER || self.eof => {
                return self.broken(
                    Problem::BadHeader(format!("no blank line within {MAX_HEADER} bytes")),
                    1,
                );
            }
            (None, None) => return Step::More,
        };
        let bare_lf = head == text_end + 2;
        let header = String::from_utf8_lossy(&self.buf[..text_end]).to_string();
        let mut names = Vec::new();
        let mut length = None;
        for line in header.split('\n').map(|l| l.trim_end_matches('\r')) {
            let Some((name, value)) = line.split_once(':') else {
                let shown: String = line.chars().take(40).collect();
                let problem = if line.contains('{') {
                    Problem::Interleaved(format!("a header line {shown:?}"))
                } else {
                    Problem::BadHeader(format!("a header line without a colon: {shown:?}"))
                };
                return self.broken(problem, head);
            };
            if name.trim().eq_ignore_ascii_case("content-length") && length.is_none() {
                length = Some(value.trim().parse::<usize>().ok());
            }
            names.push(name.trim().to_string());
        }
        let declared = match length {
            Some(Some(n)) if n <= MAX_BODY => n,
            Some(Some(n)) => {
                return self.broken(
                    Problem::BadHeader(format!("Content-Length: {n} is over 64 MiB")),
                    head,
                )
            }
            Some(None) => {
                return self.broken(
                    Problem::BadHeader("Content-Length is not a number".into()),
                    head,
                )
            }
            None => return self.broken(Problem::BadHeader("no Content-Length".into()), head),
        };
        // A header where this body should start: its own header's writer let another frame
        // in between (said before the body is awaited: that frame may be shorter).
        match header_at(&self.buf[head..]) {
            Some(true) => {
                return self.broken(
                    Problem::Interleaved("a header where a body was expected".into()),
                    head,
                )
            }
            None if !self.eof && declared > 0 => return Step::More,
            _ => {}
        }
        if self.buf.len() < head + declared {
            return Step::More;
        }
        if bare_lf {
            self.seen.problem(Problem::BareLf);
        }
        let body = &self.buf[head..head + declared];
        if let Ok(msg) = serde_json::from_slice::<Value>(body) {
            let header = names.join(" + ");
            *self.seen.header_forms.entry(header.clone()).or_default() += 1;
            self.seen.frames += 1;
            if !body.is_ascii() {
                self.seen.raw_utf8 += 1;
            }
            self.seen.largest = self.seen.largest.max(declared);
            self.buf.advance(head);
            let body = self.buf.split_to(declared).freeze();
            return Step::Got(Got::Frame(Frame {
                body,
                msg,
                char_counted: false,
                header,
            }));
        }
        let lower = body.to_ascii_lowercase();
        if let Some(at) = memchr::memmem::find(&lower, b"content-length:") {
            return self.broken(
                Problem::Interleaved("a header inside a body".into()),
                head + at,
            );
        }
        // Read as many characters as the header said: the body of a peer that counts them.
        let mut end = head;
        let mut chars = 0;
        while chars < declared && end < self.buf.len() {
            end += match self.buf[end] {
                0xF0..=0xF7 => 4,
                0xE0..=0xEF => 3,
                0xC0..=0xDF => 2,
                _ => 1,
            };
            chars += 1;
        }
        if end > head + declared {
            if chars < declared || end > self.buf.len() {
                if !self.eof {
                    return Step::More;
                }
            } else if let Ok(msg) = serde_json::from_slice::<Value>(&self.buf[head..end]) {
                let bytes = end - head;
                self.seen.problem(Problem::CharCounted { declared, bytes });
                let header = names.join(" + ");
                *self.seen.header_forms.entry(header.clone()).or_default() += 1;
                self.seen.frames += 1;
                self.seen.largest = self.seen.largest.max(bytes);
                self.buf.advance(head);
                let body = self.buf.split_to(bytes).freeze();
                return Step::Got(Got::Frame(Frame {
                    body,
                    msg,
                    char_counted: true,
                    header,
                }));
            }
        }
        let why = serde_json::from_slice::<Value>(body)
            .err()
            .map_or_else(String::new, |e| e.to_string());
        self.broken(Problem::NotJson(why), head + declared)
    }

    /// Notes `problem`, moves past `at` least `skip` bytes to the next header, and reports it.
    fn broken(&mut self, problem: Problem, skip: usize) -> Step {
        self.seen.problem(problem.clone());
        let skip = skip.min(self.buf.len());
        let lower = self.buf[skip..].to_ascii_lowercase();
        let next = memchr::memmem::find(&lower, b"content-length:")
            .or_else(|| memchr::memmem::find(&lower, b"content-type:"));
        match next {
            Some(at) => self.buf.advance(skip + at),
            None => self.buf.clear(),
        }
        Step::Got(Got::Broken(problem))
    }
}

/// Whether `bytes` start with a header field GABP peers write: `Some(true)` if so, `None`
/// while too few have arrived to tell.
fn header_at(bytes: &[u8]) -> Option<bool> {
    const NAMES: [&[u8]; 2] = [b"content-length:", b"content-type:"];
    let mut undecided = false;
    for name in NAMES {
        let n = bytes.len().min(name.len());
        if bytes[..n].eq_ignore_ascii_case(&name[..n]) {
            if n == name.len() {
                return Some(true);
            }
            undecided = true;
        }
    }
    if undecided {
        None
    } else {
        Some(false)
    }
}

/// A request body: compact JSON, non-ASCII left raw (so a check sends exactly the bytes it
/// means to).
pub fn request(id: &str, method: &str, params: &Value) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "v": "gabp/1", "id": id, "type": "request", "method": method, "params": params
    }))
    .expect("a Value serializes")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A wire fed `bytes` by a peer that then closes.
    async fn reading(bytes: &[u8]) -> Wire {
        let (mut ours, theirs) = tokio::io::duplex(1 << 20);
        ours.write_all(bytes).await.expect("write");
        drop(ours);
        let (r, w) = tokio::io::split(theirs);
        Wire::new(Conn::from_halves(r, w, "test"))
    }

    async fn all(bytes: &[u8]) -> (Vec<Got>, Seen) {
        let mut w = reading(bytes).await;
        let mut out = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            match w.next(deadline).await {
                Got::Closed => return (out, w.seen),
                g => out.push(g),
            }
        }
    }

    fn frame(header: &str, body: &str) -> Vec<u8> {
        format!("{header}\r\n\r\n{body}").into_bytes()
    }

    #[tokio::test]
    async fn every_header_form_reads_and_raw_utf8_counted_in_bytes_is_whole() {
        let body = r#"{"a":"héllo"}"#;
        let mut bytes = Vec::new();
        for h in Header::ALL {
            bytes.extend(h.bytes(body.len()));
            bytes.extend(body.as_bytes());
        }
        let (got, seen) = all(&bytes).await;
        assert_eq!(got.len(), 4);
        assert!(got
            .iter()
            .all(|g| matches!(g, Got::Frame(f) if !f.char_counted && f.msg["a"] == "héllo")));
        assert_eq!((seen.frames, seen.raw_utf8), (4, 4));
        assert!(seen.problems.is_empty(), "{:?}", seen.problems);
        assert_eq!(seen.header_forms.len(), 4, "{:?}", seen.header_forms);
    }

    #[tokio::test]
    async fn a_length_counted_in_characters_is_named_and_the_stream_goes_on() {
        let body = r#"{"a":"héllo €"}"#;
        let chars = body.chars().count();
        let mut bytes = frame(&format!("Content-Length: {chars}"), body);
        bytes.extend(frame("Content-Length: 2", "{}"));
        let (got, seen) = all(&bytes).await;
        assert!(matches!(&got[0], Got::Frame(f) if f.char_counted && f.msg["a"] == "héllo €"));
        assert!(matches!(&got[1], Got::Frame(f) if !f.char_counted));
        assert_eq!(
            seen.problems,
            [Problem::CharCounted {
                declared: chars,
                bytes: body.len()
            }]
        );
    }

    #[tokio::test]
    async fn header_and_body_written_apart_and_interleaved_are_named() {
        let (a, b) = (r#"{"n":1}"#, r#"{"n":22}"#);
        // Two writers: header A, header B, body A, body B.
        let mut bytes = format!("Content-Length: {}\r\n\r\n", a.len()).into_bytes();
        bytes.extend(format!("Content-Length: {}\r\n\r\n", b.len()).as_bytes());
        bytes.extend(a.as_bytes());
        bytes.extend(b.as_bytes());
        bytes.extend(frame("Content-Length: 2", "{}"));
        let (got, seen) = all(&bytes).await;
        assert!(
            seen.problems
                .iter()
                .any(|p| matches!(p, Problem::Interleaved(_))),
            "{:?}",
            seen.problems
        );
        assert!(
            matches!(got.last(), Some(Got::Frame(f)) if f.msg == serde_json::json!({})),
            "{got:?}"
        );
    }

    #[tokio::test]
    async fn bare_lf_missing_length_and_non_json_are_named() {
        let mut bytes = b"Content-Length: 2\n\n{}".to_vec();
        bytes.extend(frame("Content-Type: application/json", "{}"));
        bytes.extend(frame("Content-Length: 3", "{x}"));
        bytes.extend(frame("Content-Length: 2", "{}"));
        let (got, seen) = all(&bytes).await;
        assert!(matches!(&got[0], Got::Frame(_)));
        assert_eq!(seen.problems[0], Problem::BareLf);
        assert!(
            matches!(&seen.problems[1], Problem::BadHeader(w) if w.contains("no Content-Length"))
        );
        assert!(
            matches!(&seen.problems[2], Problem::NotJson(_)),
            "{:?}",
            seen.problems
        );
        assert!(matches!(got.last(), Some(Got::Frame(_))));
    }

    #[tokio::test]
    async fn a_silent_peer_is_a_timeout_and_a_cut_frame_is_named() {
        let (ours, theirs) = tokio::io::duplex(1024);
        let (r, w) = tokio::io::split(theirs);
        let mut wire = Wire::new(Conn::from_halves(r, w, "test"));
        let started = Instant::now();
        assert!(matches!(
            wire.next(Instant::now() + Duration::from_millis(50)).await,
            Got::TimedOut
        ));
        assert!(started.elapsed() < Duration::from_secs(2));
        drop(ours);
        let (got, _) = all(b"Content-Length: 10\r\n\r\n{}").await;
        assert!(
            matches!(&got[..], [Got::Broken(Problem::Truncated)]),
            "{got:?}"
        );
    }
}
