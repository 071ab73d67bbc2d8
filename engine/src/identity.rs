//! Bridge identities: who a bridge is (the token it presented), what it may do (its role and
//! tool globs), how fast (a token bucket), and the reload that swaps the set while bridges
//! stay connected.
//!
//! A route's identities are its `[[route.bridge]]` tables plus the implicit one of its single
//! `token` (`--token`): role `control`, no name (`default` in metrics and messages). A hello's
//! token is compared with every identity's, in constant time and without stopping at a match,
//! so the time taken does not tell which identity (if any) matched.
//!
//! Rights, checked before anything reaches the mod (see [`Identity::check`]):
//! - `observe` may subscribe, list tools, read status and mark the recording; of the mod's
//!   methods it may call only [`OBSERVE_METHODS`] (reads). No `tools/call`, no `attention/ack`,
//!   no `relay/lease`.
//! - `methods` globs apply to every method bound for the mod, `tools` globs to `tools/call`'s
//!   tool name: a name is allowed when no `!deny` glob matches it and, if there is any allow
//!   glob, at least one allow glob matches it. Deny wins; order does not matter. `*` matches
//!   any run of characters (`/` included), `?` one. Read methods ([`OBSERVE_METHODS`]) need
//!   no allow glob (a `!` glob still refuses them). An identity with `tools` and no `methods`
//!   may call, besides reads, only `tools/call`: restricting its tools restricts its writes.
//! - The lease (`relay/lease`) may be held only by a `control` identity that may call at least
//!   one leased tool ([`Identity::may_hold_lease`]).
//! - `calls_per_second` bounds every request after the hello, the relay's own included (token
//!   bucket, burst of one second's worth, at least 1), shared by all of the identity's
//!   connections.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use subtle::{Choice, ConditionallySelectable, ConstantTimeEq};
use tokio_util::sync::CancellationToken;

/// What the implicit identity (the route's single token) is called in metrics and messages.
pub const DEFAULT_NAME: &str = gabp_storage::catalog::DEFAULT_IDENTITY;
/// The longest time to live a route may allow for the lease (`lease_max_ttl`).
pub const MAX_TTL_MS: u64 = 3_600_000;
/// The longest time to live one lease request may ask for, unless the route sets
/// `lease_max_ttl`.
pub const DEFAULT_MAX_TTL: Duration = Duration::from_secs(300);
/// Mod methods an `observe` bridge may call: reads only.
pub const OBSERVE_METHODS: &[&str] = &[
    "tools/list",
    "events/list",
    "resources/list",
    "resources/read",
    "attention/current",
    "state/get",
];
/// Longest identity name (names become metric labels).
pub const MAX_NAME: usize = 64;
/// Highest `calls_per_second`.
pub const MAX_RATE: f64 = 1_000_000.0;

/// What a bridge may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Role {
    /// Everything.
    #[default]
    Control,
    /// Subscribe, list, status; no tool calls, no attention acks, no lease.
    Observe,
}

impl Role {
    /// The config spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Control => "control",
            Role::Observe => "observe",
        }
    }
}

impl std::str::FromStr for Role {
    type Err = String;
    fn from_str(s: &str) -> Result<Role, String> {
        match s {
            "control" => Ok(Role::Control),
            "observe" => Ok(Role::Observe),
            _ => Err(format!("unknown role {s:?}: expected control or observe")),
        }
    }
}

/// Whether `name` matches `glob` (`*` any run of characters, `?` exactly one).
pub fn glob_matches(glob: &str, name: &str) -> bool {
    let (g, n): (Vec<char>, Vec<char>) = (glob.chars().collect(), name.chars().collect());
    // Iterative wildcard match with one backtrack point: linear in practice, never exponential.
    let (mut gi, mut ni, mut star, mut mark) = (0, 0, None, 0);
    while ni < n.len() {
        if gi < g.len() && (g[gi] == '?' || g[gi] == n[ni]) {
            gi += 1;
            ni += 1;
        } else if gi < g.len() && g[gi] == '*' {
            star = Some(gi);
            mark = ni;
            gi += 1;
        } else if let Some(s) = star {
            gi = s + 1;
            mark += 1;
            ni = mark;
        } else {
            return false;
        }
    }
    g[gi..].iter().all(|&c| c == '*')
}

