//! Tool names safe for strict MCP clients, and the deterministic map back to the mod's names.
//!
//! Strict clients accept only `^[A-Za-z0-9_-]{1,64}$`. A mod's name is mapped by replacing every
//! other character with `_` (`inventory/get` -> `inventory_get`) and cutting it to 64 characters.
//! Collisions are resolved in the order of the mod's names sorted bytewise: the first keeps the
//! plain name, the next ones get `_2`, `_3`, … (the base cut so the whole stays within 64). A
//! name equal to one of the relay's own tools is treated as taken, so it gets a suffix too.
//! The same set of mod names always gives the same map, whatever order the mod lists them in.

use std::collections::{BTreeMap, HashSet};

/// The longest tool name strict clients accept.
pub const MAX_LEN: usize = 64;

/// A mod tool name with every character outside `[A-Za-z0-9_-]` replaced by `_`, cut to 64.
pub fn sanitize(name: &str) -> String {
    let s: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .take(MAX_LEN)
        .collect();
    if s.is_empty() {
        "tool".into()
    } else {
        s
    }
}

/// MCP name -> mod name for `mod_names`, avoiding `reserved` (the relay's own tools).
pub fn map(mod_names: &[String], reserved: &[&str]) -> BTreeMap<String, String> {
    let mut sorted: Vec<&String> = mod_names.iter().collect();
    sorted.sort();
    sorted.dedup();
    let mut taken: HashSet<String> = reserved.iter().map(|s| s.to_string()).collect();
    let mut out = BTreeMap::new();
    for original in sorted {
        let base = sanitize(original);
        let mut name = base.clone();
        let mut n = 2u32;
        while taken.contains(&name) {
            let suffix = format!("_{n}");
            let keep: String = base.chars().take(MAX_LEN - suffix.len()).collect();
            name = format!("{keep}{suffix}");
            n += 1;
        }
        taken.insert(name.clone());
        out.insert(name, original.clone());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn slashes_and_dots_become_underscores() {
        assert_eq!(sanitize("inventory/get"), "inventory_get");
        assert_eq!(sanitize("a.b c/ü"), "a_b_c__");
        assert_eq!(sanitize(""), "tool");
        assert_eq!(sanitize(&"x".repeat(100)).len(), 64);
    }

    #[test]
    fn collisions_resolve_in_sorted_order_whatever_the_listing_order() {
        let a = map(&names(&["inv/get", "inv_get", "inv.get"]), &[]);
        let b = map(&names(&["inv.get", "inv_get", "inv/get"]), &[]);
        assert_eq!(a, b);
        // Sorted bytewise: "inv.get" < "inv/get" < "inv_get".
        assert_eq!(a["inv_get"], "inv.get");
        assert_eq!(a["inv_get_2"], "inv/get");
        assert_eq!(a["inv_get_3"], "inv_get");
    }

    #[test]
    fn reserved_names_and_long_names_stay_distinct_and_within_64() {
        let m = map(&names(&["events/poll"]), &["events_poll"]);
        assert_eq!(m["events_poll_2"], "events/poll");
        let long = "y".repeat(70);
        let m = map(&[long.clone(), format!("{long}/z")], &[]);
        assert_eq!(m.len(), 2);
        assert!(m.keys().all(|k| k.len() <= MAX_LEN));
    }
}
