//! Walking simd-json's tape: value sizes, object members, and the whole-tape checks of strict
//! mode (duplicate keys at every level, finite numbers, the shape of an error object). Owns no
//! envelope rules beyond those.

use simd_json::{Node, StaticNode};

use super::fields::truncate_key;
use crate::error::EnvelopeError;

/// Reuses a vector's allocation for a different lifetime; the vector is empty, so no value
/// crosses lifetimes (the in-place `collect` keeps the allocation).
pub(super) fn recycle<'b>(mut v: Vec<Node<'_>>) -> Vec<Node<'b>> {
    v.clear();
    v.into_iter()
        .map(|_| -> Node<'b> { unreachable!("vector was cleared") })
        .collect()
}

/// Number of tape nodes taken by the value at `i`, itself included.
pub(crate) fn node_size(tape: &[Node<'_>], i: usize) -> usize {
    match tape[i] {
        Node::Object { count, .. } | Node::Array { count, .. } => count + 1,
        _ => 1,
    }
}

/// Iterates an object's members on the tape as (key, value index).
pub(crate) fn object_members<'t, 'a>(
    tape: &'t [Node<'a>],
    at: usize,
) -> impl Iterator<Item = (&'a str, usize)> + 't {
    let len = match tape[at] {
        Node::Object { len, .. } => len,
        _ => 0,
    };
    let mut next = at + 1;
    (0..len).filter_map(move |_| {
        let key = match tape.get(next)? {
            Node::String(k) => *k,
            _ => return None,
        };
        let value = next + 1;
        next = value + node_size(tape, value);
        Some((key, value))
    })
}

/// Strict: an error object has an integer code, a non-empty message, optional data, nothing else.
pub(super) fn check_error_object(tape: &[Node<'_>], at: usize) -> Result<(), EnvelopeError> {
    let mut has_code = false;
    let mut has_message = false;
    for (key, value) in object_members(tape, at) {
        match key {
            "code" => {
                has_code = matches!(
                    tape[value],
                    Node::Static(StaticNode::I64(_) | StaticNode::U64(_))
                )
            }
            "message" => has_message = matches!(tape[value], Node::String(m) if !m.is_empty()),
            "data" => {}
            _ => return Err(EnvelopeError::InvalidField("error")),
        }
    }
    if has_code && has_message {
        Ok(())
    } else {
        Err(EnvelopeError::InvalidField("error"))
    }
}

/// Checks every object on the tape for duplicate keys, and every number for finiteness.
pub(super) fn check_whole_tape(tape: &[Node<'_>]) -> Result<(), EnvelopeError> {
    for (i, node) in tape.iter().enumerate() {
        match node {
            Node::Static(StaticNode::F64(f)) if !f.is_finite() => {
                return Err(EnvelopeError::NonFiniteNumber)
            }
            Node::Object { len, .. } if *len > 1 => check_duplicates(tape, i)?,
            _ => {}
        }
    }
    Ok(())
}

pub(super) fn check_duplicates(tape: &[Node<'_>], at: usize) -> Result<(), EnvelopeError> {
    let names: Vec<&str> = object_members(tape, at).map(|(k, _)| k).collect();
    if names.len() <= 16 {
        for (i, a) in names.iter().enumerate() {
            if names[..i].contains(a) {
                return Err(EnvelopeError::DuplicateKey(truncate_key(a)));
            }
        }
    } else {
        let mut seen = std::collections::HashSet::with_capacity(names.len());
        for a in &names {
            if !seen.insert(*a) {
                return Err(EnvelopeError::DuplicateKey(truncate_key(a)));
            }
        }
    }
    Ok(())
}
