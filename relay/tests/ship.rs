//! Shipping to NATS JetStream and collecting an archive (issue 14), with real `nats-server`
//! processes on loopback: a three-node JetStream cluster (replicas 3), relays in front of
//! simulated mods shipping at once, and `gabp-relay collect`. The archive must equal the
//! sources frame for frame (exports compared byte for byte, `sessions check` clean) through
//! faults: a node killed, the collector `kill -9`ed, a relay restarted, the whole cluster down
//! and back; and a server without JetStream, a wrong token or no server at all must give one
//! clear line while the relay keeps relaying and recording.

mod support;

use std::path::{Path, PathBuf};
use std::time::Instant;

use serde_json::Value;
use support::storage::sessions;
use support::*;

const NATS: &str = "/usr/sbin/nats-server";

/// One `nats-server` node: its config, ports and process (killed on drop).
struct Node {
    conf: PathBuf,
    client: u16,
    http: u16,
    child: Option<std::process::Child>,
}

impl Node {
    fn start(&mut self) {
        let child = std::process::Command::new(NATS)
            .args(["-c", self.conf.to_str().expect("utf8")])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start nats-server");
        self.child = Some(child);
    }

    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// The monitoring endpoint's answer to `path` (status line and body), if it answers.
    fn get(&self, path: &str) -> Option<String> {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(("127.0.0.1", self.http)).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
        write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").ok()?;
        let mut out = String::new();
        s.read_to_string(&mut out).ok()?;
        Some(out)
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A set of nodes sharing one temp dir.
struct Cluster {
    _dir: tempfile::TempDir,
    nodes: Vec<Node>,
}

impl Cluster {
    /// `n` nodes with JetStream (clustered when `n > 1`), or one without (`jetstream` false),
    /// with `extra` added to every config (authorization, say).
    fn new(n: usize, jetstream: bool, extra: &str) -> Cluster {
        let dir = tempfile::tempdir().expect("tmp");
        let ports: Vec<(u16, u16, u16)> = (0..n)
            .map(|_| (free_addr().port(), free_addr().port(), free_addr().port()))
            .collect();
        let mut nodes = Vec::new();
        for (i, (client, cluster, http)) in ports.iter().enumerate() {
            let store = dir.path().join(format!("n{i}"));
            let mut conf = format!(
                "server_name: n{i}\nlisten: 127.0.0.1:{client}\nhttp: 127.0.0.1:{http}\n{extra}\n"
            );
            if jetstream {
                conf += &format!("jetstream {{ store_dir: \"{}\" }}\n", store.display());
            }
            if n > 1 {
                let routes: Vec<String> = ports
                    .iter()
                    .map(|(_, c, _)| format!("nats-route://127.0.0.1:{c}"))
                    .collect();
                conf += &format!(
                    "cluster {{ name: c1\n listen: 127.0.0.1:{cluster}\n routes: [{}] }}\n",
                    routes.join(", ")
                );
            }
            let path = dir.path().join(format!("n{i}.conf"));
            std::fs::write(&path, conf).expect("write config");
            nodes.push(Node {
                conf: path,
                client: *client,
                http: *http,
                child: None,
            });
        }
        let mut c = Cluster { _dir: dir, nodes };
        c.start_all();
        c
    }

    fn start_all(&mut self) {
        for n in &mut self.nodes {
            n.start();
        }
    }

    /// The README's form: the scheme once, then every node's address.
    fn urls(&self) -> String {
        let list: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.client))
            .collect();
        format!("nats://{}", list.join(","))
    }

