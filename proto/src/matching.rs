//! How a replay matches a bridge's request to a recorded one, and which requests are an agent's
//! calls. One rule for the replay, which answers requests from recorded answers, and the call
//! check, which compares an agent's calls with a recording's: both read params the same way.
//!
//! The modes (`replay --match`):
//! - [`MatchRule::Exact`]: same method, and params equal as canonical JSON (parsed, object keys
//!   sorted, written compactly; absent params read as `{}`).
//! - [`MatchRule::Ignore`]: as exact, once the fields named by the [`FieldPath`]s are removed
//!   from both sides (an array element named is replaced by `null`, so the others keep their
//!   places).
//! - [`MatchRule::Order`]: same method, whatever the params: the Nth call of a method from a
//!   bridge gets the Nth recorded answer of that method.

use std::hash::{Hash, Hasher};

use serde_json::Value;

/// Calls the call check keeps per side (recorded, and an agent's): the rest are counted.
pub const MAX_CALLS: usize = 100_000;
/// Bytes of params the call check keeps per side: calls past it are counted, not kept.
pub const MAX_CALL_BYTES: usize = 64 << 20;

/// Whether a bridge's request to `method` is an agent's call: every request but the hello,
/// `events/*` (subscriptions, answered by the relay) and `relay/*` (the relay's own: status,
/// marks, the lease).
pub fn is_agent_call(method: &str) -> bool {
    method != "session/hello" && !method.starts_with("events/") && !method.starts_with("relay/")
}

/// The tool a `tools/call` names (`params.name`), if it names one.
pub fn tool_name<'a>(method: &str, params: Option<&'a Value>) -> Option<&'a str> {
    (method == "tools/call")
        .then(|| params?.get("name")?.as_str())
        .flatten()
}

/// A field of a request to leave out of matching: a JSON pointer (`/params/arguments/ts`) or a
/// dotted path (`params.arguments.ts`), starting at the request's `params`. A `*` segment stands
/// for every member of an object or element of an array.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldPath {
    text: String,
    /// Segments under `params`.
    segments: Vec<String>,
}

impl std::fmt::Display for FieldPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

impl std::str::FromStr for FieldPath {
    type Err = String;

    fn from_str(s: &str) -> Result<FieldPath, String> {
        let segments: Vec<String> = if let Some(pointer) = s.strip_prefix('/') {
            // RFC 6901: `~1` is `/`, `~0` is `~`, in that order.
            pointer
                .split('/')
                .map(|p| p.replace("~1", "/").replace("~0", "~"))
                .collect()
        } else {
            s.split('.').map(str::to_string).collect()
        };
        if segments.first().map(String::as_str) != Some("params") {
            return Err(format!(
                "{s:?} does not start at params: write it as params.arguments.timestamp or /params/arguments/timestamp"
            ));
        }
        if segments.iter().any(String::is_empty) {
            return Err(format!("{s:?} has an empty segment"));
        }
        Ok(FieldPath {
            text: s.to_string(),
            segments: segments[1..].to_vec(),
        })
    }
}

impl FieldPath {
    /// Removes what the path names from `params` (see the module doc).
    fn remove(&self, params: &mut Value) {
        if self.segments.is_empty() {
            *params = Value::Null;
            return;
        }
        remove_at(params, &self.segments);
    }
}

fn remove_at(v: &mut Value, segments: &[String]) {
    let (first, rest) = (&segments[0], &segments[1..]);
    match v {
        Value::Object(map) => {
            if first == "*" {
                if rest.is_empty() {
                    map.clear();
                } else {
                    map.values_mut().for_each(|c| remove_at(c, rest));
                }
            } else if rest.is_empty() {
                map.remove(first);
            } else if let Some(c) = map.get_mut(first) {
                remove_at(c, rest);
            }
        }
        Value::Array(items) => {
            let picked: Vec<&mut Value> = if first == "*" {
                items.iter_mut().collect()
            } else {
                first
                    .parse::<usize>()
                    .ok()
                    .and_then(|i| items.get_mut(i))
                    .into_iter()
                    .collect()
            };
            for c in picked {
                if rest.is_empty() {
                    *c = Value::Null;
                } else {
                    remove_at(c, rest);
                }
            }
        }
        _ => {}
    }
}

/// How requests are matched (see the module doc).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum MatchRule {
    /// Method and params, as canonical JSON.
    #[default]
    Exact,
    /// Method and params without these fields.
    Ignore(Vec<FieldPath>),
    /// Method only, by order of calls.
    Order,
}