/// Whether some string matches both globs (`*` any run, `?` one character): a walk over
/// pairs of positions, at most `(|a| + 1) × (|b| + 1)` of them.
pub fn globs_overlap(a: &str, b: &str) -> bool {
    let (a, b): (Vec<char>, Vec<char>) = (a.chars().collect(), b.chars().collect());
    let width = b.len() + 1;
    let mut seen = vec![false; (a.len() + 1) * width];
    let mut todo = vec![(0usize, 0usize)];
    while let Some((i, j)) = todo.pop() {
        if std::mem::replace(&mut seen[i * width + j], true) {
            continue;
        }
        match (a.get(i), b.get(j)) {
            (None, None) => return true,
            (Some('*'), _) | (_, Some('*')) => {
                // A star matches nothing (step past it) or one more character of the other
                // side (stay on it, step the other side).
                if a.get(i) == Some(&'*') {
                    todo.push((i + 1, j));
                    if j < b.len() {
                        todo.push((i, j + 1));
                    }
                }
                if b.get(j) == Some(&'*') {
                    todo.push((i, j + 1));
                    if i < a.len() {
                        todo.push((i + 1, j));
                    }
                }
            }
            (Some(x), Some(y)) if *x == '?' || *y == '?' || x == y => todo.push((i + 1, j + 1)),
            _ => {}
        }
    }
    false
}

/// Allow and deny globs over tool (or method) names.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ToolRules {
    allow: Vec<String>,
    deny: Vec<String>,
}

impl ToolRules {
    /// Rules from config globs (`!` marks a deny); an empty or bare `!` glob is an error.
    pub fn parse(globs: &[String]) -> Result<ToolRules, String> {
        let mut r = ToolRules::default();
        for g in globs {
            let (deny, pat) = match g.strip_prefix('!') {
                Some(p) => (true, p),
                None => (false, g.as_str()),
            };
            if pat.is_empty() {
                return Err(format!("empty glob {g:?}"));
            }
            if deny {
                r.deny.push(pat.into());
            } else {
                r.allow.push(pat.into());
            }
        }
        Ok(r)
    }

    /// `None` if `tool` is allowed, else the rule that refuses it (as the config wrote it).
    pub fn refusal(&self, tool: &str) -> Option<String> {
        self.refusal_as("tools", tool)
    }

    /// Whether no glob is set.
    pub fn is_empty(&self) -> bool {
        self.allow.is_empty() && self.deny.is_empty()
    }

    /// `None` if `name` is allowed, else the rule that refuses it, naming the config key.
    fn refusal_as(&self, key: &str, name: &str) -> Option<String> {
        if let Some(d) = self.deny.iter().find(|d| glob_matches(d, name)) {
            return Some(format!("\"!{d}\""));
        }
        if !self.allow.is_empty() && !self.allow.iter().any(|a| glob_matches(a, name)) {
            return Some(self.allow_list(key));
        }
        None
    }

    /// `key = ["a", "b"]`, the allow globs as the config wrote them.
    fn allow_list(&self, key: &str) -> String {
        let list: Vec<String> = self.allow.iter().map(|a| format!("{a:?}")).collect();
        format!("{key} = [{}]", list.join(", "))
    }

    /// Whether some name that matches `glob` is allowed: `glob` overlaps an allow glob (any,
    /// if there is none) and no deny glob covers it whole.
    fn admits_some(&self, glob: &str) -> bool {
        if self.deny.iter().any(|d| glob_matches(d, glob)) {
            return false;
        }
        self.allow.is_empty() || self.allow.iter().any(|a| globs_overlap(a, glob))
    }
}

/// One bridge identity (its `Debug` leaves the token out).
#[derive(Clone, PartialEq)]
pub struct Identity {
    /// Its name; `None` for the route's single token.
    pub name: Option<String>,
    token: String,
    /// Its role.
    pub role: Role,
    /// Its tool globs.
    pub tools: ToolRules,
    /// Its method globs (over methods bound for the mod).
    pub methods: ToolRules,
    /// Calls per second to the mod, if bounded.
    pub calls_per_second: Option<f64>,
    /// Channels it may subscribe to at once, if lower than the route's bound.
    pub max_subscriptions: Option<usize>,
}

