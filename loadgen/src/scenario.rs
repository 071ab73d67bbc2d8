//! Scenarios: what a run does, from a TOML file in `loadgen/scenarios/` and flags on top.
//!
//! A scenario fixes everything that decides the numbers: seed, rate, payload size, channels,
//! bridge count and pace, stalled bridges, tool-call rate, the relay's policy and recording,
//! warm-up and duration. The file is echoed into the report so a result can be rerun.

use std::path::Path;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use serde::{Deserialize, Serialize};

/// The smallest pacing window: a publisher batch (256) plus what readers report late (32).
const MIN_WINDOW: u64 = 512;

/// One benchmark scenario.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Scenario {
    /// Name, for reports.
    pub name: String,
    /// Seed of the simulated mod.
    pub seed: u64,
    /// Events per second published by the mod; 0 means as fast as possible.
    pub rate: f64,
    /// At a fixed rate, the mod writes the events due once per tick of this many milliseconds
    /// (as a game writes a frame's events once per frame); 0 writes each as it falls due.
    #[serde(skip_serializing_if = "is_zero")]
    pub tick_ms: f64,
    /// Event body size in bytes.
    pub payload_bytes: usize,
    /// Channels the mod publishes on (round-robin at random, seeded).
    pub channels: Vec<String>,
    /// Bridges subscribed to every channel and reading.
    pub bridges: usize,
    /// Of those bridges, how many subscribe to the first channel only: mixed subscription
    /// sets, so consecutive events go to different sets of bridges.
    pub one_channel_bridges: usize,
    /// Events per second each reading bridge consumes; 0 means as fast as possible.
    pub read_rate: f64,
    /// Extra bridges that subscribe and never read.
    pub stalled: usize,
    /// tools/call requests per second from one extra bridge; 0 for none.
    pub calls_per_s: f64,
    /// The relay's slow-bridge policy.
    pub policy: String,
    /// Record the session.
    pub record: bool,
    /// Durability when recording: none or batch.
    pub durability: String,
    /// Seconds before measuring.
    pub warmup_s: f64,
    /// Seconds measured.
    pub duration_s: f64,
    /// At max rate, how many events the publisher may run ahead of the slowest reading bridge
    /// (closed loop: lossless, the same pace for every target); 0 = open loop, where the mod
    /// writes as fast as the target reads and slow bridges see drops.
    pub window: u64,
}

impl Default for Scenario {
    fn default() -> Self {
        Scenario {
            name: "default".into(),
            seed: 1,
            rate: 0.0,
            tick_ms: 0.0,
            payload_bytes: 256,
            channels: vec![
                "world/tick".into(),
                "player/move".into(),
                "chat/message".into(),
            ],
            bridges: 8,
            one_channel_bridges: 0,
            read_rate: 0.0,
            stalled: 0,
            calls_per_s: 0.0,
            policy: "drop-oldest".into(),
            record: true,
            durability: "batch".into(),
            warmup_s: 1.0,
            duration_s: 10.0,
            window: 8192,
        }
    }
}

impl Scenario {
    /// Loads a scenario file.
    pub fn load(path: &Path) -> Result<Scenario> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        toml::from_str(&text).map_err(|e| anyhow!("{}: {}", path.display(), e.message()))
    }

    /// Warm-up as a duration.
    pub fn warmup(&self) -> Duration {
        Duration::from_secs_f64(self.warmup_s.max(0.0))
    }

    /// Measurement window as a duration.
    pub fn duration(&self) -> Duration {
        Duration::from_secs_f64(self.duration_s.max(0.1))
    }

    /// The closed-loop window, if this run is paced (max rate, window > 0, readers present).
    pub fn pace_window(&self) -> Option<u64> {
        (self.rate <= 0.0 && self.window > 0 && self.bridges > 0)
            .then_some(self.window.max(MIN_WINDOW))
    }

    /// The channels reading bridge number `reader` subscribes to.
    pub fn channels_of(&self, reader: usize) -> &[String] {
        if reader < self.one_channel_bridges {
            &self.channels[..1]
        } else {
            &self.channels
        }
    }

    /// Refuses what cannot be measured as asked.
    pub fn check(&self) -> Result<()> {
        if self.channels.is_empty() {
            bail!("a scenario needs at least one channel");
        }
        if !(0.0..=1000.0).contains(&self.tick_ms) {
            bail!("tick_ms is from 0 to 1000 ms, not {}", self.tick_ms);
        }
        if self.one_channel_bridges > self.bridges {
            bail!(
                "one_channel_bridges ({}) is more than the reading bridges ({})",
                self.one_channel_bridges,
                self.bridges
            );
        }
        if self.one_channel_bridges > 0 && self.pace_window().is_some() {
            // Pacing holds the publisher to the slowest reader's count of events, and a
            // one-channel reader counts only its channel's.
            bail!("bridges on one channel need a fixed --rate, or --window 0 at max rate");
        }
        Ok(())
    }

    /// The mod's rate, `None` for as fast as possible.
    pub fn mod_rate(&self) -> Option<f64> {
        (self.rate > 0.0).then_some(self.rate)
    }

    /// The mod's write tick (zero: none).
    pub fn tick(&self) -> Duration {
        Duration::from_secs_f64((self.tick_ms / 1e3).clamp(0.0, 1.0))
    }
}

/// A tick of zero is left out of a scenario's JSON, as results from before it had one read.
fn is_zero(v: &f64) -> bool {
    *v == 0.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shipped_scenarios_parse() {
        // The clone this runs in (`cargo test` sets it), not the one that compiled a test binary
        // shared through one target dir.
        let dir = std::env::var_os("CARGO_MANIFEST_DIR")
            .map_or_else(
                || env!("CARGO_MANIFEST_DIR").into(),
                std::path::PathBuf::from,
            )
            .join("scenarios");
        let mut n = 0;
        for e in std::fs::read_dir(&dir).expect("scenarios dir") {
            let p = e.expect("entry").path();
            if p.extension().is_some_and(|x| x == "toml") {
                let s = Scenario::load(&p).unwrap_or_else(|e| panic!("{e}"));
                assert!(s.bridges > 0 || s.calls_per_s > 0.0, "{}", p.display());
                n += 1;
            }
        }
        assert!(n >= 4);
        assert!(
            toml::from_str::<Scenario>("bogus = 1").is_err(),
            "unknown keys are refused"
        );
    }
}
