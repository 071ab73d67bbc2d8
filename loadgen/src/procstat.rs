//! CPU time and peak memory of a process, read from /proc.

/// A sample of a process's resource use.
#[derive(Debug, Clone, Copy, Default)]
pub struct ProcSample {
    /// User + system CPU seconds so far.
    pub cpu_s: f64,
    /// Peak resident set (VmHWM) in bytes.
    pub peak_rss: u64,
    /// Current resident set in bytes.
    pub rss: u64,
    /// Open file descriptors.
    pub fds: u64,
    /// Open sockets (the descriptors a connection leak would grow).
    pub sockets: u64,
}

/// Reads `/proc/<pid>`; `None` once the process is gone.
pub fn sample(pid: u32) -> Option<ProcSample> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may contain spaces) start after the last ')'.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = 100.0; // USER_HZ is 100 on Linux
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib = |key: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.trim().trim_end_matches(" kB").parse::<u64>().ok())
            .unwrap_or(0)
            * 1024
    };
    let links: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| {
            d.filter_map(Result::ok)
                .filter_map(|e| std::fs::read_link(e.path()).ok())
                .map(|p| p.display().to_string())
                .collect()
        })
        .unwrap_or_default();
    let sockets = links.iter().filter(|l| l.starts_with("socket:")).count() as u64;
    Some(ProcSample {
        cpu_s: (utime + stime) / ticks,
        peak_rss: kib("VmHWM:"),
        rss: kib("VmRSS:"),
        fds: links.len() as u64,
        sockets,
    })
}

/// The machine: cores and CPU model.
pub fn machine() -> serde_json::Value {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map(|v| v.trim_start_matches([' ', '\t', ':']).to_string())
        .unwrap_or_default();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    serde_json::json!({ "cores": cores, "cpu": model })
}

#[cfg(test)]
mod tests {
    #[test]
    fn samples_this_process() {
        let s = super::sample(std::process::id()).expect("own /proc entry");
        assert!(s.peak_rss > 0 && s.rss > 0 && s.fds > 0);
    }
}
