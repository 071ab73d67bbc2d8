//! Shipping to NATS JetStream and collecting an archive, with real `nats-server`
//! processes on loopback: a three-node JetStream cluster (replicas 3), relays in front of
//! simulated mods shipping at once, and `gabp-relay collect`. The archive must equal the
//! sources frame for frame (exports compared byte for byte, `sessions check` clean) through
//! faults: a node killed, the collector `kill -9`ed, a relay restarted, the whole cluster down
//! and back; and a server without JetStream, a wrong token or no server at all must give one
//! clear line while the relay keeps relaying and recording.

use std::path::{Path, PathBuf};
use std::time::Instant;

use crate::support::storage::sessions;
use crate::support::*;
use gabp_ship::fleet::{self, Covered, FleetKey, Kind};
use serde_json::Value;

const NATS: &str = "/usr/sbin/nats-server";

/// One `nats-server` node: its config, ports, environment and process (killed on drop).
struct Node {
    conf: PathBuf,
    client: u16,
    http: u16,
    env: Vec<(String, String)>,
    child: Option<std::process::Child>,
}

impl Node {
    fn start(&mut self) {
        let child = std::process::Command::new(NATS)
            .args(["-c", self.conf.to_str().expect("utf8")])
            .envs(self.env.iter().map(|(k, v)| (k, v)))
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
        Cluster::build(n, jetstream, extra, &[], &[])
    }

    /// [`Cluster::new`] with `files` (name, text) written beside the configs (for an
    /// `include`) and `env` in the servers' environment.
    fn build(
        n: usize,
        jetstream: bool,
        extra: &str,
        files: &[(&str, &str)],
        env: &[(&str, &str)],
    ) -> Cluster {
        let dir = tempfile::tempdir().expect("tmp");
        for (name, text) in files {
            std::fs::write(dir.path().join(name), text).expect("write an included file");
        }
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
                env: env
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
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
        "--fleet-key",
        key_for(data).to_str().expect("utf8"),
    ])
    .await
}

/// The fleet key of the test whose temp dir holds `p` (made with `fleet-key new` at first use).
fn key_for(p: &Path) -> PathBuf {
    let key = p.parent().expect("in a temp dir").join("fleet.key");
    if !key.exists() {
        new_key(&key);
    }
    key
}

/// `gabp-relay fleet-key new -o key`: it says the key's id, never the key.
fn new_key(key: &Path) {
    let out = std::process::Command::new(BIN)
        .args(["fleet-key", "new", "-o", key.to_str().expect("utf8")])
        .output()
        .expect("fleet-key new");
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && said.contains("wrote fleet key"),
        "{said}"
    );
    let hex = std::fs::read_to_string(key).expect("key");
    assert!(
        !said.contains(hex.trim()),
        "the key is never printed: {said}"
    );
}

