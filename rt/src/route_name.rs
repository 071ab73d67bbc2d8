//! Route names: what one may be, checked where a name enters (config file, flags, `wrap`'s
//! launcher, a collected archive), and how an error shows one. Knows nothing else.

/// Longest route name, in bytes. Route names become metric labels, log fields, the `route=`
/// directory of a Parquet export (escaped, up to three bytes for one) and archive entries.
pub const MAX_ROUTE_NAME: usize = 64;

/// Checks a route name where it enters (config file, flags, `wrap`'s launcher, a collected
/// archive): 1 to [`MAX_ROUTE_NAME`] bytes, no control or invisible formatting characters
/// (line breaks, escapes, bidirectional overrides), no whitespace at either end. Anything else
/// goes (`lab/a`, `lab b`, `é`): paths escape it.
pub fn check_route_name(name: &str) -> Result<(), String> {
    let rule =
        "route names are 1 to 64 bytes of printable characters without whitespace at either end";
    if name.is_empty() {
        return Err(format!("empty: {rule}"));
    }
    if name.len() > MAX_ROUTE_NAME {
        return Err(format!("{} bytes, too long: {rule}", name.len()));
    }
    if let Some(c) = name
        .chars()
        .find(|&c| c.is_control() || crate::display::invisible(c))
    {
        return Err(format!("holds the character {c:?}: {rule}"));
    }
    if name.starts_with(char::is_whitespace) || name.ends_with(char::is_whitespace) {
        return Err(format!("whitespace at an end: {rule}"));
    }
    Ok(())
}

/// A route name as an error shows it (quoted with `{:?}`): its first 32 characters and `…`
/// when longer.
pub fn shown_route_name(name: &str) -> String {
    match name.char_indices().nth(32) {
        Some((at, _)) => format!("{}…", &name[..at]),
        None => name.to_string(),
    }
}
