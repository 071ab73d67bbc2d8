//! Reading a few top-level string members from a body no parser would take: invalid, cut
//! short, nested past [`super::MAX_DEPTH`], not UTF-8, or never held whole (a frame over the
//! body limit, fed as it streams past). Only quotes, escapes and brackets are followed;
//! nothing is validated. For telling a waiting caller its answer cannot be forwarded, and for
//! echoing a refused request's id; never for routing a frame that parsed.

/// String values kept per key: the last ones, as JSON parsers keep the last of duplicates.
pub const LOOSE_MAX: usize = 4;
/// Longest key or value read, in raw bytes; longer ones are passed over.
const LOOSE_CAP: usize = 256;

/// A streaming loose reader of the top-level string members named by its keys.
#[derive(Debug, Clone)]
pub struct LooseScan {
    keys: &'static [&'static str],
    found: Vec<Vec<String>>,
    /// Bytes seen before the opening brace (a BOM, whitespace); `None` once in the body.
    lead: Option<usize>,
    done: bool,
    depth: usize,
    in_string: bool,
    escaped: bool,
    role: Role,
    buf: Vec<u8>,
    overflow: bool,
    expect_key: bool,
    /// After a key (`Some(which)`): waiting for its colon.
    awaiting_colon: Option<Option<usize>>,
    /// After a wanted key's colon: its value, if a string comes next.
    awaiting_value: Option<usize>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    Key,
    Value(usize),
    Other,
}

impl LooseScan {
    /// A reader of the members named `keys`.
    pub fn new(keys: &'static [&'static str]) -> LooseScan {
        LooseScan {
            keys,
            found: vec![Vec::new(); keys.len()],
            lead: Some(0),
            done: false,
            depth: 0,
            in_string: false,
            escaped: false,
            role: Role::Other,
            buf: Vec::new(),
            overflow: false,
            expect_key: false,
            awaiting_colon: None,
            awaiting_value: None,
        }
    }

    /// Reads the whole of `body` with a fresh reader.
    pub fn of(keys: &'static [&'static str], body: &[u8]) -> LooseScan {
        let mut scan = LooseScan::new(keys);
        scan.feed(body);
        scan
    }

    /// The values of `keys[which]` found so far, decoded, in order (the last [`LOOSE_MAX`]).
    pub fn values(&self, which: usize) -> &[String] {
        &self.found[which]
    }

    /// Whether every key has a value by now.
    pub fn found_all(&self) -> bool {
        self.found.iter().all(|v| !v.is_empty())
    }

    /// Reads the next bytes of the body.
    pub fn feed(&mut self, chunk: &[u8]) {
        for &b in chunk {
            if self.done {
                return;
            }
            self.step(b);
        }
    }

    fn step(&mut self, b: u8) {
        if let Some(seen) = self.lead {
            match (seen, b) {
                (0, 0xef) | (1, 0xbb) | (2, 0xbf) => self.lead = Some(seen + 1),
                (_, b' ' | b'\t' | b'\n' | b'\r') => self.lead = Some(3),
                (_, b'{') => {
                    self.lead = None;
                    self.depth = 1;
                    self.expect_key = true;
                }
                _ => self.done = true,
            }
            return;
        }
        if self.in_string {
            if self.escaped {
                self.escaped = false;
            } else if b == b'\\' {
                self.escaped = true;
            } else if b == b'"' {
                self.in_string = false;
                return self.end_string();
            }
            if self.role != Role::Other {
                if self.buf.len() < LOOSE_CAP {
                    self.buf.push(b);
                } else {
                    self.overflow = true;
                }
            }
            return;
        }
        match b {
            b' ' | b'\t' | b'\n' | b'\r' => return,
            b'"' => {
                self.in_string = true;
                self.buf.clear();
                self.overflow = false;
                self.role = if self.depth == 1 && self.expect_key {
                    self.expect_key = false;
                    Role::Key
                } else if let Some(which) = self.awaiting_value.take() {
                    Role::Value(which)
                } else {
                    Role::Other
                };
                self.awaiting_colon = None;
                return;
            }
            b':' if self.depth == 1 => {
                if let Some(which) = self.awaiting_colon.take() {
                    self.awaiting_value = which;
                    return;
                }
            }
            b'{' | b'[' => self.depth += 1,
            b'}' | b']' => {
                self.depth = self.depth.saturating_sub(1);
                self.done = self.depth == 0;
            }
            b',' if self.depth == 1 => self.expect_key = true,
            _ => {}
        }
        self.awaiting_colon = None;
        self.awaiting_value = None;
    }

    fn end_string(&mut self) {
        if self.overflow || self.role == Role::Other {
            self.awaiting_colon = (self.role == Role::Key).then_some(None);
            return;
        }
        let text = decode(&self.buf);
        match self.role {
            Role::Key => {
                let which = text.and_then(|k| self.keys.iter().position(|w| *w == k));
                self.awaiting_colon = Some(which);
            }
            Role::Value(which) => {
                if let Some(v) = text {
                    let kept = &mut self.found[which];
                    if kept.len() == LOOSE_MAX {
                        kept.remove(0);
                    }
                    kept.push(v);
                }
            }
            Role::Other => {}
        }
    }
}

