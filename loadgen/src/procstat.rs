//! CPU time and peak memory of a process, the machine (cores, CPU model, kernel, load, the
//! CPU time of every process together), and which local process listens on an address: all
//! read from /proc.

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

/// The machine: cores, CPU model and kernel.
pub fn machine() -> serde_json::Value {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map(|v| v.trim_start_matches([' ', '\t', ':']).to_string())
        .unwrap_or_default();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    serde_json::json!({ "cores": cores, "cpu": model, "kernel": kernel() })
}

/// The kernel's release (`uname -r`), empty if unknown.
pub fn kernel() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// The 1-, 5- and 15-minute load averages.
pub fn loadavg() -> Option<[f64; 3]> {
    let text = std::fs::read_to_string("/proc/loadavg").ok()?;
    let mut it = text.split_whitespace().map(str::parse::<f64>);
    Some([it.next()?.ok()?, it.next()?.ok()?, it.next()?.ok()?])
}

/// Clock ticks per second of /proc's CPU times (USER_HZ, 100 on Linux).
const TICKS: f64 = 100.0;

/// The CPU time of every process on the machine together, from the first line of /proc/stat.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct MachineCpu {
    /// Seconds spent running processes (user, nice and system time, all cores).
    pub processes_s: f64,
    /// Seconds a hypervisor gave this machine's CPUs to someone else (steal).
    pub steal_s: f64,
}

/// Reads /proc/stat; `None` where it cannot be read.
pub fn machine_cpu() -> Option<MachineCpu> {
    parse_machine_cpu(&std::fs::read_to_string("/proc/stat").ok()?)
}

fn parse_machine_cpu(stat: &str) -> Option<MachineCpu> {
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    let f: Vec<f64> = line
        .split_whitespace()
        .skip(1)
        .map(|v| v.parse().unwrap_or(0.0))
        .collect();
    // user nice system idle iowait irq softirq steal ...; interrupt time is left out: with
    // interrupt accounting it belongs to no process, and loopback traffic makes plenty of it.
    Some(MachineCpu {
        processes_s: (f.first()? + f.get(1)? + f.get(2)?) / TICKS,
        steal_s: f.get(7).copied().unwrap_or(0.0) / TICKS,
    })
}

/// This process's CPU seconds, its children's that it has waited for included (a target it
/// started and stopped counts as its own).
pub fn own_cpu_s() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return 0.0;
    };
    let Some(rest) = stat.rfind(')').map(|i| &stat[i + 2..]) else {
        return 0.0;
    };
    // utime stime cutime cstime: fields 14-17 of stat, 11-14 after the state.
    rest.split_whitespace()
        .skip(11)
        .take(4)
        .map(|v| v.parse::<f64>().unwrap_or(0.0))
        .sum::<f64>()
        / TICKS
}

/// The process whose listening socket is `addr` (TCP: that port on that address or on every
/// address; unix: that path), if it runs on this machine and its descriptors are readable.
pub fn listener_pid(addr: &gabp_sim::Addr) -> Option<u32> {
    let inodes: Vec<u64> = match addr {
        gabp_sim::Addr::Tcp(a) => ["/proc/net/tcp", "/proc/net/tcp6"]
            .iter()
            .filter_map(|p| std::fs::read_to_string(p).ok())
            .flat_map(|t| tcp_listeners(&t, *a))
            .collect(),
        gabp_sim::Addr::Unix(path) => unix_listeners(
            &std::fs::read_to_string("/proc/net/unix").ok()?,
            &path.display().to_string(),
        ),
    };
    if inodes.is_empty() {
        return None;
    }
    let wanted: Vec<String> = inodes.iter().map(|i| format!("socket:[{i}]")).collect();
    for e in std::fs::read_dir("/proc").ok()?.filter_map(Result::ok) {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(fds) = std::fs::read_dir(e.path().join("fd")) else {
            continue;
        };
        for fd in fds.filter_map(Result::ok) {
            if let Ok(link) = std::fs::read_link(fd.path()) {
                if wanted.iter().any(|w| link.as_os_str() == w.as_str()) {
                    return Some(pid);
                }
            }
        }
    }
    None
}

