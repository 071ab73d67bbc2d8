//! What makes a result self-describing: the command line (tokens redacted), loadgen's version,
//! the machine (cores, CPU model, kernel), the load average before and after, and whether other
//! processes shared the CPU meanwhile (a busy machine is warned about on stderr and flagged in
//! the result); and what a target says about itself in its welcome (a relay, and whether it
//! records; or a mod, and which). It measures nothing itself and never changes a target: the
//! only requests it sends are `session/hello` and, to a relay that offers it, `relay/status`.

use std::time::Instant;

use anyhow::Result;
use gabp_rt::display;
use gabp_sim::Addr;
use serde::Serialize;
use serde_json::{json, Value};

use crate::procstat::{self, MachineCpu};

/// A machine is busy when its 1-minute load at the start is above this share of its cores.
const LOAD_BUSY_PER_CORE: f64 = 0.5;
/// …or other processes used more than this share of its cores over the run, on average.
const OTHERS_BUSY_PER_CORE: f64 = 0.25;
/// …or a hypervisor gave more than this share of its cores to someone else (steal).
const STEAL_BUSY_PER_CORE: f64 = 0.1;

/// The state of the machine when a command starts, to compare with at its end.
#[derive(Debug)]
pub struct Watch {
    started_ns: u64,
    t0: Instant,
    load_start: Option<[f64; 3]>,
    cpu_start: Option<MachineCpu>,
    own_start: f64,
    /// Processes whose CPU is the run's own (targets it did not start), with their CPU then.
    pids: Vec<(u32, f64)>,
}

/// How the command ran: attached to every result as `context`.
#[derive(Debug, Clone, Serialize)]
pub struct Context {
    /// The command line, tokens replaced by `***`.
    pub command_line: Vec<String>,
    /// This gabp-loadgen's version.
    pub loadgen_version: String,
    /// When the command started (UTC).
    pub started_at: String,
    /// Seconds from start to end.
    pub elapsed_s: f64,
    /// Cores, CPU model, kernel.
    pub machine: Value,
    /// The 1-, 5- and 15-minute load averages at the start.
    pub load_start: Option<[f64; 3]>,
    /// The same at the end.
    pub load_end: Option<[f64; 3]>,
    /// Cores used on average by this command, the processes it started and the targets it
    /// measured (when they run on this machine).
    pub own_cpu_cores: Option<f64>,
    /// Cores used on average by every other process.
    pub others_cpu_cores: Option<f64>,
    /// Cores a hypervisor gave to someone else, on average (steal).
    pub steal_cores: Option<f64>,
    /// Whether the machine was busy enough to slow and scatter the figures.
    pub busy: bool,
    /// Why it counts as busy, one line each.
    pub busy_reasons: Vec<String>,
}

/// Flags whose value is a secret.
fn secret_flag(flag: &str) -> bool {
    flag.starts_with("--") && flag.contains("token")
}

/// The command line with every token's value replaced by `***`.
pub fn command_line(args: impl IntoIterator<Item = String>) -> Vec<String> {
    let mut out = Vec::new();
    let mut hide_next = false;
    for a in args {
        if hide_next {
            out.push("***".into());
            hide_next = false;
        } else if let Some((flag, _)) = a.split_once('=').filter(|(f, _)| secret_flag(f)) {
            out.push(format!("{flag}=***"));
        } else {
            hide_next = secret_flag(&a);
            out.push(a);
        }
    }
    out
}

fn cores() -> f64 {
    std::thread::available_parallelism().map_or(1, |n| n.get()) as f64
}

impl Watch {
    /// Notes the machine's state now.
    pub fn start() -> Watch {
        Watch {
            started_ns: gabp_rt::clock::now_ns(),
            t0: Instant::now(),
            load_start: procstat::loadavg(),
            cpu_start: procstat::machine_cpu(),
            own_start: procstat::own_cpu_s(),
            pids: Vec::new(),
        }
    }

