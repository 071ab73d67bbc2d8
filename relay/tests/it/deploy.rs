//! The deploy files cannot run here, so they are validated: the example config parses into the
//! relay's config type, the dashboard is valid JSON naming only metrics the relay exports, the
//! scrape config points at /metrics, and the systemd unit keeps its hardening.

use std::path::{Path, PathBuf};

fn deploy(name: &str) -> String {
    let p = Path::new(
        // `cargo test` sets it when running: a test binary shared through one target dir by
        // two clones must read the clone it runs in, not the one that compiled it.
        &std::env::var_os("CARGO_MANIFEST_DIR")
            .map_or_else(|| env!("CARGO_MANIFEST_DIR").into(), PathBuf::from),
    )
    .join("../deploy")
    .join(name);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

#[test]
fn example_config_parses_into_routes() {
    let text = deploy("relay.toml");
    let file = gabp_relay::config::FileConfig::parse(&text, "deploy/relay.toml").expect("parses");
    // Token files do not exist here; swap them for inline tokens to resolve the routes.
    let text = text
        .replace(
            "upstream_token_file = \"/etc/gabp-relay/colony.mod-token\"",
            "upstream_token = \"mod-token-for-tests\"",
        )
        .replace(
            "token_file = \"/etc/gabp-relay/colony.token\"",
            "token = \"bridge-token-for-tests\"",
        )
        .replace(
            "token_file = \"/etc/gabp-relay/colony.planner.token\"",
            "token = \"planner-token-for-tests\"",
        )
        .replace(
            "token_file = \"/etc/gabp-relay/colony.dashboard.token\"",
            "token = \"dashboard-token-for-tests\"",
        );
    let resolved = gabp_relay::config::FileConfig::parse(&text, "relay.toml")
        .expect("parses")
        .routes("relay.toml")
        .expect("routes resolve");
    assert_eq!(resolved.len(), 2);
    let colony = &resolved[0];
    let names: Vec<_> = colony.identities.iter().map(|i| i.label()).collect();
    assert_eq!(names, ["planner", "dashboard"]);
    assert_eq!(colony.leased, ["build/*"]);
    assert_eq!(colony.max_marks, 10_000);
    assert_eq!(colony.lease_max_ttl, std::time::Duration::from_secs(300));
    assert_eq!(resolved[1].on_slow, gabp_engine::OnSlow::Disconnect);
    assert!(resolved[1].token_generated);
    assert_eq!(file.retain.as_deref(), Some("30d,200GiB"));
    assert!(file
        .retain
        .expect("set")
        .parse::<gabp_relay::config::Retention>()
        .is_ok());
}

#[test]
fn dashboard_names_only_exported_metrics() {
    let dash: serde_json::Value =
        serde_json::from_str(&deploy("grafana-dashboard.json")).expect("valid JSON");
    let mut seen = 0;
    for panel in dash["panels"].as_array().expect("panels") {
        for target in panel["targets"].as_array().expect("targets") {
            let expr = target["expr"].as_str().expect("expr");
            for word in expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
                if let Some(name) = word.strip_prefix("gabp_") {
                    let base = format!("gabp_{name}");
                    let base = ["_bucket", "_sum", "_count"].iter().fold(base, |b, s| {
                        b.strip_suffix(s).map(String::from).unwrap_or(b)
                    });
                    assert!(
                        gabp_engine::metrics::NAMES.contains(&base.as_str()),
                        "dashboard uses unknown metric {base}"
                    );
                    seen += 1;
                }
            }
        }
    }
    assert!(seen >= 10);
}

#[test]
fn scrape_config_and_unit() {
    let prom = deploy("prometheus.yml");
    assert!(prom.contains("metrics_path: /metrics") && prom.contains("127.0.0.1:9464"));
    let unit = deploy("gabp-relay.service");
    for key in [
        "NoNewPrivileges=yes",
        "PrivateTmp=yes",
        "StateDirectory=gabp-relay",
        "ProtectSystem=strict",
        "ExecStart=/usr/local/bin/gabp-relay serve",
    ] {
        assert!(unit.contains(key), "unit lacks {key}");
    }
}