/// A collector writing `archive` with the test's fleet key, once it has the archive open.
async fn collector(urls: &str, archive: &Path) -> Child {
    let name = archive
        .file_name()
        .and_then(|n| n.to_str())
        .expect("named")
        .to_string();
    let key = key_for(archive);
    collector_logged(urls, archive, &[&key], &[], free_addr().port(), &name)
        .await
        .0
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
    let collector = collector(&urls, &archive).await;
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
    let mut col = collector(&urls, &archive).await;
    recorded_beyond(&a, 2000).await;
    // The collector is kill -9'd mid-stream, once it has written something, and restarted.
    let deadline = Instant::now() + Duration::from_secs(60);
    while frames(&archive).await == 0 {
        assert!(Instant::now() < deadline, "the collector never wrote");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    kill9(&mut col);
    let _ = col.wait().await;
    col = collector(&urls, &archive).await;
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
    let mut col = collector(&first.urls(), &archive1).await;
    archive_equals(&archive1, &[&a]).await;
    kill9(&mut col);
    // Another cluster is another destination: it gets every frame, once; on a terminal with
    // a bar of the frames shipped (on stderr: stdout has the summary alone).
    let key = key_for(&a);
    let (terminal, stdout) = crate::progress::under_a_terminal(
        &[
            "ship",
            "--all",
            "--to",
            &second.urls(),
            "--data-dir",
            a.to_str().expect("utf8"),
            "--fleet-key",
            key.to_str().expect("utf8"),
        ],
        dir.path(),
    )
    .await;
    assert!(
        terminal.contains(" frames") && terminal.contains("left"),
        "no progress on the terminal: {terminal:?}"
    );
    assert_eq!(
        stdout.trim_end(),
        format!(
            "shipped 1 session(s) to {}: {total} new frame(s)",
            second.urls()
        ),
        "stdout holds the summary alone"
    );
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
    let mut col = collector(&second.urls(), &archive2).await;
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
    let key = key_for(data);
    let mut args = vec![
        "ship",
        "--all",
        "--to",
        urls,
        "--data-dir",
        data.to_str().expect("utf8"),
    ];
    if !extra.contains(&"--fleet-key") && !extra.contains(&"--insecure-unsigned") {
        args.extend(["--fleet-key", key.to_str().expect("utf8")]);
    }
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
    let key = key_for(&dir.path().join("d"));
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
            "--fleet-key",
            key.to_str().expect("utf8"),
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

/// Signs a message as a relay with `key` does: `Gabp-Key` and `Gabp-Mac` added to `h`.
fn sign(
    h: &mut async_nats::HeaderMap,
    key: &FleetKey,
    session: uuid::Uuid,
    kind: Kind,
    first: u64,
    body: &[u8],
) {
    let mac = key.sign(&Covered {
        session,
        kind,
        first,
        body,
    });
    h.insert("Gabp-Key", key.id().to_string().as_str());
    h.insert("Gabp-Mac", fleet::hex(&mac).as_str());
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
    // The password file does not exist here; one in a temp dir stands in for it.
    let dir = tempfile::tempdir().expect("tmp");
    let password = dir.path().join("nats-password");
    std::fs::write(&password, "relay-password\n").expect("write");
    let text = text.replace(
        "/etc/gabp-relay/nats-password",
        password.to_str().expect("utf8"),
    );
    let table: toml::Table = toml::from_str(&text).expect("toml");
    let ship: gabp_ship::FileShip = table["ship"].clone().try_into().expect("[ship]");
    let t = ship.target().expect("a valid target");
    assert_eq!(t.flags.replicas, 3);
    assert_eq!(t.urls.split(',').count(), 3);
    // The relay user of nats-permissions.conf, on its own inboxes.
    assert_eq!(t.flags.nats_user.as_deref(), Some("gabp-relay"));
    assert_eq!(t.flags.nats_password.as_deref(), Some("relay-password"));
    assert_eq!(t.flags.nats_inbox_prefix, "_INBOX_relay");
    // The NATS cluster config is one nats-server accepts, with the permissions it includes
    // (and their passwords from the environment: without them it is refused).
    let (conf, text) = deploy_file("nats-cluster.conf");
    assert!(text.contains("jetstream") && text.contains("cluster"));
    assert!(text.contains("include ./nats-permissions.conf"));
    let check = |env: &[(&str, &str)]| {
        std::process::Command::new(NATS)
            .args(["-t", "-c", conf.to_str().expect("utf8")])
            .envs(env.iter().copied())
            .output()
            .expect("nats-server -t")
    };
    let out = check(&[
        ("GABP_RELAY_NATS_PASSWORD", "r"),
        ("GABP_COLLECTOR_NATS_PASSWORD", "c"),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!check(&[]).status.success(), "no password, no server");
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
    // Both units hand their service the fleet key as a credential and pass it.
    let (_, relay_unit) = deploy_file("gabp-relay.service");
    let relay_exec = relay_unit
        .lines()
        .find_map(|l| l.strip_prefix("ExecStart="))
        .expect("ExecStart");
    let serve_help = output(&["serve", "--help"]).await;
    let serve_help = String::from_utf8_lossy(&serve_help.stdout).to_string();
    for flag in relay_exec
        .split_whitespace()
        .filter(|w| w.starts_with("--"))
    {
        assert!(serve_help.contains(flag), "serve has no {flag}");
    }
    for (u, exec) in [(&unit, exec), (&relay_unit, relay_exec)] {
        assert!(u.contains("LoadCredential=fleet.key:/etc/gabp-relay/fleet.key"));
        assert!(
            exec.contains("--fleet-key ${CREDENTIALS_DIRECTORY}/fleet.key"),
            "{exec}"
        );
    }
    assert!(exec.contains("--nats-user gabp-collector") && exec.contains("_INBOX_collector"));
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
    // Signed with the fleet key where they name a session and a kind: unreadable, not forged.
    let key = FleetKey::load(&key_for(&a)).expect("key");
    for (subject, headers, body) in &bad {
        let mut h = async_nats::HeaderMap::new();
        for (k, v) in *headers {
            h.insert(*k, *v);
        }
        let kind = match headers[0].1 {
            "chunk" => Some(Kind::Chunk),
            "catalog" => Some(Kind::Catalog),
            _ => None,
        };
        if let (Some(kind), Ok(session)) = (kind, id.parse()) {
            let first = headers.get(1).map_or(0, |f| f.1.parse().expect("first"));
            sign(&mut h, &key, session, kind, first, body);
        }
        js.publish_with_headers(subject.clone(), h, body.to_vec().into())
            .await
            .expect("publish")
            .await
            .expect("ack");
    }
    backfill(&a, &urls).await;

    let metrics = free_addr().port();
    let key = key_for(&a);
    let (mut col, _, log) =
        collector_logged(&urls, &archive, &[&key], &[], metrics, "collect").await;
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
    let ids: Vec<String> = (0..n).map(|_| gabp_client::new_id()).collect();
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

/// A command that must fail as a usage error (exit 2): its one line.
async fn usage_line(args: &[&str]) -> String {
    let out = output(args).await;
    let line = one_line(&out);
    assert_eq!(out.status.code(), Some(2), "{args:?}: {line}");
    line
}

/// Publishes on `subject` as anyone allowed to publish on the stream's subjects could, and
/// waits for the stream's ack.
async fn publish(
    js: &async_nats::jetstream::Context,
    subject: String,
    h: async_nats::HeaderMap,
    body: Vec<u8>,
) {
    js.publish_with_headers(subject, h, body.into())
        .await
        .expect("publish")
        .await
        .expect("ack");
}

/// Headers from (name, value) pairs.
fn headers(pairs: &[(&str, &str)]) -> async_nats::HeaderMap {
    let mut h = async_nats::HeaderMap::new();
    for (k, v) in pairs {
        h.insert(*k, *v);
    }
    h
}

/// Every message of the stream, in order.
async fn stream_messages(
    js: &async_nats::jetstream::Context,
) -> Vec<async_nats::jetstream::message::StreamMessage> {
    let mut stream = js.get_stream("GABP").await.expect("stream");
    let last = stream.info().await.expect("info").state.last_sequence;
    let mut out = Vec::new();
    for seq in 1..=last {
        out.push(stream.get_raw_message(seq).await.expect("message"));
    }
    out
}

/// Waits until the metrics page on `port` has `line`; returns the page.
async fn metric_reaches(port: u16, line: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let page = http_get(port, "/metrics").unwrap_or_default();
        if page.lines().any(|l| l == line) {
            return page;
        }
        assert!(Instant::now() < deadline, "never {line}: {page}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until the durable consumer has nothing undelivered or unacknowledged.
async fn drained(js: &async_nats::jetstream::Context, durable: &str) {
    let stream = js.get_stream("GABP").await.expect("stream");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let info = stream.consumer_info(durable).await.expect("consumer");
        if info.num_ack_pending == 0 && info.num_pending == 0 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "messages left: {} unacked, {} undelivered",
            info.num_ack_pending,
            info.num_pending
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A collector writing `archive` with `keys`, `extra` flags and metrics on `metrics`; its
/// stdout and stderr go to `out` and `log` under `archive`'s parent, named by `name`. Returns
/// once it has the archive open (its log says what it takes), so reading the archive then
/// never meets one half made.
async fn collector_logged(
    urls: &str,
    archive: &Path,
    keys: &[&Path],
    extra: &[&str],
    metrics: u16,
    name: &str,
) -> (Child, PathBuf, PathBuf) {
    let dir = archive.parent().expect("in a temp dir");
    let (out, log) = (
        dir.join(format!("{name}.out")),
        dir.join(format!("{name}.log")),
    );
    let mut cmd = relay();
    cmd.args([
        "collect",
        "--from",
        urls,
        "--data-dir",
        archive.to_str().expect("utf8"),
        "--metrics",
        &format!("127.0.0.1:{metrics}"),
    ]);
    for k in keys {
        cmd.args(["--fleet-key", k.to_str().expect("utf8")]);
    }
    let mut child = cmd
        .args(extra)
        .stdout(std::fs::File::create(&out).expect("out"))
        .stderr(std::fs::File::create(&log).expect("log"))
        .spawn()
        .expect("spawn collect");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if text.contains("taking only messages signed") || text.contains("(--insecure-unsigned)") {
            break;
        }
        assert!(
            child.try_wait().expect("wait").is_none(),
            "the collector exited: {text}"
        );
        assert!(
            Instant::now() < deadline,
            "the collector never opened its archive: {text}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    (child, out, log)
}

/// Stops a collector with SIGTERM: it exits 0.
async fn stop(mut c: Child) {
    sigterm(&c);
    let st = tokio::time::timeout(Duration::from_secs(30), c.wait())
        .await
        .expect("collector stops")
        .expect("wait");
    assert!(st.success(), "collector exit: {st}");
}

/// A session's `sessions --json` entry without what shipping adds (`ship`, `origin`).
async fn entry(data: &Path, id: &str) -> Value {
    let v = sessions(data).await;
    let mut e = v["sessions"]
        .as_array()
        .expect("list")
        .iter()
        .find(|s| s["id"] == id)
        .unwrap_or_else(|| panic!("{id} not in {v}"))
        .clone();
    let o = e.as_object_mut().expect("object");
    o.remove("ship");
    o.remove("origin");
    e
}

/// Everything a publisher without the fleet key tries, with the session a relay recorded and
/// ships by backfill (so the message ids it would have had unsigned are known beforehand):
/// (b) a chunk of its own under the id of the session's first chunk, published first; (a) a
/// catalog snapshot of the session with the highest sequence number renaming its route and
/// app and saying it records again, unsigned and with a made-up signature; (c) a snapshot of a
/// session that never existed; a genuine signed chunk replayed on that other session's
/// subject; and (d) a snapshot signed with the fleet key whose route name is 300 bytes. The
/// archive equals the source (every frame, the same entry, `sessions check` sound), nothing
/// else is in it, each message is refused, counted, logged without its payload and
/// terminated, and `collect` says how many at exit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_messages_are_refused_counted_and_change_nothing() {
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
        "--route-name",
        "real",
        "--data-dir",
        a.to_str().expect("utf8"),
    ])
    .await;
    recorded_beyond(&a, 1500).await;
    r.stop_cleanly().await;
    let (id, source_frames, _) = listed(&a).await[0].clone();
    let made_up = uuid::Uuid::now_v7();

    // A client with no key at all: what anyone allowed to publish can do.
    let client = async_nats::connect(urls.as_str()).await.expect("connect");
    let js = async_nats::jetstream::new(client);
    js.get_or_create_stream(async_nats::jetstream::stream::Config {
        name: "GABP".into(),
        subjects: vec!["gabp.>".into()],
        ..Default::default()
    })
    .await
    .expect("stream");
    let mut forged = gabp_storage::chunk::ChunkBuilder::default();
    let mut rec = gabp_storage::FrameRecord::message(
        gabp_storage::Direction::ModToRelay,
        0,
        1,
        true,
        bytes::Bytes::from_static(b"{\"FORGED-PAYLOAD\":1}"),
    );
    rec.channel = Some(0);
    forged.push(&rec);
    publish(
        &js,
        format!("gabp.{id}"),
        headers(&[
            ("Gabp-Kind", "chunk"),
            ("Gabp-First", "0"),
            ("Nats-Msg-Id", &format!("{id}-0")),
        ]),
        forged.finish().to_vec(),
    )
    .await;
    backfill(&a, &urls).await;

    let metrics = free_addr().port();
    let key = key_for(&a);
    let (col, out, log) = collector_logged(&urls, &archive, &[&key], &[], metrics, "collect").await;
    archive_equals(&archive, &[&a]).await;
    let before = entry(&archive, &id).await;
    assert_eq!(before["route"], "real");
    assert_eq!(before["frames"], source_frames);

    // The genuine catalog, turned into forgeries.
    let genuine = stream_messages(&js).await;
    let catalog = genuine
        .iter()
        .find(|m| m.headers.get("Gabp-Kind").map(|v| v.as_str()) == Some("catalog"))
        .expect("a catalog in the stream");
    let snap: gabp_storage::ship::CatalogSnapshot =
        serde_json::from_slice(&catalog.payload).expect("catalog");
    let mut takeover = snap.clone();
    takeover.seq = u64::MAX;
    takeover.meta.route = "forged".into();
    takeover.origin.route = "forged".into();
    takeover.meta.app_name = Some("forged".into());
    takeover.meta.state = Some(gabp_storage::SessionState::Recording);
    (takeover.meta.end_reason, takeover.meta.ended_ns) = (None, None);
    let takeover = serde_json::to_vec(&takeover).expect("json");
    publish(
        &js,
        format!("gabp.{id}"),
        headers(&[("Gabp-Kind", "catalog")]),
        takeover.clone(),
    )
    .await;
    let key_id = FleetKey::load(&key).expect("key").id().to_string();
    publish(
        &js,
        format!("gabp.{id}"),
        headers(&[
            ("Gabp-Kind", "catalog"),
            ("Gabp-Key", &key_id),
            ("Gabp-Mac", &"ab".repeat(32)),
        ]),
        takeover,
    )
    .await;
    let mut ghost = snap.clone();
    ghost.meta.id = made_up;
    ghost.seq = 1;
    publish(
        &js,
        format!("gabp.{made_up}"),
        headers(&[("Gabp-Kind", "catalog")]),
        serde_json::to_vec(&ghost).expect("json"),
    )
    .await;
    // A genuine chunk, signature and all, on the made-up session's subject.
    let chunk = genuine
        .iter()
        .find(|m| {
            m.headers.get("Gabp-Kind").map(|v| v.as_str()) == Some("chunk")
                && m.headers.get("Gabp-Mac").is_some()
        })
        .expect("a signed chunk in the stream");
    let mut replayed = async_nats::HeaderMap::new();
    for name in ["Gabp-Kind", "Gabp-First", "Gabp-Key", "Gabp-Mac"] {
        let v = chunk.headers.get(name).expect("signed chunk header");
        replayed.insert(name, v.as_str());
    }
    publish(
        &js,
        format!("gabp.{made_up}"),
        replayed,
        chunk.payload.to_vec(),
    )
    .await;
    // Signed, but with a route no relay accepts.
    let mut long = ghost.clone();
    (long.meta.route, long.origin.route) = ("r".repeat(300), "r".repeat(300));
    let long = serde_json::to_vec(&long).expect("json");
    let mut h = headers(&[("Gabp-Kind", "catalog")]);
    sign(
        &mut h,
        &FleetKey::load(&key).expect("key"),
        made_up,
        Kind::Catalog,
        0,
        &long,
    );
    publish(&js, format!("gabp.{made_up}"), h, long).await;

    metric_reaches(metrics, "gabp_collect_rejected_messages_total 6").await;
    let page = metric_reaches(metrics, "gabp_collect_unverified_messages_total 5").await;
    drained(&js, "gabp-collector").await;
    // Nothing changed: the one session, as recorded, sound; nothing of the made-up one.
    assert_eq!(listed(&archive).await, listed(&a).await);
    assert_eq!(entry(&archive, &id).await, before);
    assert_eq!(export(&a, &id).await, export(&archive, &id).await);
    let check = output(&[
        "sessions",
        "check",
        "--data-dir",
        archive.to_str().expect("utf8"),
    ])
    .await;
    assert!(
        check.status.success(),
        "{}",
        String::from_utf8_lossy(&check.stdout)
    );
    stop(col).await;
    let said = std::fs::read_to_string(&out).expect("out");
    assert!(
        said.contains("refused 5 message(s) not signed with the fleet key and 1 unreadable"),
        "{said}"
    );
    let text = std::fs::read_to_string(&log).expect("log");
    assert!(!text.contains("FORGED"), "no payload in the log: {text}");
    let refusing: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("refusing message"))
        .collect();
    assert_eq!(refusing.len(), 5, "one line each:\n{text}\n{page}");
    for why in [
        "not signed with the fleet key",
        &format!("a wrong signature for fleet key {key_id}"),
    ] {
        assert!(refusing.iter().any(|l| l.contains(why)), "{why}:\n{text}");
    }
    assert!(
        text.lines()
            .any(|l| l.contains("skipping") && l.contains("not a valid route name")),
        "{text}"
    );
}

/// (e) A collector whose key is not the relays' takes nothing: every message refused,
/// counted, logged within a budget that names both keys' ids, and terminated. The messages
/// were genuine: a collector given both keys (a key being replaced) on a durable of its own
/// takes all of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collector_with_another_key_takes_nothing_and_says_why() {
    let Solo {
        cluster: _cluster,
        urls,
        dir,
        data: a,
        archive: _,
        sim: _sim,
        relay: r,
        collector: mut right,
    } = solo_shipping("", 2000.0, "solo").await;
    recorded_beyond(&a, 1500).await;
    r.stop_cleanly().await;
    assert_eq!(shipped_new(&a, &urls).await, 0, "the relay shipped it all");
    kill9(&mut right);
    let client = async_nats::connect(urls.as_str()).await.expect("connect");
    let js = async_nats::jetstream::new(client);
    let total = stream_messages(&js).await.len();
    assert!(total > 10, "{total} messages");

    let key = key_for(&a);
    let other = dir.path().join("other.key");
    new_key(&other);
    let wrong = dir.path().join("wrong-archive");
    let metrics = free_addr().port();
    let (col, out, log) = collector_logged(
        &urls,
        &wrong,
        &[&other],
        &["--durable", "wrong"],
        metrics,
        "wrong",
    )
    .await;
    metric_reaches(
        metrics,
        &format!("gabp_collect_unverified_messages_total {total}"),
    )
    .await;
    drained(&js, "wrong").await;
    assert!(listed(&wrong).await.is_empty(), "nothing taken");
    stop(col).await;
    let said = std::fs::read_to_string(&out).expect("out");
    assert!(
        said.contains(&format!(
            "collected 0 new frame(s); refused {total} message(s) not signed with the fleet key and 0 unreadable"
        )),
        "{said}"
    );
    let (ours, theirs) = (
        FleetKey::load(&key).expect("key").id(),
        FleetKey::load(&other).expect("key").id(),
    );
    let text = std::fs::read_to_string(&log).expect("log");
    let refusing: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("refusing message"))
        .collect();
    assert!(!refusing.is_empty(), "{text}");
    assert!(refusing.len() < total, "logged within a budget:\n{text}");
    for l in &refusing {
        assert!(
            l.contains(&format!(
                "signed with fleet key {ours}, which this collector does not have (it has {theirs})"
            )),
            "{l}"
        );
    }

    let both = dir.path().join("both-archive");
    let (col, _, _) = collector_logged(
        &urls,
        &both,
        &[&other, &key],
        &["--durable", "both"],
        free_addr().port(),
        "both",
    )
    .await;
    archive_equals(&both, &[&a]).await;
    stop(col).await;
}

/// Shipping and collecting need the fleet key unless told to go without; a key file others may
/// read is refused like ssh refuses a private key; with --insecure-unsigned on both ends an
/// archive is still made (the messages carry no signature), and a signed collector refuses
/// those messages.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_fleet_key_nothing_ships_unless_told_to() {
    let cluster = Cluster::new(1, true, "");
    cluster.ready(true).await;
    let urls = cluster.urls();
    let dir = tempfile::tempdir().expect("tmp");
    let (a, archive) = (dir.path().join("a"), dir.path().join("archive"));
    let d = a.to_str().expect("utf8");
    let serve_args = [
        "serve",
        "--upstream",
        "127.0.0.1:1",
        "--listen",
        "127.0.0.1:0",
        "--no-bridge-file",
        "--data-dir",
        d,
        "--ship",
        &urls,
    ];
    let line = usage_line(&serve_args).await;
    assert!(
        line.contains("--fleet-key") && line.contains("fleet-key new"),
        "{line}"
    );
    let line = usage_line(&["ship", "--all", "--to", &urls, "--data-dir", d]).await;
    assert!(line.contains("--fleet-key"), "{line}");
    let line = usage_line(&["collect", "--from", &urls, "--data-dir", d]).await;
    assert!(line.contains("--fleet-key"), "{line}");
    // A config file's [ship] table needs it as well; --fleet-key on the command line gives it.
    let open = dir.path().join("open.key");
    std::fs::write(&open, "ab".repeat(32)).expect("write");
    std::fs::set_permissions(&open, std::os::unix::fs::PermissionsExt::from_mode(0o644))
        .expect("chmod");
    let line = usage_line(
        &[
            &serve_args[..],
            &["--fleet-key", open.to_str().expect("utf8")],
        ]
        .concat(),
    )
    .await;
    assert!(
        line.contains("0644 are too open") && line.contains("chmod 600"),
        "{line}"
    );
    assert!(!line.contains(&"ab".repeat(32)), "no key: {line}");
    let line = usage_line(&[
        "collect",
        "--from",
        &urls,
        "--data-dir",
        d,
        "--fleet-key",
        open.to_str().expect("utf8"),
    ])
    .await;
    assert!(line.contains("too open"), "{line}");
    let line = usage_line(&[
        "serve",
        "--upstream",
        "127.0.0.1:1",
        "--listen",
        "127.0.0.1:0",
        "--no-bridge-file",
        "--data-dir",
        d,
        "--fleet-key",
        key_for(&a).to_str().expect("utf8"),
    ])
    .await;
    assert!(line.contains("--fleet-key applies to shipping"), "{line}");
    let conf = dir.path().join("relay.toml");
    std::fs::write(
        &conf,
        format!(
            "[[route]]\nname = \"conf\"\nupstream = \"127.0.0.1:1\"\nlisten = \"127.0.0.1:0\"\n\n[ship]\nto = \"{urls}\"\n"
        ),
    )
    .expect("write");
    let with_conf = [
        "serve",
        "--config",
        conf.to_str().expect("utf8"),
        "--no-bridge-file",
        "--data-dir",
        d,
    ];
    let line = usage_line(&with_conf).await;
    assert!(line.contains("shipping needs the fleet key"), "{line}");
    assert!(!a.exists(), "nothing was recorded");

    // Unsigned on purpose, both ends: it ships and is collected.
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
        d,
        "--ship",
        &urls,
        "--insecure-unsigned",
    ])
    .await;
    recorded_beyond(&a, 1000).await;
    r.stop_cleanly().await;
    let (col, _, _) = collector_logged(
        &urls,
        &archive,
        &[],
        &["--insecure-unsigned"],
        free_addr().port(),
        "unsigned",
    )
    .await;
    archive_equals(&archive, &[&a]).await;
    stop(col).await;
    // A collector with the key refuses every one of those.
    let client = async_nats::connect(urls.as_str()).await.expect("connect");
    let js = async_nats::jetstream::new(client);
    let total = stream_messages(&js).await.len();
    let metrics = free_addr().port();
    let (col, _, _) = collector_logged(
        &urls,
        &dir.path().join("signed-only"),
        &[&key_for(&a)],
        &["--durable", "signed-only"],
        metrics,
        "signed",
    )
    .await;
    metric_reaches(
        metrics,
        &format!("gabp_collect_unverified_messages_total {total}"),
    )
    .await;
    assert!(listed(&dir.path().join("signed-only")).await.is_empty());
    stop(col).await;
}

