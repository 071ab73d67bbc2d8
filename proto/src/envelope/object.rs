//! Reading an object the scanner has validated: its members by decoded name, and a value's JSON
//! type from its first bytes, typed as a JSON reader would (integers that fit 64 bits, decoded
//! strings). Strict mode's schema checks are built on it; it must not judge what a value means.

use std::borrow::Cow;

use crate::scan;

/// An object's members, read from its text as they are asked for (nothing is collected).
pub(super) struct Object<'a> {
    text: &'a str,
}

impl<'a> Object<'a> {
    /// The object `text` is (already validated by the envelope's scan), or `None` if it does
    /// not even start as one.
    pub(super) fn read(text: &'a str) -> Option<Object<'a>> {
        text.starts_with('{').then_some(Object { text })
    }

    /// Each member as (key text with its quotes, value text), in one walk; it stops where the
    /// text breaks.
    fn members(&self) -> impl Iterator<Item = (&'a str, &'a str)> + '_ {
        let (text, b) = (self.text, self.text.as_bytes());
        let mut at = Some(scan::skip_ws(b, 1));
        std::iter::from_fn(move || {
            let i = at.take()?;
            if b.get(i) != Some(&b'"') {
                return None;
            }
            let key_end = scan::skip_string(b, i)?;
            let colon = scan::skip_ws(b, key_end);
            (b.get(colon) == Some(&b':')).then_some(())?;
            let start = scan::skip_ws(b, colon + 1);
            let end = scan::skip_value(b, start)?;
            let next = scan::skip_ws(b, end);
            if b.get(next) == Some(&b',') {
                at = Some(scan::skip_ws(b, next + 1));
            }
            Some((&text[i..key_end], &text[start..end]))
        })
    }

    /// The values of the members named `names` (escapes in keys decoded), as their texts, in
    /// one walk over the object.
    pub(super) fn fields<const N: usize>(&self, names: [&str; N]) -> [Option<&'a str>; N] {
        let mut found = [None; N];
        for (key, value) in self.members() {
            if let Some(k) = string(key) {
                if let Some(at) = names.iter().position(|n| *n == k) {
                    found[at].get_or_insert(value);
                }
            }
        }
        found
    }

    /// Each member as (decoded key, value text).
    pub(super) fn entries(&self) -> impl Iterator<Item = (Option<Cow<'a, str>>, &'a str)> + '_ {
        self.members().map(|(key, value)| (string(key), value))
    }
}

/// The decoded text of a JSON string value; `None` if `raw` is not a string.
pub(super) fn string(raw: &str) -> Option<Cow<'_, str>> {
    let inner = raw.strip_prefix('"')?.strip_suffix('"')?;
    if !inner.contains('\\') {
        return Some(Cow::Borrowed(inner));
    }
    serde_json::from_str::<String>(raw).ok().map(Cow::Owned)
}

/// Whether `raw` is a string that decodes to at least one character (every escape does).
pub(super) fn is_non_empty_string(raw: &str) -> bool {
    raw.len() > 2 && raw.starts_with('"')
}

/// The value of an integer: digits with an optional minus, no fraction or exponent, within
/// the 64-bit range (signed or unsigned). Larger integers read as doubles, as JSON readers do.
pub(super) fn integer(raw: &str) -> Option<i128> {
    let digits = raw.strip_prefix('-').unwrap_or(raw);
    if digits.is_empty() || digits.len() > 20 || !digits.bytes().all(|c| c.is_ascii_digit()) {
        return None;
    }
    let n: i128 = raw.parse().ok()?;
    (i128::from(i64::MIN)..=i128::from(u64::MAX))
        .contains(&n)
        .then_some(n)
}

/// The items of a JSON array as their texts; `None` if `raw` is not a valid array.
pub(super) fn array_items(raw: &str) -> Option<Vec<&str>> {
    let b = raw.as_bytes();
    if b.first() != Some(&b'[') {
        return None;
    }
    let mut items = Vec::new();
    let mut i = scan::skip_ws(b, 1);
    if b.get(i) == Some(&b']') {
        return Some(items);
    }
    loop {
        let end = scan::skip_value(b, i)?;
        items.push(&raw[i..end]);
        i = scan::skip_ws(b, end);
        match b.get(i)? {
            b',' => i = scan::skip_ws(b, i + 1),
            b']' => return Some(items),
            _ => return None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers_are_what_fits_sixty_four_bits() {
        assert_eq!(integer("0"), Some(0));
        assert_eq!(integer("-0"), Some(0));
        assert_eq!(integer("-9223372036854775808"), Some(i128::from(i64::MIN)));
        assert_eq!(integer("18446744073709551615"), Some(i128::from(u64::MAX)));
        for not in [
            "18446744073709551616",
            "-9223372036854775809",
            "1.0",
            "1e3",
            "-",
            "",
            "\"1\"",
        ] {
            assert_eq!(integer(not), None, "{not}");
        }
    }

    #[test]
    fn members_are_found_by_decoded_name() {
        let o = Object::read(r#"{"n\u0061me":"a\/b","x":[1, "y" ,{}]}"#).expect("object");
        let [name, x, none] = o.fields(["name", "x", "z"]);
        assert_eq!(name, Some(r#""a\/b""#));
        assert_eq!(string(name.expect("name")).as_deref(), Some("a/b"));
        assert_eq!(array_items(x.expect("x")), Some(vec!["1", "\"y\"", "{}"]));
        assert_eq!(none, None);
        assert_eq!(array_items("[ ]"), Some(vec![]));
        let keys: Vec<String> = o
            .entries()
            .map(|(k, _)| k.expect("key").into_owned())
            .collect();
        assert_eq!(keys, ["name", "x"]);
    }
}
