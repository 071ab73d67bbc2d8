//! The byte-level JSON grammar the scanner is built from: whitespace, strings (memchr and a
//! vectorised control-byte check over long runs), numbers (finite only, when asked), and
//! containers walked with an explicit stack bounded by [`MAX_DEPTH`]. Each function returns the
//! index just past what it accepted, or `None`; none of them allocates or builds a value.

use std::ops::Range;

use super::MAX_DEPTH;

/// One object key met by the scanner: its bytes between the quotes, and whether any of them is
/// an escape (one without needs no decoding to be compared).
#[derive(Debug, Clone)]
pub struct Key {
    /// Bytes of the key between its quotes.
    pub raw: Range<usize>,
    /// Whether the key holds a backslash escape.
    pub escaped: bool,
}

/// Stands in the key stack where an object opens.
const OPENS: Key = Key {
    raw: usize::MAX..usize::MAX,
    escaped: false,
};

/// A hook into a scan for rules about keys: the keys of the objects being walked are kept on
/// `stack`, and `on_close` sees each nested object's keys when it closes.
pub struct KeyCheck<'a> {
    /// Scratch space, reused between scans.
    pub stack: &'a mut Vec<Key>,
    /// Called with the keys of each object inside the scanned value, as it closes.
    pub on_close: &'a mut dyn FnMut(&[Key]),
}

impl KeyCheck<'_> {
    fn open(&mut self) {
        self.stack.push(OPENS);
    }

    fn close(&mut self) {
        let opened = self
            .stack
            .iter()
            .rposition(|k| k.raw.start == usize::MAX)
            .expect("every object pushed its mark");
        (self.on_close)(&self.stack[opened + 1..]);
        self.stack.truncate(opened);
    }
}

#[inline]
pub(crate) fn skip_ws(b: &[u8], mut i: usize) -> usize {
    while i < b.len() && matches!(b[i], b' ' | b'\t' | b'\n' | b'\r') {
        i += 1;
    }
    i
}

/// Whether any byte is a control character (below 0x20), written so it vectorises.
#[inline]
pub(super) fn any_control(seg: &[u8]) -> bool {
    seg.iter().fold(false, |acc, &c| acc | (c < 0x20))
}

/// The index of the first byte of `word` (8 bytes, little-endian) that ends a run of plain
/// string bytes: a quote, a backslash or a control byte. Eight bytes per step instead of one
/// (keys, ids and channel names are all short strings). Each test flags a matching byte
/// exactly; a borrow can only flag bytes *above* a real match, so the lowest flag is right.
#[inline]
pub(super) fn first_special(word: u64) -> Option<usize> {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    let zero_byte = |x: u64| x.wrapping_sub(ONES) & !x & HIGH;
    let quote = zero_byte(word ^ (ONES * u64::from(b'"')));
    let backslash = zero_byte(word ^ (ONES * u64::from(b'\\')));
    let control = word.wrapping_sub(ONES * 0x20) & !word & HIGH;
    let m = quote | backslash | control;
    (m != 0).then(|| (m.trailing_zeros() / 8) as usize)
}

/// The value of the four hex digits at `b[at..at + 4]`.
#[inline]
pub(super) fn hex4(b: &[u8], at: usize) -> Option<u16> {
    let hex = b.get(at..at + 4)?;
    hex.iter().try_fold(0u16, |n, &c| {
        let d = (c as char).to_digit(16)?;
        Some(n << 4 | d as u16)
    })
}

/// Given `b[i] == '"'`, the index just past the closing quote; `None` if the string is invalid
/// (lone surrogate escapes included).
#[inline]
pub fn skip_string(b: &[u8], i: usize) -> Option<usize> {
    skip_str::<true>(b, i)
}

/// [`skip_string`]; with `PAIRS` false, lone surrogate escapes are let through (diagnosis only).
#[inline]
pub(super) fn skip_str<const PAIRS: bool>(b: &[u8], i: usize) -> Option<usize> {
    skip_str_noting_escapes::<PAIRS>(b, i).map(|(end, _)| end)
}