/// (d) Route names are bounded where they enter: flags, a config file, `wrap`'s launcher
/// variable; a data dir from before (a 300-byte route written there directly) still exports
/// to a Parquet directory, its `route=` directory cut to a file name.
#[tokio::test]
async fn route_names_are_bounded_where_they_enter_and_long_old_ones_still_export() {
    let dir = tempfile::tempdir().expect("tmp");
    let data = dir.path().join("data");
    let d = data.to_str().expect("utf8");
    let long = "r".repeat(300);
    let serve_with = |name: &str| {
        vec![
            "serve".to_string(),
            "--upstream".into(),
            "127.0.0.1:1".into(),
            "--listen".into(),
            "127.0.0.1:0".into(),
            "--no-bridge-file".into(),
            "--data-dir".into(),
            d.into(),
            "--route-name".into(),
            name.into(),
        ]
    };
    for (name, says) in [
        (long.as_str(), "300 bytes, too long"),
        ("lab\u{1b}[2J", "holds the character"),
        ("a\u{202e}b", "holds the character"),
        (" lab", "whitespace at an end"),
    ] {
        let args = serve_with(name);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let line = usage_line(&args).await;
        assert!(
            line.contains("--route-name") && line.contains(says),
            "{line}"
        );
        assert!(line.len() < 300, "the name is cut in the error: {line}");
        assert!(!line.contains('\u{1b}'), "escaped: {line:?}");
    }
    let conf = dir.path().join("r.toml");
    std::fs::write(
        &conf,
        format!(
            "[[route]]\nname = \"{long}\"\nupstream = \"127.0.0.1:1\"\nlisten = \"127.0.0.1:0\"\n"
        ),
    )
    .expect("write");
    let line = usage_line(&[
        "serve",
        "--config",
        conf.to_str().expect("utf8"),
        "--no-bridge-file",
        "--data-dir",
        d,
    ])
    .await;
    assert!(
        line.contains("r.toml: line 2") && line.contains("300 bytes, too long"),
        "{line}"
    );
    let out = relay()
        .args(["wrap", "--data-dir", d, "--", "true"])
        .env("GABP_SERVER_PORT", free_addr().port().to_string())
        .env("GABP_TOKEN", "launcher-token-123456")
        .env("GABS_GAME_ID", &long)
        .output()
        .await
        .expect("wrap");
    assert_eq!(out.status.code(), Some(2));
    let line = one_line(&out);
    assert!(
        line.contains("GABS_GAME_ID") && line.contains("300 bytes"),
        "{line}"
    );
    assert!(!data.exists(), "nothing was recorded");

    // A data dir written before route names were bounded.
    {
        let store =
            gabp_storage::Store::open(&data, gabp_storage::StoreOptions::default()).expect("open");
        let mut w = gabp_storage::SessionWriter::new(store.clone());
        let id = uuid::Uuid::now_v7();
        w.begin(gabp_storage::SessionMeta {
            id,
            route: "é".repeat(150),
            started_ns: 1,
            relay_version: "old".into(),
            channels: vec!["ch".into()],
            ..gabp_storage::SessionMeta::default()
        });
        for i in 0..10u64 {
            let mut rec = gabp_storage::FrameRecord::message(
                gabp_storage::Direction::ModToRelay,
                0,
                10 + i,
                true,
                bytes::Bytes::from(format!("{{\"n\":{i}}}")),
            );
            rec.channel = Some(0);
            rec.relay_seq = Some(i);
            w.append(id, &rec);
        }
        w.end(id, gabp_storage::EndReason::Clean, 100);
        w.commit().expect("commit");
    }
    let export_dir = dir.path().join("export");
    let out = output(&[
        "export",
        "--all",
        "--format",
        "parquet",
        "-o",
        export_dir.to_str().expect("utf8"),
        "--data-dir",
        d,
    ])
    .await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let routes: Vec<_> = std::fs::read_dir(&export_dir)
        .expect("export dir")
        .map(|e| e.expect("entry").file_name())
        .collect();
    assert_eq!(routes.len(), 1, "{routes:?}");
    let name = routes[0].to_str().expect("ascii");
    assert!(
        name.starts_with("route=%C3%A9") && name.len() <= 255,
        "{name}"
    );
    assert!(name.contains('~'), "cut, with a hash: {name}");
}