impl std::fmt::Debug for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Identity")
            .field("name", &self.name)
            .field("role", &self.role)
            .field("tools", &self.tools)
            .field("methods", &self.methods)
            .field("calls_per_second", &self.calls_per_second)
            .field("max_subscriptions", &self.max_subscriptions)
            .finish_non_exhaustive()
    }
}

/// Why a request was refused by a bridge's rights.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Denial {
    /// Outside its role or tool globs: the message names the rule.
    Forbidden(String),
}

impl Identity {
    /// A named identity from the config.
    pub fn named(name: String, token: String, role: Role) -> Identity {
        Identity {
            name: Some(name),
            token,
            role,
            tools: ToolRules::default(),
            methods: ToolRules::default(),
            calls_per_second: None,
            max_subscriptions: None,
        }
    }

    /// The route's single token: control, unnamed, unbounded.
    pub fn implicit(token: String) -> Identity {
        Identity {
            name: None,
            token,
            role: Role::Control,
            tools: ToolRules::default(),
            methods: ToolRules::default(),
            calls_per_second: None,
            max_subscriptions: None,
        }
    }

    /// The token (never logged or recorded).
    pub fn token(&self) -> &str {
        &self.token
    }

    /// Its name for metrics, logs and messages ([`DEFAULT_NAME`] for the implicit one).
    pub fn label(&self) -> &str {
        self.name.as_deref().unwrap_or(DEFAULT_NAME)
    }

    /// The role's part of [`Self::check`], which needs no params: asked first even of a request
    /// whose params are malformed, so a bridge learns it may not call the method at all.
    pub fn check_role(&self, method: &str) -> Result<(), Denial> {
        if self.role == Role::Observe && !OBSERVE_METHODS.contains(&method) {
            return Err(Denial::Forbidden(format!(
                "bridge {:?} has role observe, which may not call {method}",
                self.label()
            )));
        }
        Ok(())
    }

    /// The role's and the method rules' part of [`Self::check`], which needs no params: asked
    /// first even of a request whose params are malformed, so a bridge learns it may not call
    /// the method at all.
    pub fn check_method(&self, method: &str) -> Result<(), Denial> {
        self.check_role(method)?;
        if method.starts_with("relay/") {
            return Ok(());
        }
        match self.method_refusal(method) {
            Some(rule) => Err(Denial::Forbidden(format!(
                "bridge {:?} may not call {method}: refused by {rule}",
                self.label()
            ))),
            None => Ok(()),
        }
    }

    /// Whether this identity may send `method` (`tool`: `tools/call`'s tool name) to the mod
    /// or to the relay's `relay/lease`; the refusal names the rule.
    pub fn check(&self, method: &str, tool: Option<&str>) -> Result<(), Denial> {
        let who = self.label();
        self.check_method(method)?;
        if method == "tools/call" {
            let tool = tool.unwrap_or_default();
            if let Some(rule) = self.tools.refusal(tool) {
                return Err(Denial::Forbidden(format!(
                    "bridge {who:?} may not call tool {tool:?}: refused by {rule}"
                )));
            }
        }
        Ok(())
    }

    /// The rule that refuses `method` (bound for the mod), if one does: its `methods` globs,
    /// or, with `tools` set and no `methods`, every write method but `tools/call`.
    fn method_refusal(&self, method: &str) -> Option<String> {
        let read = OBSERVE_METHODS.contains(&method);
        if !self.methods.is_empty() {
            if let Some(d) = self.methods.deny.iter().find(|d| glob_matches(d, method)) {
                return Some(format!("methods: \"!{d}\""));
            }
            if read {
                return None;
            }
            return self.methods.refusal_as("methods", method);
        }
        if read || method == "tools/call" || self.tools.is_empty() {
            return None;
        }
        Some(format!(
            "{} (an identity with tool rules may call only tools/call and read methods, unless its `methods` allow more)",
            self.tools.allow_list("tools")
        ))
    }

    /// Whether this identity may hold the lease over `leased` (the route's leased tool
    /// globs): it is `control`, may call `tools/call`, and at least one leased glob overlaps
    /// the tools it may call. An identity that could call none of them would only keep the
    /// lease from those who can.
    pub fn may_hold_lease(&self, leased: &[String]) -> bool {
        self.role == Role::Control
            && self.method_refusal("tools/call").is_none()
            && leased.iter().any(|g| self.tools.admits_some(g))
    }
}