/// A string's raw bytes (between the quotes) decoded, if they are valid.
fn decode(raw: &[u8]) -> Option<String> {
    if !raw.contains(&b'\\') {
        return std::str::from_utf8(raw).ok().map(String::from);
    }
    let mut quoted = Vec::with_capacity(raw.len() + 2);
    quoted.push(b'"');
    quoted.extend_from_slice(raw);
    quoted.push(b'"');
    serde_json::from_slice(&quoted).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &[&str] = &["id"];

    fn values(b: &[u8]) -> Vec<String> {
        LooseScan::of(ID, b).values(0).to_vec()
    }

    #[test]
    fn found_past_what_no_parser_would_read() {
        // Past invalid JSON, a non-finite number, a lone surrogate, an escaped quote posing as
        // an id, nesting deeper than any parser takes, a nested id, a raw control character
        // and invalid UTF-8.
        let deep = format!("{}{}", "[".repeat(300), "]".repeat(300));
        let mut b = format!(
            r#"{{"a":1,,"n":1e400,"s":"\ud800","q":"x\"id\":\"no","d":{deep},"r":{{"id":"nested"}},"c":""#
        )
        .into_bytes();
        b.extend_from_slice(b"\x01\xff\xfe\",\"id\":\"yes\",\"\\u0069d\":\"again\"}");
        assert_eq!(values(&b), ["yes", "again"]);
    }

    #[test]
    fn fed_in_pieces_it_reads_the_same() {
        let b = "\u{feff} {\"type\":\"response\",\"x\":[1,{\"id\":\"no\"}],\"id\":\"a\\u0062\"}";
        for step in [1, 2, 3, 7, 100] {
            let mut scan = LooseScan::new(&["type", "id"]);
            for chunk in b.as_bytes().chunks(step) {
                scan.feed(chunk);
            }
            assert_eq!(scan.values(0), ["response"], "{step}");
            assert_eq!(scan.values(1), ["ab"], "{step}");
        }
    }

    #[test]
    fn only_top_level_strings_of_an_object_count() {
        assert_eq!(values(br#"{"id":"a","result":[1,"#), ["a"]);
        assert!(values(br#"{"id":"a"#).is_empty());
        assert!(values(br#"["id","a"]"#).is_empty());
        assert!(values(br#"{"id":7}"#).is_empty());
        assert!(values(br#"{"xid":"a","i":"id"}"#).is_empty());
        let many = br#"{"id":"1","id":"2","id":"3","id":"4","id":"5"}"#;
        assert_eq!(values(many), ["2", "3", "4", "5"]);
        let long = format!(r#"{{"id":"{}","id":"b"}}"#, "x".repeat(LOOSE_CAP + 1));
        assert_eq!(values(long.as_bytes()), ["b"]);
    }
}
