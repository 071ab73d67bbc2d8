//! Tokens: generation from the OS RNG, constant-time comparison, and throttling of failures.
//!
//! Tokens are never logged or recorded. A failed hello is answered only after a delay that
//! grows with the source's recent failures, so guessing is slow, while a correct token is
//! always answered at once and other sources are never delayed.
//!
//! Redaction, for everything the relay records: a valid hello is recorded with its
//! token replaced; any frame has every occurrence of the route's secrets replaced at the byte
//! level, whatever its validity, and inside decoded strings when the frame has `\u` escapes;
//! and a frame that failed strict parsing and could spell a token
//! in a way the byte-level pass cannot see (a `token` key, `\u` escapes) is withheld: a short
//! note stands in its place. Names a bridge chose (channels, methods, tools) may spell a token
//! too: [`Redactor::hits`] and [`Redactor::redact_name`] keep them out of metric labels, log
//! lines and `relay/status`.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use parking_lot::Mutex;
use serde_json::{json, Value};
use subtle::ConstantTimeEq;

/// The shortest bridge token the relay takes without a warning (`--token`, the config's
/// `token` and `token_file`). Generated tokens are 32 hex digits; a short one could be guessed
/// even through the per-source throttle. Shorter ones still work (launchers and existing
/// scripts choose their own), but the operator is told once at start-up.
pub const MIN_TOKEN_LEN: usize = 16;

/// Warns (never failing, never repeating the token) when a bridge token set by the operator is
/// shorter than [`MIN_TOKEN_LEN`] characters; `what` names where it was set.
pub fn warn_if_short(token: &str, what: &str) {
    if token.chars().count() < MIN_TOKEN_LEN {
        tracing::warn!(
            "{what} is shorter than {MIN_TOKEN_LEN} characters: a bridge could guess it \
             (`gabp-relay token` prints a fresh one)"
        );
    }
}

