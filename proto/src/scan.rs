//! Finds the byte spans of a JSON object's top-level members without building any value.
//!
//! The relay forwards the bytes it received, so it needs to know *where* `id` and `seq` sit in
//! the original body to rewrite them. simd-json parses a scratch copy (it mutates its input), so
//! its tape cannot give offsets into the original; this scanner does, in one pass that skips
//! nested values by bracket depth. It assumes the input already passed a JSON validator and
//! only promises sensible spans for valid JSON; on anything else it returns `None`.

use std::ops::Range;

/// One top-level member: the raw key (between the quotes) and the raw value span.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    /// Bytes of the key between its quotes, escapes not decoded.
    pub key: Range<usize>,
    /// Bytes of the value; for strings this includes the quotes.
    pub value: Range<usize>,
}

fn skip_ws(b: &[u8], mut i: usize) -> usize {
    while i < b.len() && matches!(b[i], b' ' | b'\t' | b'\n' | b'\r') {
        i += 1;
    }
    i
}

/// Given `b[i] == '"'`, the index just past the closing quote.
fn skip_string(b: &[u8], i: usize) -> Option<usize> {
    let mut j = i + 1;
    loop {
        let k = memchr::memchr2(b'"', b'\\', &b[j..])? + j;
        if b[k] == b'\\' {
            j = k + 2;
            if j > b.len() {
                return None;
            }
        } else {
            return Some(k + 1);
        }
    }
}

/// The index just past the value starting at `i`.
fn skip_value(b: &[u8], i: usize) -> Option<usize> {
    match *b.get(i)? {
        b'"' => skip_string(b, i),
        b'{' | b'[' => {
            let mut depth = 0usize;
            let mut j = i;
            while j < b.len() {
                match b[j] {
                    b'"' => {
                        j = skip_string(b, j)?;
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            return Some(j + 1);
                        }
                    }
                    _ => {}
                }
                j += 1;
            }
            None
        }
        _ => {
            let end = b[i..]
                .iter()
                .position(|c| matches!(c, b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r'))
                .map_or(b.len(), |p| p + i);
            Some(end)
        }
    }
}

/// Appends the top-level members of the object in `b` to `out`; `None` if `b` is not an object.
pub fn members(b: &[u8], out: &mut Vec<Member>) -> Option<()> {
    let mut i = skip_ws(b, 0);
    if b.get(i) != Some(&b'{') {
        return None;
    }
    i = skip_ws(b, i + 1);
    if b.get(i) == Some(&b'}') {
        return Some(());
    }
    loop {
        if b.get(i) != Some(&b'"') {
            return None;
        }
        let key_end = skip_string(b, i)?;
        let key = i + 1..key_end - 1;
        i = skip_ws(b, key_end);
        if b.get(i) != Some(&b':') {
            return None;
        }
        i = skip_ws(b, i + 1);
        let value_end = skip_value(b, i)?;
        out.push(Member {
            key,
            value: i..value_end,
        });
        i = skip_ws(b, value_end);
        match b.get(i)? {
            b',' => i = skip_ws(b, i + 1),
            b'}' => return Some(()),
            _ => return None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_spans_around_nested_values_and_escapes() {
        let b = br#" { "id" : "a\"}b", "p":{"x":[1,{"y":"}"}]}, "seq":42 ,"z":null}"#;
        let mut m = Vec::new();
        members(b, &mut m).expect("object");
        let keys: Vec<&[u8]> = m.iter().map(|x| &b[x.key.clone()]).collect();
        assert_eq!(keys, vec![&b"id"[..], b"p", b"seq", b"z"]);
        assert_eq!(&b[m[0].value.clone()], br#""a\"}b""#);
        assert_eq!(&b[m[1].value.clone()], br#"{"x":[1,{"y":"}"}]}"#);
        assert_eq!(&b[m[2].value.clone()], b"42");
        assert_eq!(&b[m[3].value.clone()], b"null");
    }

    #[test]
    fn rejects_non_objects() {
        let mut m = Vec::new();
        assert!(members(b"[1]", &mut m).is_none());
        assert!(members(b"{\"a\":", &mut m).is_none());
        assert!(members(b"{}", &mut m).is_some());
    }
}
