//! Strict mode's rule that no object repeats a key, at any depth. The scanner shows each nested
//! object's keys as it validates the body (one pass); keys are compared as they stand, and
//! decoded only when one of them holds an escape (`"\u0069d"` repeats `"id"`). Owns that rule
//! only; it must not judge envelope fields ([`super::view`] does).

use std::borrow::Cow;

use super::fields::{decode_str, truncate_key};
use super::not_object_or_invalid;
use crate::error::EnvelopeError;
use crate::scan::{self, Key, KeyCheck, Member};

/// Scans `text` into its top-level `members`, validating all of it (a grammar error is the
/// `Err`), and returns the first key repeated within an object inside a member's value. `keys`
/// is scratch space kept by the parser.
pub(super) fn scan_noting_repeats(
    text: &str,
    members: &mut Vec<Member>,
    keys: &mut Vec<Key>,
) -> Result<Option<EnvelopeError>, EnvelopeError> {
    let b = text.as_bytes();
    let mut nested = None;
    let mut on_close = |object: &[Key]| {
        if nested.is_none() {
            nested = distinct(text, object).err();
        }
    };
    keys.clear();
    let scanned = scan::members_showing_keys(
        b,
        members,
        &mut KeyCheck {
            stack: keys,
            on_close: &mut on_close,
        },
    );
    scanned.ok_or_else(|| not_object_or_invalid(b))?;
    Ok(nested)
}

/// Refuses the first repeated key among the envelope's own `members`.
pub(super) fn refuse_top_level_repeats(
    text: &str,
    members: &[Member],
    keys: &mut Vec<Key>,
) -> Result<(), EnvelopeError> {
    let b = text.as_bytes();
    keys.clear();
    keys.extend(members.iter().map(|m| Key {
        raw: m.key.clone(),
        escaped: b[m.key.clone()].contains(&b'\\'),
    }));
    distinct(text, keys)
}

/// Refuses the first key of one object that repeats an earlier one.
fn distinct(text: &str, keys: &[Key]) -> Result<(), EnvelopeError> {
    if keys.len() < 2 {
        return Ok(());
    }
    if keys.iter().any(|k| k.escaped) {
        let names = keys
            .iter()
            .map(|k| decode_str(text, &(k.raw.start - 1..k.raw.end + 1)))
            .collect::<Result<Vec<Cow<'_, str>>, _>>()?;
        return first_repeat(names.iter().map(|n| n.as_bytes()));
    }
    first_repeat(keys.iter().map(|k| &text.as_bytes()[k.raw.clone()]))
}

fn first_repeat<'a>(names: impl ExactSizeIterator<Item = &'a [u8]>) -> Result<(), EnvelopeError> {
    let repeated =
        |name: &[u8]| EnvelopeError::DuplicateKey(truncate_key(&String::from_utf8_lossy(name)));
    if names.len() <= 16 {
        let mut seen: [&[u8]; 16] = [&[]; 16];
        for (i, name) in names.enumerate() {
            if seen[..i].contains(&name) {
                return Err(repeated(name));
            }
            seen[i] = name;
        }
    } else {
        let mut seen = std::collections::HashSet::with_capacity(names.len());
        for name in names {
            if !seen.insert(name) {
                return Err(repeated(name));
            }
        }
    }
    Ok(())
}