/// The inodes of listening sockets in a /proc/net/tcp{,6} table that `addr` reaches.
fn tcp_listeners(table: &str, addr: std::net::SocketAddr) -> Vec<u64> {
    table
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let (local, state, inode) = (f.get(1)?, f.get(3)?, f.get(9)?);
            if *state != "0A" {
                return None;
            }
            let (ip, port) = local.split_once(':')?;
            if u16::from_str_radix(port, 16).ok()? != addr.port() {
                return None;
            }
            let ip = proc_ip(ip)?;
            (ip == addr.ip() || ip.is_unspecified()).then(|| inode.parse().ok())?
        })
        .collect()
}

/// An address as /proc/net/tcp writes it: 32-bit words in host (little-endian) order.
fn proc_ip(hex: &str) -> Option<std::net::IpAddr> {
    let words: Vec<u32> = (0..hex.len() / 8)
        .map(|i| u32::from_str_radix(&hex[i * 8..i * 8 + 8], 16).ok())
        .collect::<Option<_>>()?;
    let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    match bytes.len() {
        4 => Some(std::net::Ipv4Addr::new(bytes[0], bytes[1], bytes[2], bytes[3]).into()),
        16 => {
            let b: [u8; 16] = bytes.try_into().ok()?;
            let v6 = std::net::Ipv6Addr::from(b);
            // A v4 client reaches a v6 socket bound to `::`; a v4-mapped bind is the v4 address.
            Some(v6.to_ipv4_mapped().map_or(v6.into(), Into::into))
        }
        _ => None,
    }
}

/// The inodes of listening unix sockets bound to `path` in /proc/net/unix.
fn unix_listeners(table: &str, path: &str) -> Vec<u64> {
    table
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            // Num RefCount Protocol Flags Type St Inode Path; Flags 00010000 is a listener.
            (f.get(3) == Some(&"00010000") && f.get(7) == Some(&path))
                .then(|| f.get(6)?.parse().ok())?
        })
        .collect()
}

/// The short name of a process (`comm`), if it still runs.
pub fn process_name(pid: u32) -> Option<String> {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .ok()
        .map(|s| s.trim().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_this_process() {
        let s = sample(std::process::id()).expect("own /proc entry");
        assert!(s.peak_rss > 0 && s.rss > 0 && s.fds > 0);
        assert!(own_cpu_s() >= 0.0);
        let m = machine();
        assert!(m["cores"].as_u64().is_some_and(|c| c > 0), "{m}");
        assert!(loadavg().is_some());
        assert!(machine_cpu().is_some_and(|c| c.processes_s > 0.0));
    }

    #[test]
    fn machine_cpu_counts_process_time_and_steal() {
        let stat = "cpu  200 100 300 5000 20 7 9 50 0 0\ncpu0 1 2 3 4 5 6 7 8 0 0\n";
        let c = parse_machine_cpu(stat).expect("parsed");
        assert_eq!(c.processes_s, 6.0);
        assert_eq!(c.steal_s, 0.5);
    }

    #[test]
    fn finds_this_process_by_its_listening_socket() {
        let tcp = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = gabp_sim::Addr::Tcp(tcp.local_addr().expect("addr"));
        assert_eq!(listener_pid(&addr), Some(std::process::id()));
        drop(tcp);
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("s.sock");
        let unix = std::os::unix::net::UnixListener::bind(&path).expect("bind");
        assert_eq!(
            listener_pid(&gabp_sim::Addr::Unix(path)),
            Some(std::process::id())
        );
        drop(unix);
        assert_eq!(proc_ip("0100007F"), Some("127.0.0.1".parse().expect("ip")));
        assert_eq!(
            proc_ip("00000000000000000000000000000000"),
            Some("::".parse().expect("ip"))
        );
    }
}