/// A token bucket: `rate` per second, holding at most `burst`.
#[derive(Debug)]
pub struct Bucket {
    rate: f64,
    burst: f64,
    tokens: f64,
    at: Instant,
}

impl Bucket {
    fn new(rate: f64) -> Bucket {
        let burst = rate.max(1.0);
        Bucket {
            rate,
            burst,
            tokens: burst,
            at: Instant::now(),
        }
    }

    /// Takes one token, or says how long until one is there.
    fn take(&mut self, now: Instant) -> Result<(), Duration> {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.rate).min(self.burst);
        self.at = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64((1.0 - self.tokens) / self.rate))
        }
    }
}

/// One identity's rate, shared by every connection of that identity: ten connections, or a
/// reconnect, get no more calls through than one.
pub type SharedBucket = Arc<Mutex<Bucket>>;

/// A connected bridge's identity and its counters (held by `route::BridgeState`).
#[derive(Debug, Default)]
pub struct BridgeAccess {
    identity: Mutex<Option<Arc<Identity>>>,
    bucket: Mutex<Option<SharedBucket>>,
    /// Requests refused by its rights.
    pub denied: AtomicU64,
    /// Requests refused by its rate.
    pub limited: AtomicU64,
    /// Requests refused because another bridge holds the lease.
    pub lease_refused: AtomicU64,
    /// Cancelled when its identity is revoked: the bridge is closed after its notice.
    pub revoked: CancellationToken,
}

impl BridgeAccess {
    /// Its identity, once its hello succeeded.
    pub fn identity(&self) -> Option<Arc<Identity>> {
        self.identity.lock().clone()
    }

    /// Sets (or, on reload, replaces) its identity and the identity's shared rate
    /// ([`RouteAccess::bucket`]).
    pub fn set(&self, id: Arc<Identity>, bucket: Option<SharedBucket>) {
        *self.bucket.lock() = bucket;
        *self.identity.lock() = Some(id);
    }

    /// Forgets its identity (a hello that failed after it was decided); returns it.
    pub fn clear(&self) -> Option<Arc<Identity>> {
        *self.bucket.lock() = None;
        self.identity.lock().take()
    }

    /// Takes one call from its rate, or says how long to wait.
    pub fn take_call(&self) -> Result<(), Duration> {
        let bucket = self.bucket.lock().clone();
        match bucket {
            Some(b) => b.lock().take(Instant::now()),
            None => Ok(()),
        }
    }

    /// Its name for metrics and logs (`default` for the route token, `-` before hello).
    pub fn label(&self) -> String {
        self.identity()
            .map_or_else(|| "-".into(), |i| i.label().to_string())
    }

    /// Its role's name, once known.
    pub fn role(&self) -> Option<&'static str> {
        self.identity().map(|i| i.role.as_str())
    }

    /// Its per-bridge counters as `(denied, rate limited, lease refused)`.
    pub fn counts(&self) -> (u64, u64, u64) {
        (
            self.denied.load(Ordering::Relaxed),
            self.limited.load(Ordering::Relaxed),
            self.lease_refused.load(Ordering::Relaxed),
        )
    }
}

/// A route's identities: the implicit one first, then the config's (its `Debug` shows no
/// secret).
#[derive(Clone)]
pub struct Table {
    list: Vec<Arc<Identity>>,
    /// Every bridge token and the mod's: what redaction removes from anything recorded.
    secrets: Vec<String>,
    /// Their redactor, built on first use (the secrets are final once the table is shared).
    redactor: std::sync::OnceLock<crate::auth::Redactor>,
    /// Tool globs only the lease holder may call.
    leased: Vec<String>,
    /// The longest a lease may be taken or renewed for at once.
    lease_max_ttl: Duration,
}

impl std::fmt::Debug for Table {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Table")
            .field("list", &self.list)
            .field("leased", &self.leased)
            .finish_non_exhaustive()
    }
}

impl Table {
    /// The same table with `ttl` the longest a lease may be taken for at once.
    pub fn with_lease_max_ttl(mut self, ttl: Duration) -> Table {
        self.lease_max_ttl = ttl;
        self
    }

    /// The longest a lease may be taken or renewed for at once.
    pub fn lease_max_ttl(&self) -> Duration {
        self.lease_max_ttl
    }

