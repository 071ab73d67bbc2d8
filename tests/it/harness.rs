//! Starts a simulated mod and a relay in front of it, both on 127.0.0.1 port 0, recording to a
//! temporary data dir. Everything started here stops when the harness is dropped or shut down.

use std::time::Duration;

use gabp_relay::{Relay, RelayConfig, RouteConfig, Upstream};
use gabp_sim::{Addr, Client, ModSim, ModSimConfig};
use serde_json::Value;

pub const MOD_TOKEN: &str = "mod-token-for-tests";

pub struct Harness {
    pub sim: ModSim,
    pub relay: Option<Relay>,
    pub addr: Addr,
    pub token: String,
    pub dir: tempfile::TempDir,
}

pub fn loopback() -> Addr {
    "127.0.0.1:0".parse().expect("literal address")
}

/// A mod that only emits when asked (`sim/emit`), so tests control every event.
pub fn quiet_mod() -> ModSimConfig {
    ModSimConfig {
        token: MOD_TOKEN.into(),
        autostart: false,
        channels: vec!["a".into(), "b".into(), "world/tick".into()],
        ..ModSimConfig::default()
    }
}

pub fn relay_config(route: RouteConfig, dir: &std::path::Path) -> RelayConfig {
    RelayConfig::new(vec![route], dir.to_path_buf())
}

impl Harness {
    pub async fn start(mod_cfg: ModSimConfig) -> Harness {
        Harness::start_with(mod_cfg, |_| {}).await
    }

    pub async fn start_with(
        mod_cfg: ModSimConfig,
        tweak: impl FnOnce(&mut RelayConfig),
    ) -> Harness {
        // Relay logs show up in a failing test's output (GABP_LOG=debug for more).
        let _ = tracing_subscriber::fmt()
            .with_env_filter(
                tracing_subscriber::EnvFilter::try_from_env("GABP_LOG")
                    .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
            )
            .with_test_writer()
            .try_init();
        let sim = ModSim::start(&loopback(), mod_cfg).expect("start simulated mod");
        let dir = tempfile::tempdir().expect("tempdir");
        let token = gabp_relay::auth::generate_token();
        let mut route = RouteConfig::new(
            "test",
            Upstream::Addr(sim.addr().clone()),
            loopback(),
            token.clone(),
        );
        route.upstream_token = MOD_TOKEN.into();
        route.hello_wait = Duration::from_secs(5);
        let mut cfg = relay_config(route, dir.path());
        tweak(&mut cfg);
        let relay = Relay::start(cfg).await.expect("start relay");
        let addr = relay.addrs[0].clone();
        Harness {
            sim,
            relay: Some(relay),
            addr,
            token,
            dir,
        }
    }

    pub fn relay(&self) -> &Relay {
        self.relay.as_ref().expect("relay running")
    }

    /// A bridge that has said hello.
    pub async fn bridge(&self) -> Client {
        Client::connect_hello(&self.addr, &self.token)
            .await
            .expect("bridge hello")
            .0
    }

    /// Waits (bounded) until the relay has a session with the mod.
    pub async fn wait_session(&self) -> String {
        let mut rx = self.relay().routes[0].session.subscribe();
        let s = tokio::time::timeout(Duration::from_secs(10), rx.wait_for(|s| s.is_some()))
            .await
            .expect("session within 10s")
            .expect("watch open");
        s.as_ref().expect("some").id.to_string()
    }

    /// Waits (bounded) for a session other than `old`.
    pub async fn wait_new_session(&self, old: &str) -> String {
        let mut rx = self.relay().routes[0].session.subscribe();
        let s = tokio::time::timeout(
            Duration::from_secs(10),
            rx.wait_for(|s| s.as_ref().is_some_and(|s| s.id.to_string() != old)),
        )
        .await
        .expect("new session within 10s")
        .expect("watch open");
        s.as_ref().expect("some").id.to_string()
    }

    pub async fn shutdown(mut self) -> tempfile::TempDir {
        if let Some(r) = self.relay.take() {
            assert!(r.shutdown().await, "relay shut down within its bound");
        }
        self.sim.stop();
        self.dir
    }
}

/// Asks the simulated mod (through the relay) to emit `count` events on `channel`.
pub async fn emit(c: &mut Client, channel: &str, count: u64) {
    let r = c.call("tools/call", serde_json::json!({"name": "sim/emit", "arguments": {"count": count, "channel": channel}})).await.expect("emit");
    assert_eq!(r["emitted"], count);
}

pub fn error_code(resp: &Value) -> i64 {
    resp["error"]["code"]
        .as_i64()
        .unwrap_or_else(|| panic!("expected an error response, got {resp}"))
}

/// Waits (bounded) until the relay's pending-request table is or is not empty. The table has
/// no change notification, so this yields between checks rather than sleeping.
pub async fn wait_pending(h: &Harness, empty: bool, what: &str) {
    let route = &h.relay().routes[0];
    tokio::time::timeout(Duration::from_secs(5), async {
        while route.pending.is_empty() != empty {
            tokio::task::yield_now().await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{what} within 5 s"));
}