/// A fresh 128-bit token as 32 lowercase hex digits.
pub fn generate_token() -> String {
    let mut bytes = [0u8; 16];
    getrandom(&mut bytes);
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn getrandom(buf: &mut [u8]) {
    use rand::RngCore;
    // OsRng reads the kernel's CSPRNG (getrandom(2)).
    rand::rngs::OsRng.fill_bytes(buf);
}

/// Compares a presented token with the expected one in time independent of where they differ.
pub fn token_matches(expected: &str, presented: &str) -> bool {
    let (e, p) = (expected.as_bytes(), presented.as_bytes());
    // Only the length can leak, and token lengths are public (32 hex digits when generated).
    e.len() == p.len() && bool::from(e.ct_eq(p))
}

/// Per-source memory of failed hellos.
#[derive(Debug, Default)]
pub struct FailureThrottle {
    sources: Mutex<HashMap<String, (u32, Instant)>>,
}

/// Failures are forgotten after this long without another.
const FORGET_AFTER: Duration = Duration::from_secs(60);
/// The longest delay before a failure is answered.
const MAX_DELAY: Duration = Duration::from_secs(2);
/// Sources remembered at most; the map never grows without bound.
const MAX_SOURCES: usize = 4096;

impl FailureThrottle {
    /// Records a failure from `source` and returns how long to wait before answering it.
    pub fn fail(&self, source: &str) -> Duration {
        let now = Instant::now();
        let mut map = self.sources.lock();
        if map.len() >= MAX_SOURCES {
            map.retain(|_, (_, at)| now.duration_since(*at) < FORGET_AFTER);
            if map.len() >= MAX_SOURCES {
                map.clear();
            }
        }
        let entry = map.entry(source.to_string()).or_insert((0, now));
        if now.duration_since(entry.1) > FORGET_AFTER {
            entry.0 = 0;
        }
        entry.0 = entry.0.saturating_add(1);
        entry.1 = now;
        let shift = entry.0.saturating_sub(1).min(10);
        (Duration::from_millis(10) * (1u32 << shift)).min(MAX_DELAY)
    }

    /// Forgets a source's failures after it succeeds.
    pub fn succeed(&self, source: &str) {
        self.sources.lock().remove(source);
    }
}

/// The part of a peer description that identifies its source (the IP, not the port).
pub fn source_of(peer: &str) -> String {
    match peer.parse::<std::net::SocketAddr>() {
        Ok(a) => a.ip().to_string(),
        Err(_) => peer.to_string(),
    }
}

/// What replaces a secret in anything recorded.
pub const REDACTED: &str = "[redacted]";

/// Secrets shorter than this are not searched for byte by byte (a short one would match
/// ordinary text and mangle recordings; tokens are 32 hex digits when generated).
const MIN_SECRET: usize = 8;

/// `body` with every occurrence of each secret replaced by [`REDACTED`], whether written plain
/// or spelled with JSON `\u` escapes; the same buffer (no copy) when none occurs.
pub fn redact(body: &Bytes, secrets: &[&str]) -> Bytes {
    Redactor::new(secrets).redact(body)
}

/// Secrets with their searchers built once: building a searcher costs more than searching a
/// small frame, and every recorded frame is searched.
#[derive(Debug, Clone)]
pub struct Redactor {
    secrets: Vec<String>,
    /// The searchers of the secrets long enough to search for byte by byte.
    finders: Vec<memchr::memmem::Finder<'static>>,
}

impl Redactor {
    /// The redactor of `secrets`.
    pub fn new(secrets: &[&str]) -> Redactor {
        Redactor {
            secrets: secrets.iter().map(|s| s.to_string()).collect(),
            finders: secrets
                .iter()
                .filter(|s| s.len() >= MIN_SECRET)
                .map(|s| memchr::memmem::Finder::new(s.as_bytes()).into_owned())
                .collect(),
        }
    }

    /// [`redact`] with these secrets.
    pub fn redact(&self, body: &Bytes) -> Bytes {
        // A `\u` escape can spell any character of a token, so a byte search cannot see it
        // (and a byte-level replacement could cut an escape in half): such frames (rare:
        // bridges and mods write ASCII-safe text mostly unescaped) are decoded and their
        // strings searched. One that cannot be decoded is withheld.
        static ESCAPE: std::sync::LazyLock<memchr::memmem::Finder<'static>> =
            std::sync::LazyLock::new(|| memchr::memmem::Finder::new(b"\\u"));
        if self.finders.is_empty() || ESCAPE.find(body).is_none() {
            return self.redact_plain(body);
        }
        let Ok(mut msg) = serde_json::from_slice::<Value>(body) else {
            return withheld(body.len());
        };
        let secrets: Vec<&str> = self.secrets.iter().map(String::as_str).collect();
        if redact_value(&mut msg, &secrets) {
            Bytes::from(gabp_proto::message::to_ascii_json(&msg))
        } else {
            body.clone()
        }
    }

    /// Whether `name` (a decoded string: a method, channel or tool name) holds a secret.
    pub fn hits(&self, name: &str) -> bool {
        self.finders
            .iter()
            .any(|f| f.find(name.as_bytes()).is_some())
    }

    /// `name` with every secret replaced by [`REDACTED`]; itself, without a copy, when it
    /// holds none (names are checked on every refusal and status answer).
    pub fn redact_name<'a>(&self, name: &'a str) -> std::borrow::Cow<'a, str> {
        if !self.hits(name) {
            return std::borrow::Cow::Borrowed(name);
        }
        let secrets: Vec<&str> = self.secrets.iter().map(String::as_str).collect();
        std::borrow::Cow::Owned(redact_str(name, &secrets))
    }

    /// Replaces the secrets inside every string and key of `v`; whether anything changed.
    pub fn redact_json(&self, v: &mut Value) -> bool {
        let secrets: Vec<&str> = self.secrets.iter().map(String::as_str).collect();
        redact_value(v, &secrets)
    }

    /// Replaces every plain occurrence of a secret, without decoding (so never withholds).
    pub fn redact_plain(&self, body: &Bytes) -> Bytes {
        let mut out: Option<Vec<u8>> = None;
        for finder in &self.finders {
            let cur: &[u8] = out.as_deref().unwrap_or(body);
            if finder.find(cur).is_none() {
                continue;
            }
            let mut next = Vec::with_capacity(cur.len());
            let mut at = 0;
            for hit in finder.find_iter(cur) {
                next.extend_from_slice(&cur[at..hit]);
                next.extend_from_slice(REDACTED.as_bytes());
                at = hit + finder.needle().len();
            }
            next.extend_from_slice(&cur[at..]);
            out = Some(next);
        }
        out.map_or_else(|| body.clone(), Bytes::from)
    }
}