/// [`skip_str`], also saying whether the string holds a backslash escape (one without needs
/// no decoding: its bytes are its text).
#[inline]
pub(super) fn skip_str_noting_escapes<const PAIRS: bool>(
    b: &[u8],
    i: usize,
) -> Option<(usize, bool)> {
    let mut escaped = false;
    let mut j = i + 1;
    loop {
        // Short strings (keys, ids, channel names) are done byte by byte; long ones (payload
        // text) jump to the next quote or backslash with memchr and check the skipped bytes for
        // control characters in one vectorised pass.
        let short_end = (j + 16).min(b.len());
        let mut k = j;
        while k + 8 <= short_end {
            let word = u64::from_le_bytes(b[k..k + 8].try_into().expect("8 bytes"));
            match first_special(word) {
                Some(at) => {
                    k += at;
                    break;
                }
                None => k += 8,
            }
        }
        while k < short_end && !matches!(b[k], b'"' | b'\\' | 0..=0x1f) {
            k += 1;
        }
        if k == short_end && k < b.len() {
            let stop = memchr::memchr2(b'"', b'\\', &b[k..])? + k;
            if any_control(&b[k..stop]) {
                return None;
            }
            k = stop;
        }
        match *b.get(k)? {
            b'"' => return Some((k + 1, escaped)),
            b'\\' => match *b.get(k + 1)? {
                b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => {
                    escaped = true;
                    j = k + 2;
                }
                b'u' => {
                    escaped = true;
                    let unit = hex4(b, k + 2)?;
                    j = k + 6;
                    if PAIRS {
                        match unit {
                            // A high surrogate must be followed at once by an escaped low one.
                            0xD800..=0xDBFF => {
                                if b.get(j..j + 2) != Some(&b"\\u"[..])
                                    || !matches!(hex4(b, j + 2)?, 0xDC00..=0xDFFF)
                                {
                                    return None;
                                }
                                j += 6;
                            }
                            0xDC00..=0xDFFF => return None,
                            _ => {}
                        }
                    }
                }
                _ => return None,
            },
            _ => return None, // a control character
        }
    }
}

/// Integer digits below which a number without exponent is always a finite double.
pub(super) const FINITE_DIGITS: usize = 300;

/// Validates a number starting at `i`; returns the index just past it. With `FINITE`, a number
/// that overflows a double is refused (only numbers with an exponent or over 300 integer digits
/// are ever converted to check).
pub(super) fn skip_number<const FINITE: bool>(b: &[u8], mut i: usize) -> Option<usize> {
    let start = i;
    let digits = |b: &[u8], mut i: usize| {
        let s = i;
        while i < b.len() && b[i].is_ascii_digit() {
            i += 1;
        }
        (i > s).then_some(i)
    };
    if b.get(i) == Some(&b'-') {
        i += 1;
    }
    let int_start = i;
    match b.get(i)? {
        b'0' => i += 1,
        b'1'..=b'9' => i = digits(b, i)?,
        _ => return None,
    }
    let mut may_overflow = i - int_start > FINITE_DIGITS;
    if b.get(i) == Some(&b'.') {
        i = digits(b, i + 1)?;
    }
    if matches!(b.get(i), Some(b'e' | b'E')) {
        i += 1;
        if matches!(b.get(i), Some(b'+' | b'-')) {
            i += 1;
        }
        i = digits(b, i)?;
        may_overflow = true;
    }
    if FINITE && may_overflow && overflows(&b[start..i]) {
        return None;
    }
    Some(i)
}