/// A plain client of `user` on its own inboxes, with short requests; its server errors (the
/// permission violations) arrive on the receiver.
async fn nats_user(
    port: u16,
    user: &str,
    password: &str,
    inbox: &str,
) -> (async_nats::Client, tokio::sync::mpsc::Receiver<String>) {
    // Bounded like every queue here: a handful of events come, read as they come.
    let (tx, rx) = tokio::sync::mpsc::channel(1024);
    let client = async_nats::ConnectOptions::with_user_and_password(user.into(), password.into())
        .custom_inbox_prefix(inbox)
        .request_timeout(Some(Duration::from_secs(3)))
        .event_callback(move |e| {
            let tx = tx.clone();
            async move {
                let _ = tx.try_send(e.to_string());
            }
        })
        .connect(format!("nats://127.0.0.1:{port}"))
        .await
        .expect("connect");
    (client, rx)
}

/// Waits for a server error naming a permission violation on `what` (`Publish to "x"`).
async fn violation(events: &mut tokio::sync::mpsc::Receiver<String>, what: &str) {
    let wanted = format!("permissions violation for {what}").to_lowercase();
    let wait = async {
        while let Some(e) = events.recv().await {
            if e.to_lowercase().contains(&wanted) {
                return;
            }
        }
        panic!("the connection closed before {wanted}");
    };
    tokio::time::timeout(Duration::from_secs(30), wait)
        .await
        .unwrap_or_else(|_| panic!("no {wanted}"));
}