/// Replaces secrets inside every decoded string and key of `v`; whether anything changed.
fn redact_value(v: &mut Value, secrets: &[&str]) -> bool {
    let hit = |s: &str| {
        secrets
            .iter()
            .any(|secret| secret.len() >= MIN_SECRET && s.contains(secret))
    };
    match v {
        Value::String(s) if hit(s) => {
            *s = redact_str(s, secrets);
            true
        }
        Value::Array(items) => items
            .iter_mut()
            .fold(false, |changed, x| redact_value(x, secrets) | changed),
        Value::Object(map) => {
            let mut changed = false;
            if map.keys().any(|k| hit(k)) {
                let old = std::mem::take(map);
                for (k, x) in old {
                    map.insert(redact_str(&k, secrets), x);
                }
                changed = true;
            }
            map.values_mut()
                .fold(changed, |changed, x| redact_value(x, secrets) | changed)
        }
        _ => false,
    }
}

/// `s` with every occurrence of each secret replaced by [`REDACTED`].
pub fn redact_str(s: &str, secrets: &[&str]) -> String {
    let mut out = s.to_string();
    for secret in secrets.iter().filter(|s| s.len() >= MIN_SECRET) {
        if out.contains(*secret) {
            out = out.replace(*secret, REDACTED);
        }
    }
    out
}

/// A strictly valid `session/hello` as it may be recorded: its token replaced (then the
/// byte-level pass, for a secret elsewhere in it).
pub fn redact_hello(body: &Bytes, secrets: &[&str]) -> Bytes {
    let Ok(mut msg) = serde_json::from_slice::<Value>(body) else {
        return withheld(body.len());
    };
    if let Some(params) = msg.get_mut("params").and_then(Value::as_object_mut) {
        if params.contains_key("token") {
            params.insert("token".into(), json!(REDACTED));
        }
    }
    let out = Bytes::from(gabp_proto::message::to_ascii_json(&msg));
    redact(&out, secrets)
}

/// A frame that failed strict parsing, as it may be recorded: `(body, json_ok)`. Kept byte for
/// byte (secrets redacted) unless it could carry a token the byte-level pass cannot see;
/// `json_ok` says whether what is kept is JSON any reader can decode (a request refused for
/// its method or params is, and exports as a message, not as text).
pub fn redact_unparsed(body: &Bytes, secrets: &[&str]) -> (Bytes, bool) {
    let lower = body.to_ascii_lowercase();
    let risky = memchr::memmem::find(&lower, b"token").is_some()
        || memchr::memmem::find(&lower, b"\\u").is_some();
    if risky {
        (withheld(body.len()), true)
    } else {
        let kept = redact(body, secrets);
        let json_ok = std::str::from_utf8(&kept).is_ok() && gabp_proto::scan::is_valid_json(&kept);
        (kept, json_ok)
    }
}