    /// Whether `id` may hold the lease: a `control` identity that may call at least one leased
    /// tool (any `control` identity when no tool is leased: the lease then guards nothing).
    pub fn may_hold_lease(&self, id: &Identity) -> bool {
        id.role == Role::Control && (self.leased.is_empty() || id.may_hold_lease(&self.leased))
    }

    /// The table of `implicit` (the route token) and `named`, with `upstream_token` among the
    /// secrets and `leased` the globs only the lease holder may call.
    pub fn new(
        implicit: &str,
        named: &[Identity],
        upstream_token: &str,
        leased: &[String],
    ) -> Table {
        let mut list = vec![Arc::new(Identity::implicit(implicit.to_string()))];
        list.extend(named.iter().cloned().map(Arc::new));
        let mut secrets: Vec<String> = list.iter().map(|i| i.token.clone()).collect();
        secrets.push(upstream_token.to_string());
        Table {
            list,
            secrets,
            redactor: std::sync::OnceLock::new(),
            leased: leased.to_vec(),
            lease_max_ttl: DEFAULT_MAX_TTL,
        }
    }

    /// Whether `tool` is one only the lease holder may call.
    pub fn leased(&self, tool: &str) -> bool {
        self.leased.iter().any(|g| glob_matches(g, tool))
    }

    /// Whether any tool is leased.
    pub fn has_leased(&self) -> bool {
        !self.leased.is_empty()
    }

    /// The leased tool globs.
    pub fn leased_globs(&self) -> &[String] {
        &self.leased
    }

    /// The identity whose token is `presented`. Every identity is compared, each in constant
    /// time, and the index is chosen without a branch: no early exit tells which one matched.
    pub fn find(&self, presented: &str) -> Option<Arc<Identity>> {
        let mut index = 0u32;
        let mut any = Choice::from(0);
        for (i, id) in self.list.iter().enumerate() {
            let (e, p) = (id.token.as_bytes(), presented.as_bytes());
            // Only lengths can leak (they are public: 32 hex digits when generated).
            let hit = Choice::from(u8::from(e.len() == p.len())) & e.ct_eq(p);
            index.conditional_assign(&(i as u32), hit);
            any |= hit;
        }
        bool::from(any).then(|| self.list[index as usize].clone())
    }

    /// The identity named `name` (`None`: the implicit one).
    pub fn by_name(&self, name: Option<&str>) -> Option<&Arc<Identity>> {
        self.list.iter().find(|i| i.name.as_deref() == name)
    }

    /// The configured names, in config order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.list.iter().filter_map(|i| i.name.as_deref())
    }

    /// The secrets, as redaction takes them.
    pub fn secrets(&self) -> Vec<&str> {
        self.secrets.iter().map(String::as_str).collect()
    }

    /// What removes the secrets from anything recorded.
    pub fn redactor(&self) -> &crate::auth::Redactor {
        self.redactor
            .get_or_init(|| crate::auth::Redactor::new(&self.secrets()))
    }
}

/// A route's current identity table, replaced whole on reload, what the reloads did, and each
/// identity's rate.
#[derive(Debug)]
pub struct RouteAccess {
    table: Mutex<Arc<Table>>,
    reloads: Mutex<serde_json::Value>,
    /// Each rate-bounded identity's bucket, by name (`None`: the route's own token), kept
    /// while its rate stays the same, so reconnecting refills nothing.
    buckets: Mutex<std::collections::HashMap<Option<String>, (f64, SharedBucket)>>,
}

impl RouteAccess {
    /// Access under `table` (a route's, [`crate::config::RouteConfig::access_table`]).
    pub fn new(table: Table) -> RouteAccess {
        RouteAccess {
            table: Mutex::new(Arc::new(table)),
            reloads: Mutex::new(serde_json::json!({"count": 0})),
            buckets: Mutex::new(std::collections::HashMap::new()),
        }
    }

    /// The rate every connection of `id` shares: the one it has while its rate is unchanged,
    /// a full new one when a reload changed it, none when it has no rate.
    pub fn bucket(&self, id: &Identity) -> Option<SharedBucket> {
        let mut buckets = self.buckets.lock();
        let Some(rate) = id.calls_per_second else {
            buckets.remove(&id.name);
            return None;
        };
        match buckets.get(&id.name) {
            Some((r, b)) if *r == rate => Some(b.clone()),
            _ => {
                let b = Arc::new(Mutex::new(Bucket::new(rate)));
                buckets.insert(id.name.clone(), (rate, b.clone()));
                Some(b)
            }
        }
    }