/// deploy/nats-permissions.conf, as shipped, on a real server: a relay of its relay user ships
/// (user and password in the address, as the NATS tools take them) and a collector of its
/// collector user collects (user by flag, password from the environment), each on its own
/// inboxes. The relay user can neither make a consumer nor use the collector's, subscribe to
/// the stream's subjects or the collector's inboxes, nor delete the stream; the collector user
/// cannot publish into the stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_deploy_permissions_let_each_role_do_its_part_and_no_more() {
    let (_, perms) = deploy_file("nats-permissions.conf");
    let (relay_pw, collector_pw) = ("relay-secret-123456", "collector-secret-654321");
    let cluster = Cluster::build(
        1,
        true,
        "include ./nats-permissions.conf",
        &[("nats-permissions.conf", &perms)],
        &[
            ("GABP_RELAY_NATS_PASSWORD", relay_pw),
            ("GABP_COLLECTOR_NATS_PASSWORD", collector_pw),
        ],
    );
    cluster.ready(true).await;
    let port = cluster.nodes[0].client;
    let dir = tempfile::tempdir().expect("tmp");
    let (a, archive) = (dir.path().join("a"), dir.path().join("archive"));
    let key = key_for(&a);
    let sim = start_mod(Some(2000.0));
    let up = sim.addr().to_string();
    let relay_url = format!("nats://gabp-relay:{relay_pw}@127.0.0.1:{port}");
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
        "--ship",
        &relay_url,
        "--nats-inbox-prefix",
        "_INBOX_relay",
        "--fleet-key",
        key.to_str().expect("utf8"),
    ])
    .await;
    let log = dir.path().join("collect.log");
    let mut col = relay()
        .args([
            "collect",
            "--from",
            &format!("nats://127.0.0.1:{port}"),
            "--data-dir",
            archive.to_str().expect("utf8"),
            "--nats-user",
            "gabp-collector",
            "--nats-inbox-prefix",
            "_INBOX_collector",
            "--fleet-key",
            key.to_str().expect("utf8"),
        ])
        .env("GABP_NATS_PASSWORD", collector_pw)
        .env("GABP_LOG", "debug")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("log"))
        .spawn()
        .expect("spawn collect");
    recorded_beyond(&a, 1000).await;
    r.stop_cleanly().await;
    archive_equals(&archive, &[&a]).await;
    let id = listed(&a).await[0].0.clone();
    kill9(&mut col);
    let text = std::fs::read_to_string(&log).expect("log");
    assert!(!text.contains(collector_pw), "no password in the log");

    // The relay user.
    let (as_relay, mut relay_events) =
        nats_user(port, "gabp-relay", relay_pw, "_INBOX_relay").await;
    let js = async_nats::jetstream::new(as_relay.clone());
    let stream = js
        .get_stream("GABP")
        .await
        .expect("a relay looks the stream up");
    let before = stream.cached_info().state.messages;
    let thief = stream
        .get_or_create_consumer(
            "thief",
            async_nats::jetstream::consumer::pull::Config {
                durable_name: Some("thief".into()),
                ..Default::default()
            },
        )
        .await;
    assert!(thief.is_err(), "a relay made a consumer");
    violation(&mut relay_events, "Publish to \"$JS.API.CONSUMER.").await;
    let theirs = stream
        .get_consumer::<async_nats::jetstream::consumer::pull::Config>("gabp-collector")
        .await;
    assert!(theirs.is_err(), "a relay opened the collector's consumer");
    let _sub = as_relay.subscribe("gabp.>").await.expect("sent");
    violation(&mut relay_events, "Subscription to \"gabp.>\"").await;
    let _sub = as_relay
        .subscribe("_INBOX_collector.>")
        .await
        .expect("sent");
    violation(&mut relay_events, "Subscription to \"_INBOX_collector.>\"").await;
    assert!(
        js.delete_stream("GABP").await.is_err(),
        "a relay deleted the stream"
    );

    // The collector user.
    let (as_collector, mut collector_events) =
        nats_user(port, "gabp-collector", collector_pw, "_INBOX_collector").await;
    let cjs = async_nats::jetstream::new(as_collector);
    let ack = cjs
        .publish(format!("gabp.{id}"), "forged".into())
        .await
        .expect("sent");
    assert!(ack.await.is_err(), "the stream took a collector's message");
    violation(&mut collector_events, &format!("Publish to \"gabp.{id}\"")).await;
    assert!(
        cjs.delete_stream("GABP").await.is_err(),
        "a collector deleted the stream"
    );

    let mut stream = cjs.get_stream("GABP").await.expect("still there");
    assert_eq!(stream.info().await.expect("info").state.messages, before);
}