/// The note recorded in place of a withheld frame.
fn withheld(len: usize) -> Bytes {
    let note = json!({"relay": "frame withheld: unparseable and may carry a token", "bytes": len});
    let mut b = BytesMut::new();
    b.extend_from_slice(note.to_string().as_bytes());
    b.freeze()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redaction_replaces_every_occurrence_and_copies_only_when_needed() {
        let secret = "0123456789abcdef0123456789abcdef";
        let body = Bytes::from(format!(r#"{{"a":"{secret}","b":"x{secret}{secret}"}}"#));
        let out = redact(&body, &[secret, ""]);
        let text = std::str::from_utf8(&out).expect("utf8");
        assert!(!text.contains(secret));
        assert_eq!(text.matches(REDACTED).count(), 3);
        let clean = Bytes::from_static(b"{\"a\":1}");
        assert_eq!(
            redact(&clean, &[secret]).as_ptr(),
            clean.as_ptr(),
            "no copy without a hit"
        );
        assert_eq!(
            &redact(&Bytes::from_static(b"short"), &["short"])[..],
            b"short"
        );
    }

    #[test]
    fn names_are_checked_and_redacted_without_a_copy_when_clean() {
        let secret = "0123456789abcdef0123456789abcdef";
        let r = Redactor::new(&[secret, "short"]);
        let name = format!("game/t{secret}");
        assert!(r.hits(&name));
        assert!(!r.hits("game/short"), "short secrets are not searched for");
        assert_eq!(r.redact_name(&name), format!("game/t{REDACTED}"));
        assert!(matches!(
            r.redact_name("game/move"),
            std::borrow::Cow::Borrowed(_)
        ));
        let mut v = json!({"subscriptions": [format!("c/{secret}"), "c/ok"], secret: 1});
        assert!(r.redact_json(&mut v));
        assert!(!v.to_string().contains(secret), "{v}");
        assert_eq!(v["subscriptions"][1], "c/ok");
        assert!(!r.redact_json(&mut v), "nothing left to change");
    }

    #[test]
    fn escaped_tokens_in_valid_frames_are_redacted_and_other_escapes_kept() {
        let secret = "0123456789abcdef0123456789abcdef";
        // One escaped character is enough to hide the token from a byte search.
        let hidden = format!("\\u0030{}", &secret[1..]);
        let all = secret
            .chars()
            .map(|c| format!("\\u{:04x}", c as u32))
            .collect::<String>();
        for spelled in [hidden, all] {
            let body = Bytes::from(format!(
                r#"{{"params":{{"arguments":{{"x":"a{spelled}b","{spelled}":[1,"{spelled}"]}}}}}}"#
            ));
            let out = redact(&body, &[secret]);
            let decoded: Value = serde_json::from_slice(&out).expect("still JSON");
            let text = decoded.to_string();
            assert!(!text.contains(secret), "{text}");
            assert_eq!(text.matches(REDACTED).count(), 3, "{text}");
        }
        // Escapes that spell no secret: the frame is kept byte for byte, without a copy.
        let body = Bytes::from_static(br#"{"x":"caf\u00e9"}"#);
        assert_eq!(redact(&body, &[secret]).as_ptr(), body.as_ptr());
    }

    #[test]
    fn unparsed_frames_that_may_spell_a_token_are_withheld() {
        let secret = "0123456789abcdef0123456789abcdef";
        for risky in [
            r#"{"params":{"TOKEN":"x"}"#,
            r#"{"params":{"\u0074oken":"x"}} junk"#,
            r#"{"params":{"t":"\u0030123"}"#,
        ] {
            let (out, _) = redact_unparsed(&Bytes::from(risky), &[secret]);
            assert!(
                std::str::from_utf8(&out)
                    .expect("utf8")
                    .contains("withheld"),
                "{risky}"
            );
        }
        let (out, json_ok) =
            redact_unparsed(&Bytes::from(format!("{{not json {secret}")), &[secret]);
        assert!(!json_ok);
        assert_eq!(&out[..], format!("{{not json {REDACTED}").as_bytes());
        // Valid JSON refused for what it says (a bad tool name) is kept as JSON, redacted.
        let refused = format!(
            r#"{{"v":"gabp/1","id":"x","type":"request","method":"tools/call","params":{{"name":"Bad Name","arguments":{{"k":"{secret}"}}}}}}"#
        );
        let (out, json_ok) = redact_unparsed(&Bytes::from(refused), &[secret]);
        assert!(json_ok);
        let v: serde_json::Value = serde_json::from_slice(&out).expect("still JSON");
        assert_eq!(v["params"]["arguments"]["k"], REDACTED);
        // A number past a double's range is JSON no reader decodes: kept as text.
        assert!(!redact_unparsed(&Bytes::from(r#"{"x":1e999}"#), &[secret]).1);
    }

    #[test]
    fn hellos_lose_their_token() {
        let secret = "0123456789abcdef0123456789abcdef";
        let body = Bytes::from(format!(
            r#"{{"v":"gabp/1","id":"x","type":"request","method":"session/hello","params":{{"token":"{secret}","launchId":"{secret}"}}}}"#
        ));
        let out = redact_hello(&body, &[secret]);
        let text = std::str::from_utf8(&out).expect("utf8");
        assert!(!text.contains(secret), "{text}");
        assert!(text.contains(REDACTED));
    }

    #[test]
    fn tokens_are_128_bit_hex_and_distinct() {
        let a = generate_token();
        assert_eq!(a.len(), 32);
        assert!(a.bytes().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, generate_token());
    }

    #[test]
    fn comparison() {
        assert!(token_matches("abc", "abc"));
        assert!(!token_matches("abc", "abd"));
        assert!(!token_matches("abc", "ab"));
        assert!(!token_matches("abc", ""));
    }

    #[test]
    fn delay_grows_per_source_and_resets_on_success() {
        let t = FailureThrottle::default();
        let d1 = t.fail("1.2.3.4");
        let d2 = t.fail("1.2.3.4");
        assert!(d2 > d1);
        assert_eq!(t.fail("5.6.7.8"), d1, "other sources are not slowed");
        for _ in 0..50 {
            assert!(t.fail("1.2.3.4") <= MAX_DELAY);
        }
        t.succeed("1.2.3.4");
        assert_eq!(t.fail("1.2.3.4"), d1);
    }
}