    /// Counts the CPU of `pid` (a target this command measures but did not start) as the
    /// run's own from now on.
    pub fn own_pid(&mut self, pid: u32) {
        if pid != std::process::id() && !self.pids.iter().any(|(p, _)| *p == pid) {
            if let Some(s) = procstat::sample(pid) {
                self.pids.push((pid, s.cpu_s));
            }
        }
    }

    /// Counts the CPU of each local process `target` names (its `pid`, and its mod's
    /// `upstream_pid`) as the run's own.
    pub fn own_target(&mut self, target: &Value) {
        for k in ["pid", "upstream_pid"] {
            if let Some(pid) = target[k].as_u64().and_then(|p| u32::try_from(p).ok()) {
                self.own_pid(pid);
            }
        }
    }

    /// The context, as of now.
    pub fn finish(&self) -> Context {
        let elapsed = self.t0.elapsed().as_secs_f64().max(1e-3);
        let n = cores();
        let load_end = procstat::loadavg();
        let own = procstat::own_cpu_s() - self.own_start
            + self
                .pids
                .iter()
                .filter_map(|(pid, before)| Some(procstat::sample(*pid)?.cpu_s - before))
                .sum::<f64>();
        let (others, steal) = match (self.cpu_start, procstat::machine_cpu()) {
            (Some(a), Some(b)) => (
                Some(((b.processes_s - a.processes_s - own) / elapsed).max(0.0)),
                Some(((b.steal_s - a.steal_s) / elapsed).max(0.0)),
            ),
            _ => (None, None),
        };
        let busy_reasons = busy_reasons(n, self.load_start, others, steal);
        Context {
            command_line: command_line(std::env::args()),
            loadgen_version: env!("CARGO_PKG_VERSION").into(),
            started_at: display::utc(self.started_ns),
            elapsed_s: elapsed,
            machine: procstat::machine(),
            load_start: self.load_start,
            load_end,
            own_cpu_cores: Some(own / elapsed),
            others_cpu_cores: others,
            steal_cores: steal,
            busy: !busy_reasons.is_empty(),
            busy_reasons,
        }
    }
}

/// Why a machine with `cores` counts as busy (none: it was quiet enough).
pub fn busy_reasons(
    cores: f64,
    load_start: Option<[f64; 3]>,
    others: Option<f64>,
    steal: Option<f64>,
) -> Vec<String> {
    let mut why = Vec::new();
    if let Some([l1, ..]) = load_start.filter(|l| l[0] > LOAD_BUSY_PER_CORE * cores) {
        why.push(format!(
            "load average {l1:.2} at the start on {cores} cores"
        ));
    }
    if let Some(o) = others.filter(|o| *o > OTHERS_BUSY_PER_CORE * cores) {
        why.push(format!(
            "other processes used {o:.2} of {cores} cores during the run"
        ));
    }
    if let Some(s) = steal.filter(|s| *s > STEAL_BUSY_PER_CORE * cores) {
        why.push(format!("the hypervisor took {s:.2} cores (steal)"));
    }
    why
}

impl Context {
    /// The one-line warning for stderr, when the machine was busy.
    pub fn warning(&self) -> Option<String> {
        self.busy.then(|| {
            format!(
                "gabp-loadgen: warning: the machine was busy ({}): figures are slower and noisier than on a quiet machine",
                self.busy_reasons.join("; ")
            )
        })
    }

    /// Prints the warning to stderr if there is one.
    pub fn warn(&self) {
        if let Some(w) = self.warning() {
            eprintln!("{w}");
        }
    }

    /// As JSON.
    pub fn to_json(&self) -> Value {
        serde_json::to_value(self).expect("plain fields")
    }