/// Runs openssl with `args` in `dir`; it must succeed.
fn openssl(dir: &Path, args: &[&str]) {
    let out = std::process::Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("openssl");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A test CA and a certificate it signed for `name` (`server` for 127.0.0.1, or `client`),
/// as `name.pem` and `name.key` in `dir`.
fn certificate(dir: &Path, name: &str) {
    if !dir.join("ca.pem").exists() {
        openssl(
            dir,
            &[
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
                "-nodes",
                "-keyout",
                "ca.key",
                "-out",
                "ca.pem",
                "-days",
                "2",
                "-subj",
                "/CN=gabp-test-ca",
            ],
        );
    }
    let ext = if name == "server" {
        "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n"
    } else {
        "extendedKeyUsage=clientAuth\n"
    };
    std::fs::write(dir.join(format!("{name}.ext")), ext).expect("ext");
    let (key, csr, pem, ext) = (
        format!("{name}.key"),
        format!("{name}.csr"),
        format!("{name}.pem"),
        format!("{name}.ext"),
    );
    openssl(
        dir,
        &[
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            &key,
            "-out",
            &csr,
            "-subj",
            &format!("/CN={name}"),
        ],
    );
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            &pem,
            "-days",
            "2",
            "-extfile",
            &ext,
        ],
    );
}