    /// Notes a reload's outcome (`relay/status` shows it as `reload`: count, kept, revoked,
    /// error, tNs), so `gabp-relay reload` can tell the operator what happened.
    pub fn note_reload(&self, kept: usize, revoked: usize, error: Option<String>) {
        let mut r = self.reloads.lock();
        let count = r["count"].as_u64().unwrap_or(0) + 1;
        *r = serde_json::json!({
            "count": count,
            "kept": kept,
            "revoked": revoked,
            "error": error,
            "tNs": gabp_rt::clock::now_ns(),
        });
    }

    /// The last reload, as `relay/status` shows it.
    pub fn reload_status(&self) -> serde_json::Value {
        self.reloads.lock().clone()
    }

    /// The current table.
    pub fn table(&self) -> Arc<Table> {
        self.table.lock().clone()
    }

    /// Replaces the table; returns the old one. Every secret of the old table stays among the
    /// new one's: a token the relay once accepted is redacted for the life of the process,
    /// even after a reload removed or changed its identity.
    pub fn replace(&self, mut table: Table) -> Arc<Table> {
        let mut current = self.table.lock();
        for s in &current.secrets {
            if !table.secrets.contains(s) {
                table.secrets.push(s.clone());
            }
        }
        // Built again from the secrets as they now stand.
        table.redactor = std::sync::OnceLock::new();
        std::mem::replace(&mut *current, Arc::new(table))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_match_runs_and_single_characters() {
        assert!(glob_matches("inventory/*", "inventory/list"));
        assert!(glob_matches("inventory/*", "inventory/a/b"));
        assert!(!glob_matches("inventory/*", "inventorylist"));
        assert!(glob_matches("*", ""));
        assert!(glob_matches("a?c", "abc"));
        assert!(!glob_matches("a?c", "ac"));
        assert!(glob_matches("*/get*", "state/getAll"));
        assert!(!glob_matches("move/*", "admin/move/x"));
        assert!(glob_matches("*move*", "admin/move/x"));
        // A long hostile name stays linear.
        assert!(!glob_matches("*a*a*a*a*b", &"a".repeat(10_000)));
    }

    #[test]
    fn deny_wins_whatever_the_order() {
        let r = ToolRules::parse(&["!admin/*".into(), "*".into()]).expect("valid");
        assert!(r.refusal("admin/kick").is_some());
        assert!(r.refusal("inventory/list").is_none());
        let r = ToolRules::parse(&["inventory/*".into(), "!inventory/drop".into()]).expect("ok");
        assert_eq!(
            r.refusal("inventory/drop").as_deref(),
            Some("\"!inventory/drop\"")
        );
        assert_eq!(
            r.refusal("move/north").as_deref(),
            Some("tools = [\"inventory/*\"]")
        );
        assert!(r.refusal("inventory/list").is_none());
        assert!(ToolRules::parse(&["!".into()]).is_err());
        assert!(ToolRules::default().refusal("anything").is_none());
    }

    #[test]
    fn observe_reads_only() {
        let o = Identity::named("watcher".into(), "t".repeat(32), Role::Observe);
        assert!(o.check("tools/list", None).is_ok());
        assert!(o.check("state/get", None).is_ok());
        for m in ["tools/call", "attention/ack", "relay/lease", "custom/write"] {
            assert!(o.check(m, Some("x")).is_err(), "{m}");
        }
        let c = Identity::implicit("t".repeat(32));
        assert!(c.check("attention/ack", None).is_ok());
        assert!(c.check("relay/lease", None).is_ok());
    }

    #[test]
    fn tokens_find_their_identity() {
        let a = Identity::named("a".into(), "a".repeat(32), Role::Control);
        let b = Identity::named("b".into(), "b".repeat(32), Role::Observe);
        let t = Table::new(&"z".repeat(32), &[a, b], "mod", &["move/*".into()]);
        assert!(t.leased("move/north") && !t.leased("look"));
        assert_eq!(t.find(&"b".repeat(32)).expect("b").label(), "b");
        assert_eq!(
            t.find(&"z".repeat(32)).expect("implicit").label(),
            "default"
        );
        assert!(t.find(&"c".repeat(32)).is_none());
        assert!(t.find("").is_none());
        assert!(t.secrets().contains(&"mod"));
    }

    #[test]
    fn buckets_refill_at_their_rate() {
        let mut b = Bucket::new(2.0);
        let t0 = b.at;
        assert!(b.take(t0).is_ok());
        assert!(b.take(t0).is_ok());
        let wait = b.take(t0).expect_err("empty");
        assert!(wait <= Duration::from_millis(500) && wait > Duration::from_millis(400));
        assert!(b.take(t0 + Duration::from_millis(500)).is_ok());
    }

    #[test]
    fn globs_overlap_when_some_name_matches_both() {
        for (a, b) in [
            ("move/*", "move/north"),
            ("move/*", "*/north"),
            ("m*", "*e"),
            ("*", "anything"),
            ("a?c", "*c"),
            ("move/*", "move/*"),
        ] {
            assert!(globs_overlap(a, b), "{a} {b}");
            assert!(globs_overlap(b, a), "{b} {a}");
        }
        for (a, b) in [
            ("inventory/get", "move/*"),
            ("a?c", "ab"),
            ("x*", "y*"),
            ("*x", "*y"),
        ] {
            assert!(!globs_overlap(a, b), "{a} {b}");
            assert!(!globs_overlap(b, a), "{b} {a}");
        }
    }

    #[test]
    fn only_an_identity_that_may_call_a_leased_tool_may_hold_the_lease() {
        let leased = vec!["move/*".to_string()];
        let mut id = Identity::named("p".into(), "p".repeat(32), Role::Control);
        assert!(id.may_hold_lease(&leased), "no rules: every tool");
        id.tools = ToolRules::parse(&["inventory/get".into()]).expect("globs");
        assert!(!id.may_hold_lease(&leased), "none of the leased tools");
        id.tools = ToolRules::parse(&["*".into(), "!move/*".into()]).expect("globs");
        assert!(!id.may_hold_lease(&leased), "every leased tool denied");
        id.tools = ToolRules::parse(&["move/north".into()]).expect("globs");
        assert!(id.may_hold_lease(&leased));
        id.methods = ToolRules::parse(&["!tools/call".into()]).expect("globs");
        assert!(!id.may_hold_lease(&leased), "may not call tools at all");
        let watcher = Identity::named("w".into(), "w".repeat(32), Role::Observe);
        assert!(!watcher.may_hold_lease(&leased));
    }

    #[test]
    fn tool_rules_restrict_writes_and_methods_widen_them() {
        let mut id = Identity::named("p".into(), "p".repeat(32), Role::Control);
        assert!(
            id.check("admin/exec", None).is_ok(),
            "no rules: every method"
        );
        id.tools = ToolRules::parse(&["inventory/get".into()]).expect("globs");
        assert!(id.check("admin/exec", None).is_err());
        assert!(id.check("attention/ack", None).is_err());
        assert!(id.check("state/get", None).is_ok(), "reads need no rule");
        assert!(id.check("tools/call", Some("inventory/get")).is_ok());
        assert!(
            id.check("relay/lease", None).is_ok(),
            "the relay's own, not the mod's"
        );
        id.methods = ToolRules::parse(&["attention/ack".into(), "!state/*".into()]).expect("globs");
        assert!(id.check("attention/ack", None).is_ok());
        assert!(id.check("state/get", None).is_err(), "deny wins, reads too");
        assert!(
            id.check("tools/call", Some("inventory/get")).is_err(),
            "methods list it not"
        );
    }

    #[test]
    fn a_reload_keeps_every_secret_it_ever_had() {
        let mut cfg = crate::config::RouteConfig::new(
            "r",
            crate::config::Upstream::Addr("127.0.0.1:1".parse().expect("addr")),
            "127.0.0.1:0".parse().expect("addr"),
            "t".repeat(32),
        );
        cfg.identities = vec![Identity::named("a".into(), "a".repeat(32), Role::Control)];
        let access = RouteAccess::new(cfg.access_table());
        access.replace(Table::new(&"t".repeat(32), &[], "mod", &[]));
        assert!(access.table().secrets().contains(&"a".repeat(32).as_str()));
        assert!(access.table().find(&"a".repeat(32)).is_none());
    }
}