    /// The machine in one line: `2 cores, Intel Xeon, Linux 6.1; load 0.31 → 1.90; other
    /// processes 0.05 cores`.
    pub fn machine_line(&self) -> String {
        let m = &self.machine;
        let load = |l: Option<[f64; 3]>| l.map_or("?".into(), |l| format!("{:.2}", l[0]));
        let mut s = format!(
            "{} cores, {}, Linux {}; load {} at start, {} at end",
            m["cores"],
            display::text(m["cpu"].as_str().unwrap_or("?"), 60),
            display::text(m["kernel"].as_str().unwrap_or("?"), 40),
            load(self.load_start),
            load(self.load_end),
        );
        if let Some(o) = self.others_cpu_cores {
            s.push_str(&format!("; other processes used {o:.2} cores"));
        }
        if self.busy {
            s.push_str(" (BUSY)");
        }
        s
    }

    /// Lines that say how a result came to be, for the head of a human report.
    pub fn lines(&self) -> Vec<(&'static str, String)> {
        vec![
            ("command", display::text(&self.command_line.join(" "), 400)),
            (
                "loadgen",
                format!("{}, started {}", self.loadgen_version, self.started_at),
            ),
            ("machine", self.machine_line()),
        ]
    }
}

/// Asks the target at `addr` who it is, on a connection of its own (see [`describe_client`]).
pub async fn describe_target(addr: &Addr, token: &str) -> Result<Value> {
    let (mut c, welcome) = gabp_client::Client::connect_hello(addr, token).await?;
    let t = describe_client(&mut c, &welcome, addr).await;
    let _ = c.close().await;
    Ok(t)
}

/// Who the target behind a welcomed connection is: its welcome, a relay's `relay/status` too
/// (sent on `c` before anything else), and its process when it runs on this machine. JSON:
/// `address`, `kind` (`relay`, `mod` or `unknown`), `name`, `version`, a relay's `recording`,
/// `policy`, `upstream` and its mod's `mod` (`agent`, `app`, `version`, `channels`), a mod's
/// `channels`, `pid` and `process`, and a local relay's mod's `upstream_pid`.
pub async fn describe_client(c: &mut gabp_client::Client, welcome: &Value, addr: &Addr) -> Value {
    let mut t = from_welcome(welcome);
    t["address"] = json!(addr.to_string());
    if t["kind"] == "relay"
        && welcome["capabilities"]["extensions"]["relay"]["methods"]
            .as_array()
            .is_some_and(|m| m.iter().any(|m| m == "relay/status"))
    {
        if let Ok(status) = c.call("relay/status", json!({})).await {
            t["recording"] = status["recording"].clone();
            t["policy"] = status["policy"]["onSlow"].clone();
            t["upstream"] = status["upstream"].clone();
        }
    }
    if let Some(pid) = procstat::listener_pid(addr) {
        t["pid"] = json!(pid);
        t["process"] = json!(procstat::process_name(pid));
    }
    let upstream: Option<Addr> = t["upstream"].as_str().and_then(|u| u.parse().ok());
    if let Some(pid) = upstream.as_ref().and_then(procstat::listener_pid) {
        t["upstream_pid"] = json!(pid);
    }
    t
}

/// What a welcome says about who sent it: a relay (its extension), or a mod.
pub fn from_welcome(welcome: &Value) -> Value {
    let relay = &welcome["capabilities"]["extensions"]["relay"];
    let app = &welcome["app"];
    let the_mod = json!({
        "agent": welcome["agentId"],
        "app": app["name"],
        "version": app["version"],
        "channels": welcome["capabilities"]["events"],
    });
    if relay.is_object() {
        json!({
            "kind": "relay",
            "name": relay["name"],
            "version": relay["version"],
            "route": relay["route"],
            "mod_connected": relay["modConnected"],
            "mod": the_mod,
        })
    } else if welcome.get("agentId").is_some() || app.is_object() {
        json!({
            "kind": "mod",
            "name": app["name"],
            "version": app["version"],
            "agent": welcome["agentId"],
            "channels": welcome["capabilities"]["events"],
        })
    } else {
        json!({"kind": "unknown"})
    }
}

