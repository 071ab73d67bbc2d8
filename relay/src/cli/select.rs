//! Which sessions a read command works on, chosen the same way by every one of them: ids,
//! unique id prefixes or `latest`, or `--all`, narrowed by `--route`, `--since`, `--tag` and
//! `--app`. One catalog scan; frames are never read here.

use std::time::Duration;

use anyhow::{bail, Result};
use clap::Args;
use gabp_storage::{SessionMeta, Store};

use super::usage;

/// The selection flags (the ids are each command's own positional arguments).
#[derive(Args, Debug, Clone, Default)]
pub struct Filters {
    /// Every session (narrowed by the other filters).
    #[arg(long)]
    pub all: bool,
    /// Only sessions of this route (repeatable: any of them).
    #[arg(long)]
    pub route: Vec<String>,
    /// Only sessions started since: a duration back from now (7d, 12h) or an RFC 3339 time.
    #[arg(long, value_parser = parse_since, value_name = "WHEN")]
    pub since: Option<Since>,
    /// Only sessions with this tag (repeatable: all must match).
    #[arg(long = "tag", value_name = "KEY=VALUE", value_parser = parse_tag)]
    pub tags: Vec<(String, String)>,
    /// Only sessions of this app (the mod's app.name).
    #[arg(long)]
    pub app: Option<String>,
}

/// `--since`: a span back from now, or a point in time.
#[derive(Debug, Clone, Copy)]
pub enum Since {
    /// This long before now.
    Ago(Duration),
    /// This time (ns since the epoch).
    At(u64),
}

fn parse_since(s: &str) -> Result<Since, String> {
    if let Ok(d) = crate::config::parse_duration(s) {
        return Ok(Since::Ago(d));
    }
    match s.parse::<jiff::Timestamp>() {
        Ok(t) if t.as_nanosecond() >= 0 => Ok(Since::At(t.as_nanosecond() as u64)),
        _ => Err(format!(
            "invalid time {s:?}: expected a duration back from now (7d, 12h) or an RFC 3339 time (2026-11-30T12:00:00Z)"
        )),
    }
}

fn parse_tag(s: &str) -> Result<(String, String), String> {
    gabp_storage::parse_tag(s)
}

impl Filters {
    /// Whether any filter (or `--all`) was given.
    pub fn any(&self) -> bool {
        self.all
            || !self.route.is_empty()
            || self.since.is_some()
            || !self.tags.is_empty()
            || self.app.is_some()
    }

    /// Whether `m` passes every filter (`now_ns` anchors `--since 7d`).
    pub fn matches(&self, m: &SessionMeta, now_ns: u64) -> bool {
        let since = match self.since {
            Some(Since::Ago(d)) => Some(now_ns.saturating_sub(d.as_nanos() as u64)),
            Some(Since::At(t)) => Some(t),
            None => None,
        };
        (self.route.is_empty() || self.route.contains(&m.route))
            && since.is_none_or(|s| m.started_ns >= s)
            && self
                .tags
                .iter()
                .all(|(k, v)| m.tags.get(k).is_some_and(|have| have == v))
            && self
                .app
                .as_ref()
                .is_none_or(|a| m.app_name.as_deref() == Some(a.as_str()))
    }
}

/// The sessions that `ids` and `filters` name, oldest first, each once. With ids, the filters
/// narrow them; without, the filters pick from every session (and with neither, every session
/// when `default_all`, else a usage error). An empty result is an error of one line.
pub fn select(
    store: &Store,
    ids: &[String],
    filters: &Filters,
    default_all: bool,
) -> Result<Vec<SessionMeta>> {
    if ids.is_empty() && !filters.any() && !default_all {
        return Err(usage(
            "which sessions? give session ids (or unique prefixes, or latest), --all, or a filter (--route, --since, --tag, --app)",
        ));
    }
    if !ids.is_empty() && filters.all {
        return Err(usage(
            "give session ids or --all, not both (the other filters narrow either)",
        ));
    }
    let candidates = if ids.is_empty() {
        store.sessions()?
    } else {
        let mut v: Vec<SessionMeta> = Vec::new();
        for q in ids {
            let m = super::sessions::resolve(store, q)?;
            if !v.iter().any(|x| x.id == m.id) {
                v.push(m);
            }
        }
        v.sort_by_key(|m| m.id);
        v
    };
    let now = gabp_rt::clock::now_ns();
    let picked: Vec<SessionMeta> = candidates
        .into_iter()
        .filter(|m| filters.matches(m, now))
        .collect();
    if picked.is_empty() {
        bail!("no session matches the selection");
    }
    Ok(picked)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(route: &str, app: &str, started_ns: u64, tags: &[(&str, &str)]) -> SessionMeta {
        SessionMeta {
            route: route.into(),
            app_name: Some(app.into()),
            started_ns,
            tags: tags
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..SessionMeta::default()
        }
    }

    #[test]
    fn filters_all_have_to_match() {
        let day = 86_400_000_000_000u64;
        let now = 10 * day;
        let m = meta(
            "lab",
            "game",
            now - 2 * day,
            &[("exp", "ppo"), ("seed", "7")],
        );
        let f = |route: &[&str], since: Option<Since>, tags: &[(&str, &str)], app: Option<&str>| {
            Filters {
                all: false,
                route: route.iter().map(|s| s.to_string()).collect(),
                since,
                tags: tags
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
                app: app.map(String::from),
            }
            .matches(&m, now)
        };
        assert!(f(&[], None, &[], None));
        assert!(f(&["x", "lab"], None, &[], None));
        assert!(!f(&["x"], None, &[], None));
        assert!(f(
            &[],
            Some(Since::Ago(Duration::from_secs(3 * 86_400))),
            &[],
            None
        ));
        assert!(!f(
            &[],
            Some(Since::Ago(Duration::from_secs(86_400))),
            &[],
            None
        ));
        assert!(f(&[], Some(Since::At(now - 2 * day)), &[], None));
        assert!(f(&[], None, &[("exp", "ppo"), ("seed", "7")], None));
        assert!(!f(&[], None, &[("exp", "ppo"), ("seed", "8")], None));
        assert!(!f(&[], None, &[("gpu", "1")], None));
        assert!(f(&["lab"], None, &[("exp", "ppo")], Some("game")));
        assert!(!f(&[], None, &[], Some("other")));
    }

    #[test]
    fn since_takes_a_duration_or_a_time() {
        assert!(
            matches!(parse_since("7d"), Ok(Since::Ago(d)) if d == Duration::from_secs(7 * 86_400))
        );
        assert!(matches!(
            parse_since("2026-11-30T12:00:00Z"),
            Ok(Since::At(t)) if t == 1_796_040_000_000_000_000
        ));
        let e = parse_since("yesterday").expect_err("not a time");
        assert_eq!(e.lines().count(), 1);
    }
}