/// Whether the number `n` (valid JSON number syntax) is beyond a double's range. Rust's float
/// parser caps an explicit exponent near 65,536 before it weighs the digits, so a long mantissa
/// with a huge exponent (`0.000…1e655360`, 1e309) would read as finite: such numbers are
/// weighed by the power of ten of their first significant digit first.
fn overflows(n: &[u8]) -> bool {
    let finite = |text: &[u8]| {
        std::str::from_utf8(text)
            .ok()
            .and_then(|t| t.parse::<f64>().ok())
            .is_some_and(f64::is_finite)
    };
    let (mantissa, exp) = match n.iter().position(|c| matches!(c, b'e' | b'E')) {
        Some(e) => (&n[..e], &n[e + 1..]),
        None => (n, &b""[..]),
    };
    let negative_exp = exp.first() == Some(&b'-');
    let exp = exp
        .strip_prefix(b"-")
        .or(exp.strip_prefix(b"+"))
        .unwrap_or(exp);
    let exp_digits = &exp[exp.iter().position(|&c| c != b'0').unwrap_or(exp.len())..];
    if exp_digits.len() <= 4 {
        return !finite(n);
    }
    let mantissa = mantissa.strip_prefix(b"-").unwrap_or(mantissa);
    let (int, frac) = match mantissa.iter().position(|&c| c == b'.') {
        Some(dot) => (&mantissa[..dot], &mantissa[dot + 1..]),
        None => (mantissa, &b""[..]),
    };
    // The power of ten of the first significant digit, before the exponent; zero is finite.
    let lead = if int != b"0" {
        int.len() as i64 - 1
    } else {
        match frac.iter().position(|&c| c != b'0') {
            Some(k) => -(k as i64) - 1,
            None => return false,
        }
    };
    let exp: i64 = std::str::from_utf8(exp_digits)
        .ok()
        .and_then(|t| t.parse().ok())
        .unwrap_or(i64::MAX / 2);
    let power = lead.saturating_add(if negative_exp { -exp } else { exp });
    if power > 400 {
        return true;
    }
    if power < -400 {
        return false;
    }
    // Within reach: the significant digits again, with a small exponent.
    let digits: Vec<u8> = int
        .iter()
        .chain(frac)
        .copied()
        .skip_while(|&c| c == b'0')
        .take(800)
        .collect();
    let mut text = b"0.".to_vec();
    text.extend_from_slice(&digits);
    text.extend_from_slice(format!("e{}", power + 1).as_bytes());
    !finite(&text)
}

/// Validates the value starting at `i` (no leading whitespace); returns the index past it.
pub fn skip_value(b: &[u8], i: usize) -> Option<usize> {
    skip_val::<true, true, false>(b, i, MAX_DEPTH, None)
}

/// [`skip_value`] with the two extra rules switchable (diagnosis only), and at most `levels`
/// levels of nesting (the value itself counting as one), showing every object's keys to `keys`.
pub(super) fn skip_val<const FINITE: bool, const PAIRS: bool, const KEYS: bool>(
    b: &[u8],
    i: usize,
    levels: usize,
    keys: Option<&mut KeyCheck<'_>>,
) -> Option<usize> {
    match *b.get(i)? {
        b'"' => skip_str::<PAIRS>(b, i),
        b'{' | b'[' => skip_container::<FINITE, PAIRS, KEYS>(b, i, levels, keys),
        b't' => b.get(i..i + 4).filter(|s| *s == b"true").map(|_| i + 4),
        b'f' => b.get(i..i + 5).filter(|s| *s == b"false").map(|_| i + 5),
        b'n' => b.get(i..i + 4).filter(|s| *s == b"null").map(|_| i + 4),
        _ => skip_number::<FINITE>(b, i),
    }
}