impl MatchRule {
    /// The mode's name, as `--match` takes it.
    pub fn name(&self) -> &'static str {
        match self {
            MatchRule::Exact => "exact",
            MatchRule::Ignore(_) => "ignore",
            MatchRule::Order => "order",
        }
    }

    /// The fields left out (empty unless [`MatchRule::Ignore`]).
    pub fn ignored(&self) -> &[FieldPath] {
        match self {
            MatchRule::Ignore(paths) => paths,
            _ => &[],
        }
    }

    /// The params as they are compared: parsed (absent or unreadable params read as `{}`), with
    /// the ignored fields removed; `None` under [`MatchRule::Order`], which compares none.
    pub fn compared(&self, params: Option<&[u8]>) -> Option<Value> {
        if *self == MatchRule::Order {
            return None;
        }
        let mut v = params
            .and_then(|p| serde_json::from_slice::<Value>(p).ok())
            .unwrap_or_else(|| Value::Object(Default::default()));
        for path in self.ignored() {
            path.remove(&mut v);
        }
        Some(v)
    }

    /// The key of a request under this rule: a 128-bit hash of its method and its compared
    /// params written canonically (two independent SipHash passes, so distinct requests never
    /// share a key in practice).
    pub fn key(&self, method: &str, params: Option<&[u8]>) -> u128 {
        // serde_json's maps are ordered by key (no `preserve_order`), so this is canonical.
        let canonical = self
            .compared(params)
            .map(|v| serde_json::to_string(&v).unwrap_or_default())
            .unwrap_or_default();
        let half = |salt: u8| {
            let mut h = std::collections::hash_map::DefaultHasher::new();
            salt.hash(&mut h);
            method.hash(&mut h);
            canonical.hash(&mut h);
            h.finish()
        };
        (u128::from(half(1)) << 64) | u128::from(half(2))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ignore(paths: &[&str]) -> MatchRule {
        MatchRule::Ignore(paths.iter().map(|p| p.parse().expect("a path")).collect())
    }

    #[test]
    fn exact_keys_ignore_key_order_and_read_absent_params_as_empty() {
        let r = MatchRule::Exact;
        let a = r.key(
            "tools/call",
            Some(br#"{"name":"x","arguments":{"q":1,"r":2}}"#),
        );
        let b = r.key(
            "tools/call",
            Some(br#"{"arguments":{"r":2,"q":1},"name":"x"}"#),
        );
        let c = r.key(
            "tools/call",
            Some(br#"{"name":"x","arguments":{"q":2,"r":2}}"#),
        );
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert_eq!(r.key("m/x", None), r.key("m/x", Some(b"{}")));
    }

    #[test]
    fn ignored_fields_are_removed_by_pointer_dotted_path_and_wildcard() {
        let p = br#"{"name":"x","arguments":{"q":1,"ts":5,"items":[{"id":"a","v":1},{"id":"b","v":2}]}}"#;
        let r = ignore(&["params.arguments.ts", "/params/arguments/items/*/id"]);
        assert_eq!(
            r.compared(Some(p)),
            Some(json!({"name":"x","arguments":{"q":1,"items":[{"v":1},{"v":2}]}}))
        );
        let q = br#"{"name":"x","arguments":{"q":1,"ts":9,"items":[{"id":"z","v":1},{"id":"y","v":2}]}}"#;
        assert_eq!(r.key("tools/call", Some(p)), r.key("tools/call", Some(q)));
        assert_ne!(
            MatchRule::Exact.key("tools/call", Some(p)),
            MatchRule::Exact.key("tools/call", Some(q))
        );
        // An array element named by its index is nulled, so later ones keep their places.
        let r = ignore(&["params.list.0"]);
        assert_eq!(
            r.compared(Some(br#"{"list":[1,2]}"#)),
            Some(json!({"list":[null,2]}))
        );
        // Pointer escapes.
        let r = ignore(&["/params/a~1b"]);
        assert_eq!(
            r.compared(Some(br#"{"a/b":1,"c":2}"#)),
            Some(json!({"c":2}))
        );
    }

    #[test]
    fn paths_start_at_params() {
        assert!("arguments.ts".parse::<FieldPath>().is_err());
        assert!("/arguments".parse::<FieldPath>().is_err());
        assert!("params..ts".parse::<FieldPath>().is_err());
        assert!("params".parse::<FieldPath>().is_ok());
    }

    #[test]
    fn order_keys_on_the_method_alone() {
        let r = MatchRule::Order;
        assert_eq!(
            r.key("tools/call", Some(br#"{"name":"a"}"#)),
            r.key("tools/call", Some(br#"{"name":"b"}"#))
        );
        assert_ne!(r.key("tools/call", None), r.key("tools/list", None));
        assert_eq!(r.compared(Some(b"{}")), None);
    }

    #[test]
    fn agent_calls_leave_out_the_relay_and_the_subscriptions() {
        assert!(is_agent_call("tools/call") && is_agent_call("state/get"));
        for m in [
            "session/hello",
            "events/subscribe",
            "relay/mark",
            "relay/status",
        ] {
            assert!(!is_agent_call(m), "{m}");
        }
        let p = json!({"name": "sim/echo"});
        assert_eq!(tool_name("tools/call", Some(&p)), Some("sim/echo"));
        assert_eq!(tool_name("tools/list", Some(&p)), None);
    }
}