    /// Waits until every running node reports itself healthy (JetStream current, with a
    /// meta leader when clustered), polling the monitoring endpoint.
    async fn ready(&self, jetstream: bool) {
        let deadline = Instant::now() + Duration::from_secs(60);
        for n in self.nodes.iter().filter(|n| n.child.is_some()) {
            loop {
                let ok = if jetstream {
                    n.get("/healthz").is_some_and(|r| r.contains("\"ok\""))
                        && (self.nodes.len() == 1
                            || n.get("/jsz").is_some_and(|r| r.contains("\"leader\"")))
                } else {
                    n.get("/varz").is_some_and(|r| r.contains("200 OK"))
                };
                if ok {
                    break;
                }
                assert!(Instant::now() < deadline, "nats node never became ready");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// `serve` in front of `sim`, recording into `data` and shipping to `urls`.
async fn serve_shipping(
    sim: &ModSim,
    data: &Path,
    urls: &str,
    route: &str,
    replicas: &str,
) -> Serve {
    let up = sim.addr().to_string();
    serve(&[
        "--upstream",
        &up,
        "--upstream-token",
        MOD_TOKEN,
        "--listen",
        "127.0.0.1:0",
        "--token",
        BRIDGE_TOKEN,
        "--route-name",
        route,
        "--data-dir",
        data.to_str().expect("utf8"),
        "--durability",
        "none",
        "--ship",
        urls,
        "--replicas",
        replicas,
    ])
    .await
}

fn collector(urls: &str, archive: &Path) -> Child {
    relay()
        .args([
            "collect",
            "--from",
            urls,
            "--data-dir",
            archive.to_str().expect("utf8"),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn collect")
}

/// The setup several tests share: a one-node JetStream server (`conf` added to its config), a
/// relay in front of a simulated mod at `rate` events/s recording into `data` and shipping to
/// it, and a collector writing `archive`.
struct Solo {
    cluster: Cluster,
    urls: String,
    dir: tempfile::TempDir,
    data: PathBuf,
    archive: PathBuf,
    sim: ModSim,
    relay: Serve,
    collector: Child,
}

async fn solo_shipping(conf: &str, rate: f64, route: &str) -> Solo {
    let cluster = Cluster::new(1, true, conf);
    cluster.ready(true).await;
    let urls = cluster.urls();
    let dir = tempfile::tempdir().expect("tmp");
    let (data, archive) = (dir.path().join("a"), dir.path().join("archive"));
    let sim = start_mod(Some(rate));
    let relay = serve_shipping(&sim, &data, &urls, route, "1").await;
    let collector = collector(&urls, &archive);
    Solo {
        cluster,
        urls,
        dir,
        data,
        archive,
        sim,
        relay,
        collector,
    }
}

/// Every session of `data` as (id, frames, state).
async fn listed(data: &Path) -> Vec<(String, u64, String)> {
    if !data.join("CURRENT").exists() {
        return Vec::new();
    }
    let v = sessions(data).await;
    v["sessions"]
        .as_array()
        .expect("sessions")
        .iter()
        .map(|s| {
            (
                s["id"].as_str().expect("id").to_string(),
                s["frames"].as_u64().expect("frames"),
                s["end"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

/// Frames recorded in `data` so far (all sessions).
async fn frames(data: &Path) -> u64 {
    listed(data).await.iter().map(|s| s.1).sum()
}

/// Waits until `data` has recorded more than `n` frames.
async fn recorded_beyond(data: &Path, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while frames(data).await <= n {
        assert!(Instant::now() < deadline, "recording stalled at {n} frames");
    }
}

async fn export(data: &Path, id: &str) -> Vec<u8> {
    let out = output(&["export", id, "--data-dir", data.to_str().expect("utf8")]).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// Waits until the archive lists every session of `sources` with as many frames and the same
/// end, then compares each session's export byte for byte and checks it.
async fn archive_equals(archive: &Path, sources: &[&Path]) {
    let mut want = Vec::new();
    for s in sources {
        want.extend(listed(s).await);
    }
    want.sort();
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let mut have = listed(archive).await;
        have.sort();
        if have == want {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the archive never caught up:\n have {have:?}\n want {want:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for s in sources {
        for (id, _, _) in listed(s).await {
            assert_eq!(export(s, &id).await, export(archive, &id).await, "{id}");
            let out = output(&[
                "sessions",
                "check",
                &id,
                "--data-dir",
                archive.to_str().expect("utf8"),
            ])
            .await;
            assert!(
                out.status.success(),
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}

/// `gabp-relay ship --all` of `data` to `urls`: its stdout (it must succeed).
async fn backfill(data: &Path, urls: &str) -> String {
    let out = ship_all(data, urls, &[]).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).to_string()
}

fn kill9(c: &mut Child) {
    let pid = c.id().expect("running");
    std::process::Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .expect("kill -9");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_relays_ship_through_faults_and_the_archive_equals_both() {
    let mut cluster = Cluster::new(3, true, "");
    cluster.ready(true).await;
    let urls = cluster.urls();
    let dir = tempfile::tempdir().expect("tmp");
    let (a, b, archive) = (
        dir.path().join("a"),
        dir.path().join("b"),
        dir.path().join("archive"),
    );
    let (sim_a, sim_b) = (start_mod(Some(2000.0)), start_mod(Some(2000.0)));
    let mut ra = serve_shipping(&sim_a, &a, &urls, "ra", "3").await;
    let rb = serve_shipping(&sim_b, &b, &urls, "rb", "3").await;
    let mut col = collector(&urls, &archive);
    recorded_beyond(&a, 2000).await;
    // The collector is kill -9'd mid-stream, once it has written something, and restarted.
    let deadline = Instant::now() + Duration::from_secs(60);
    while frames(&archive).await == 0 {
        assert!(Instant::now() < deadline, "the collector never wrote");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    kill9(&mut col);
    let _ = col.wait().await;
    col = collector(&urls, &archive);
    // One node killed mid-stream: the other two keep the stream.
    cluster.nodes[2].kill();
    let seen = frames(&a).await;
    recorded_beyond(&a, seen + 2000).await;
    // A relay restarted mid-ship: its cursor resumes, a new session starts.
    ra.stop_cleanly().await;
    ra = serve_shipping(&sim_a, &a, &urls, "ra", "3").await;
    let seen = frames(&a).await;
    recorded_beyond(&a, seen + 1000).await;
    ra.stop_cleanly().await;
    rb.stop_cleanly().await;
    // What the relays had not shipped when they stopped goes by backfill, with the same ids
    // (once the two nodes left have a JetStream leader again).
    cluster.ready(true).await;
    for d in [&a, &b] {
        assert!(backfill(d, &urls).await.contains("shipped"));
    }
    archive_equals(&archive, &[&a, &b]).await;
    // The origin is kept: the archive's sessions came from two routes.
    let v = sessions(&archive).await;
    let routes: std::collections::BTreeSet<&str> = v["sessions"]
        .as_array()
        .expect("list")
        .iter()
        .map(|s| s["route"].as_str().expect("route"))
        .collect();
    assert_eq!(routes.into_iter().collect::<Vec<_>>(), ["ra", "rb"]);
    // Backfill of what was already shipped sends nothing new and changes nothing.
    let said = backfill(&a, &urls).await;
    assert!(said.contains(": 0 new frame(s)"), "{said}");
    archive_equals(&archive, &[&a, &b]).await;
    kill9(&mut col);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_whole_cluster_down_and_back_shipping_catches_up() {
    let Solo {
        mut cluster,
        urls: _,
        dir: _dir,
        data: a,
        archive,
        sim: _sim,
        relay: r,
        collector: mut col,
    } = solo_shipping("", 2000.0, "solo").await;
    recorded_beyond(&a, 1000).await;
    cluster.nodes[0].kill();
    // The relay keeps serving bridges and recording while NATS is gone.
    let seen = frames(&a).await;
    recorded_beyond(&a, seen + 3000).await;
    let (mut c, _) = Client::connect_hello(&r.addr, BRIDGE_TOKEN)
        .await
        .expect("hello while NATS is down");
    // The lag keeps counting while NATS is gone: at least what was recorded since.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let st = c
            .call("relay/status", serde_json::json!({}))
            .await
            .expect("status");
        let ship = &st["routes"][0]["ship"];
        let ship = if ship.is_null() { &st["ship"] } else { ship };
        assert!(
            ship.to_string().contains("lagFrames"),
            "relay/status shows shipping: {st}"
        );
        if ship["lagFrames"].as_u64().unwrap_or(0) >= 3000 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the lag stood still while NATS was down: {st}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    drop(c);
    cluster.start_all();
    cluster.ready(true).await;
    // Shipping catches up while the relay runs: the archive gets past what was recorded
    // while NATS was down.
    let behind = frames(&a).await;
    let deadline = Instant::now() + Duration::from_secs(120);
    while frames(&archive).await < behind {
        assert!(
            Instant::now() < deadline,
            "shipping never caught up to {behind}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // A clean stop ships what was recorded last and the session's end: no backfill needed.
    r.stop_cleanly().await;
    archive_equals(&archive, &[&a]).await;
    kill9(&mut col);
}

/// `ship --all` of `data` to `urls`: how many new frames it says it sent.
async fn shipped_new(data: &Path, urls: &str) -> u64 {
    let said = backfill(data, urls).await;
    said.trim()
        .rsplit(": ")
        .next()
        .and_then(|t| t.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("ship said {said:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_destination_gets_every_session_and_a_stream_made_again_gets_it_again() {
    let (mut first, second) = (Cluster::new(1, true, ""), Cluster::new(1, true, ""));
    first.ready(true).await;
    second.ready(true).await;
    let dir = tempfile::tempdir().expect("tmp");
    let (a, archive1, archive2) = (
        dir.path().join("a"),
        dir.path().join("archive1"),
        dir.path().join("archive2"),
    );
    let sim = start_mod(Some(2000.0));
    let r = serve_shipping(&sim, &a, &first.urls(), "solo", "1").await;
    recorded_beyond(&a, 1500).await;
    r.stop_cleanly().await;
    let total = frames(&a).await;
    // The relay shipped everything to the first cluster, the session's end included.
    assert_eq!(shipped_new(&a, &first.urls()).await, 0);
    let mut col = collector(&first.urls(), &archive1);
    archive_equals(&archive1, &[&a]).await;
    kill9(&mut col);
    // Another cluster is another destination: it gets every frame, once.
    assert_eq!(shipped_new(&a, &second.urls()).await, total);
    assert_eq!(shipped_new(&a, &second.urls()).await, 0);
    // Another stream and prefix on the same server is another destination too, and a stream
    // keeping messages less than the two-minute dedup window can be made.
    let said = ship_ok(
        &a,
        &second.urls(),
        &[
            "--stream",
            "SHORT",
            "--subject-prefix",
            "short.lab",
            "--stream-max-age",
            "1m",
        ],
    )
    .await;
    assert!(said.contains(&format!(": {total} new frame(s)")), "{said}");
    let mut col = collector(&second.urls(), &archive2);
    archive_equals(&archive2, &[&a]).await;
    kill9(&mut col);
    let v = sessions(&a).await;
    let ship = &v["sessions"][0]["ship"];
    assert_eq!(ship["destinations"], 3, "{v}");
    assert_eq!(ship["lagFrames"], 0, "{v}");
    assert_eq!(ship["shipped"], true, "{v}");
    // The first cluster loses its stream (its store wiped): the stream made again is a new
    // destination, and gets everything again.
    first.nodes[0].kill();
    let store = first.nodes[0].conf.with_file_name("n0");
    std::fs::remove_dir_all(&store).expect("wipe the JetStream store");
    first.start_all();
    first.ready(true).await;
    assert_eq!(shipped_new(&a, &first.urls()).await, total);
}

/// `gabp-relay ship --all` of `data` against `urls` with `extra` flags.
async fn ship_all(data: &Path, urls: &str, extra: &[&str]) -> std::process::Output {
    let mut args = vec![
        "ship",
        "--all",
        "--to",
        urls,
        "--data-dir",
        data.to_str().expect("utf8"),
    ];
    args.extend(extra);
    output(&args).await
}

/// [`ship_all`] that must fail: its exit and one-line stderr.
async fn ship_err(data: &Path, urls: &str, extra: &[&str]) -> (Option<i32>, String) {
    let out = ship_all(data, urls, extra).await;
    (out.status.code(), one_line(&out))
}

/// [`ship_all`] that must succeed: everything it printed.
async fn ship_ok(data: &Path, urls: &str, extra: &[&str]) -> String {
    let out = ship_all(data, urls, extra).await;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{extra:?}: {text}");
    text
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_jetstream_a_wrong_token_or_no_server_are_one_line_and_recording_goes_on() {
    let plain = Cluster::new(1, false, "");
    plain.ready(false).await;
    let guarded = Cluster::new(1, true, "authorization { token: \"right-token-123456\" }");
    guarded.ready(true).await;
    let nowhere = format!("nats://127.0.0.1:{}", free_addr().port());
    let dir = tempfile::tempdir().expect("tmp");
    let cases = [
        (plain.urls(), vec![], "JetStream"),
        (
            guarded.urls(),
            vec!["--nats-token", "wrong-token-123456"],
            "cannot connect to NATS",
        ),
        (nowhere.clone(), vec![], "cannot connect to NATS"),
    ];
    for (i, (urls, extra, says)) in cases.iter().enumerate() {
        let data = dir.path().join(format!("d{i}"));
        let sim = start_mod(Some(500.0));
        let up = sim.addr().to_string();
        let mut args = vec![
            "--upstream",
            &up,
            "--upstream-token",
            MOD_TOKEN,
            "--listen",
            "127.0.0.1:0",
            "--token",
            BRIDGE_TOKEN,
            "--data-dir",
            data.to_str().expect("utf8"),
            "--ship",
            urls,
        ];
        args.extend(extra.iter().copied());
        let s = serve(&args).await;
        // Relaying: a bridge is welcomed and answered; recording: frames land.
        let (mut c, _) = Client::connect_hello(&s.addr, BRIDGE_TOKEN)
            .await
            .expect("hello");
        let st: Value = c
            .call("relay/status", serde_json::json!({}))
            .await
            .expect("status");
        drop(c);
        recorded_beyond(&data, 200).await;
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let text = st.to_string();
            let _ = text;
            let (mut c, _) = Client::connect_hello(&s.addr, BRIDGE_TOKEN)
                .await
                .expect("hello");
            let st: Value = c
                .call("relay/status", serde_json::json!({}))
                .await
                .expect("status");
            let err = st.to_string();
            if err.contains(says) {
                assert!(!err.contains("wrong-token"), "no secret in status: {err}");
                break;
            }
            assert!(Instant::now() < deadline, "status never said {says}: {err}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        s.stop_cleanly().await;
        let (code, line) = ship_err(&data, urls, extra).await;
        assert_eq!(code, Some(1), "{line}");
        assert!(line.contains(says), "{line}");
        assert!(!line.contains("wrong-token"), "no secret: {line}");
    }
    // The NATS tools' way to give a token, in the address, works (and is never printed).
    let guarded_port = guarded.nodes[0].client;
    let said = ship_ok(
        &dir.path().join("d1"),
        &format!("nats://right-token-123456@127.0.0.1:{guarded_port}"),
        &[],
    )
    .await;
    assert!(!said.contains("right-token"), "no secret: {said}");
}

fn deploy_file(name: &str) -> (PathBuf, String) {
    let p = std::env::var_os("CARGO_MANIFEST_DIR")
        .map_or_else(|| env!("CARGO_MANIFEST_DIR").into(), PathBuf::from)
        .join("../deploy")
        .join(name);
    let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    (p, text)
}

#[tokio::test]
async fn deploy_files_for_a_fleet_are_valid() {
    // The example relay config's [ship] table parses and describes a replicated stream.
    let (_, text) = deploy_file("relay.toml");
    gabp_relay::config::FileConfig::parse(&text, "deploy/relay.toml").expect("parses");
    let table: toml::Table = toml::from_str(&text).expect("toml");
    let ship: gabp_relay::ship::FileShip = table["ship"].clone().try_into().expect("[ship]");
    let t = ship.target().expect("a valid target");
    assert_eq!(t.flags.replicas, 3);
    assert_eq!(t.urls.split(',').count(), 3);
    // The NATS cluster config is one nats-server accepts.
    let (conf, text) = deploy_file("nats-cluster.conf");
    assert!(text.contains("jetstream") && text.contains("cluster"));
    let out = std::process::Command::new(NATS)
        .args(["-t", "-c", conf.to_str().expect("utf8")])
        .output()
        .expect("nats-server -t");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The collector unit runs `collect` with flags the binary has, hardened like the relay's.
    let (_, unit) = deploy_file("gabp-collector.service");
    let exec = unit
        .lines()
        .find_map(|l| l.strip_prefix("ExecStart="))
        .expect("ExecStart");
    assert!(exec.contains(" collect "), "{exec}");
    let help = output(&["collect", "--help"]).await;
    let help = String::from_utf8_lossy(&help.stdout).to_string();
    for flag in exec.split_whitespace().filter(|w| w.starts_with("--")) {
        assert!(help.contains(flag), "collect has no {flag}");
    }
    for hardening in [
        "DynamicUser=yes",
        "ProtectSystem=strict",
        "UMask=0077",
        "NoNewPrivileges=yes",
    ] {
        assert!(unit.contains(hardening), "{hardening}");
    }
}

/// A plain HTTP/1.0 GET on loopback `port`: status line, headers and body.
fn http_get(port: u16, path: &str) -> Option<String> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    Some(out)
}

/// Messages the collector cannot read, put in the stream before a real session's: a chunk that
/// does not decode (on that very session, at a frame number of its own), a catalog that is not
/// JSON, a kind it does not know, a subject naming no session. Each is one warning line and one
/// count of the metric, terminated (nothing left pending, nothing redelivered), and the real
/// session still arrives whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreadable_messages_are_reported_terminated_and_the_rest_is_collected() {
    let cluster = Cluster::new(1, true, "");
    cluster.ready(true).await;
    let urls = cluster.urls();
    let dir = tempfile::tempdir().expect("tmp");
    let (a, archive) = (dir.path().join("a"), dir.path().join("archive"));
    let sim = start_mod(Some(2000.0));
    let up = sim.addr().to_string();
    let r = serve(&[
        "--upstream",
        &up,
        "--upstream-token",
        MOD_TOKEN,
        "--listen",
        "127.0.0.1:0",
        "--token",
        BRIDGE_TOKEN,
        "--data-dir",
        a.to_str().expect("utf8"),
    ])
    .await;
    recorded_beyond(&a, 1500).await;
    r.stop_cleanly().await;
    let id = listed(&a).await[0].0.clone();

    let client = async_nats::connect(urls.as_str()).await.expect("connect");
    let js = async_nats::jetstream::new(client);
    js.get_or_create_stream(async_nats::jetstream::stream::Config {
        name: "GABP".into(),
        subjects: vec!["gabp.>".into()],
        ..Default::default()
    })
    .await
    .expect("stream");
    type Bad<'a> = (String, &'a [(&'a str, &'a str)], &'a [u8]);
    let bad: [Bad; 4] = [
        (
            format!("gabp.{id}"),
            &[("Gabp-Kind", "chunk"), ("Gabp-First", "900000000")],
            b"\x01\x05\x00\x00\x00garbage",
        ),
        (
            format!("gabp.{id}"),
            &[("Gabp-Kind", "catalog")],
            b"{not json",
        ),
        (format!("gabp.{id}"), &[("Gabp-Kind", "mystery")], b"?"),
        (
            "gabp.not-a-session".into(),
            &[("Gabp-Kind", "chunk"), ("Gabp-First", "0")],
            b"x",
        ),
    ];
    for (subject, headers, body) in &bad {
        let mut h = async_nats::HeaderMap::new();
        for (k, v) in *headers {
            h.insert(*k, *v);
        }
        js.publish_with_headers(subject.clone(), h, body.to_vec().into())
            .await
            .expect("publish")
            .await
            .expect("ack");
    }
    backfill(&a, &urls).await;

    let metrics = free_addr().port();
    let log = dir.path().join("collect.log");
    let mut col = relay()
        .args([
            "collect",
            "--from",
            &urls,
            "--data-dir",
            archive.to_str().expect("utf8"),
            "--metrics",
            &format!("127.0.0.1:{metrics}"),
        ])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("log"))
        .spawn()
        .expect("spawn collect");
    archive_equals(&archive, &[&a]).await;
    // Counted: the metric reaches 4 (each is counted once, not per redelivery).
    let deadline = Instant::now() + Duration::from_secs(30);
    let page = loop {
        let page = http_get(metrics, "/metrics").unwrap_or_default();
        if page.contains("gabp_collect_rejected_messages_total 4") {
            break page;
        }
        assert!(Instant::now() < deadline, "rejected count never 4: {page}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    // Terminated: nothing of them is pending or waiting for an ack.
    let stream = js.get_stream("GABP").await.expect("stream");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let info = stream
            .consumer_info("gabp-collector")
            .await
            .expect("consumer");
        if info.num_ack_pending == 0 && info.num_pending == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "messages left pending: {} unacked, {} undelivered",
            info.num_ack_pending,
            info.num_pending
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        col.try_wait().expect("wait").is_none(),
        "the collector goes on"
    );
    sigterm(&col);
    let st = tokio::time::timeout(Duration::from_secs(30), col.wait())
        .await
        .expect("collector stops")
        .expect("wait");
    assert!(st.success(), "collector exit: {st}");
    let text = std::fs::read_to_string(&log).expect("log");
    let skipped: Vec<&str> = text.lines().filter(|l| l.contains("skipping")).collect();
    assert_eq!(skipped.len(), 4, "one line each:\n{text}\n{page}");
    assert!(
        skipped.iter().any(|l| l.contains("unreadable chunk")),
        "{text}"
    );
}

/// Sends `n` `tools/call`s of the echo tool with `size` bytes of arguments back to back (so the
/// recorder commits them together), then waits for every answer.
async fn big_calls(c: &mut Client, n: usize, size: usize) {
    let ids: Vec<String> = (0..n).map(|_| gabp_sim::client::new_id()).collect();
    // Letters at random, which LZ4 cannot shrink: recorded chunks are LZ4-compressed, and a
    // repeated letter would make a frame of any size fit a message.
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for id in &ids {
        let data: String = (0..size)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                char::from(b'a' + (x % 26) as u8)
            })
            .collect();
        let params = serde_json::json!({"name": "sim/echo", "arguments": {"data": data}});
        c.send_body(&gabp_proto::message::request(id, "tools/call", params))
            .await
            .expect("send");
    }
    for id in &ids {
        let r = c.response_to(id).await.expect("answer");
        assert!(r["error"].is_null(), "{r}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunks_over_max_payload_ship_in_parts_and_a_frame_too_big_waits_with_one_line() {
    // A server that takes messages of at most 64 KiB (headers included).
    let Solo {
        mut cluster,
        urls,
        dir: _dir,
        data: a,
        archive,
        sim,
        relay: r,
        collector: mut col,
    } = solo_shipping("max_payload: 65536", 200.0, "big").await;
    let (mut c, _) = Client::connect_hello(&r.addr, BRIDGE_TOKEN)
        .await
        .expect("hello");
    // 40 frames of 30 KB committed together: chunks far over the limit, each frame under it.
    big_calls(&mut c, 40, 30_000).await;
    let recorded = frames(&a).await;
    let deadline = Instant::now() + Duration::from_secs(60);
    while frames(&archive).await < recorded {
        assert!(Instant::now() < deadline, "big chunks were never shipped");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // One frame larger than any message: that session waits, named, and the relay goes on.
    big_calls(&mut c, 1, 100_000).await;
    let deadline = Instant::now() + Duration::from_secs(60);
    let line = loop {
        let st = c
            .call("relay/status", serde_json::json!({}))
            .await
            .expect("status");
        let e = st.to_string();
        if e.contains("cannot be shipped") {
            break e;
        }
        assert!(Instant::now() < deadline, "no stuck session in {st}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(line.contains("max_payload"), "{line}");
    let seen = frames(&a).await;
    recorded_beyond(&a, seen + 200).await;
    drop(c);
    r.stop_cleanly().await;
    // The backfill says the same in one line and fails.
    let (code, err) = ship_err(&a, &urls, &[]).await;
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("cannot be shipped") && err.contains("max_payload"),
        "{err}"
    );
    // A relay started again finds it stuck again; once the servers' limit is raised (the
    // cluster restarted with a larger max_payload) it ships it without being restarted.
    let r = serve_shipping(&sim, &a, &urls, "big", "1").await;
    let stuck_again = Instant::now() + Duration::from_secs(60);
    loop {
        let (mut c, _) = Client::connect_hello(&r.addr, BRIDGE_TOKEN)
            .await
            .expect("hello");
        let st = c
            .call("relay/status", serde_json::json!({}))
            .await
            .expect("status");
        if st.to_string().contains("cannot be shipped") {
            break;
        }
        assert!(Instant::now() < stuck_again, "not stuck again: {st}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    cluster.nodes[0].kill();
    let conf = std::fs::read_to_string(&cluster.nodes[0].conf).expect("conf");
    std::fs::write(
        &cluster.nodes[0].conf,
        conf.replace("max_payload: 65536", "max_payload: 1048576"),
    )
    .expect("conf");
    cluster.start_all();
    cluster.ready(true).await;
    let first = listed(&a)
        .await
        .into_iter()
        .find(|s| !s.2.is_empty())
        .expect("the stuck session ended");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !listed(&archive)
        .await
        .iter()
        .any(|s| s.0 == first.0 && s.1 == first.1)
    {
        assert!(
            Instant::now() < deadline,
            "the stuck session was not shipped after max_payload was raised"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // A clean stop ships what was recorded last and the session's end: no backfill needed.
    r.stop_cleanly().await;
    archive_equals(&archive, &[&a]).await;
    kill9(&mut col);
}