/// A target in one line: `relay gabp-relay 0.1.0 at 127.0.0.1:6000 (recording on, drop-oldest),
/// in front of mod gabp-sim 1.0.0`.
pub fn target_line(t: &Value) -> String {
    let s = |v: &Value| display::text(v.as_str().unwrap_or("?"), 48);
    if let Some(by) = t["started_by"].as_str() {
        // A target `run` started itself: no address to name, but its program and recording.
        let program = t["program"]
            .as_str()
            .map_or("the raw forwarder".into(), |p| display::text(p, 120));
        let rec = match t["recording"].as_bool() {
            Some(true) => ", recording on",
            Some(false) => ", recording off",
            None => "",
        };
        return format!("{program} (started by {}){rec}", display::text(by, 80));
    }
    let addr = s(&t["address"]);
    match t["kind"].as_str() {
        Some("relay") => {
            let mut line = format!("relay {} {} at {addr}", s(&t["name"]), s(&t["version"]));
            let mut notes = Vec::new();
            match t["recording"].as_bool() {
                Some(true) => notes.push("recording on".to_string()),
                Some(false) => notes.push("recording off".to_string()),
                None => {}
            }
            if let Some(p) = t["policy"].as_str() {
                notes.push(display::text(p, 24));
            }
            if !notes.is_empty() {
                line.push_str(&format!(" ({})", notes.join(", ")));
            }
            let m = &t["mod"];
            if m["app"].is_string() {
                line.push_str(&format!(
                    ", in front of mod {} {}",
                    s(&m["app"]),
                    s(&m["version"])
                ));
                if let Some(u) = t["upstream"].as_str() {
                    line.push_str(&format!(" at {}", display::text(u, 60)));
                }
            }
            line
        }
        Some("mod") => format!("mod {} {} at {addr}", s(&t["name"]), s(&t["version"])),
        _ => format!("{addr} (its welcome names neither a relay nor a mod)"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_never_reach_a_result() {
        let args = [
            "gabp-loadgen",
            "call",
            "--token",
            "s3cret",
            "--relay-token=other",
            "--addr",
            "127.0.0.1:1",
        ]
        .map(String::from);
        let line = command_line(args).join(" ");
        assert_eq!(
            line,
            "gabp-loadgen call --token *** --relay-token=*** --addr 127.0.0.1:1"
        );
    }

    #[test]
    fn a_busy_machine_says_why() {
        assert!(busy_reasons(2.0, Some([0.3, 0.0, 0.0]), Some(0.1), Some(0.0)).is_empty());
        let why = busy_reasons(2.0, Some([1.5, 0.0, 0.0]), Some(0.9), Some(0.5));
        assert_eq!(why.len(), 3, "{why:?}");
        assert!(why[0].contains("1.50"), "{why:?}");
        assert!(busy_reasons(2.0, None, None, None).is_empty());
    }

    #[test]
    fn a_welcome_tells_a_relay_from_a_mod() {
        let m = json!({"agentId": "gabp-sim", "app": {"name": "sim", "version": "1.0.0"}, "capabilities": {"events": ["a"]}});
        let t = from_welcome(&m);
        assert_eq!(t["kind"], "mod");
        assert_eq!(t["channels"], json!(["a"]));
        let mut r = m.clone();
        r["capabilities"]["extensions"] =
            json!({"relay": {"name": "gabp-relay", "version": "0.1.0", "modConnected": true}});
        let mut t = from_welcome(&r);
        assert_eq!(t["kind"], "relay");
        assert_eq!(t["mod"]["app"], "sim");
        t["address"] = json!("127.0.0.1:6000");
        t["recording"] = json!(true);
        assert_eq!(
            target_line(&t),
            "relay gabp-relay 0.1.0 at 127.0.0.1:6000 (recording on), in front of mod sim 1.0.0"
        );
        assert_eq!(from_welcome(&json!({}))["kind"], "unknown");
        let started = json!({"kind": "relay", "started_by": "gabp-loadgen", "program": "/x/gabp-relay", "recording": false});
        assert_eq!(
            target_line(&started),
            "/x/gabp-relay (started by gabp-loadgen), recording off"
        );
    }
}