/// TLS and nkeys as NATS users set them up: a server that requires TLS, verifies client
/// certificates and authenticates by nkey; a relay ships to `tls://…` with `--nats-ca`,
/// `--nats-cert`/`--nats-key` and `--nats-nkey`, a collector collects the same way. Without
/// the CA, the client certificate or the nkey, `ship` fails in one line that says so, with no
/// secret in it; a seed file that is not one is a usage error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_client_certificates_and_nkeys_connect_as_nats_users_expect() {
    let certs = tempfile::tempdir().expect("tmp");
    certificate(certs.path(), "server");
    certificate(certs.path(), "client");
    let pem = |n: &str| certs.path().join(n).to_str().expect("utf8").to_string();
    let user = nkeys::KeyPair::new_user();
    let seed = user.seed().expect("seed");
    let cluster = Cluster::new(
        1,
        true,
        &format!(
            "tls {{ cert_file: \"{}\", key_file: \"{}\", ca_file: \"{}\", verify: true }}\nauthorization {{ users = [ {{ nkey: {} }} ] }}",
            pem("server.pem"),
            pem("server.key"),
            pem("ca.pem"),
            user.public_key()
        ),
    );
    cluster.ready(true).await;
    let urls = format!("tls://127.0.0.1:{}", cluster.nodes[0].client);
    let dir = tempfile::tempdir().expect("tmp");
    let (a, archive) = (dir.path().join("a"), dir.path().join("archive"));
    let seed_file = dir.path().join("relay.nk");
    std::fs::write(&seed_file, format!("{seed}\n")).expect("seed");
    let (ca, cert, ckey, nk) = (
        pem("ca.pem"),
        pem("client.pem"),
        pem("client.key"),
        seed_file.to_str().expect("utf8").to_string(),
    );
    let all = [
        "--nats-ca",
        ca.as_str(),
        "--nats-cert",
        cert.as_str(),
        "--nats-key",
        ckey.as_str(),
        "--nats-nkey",
        nk.as_str(),
    ];
    let sim = start_mod(Some(2000.0));
    let up = sim.addr().to_string();
    let key = key_for(&a);
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
        a.to_str().expect("utf8"),
        "--ship",
        &urls,
        "--fleet-key",
        key.to_str().expect("utf8"),
    ];
    args.extend(all);
    let r = serve(&args).await;
    let (col, _, log) =
        collector_logged(&urls, &archive, &[&key], &all, free_addr().port(), "tls").await;
    recorded_beyond(&a, 1000).await;
    r.stop_cleanly().await;
    archive_equals(&archive, &[&a]).await;
    stop(col).await;
    let text = std::fs::read_to_string(&log).expect("log");
    assert!(!text.contains(&seed), "no seed in the log");
    // Each missing piece: one line, exit 1, no secret.
    for (left_out, says) in [
        ("--nats-ca", "cannot connect to NATS"),
        ("--nats-cert", "cannot connect to NATS"),
        ("--nats-nkey", "cannot connect to NATS"),
    ] {
        let mut extra: Vec<&str> = Vec::new();
        let mut i = 0;
        while i < all.len() {
            let drop = all[i] == left_out || (left_out == "--nats-cert" && all[i] == "--nats-key");
            if !drop {
                extra.extend(&all[i..i + 2]);
            }
            i += 2;
        }
        let (code, line) = ship_err(&a, &urls, &extra).await;
        assert_eq!(code, Some(1), "{left_out}: {line}");
        assert!(line.contains(says), "{left_out}: {line}");
        assert!(!line.contains(&seed), "no seed: {line}");
    }
    std::fs::write(&seed_file, "not a seed\n").expect("write");
    let line = usage_line(&[
        "ship",
        "--all",
        "--to",
        &urls,
        "--data-dir",
        a.to_str().expect("utf8"),
        "--fleet-key",
        key.to_str().expect("utf8"),
        "--nats-nkey",
        &nk,
    ])
    .await;
    assert!(
        line.contains("--nats-nkey") && line.contains("no user seed"),
        "{line}"
    );
}