/// Validates an object or array, at most `levels` deep (at most [`MAX_DEPTH`]), with an
/// explicit stack (no recursion), showing every object's keys to `keys` (with `KEYS`; without,
/// the key code is compiled out of the mod's hot path).
pub(super) fn skip_container<const FINITE: bool, const PAIRS: bool, const KEYS: bool>(
    b: &[u8],
    i: usize,
    levels: usize,
    mut keys: Option<&mut KeyCheck<'_>>,
) -> Option<usize> {
    let levels = levels.min(MAX_DEPTH);
    // Each stack entry says whether that level is an object.
    let mut stack = [false; MAX_DEPTH];
    let mut depth = 0usize;
    let mut j = i;
    // Open the first container, then loop: at each step we are just after an opening bracket
    // or a comma (expecting a member/element) or just after a value.
    let open = |b: &[u8],
                j: usize,
                stack: &mut [bool; MAX_DEPTH],
                depth: &mut usize,
                keys: &mut Option<&mut KeyCheck<'_>>| {
        if *depth == levels {
            return None;
        }
        let is_object = b[j] == b'{';
        stack[*depth] = is_object;
        if let (true, true, Some(k)) = (KEYS, is_object, keys.as_deref_mut()) {
            k.open();
        }
        *depth += 1;
        Some(j + 1)
    };
    j = open(b, j, &mut stack, &mut depth, &mut keys)?;
    let mut expect_item = true;
    let mut first = true;
    loop {
        j = skip_ws(b, j);
        let in_object = stack[depth - 1];
        let close = if in_object { b'}' } else { b']' };
        if expect_item {
            let c = *b.get(j)?;
            if first && c == close {
                // Empty container.
                if let (true, true, Some(k)) = (KEYS, in_object, keys.as_deref_mut()) {
                    k.close();
                }
                depth -= 1;
                j += 1;
                if depth == 0 {
                    return Some(j);
                }
                expect_item = false;
                first = false;
                continue;
            }
            if in_object {
                if c != b'"' {
                    return None;
                }
                let (key_end, escaped) = skip_str_noting_escapes::<PAIRS>(b, j)?;
                if let (true, Some(k)) = (KEYS, keys.as_deref_mut()) {
                    k.stack.push(Key {
                        raw: j + 1..key_end - 1,
                        escaped,
                    });
                }
                j = skip_ws(b, key_end);
                if b.get(j) != Some(&b':') {
                    return None;
                }
                j = skip_ws(b, j + 1);
            }
            match *b.get(j)? {
                b'{' | b'[' => {
                    j = open(b, j, &mut stack, &mut depth, &mut keys)?;
                    first = true;
                    continue;
                }
                // Containers are opened above: only scalars get here.
                _ => j = skip_val::<FINITE, PAIRS, false>(b, j, 0, None)?,
            }
            expect_item = false;
            first = false;
        } else {
            match *b.get(j)? {
                b',' => {
                    j += 1;
                    expect_item = true;
                    first = false;
                }
                c if c == close => {
                    if let (true, true, Some(k)) = (KEYS, in_object, keys.as_deref_mut()) {
                        k.close();
                    }
                    depth -= 1;
                    j += 1;
                    if depth == 0 {
                        return Some(j);
                    }
                }
                _ => return None,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{first_special, overflows};

    #[test]
    fn a_huge_exponent_is_weighed_with_its_digits() {
        let zeros = |n: usize| "0".repeat(n);
        for (n, beyond) in [
            (format!("0.{}1e655360", zeros(655_050)), true),
            (format!("1{}e-655360", zeros(655_360)), false),
            (format!("0.{}1e655360", zeros(655_500)), false),
            ("1e99999".to_string(), true),
            ("-1e99999".to_string(), true),
            ("1e-99999".to_string(), false),
            (format!("0.{}e99999", zeros(30)), false),
            ("1.7976931348623157e308".to_string(), false),
            ("1e309".to_string(), true),
            (format!("17976931348623157{}e-10000", zeros(10_292)), false),
            (format!("17976931348623157{}e-10000", zeros(10_293)), true),
        ] {
            assert_eq!(
                overflows(n.as_bytes()),
                beyond,
                "{}…",
                &n[..n.len().min(40)]
            );
        }
    }

    /// The word test agrees with the byte test for every byte in every position, next to
    /// bytes that could borrow into it.
    #[test]
    fn first_special_agrees_with_the_byte_test() {
        let special = |c: u8| matches!(c, b'"' | b'\\' | 0..=0x1f);
        for pos in 0..8 {
            for c in 0..=255u8 {
                for fill in [b'a', 0x00, 0x20, 0x21, 0x22, 0x5c, 0x7f, 0x80, 0xff] {
                    let mut w = [fill; 8];
                    w[pos] = c;
                    let want = w.iter().position(|&x| special(x));
                    assert_eq!(first_special(u64::from_le_bytes(w)), want, "{w:?}");
                }
            }
        }
    }
}
