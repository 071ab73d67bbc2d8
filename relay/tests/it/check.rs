//! The conformance checker through the real binary: `check-mod` passes the clean simulated mod
//! and names each defect the simulated mod can be switched to (`mod-sim --defect`);
//! `check-bridge` passes the project's own bridges (the client, the relay itself) and names a
//! deviating one; and the relay's shield (`--ascii-requests`) gets a bridge's raw UTF-8 through
//! to a mod that counts characters, which without it hangs.

use serde_json::{json, Value};

use crate::support::*;

/// A `mod-sim` process with the given extra flags, and its address.
async fn mod_sim(extra: &[&str]) -> (Child, Addr) {
    let mut child = relay()
        .args(["mod-sim", "--listen", "127.0.0.1:0", "--token", MOD_TOKEN])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn mod-sim");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let line = line_with(&mut lines, "listening on").await;
    let addr = line
        .rsplit(' ')
        .next()
        .expect("an address")
        .parse()
        .expect("a valid address");
    (child, addr)
}

/// `check-mod` against `addr` as JSON, answers awaited for `timeout`, with its exit code.
async fn check_mod(addr: &Addr, timeout: &str, extra: &[&str]) -> (i32, Value) {
    let addr = addr.to_string();
    let mut args = vec![
        "check-mod",
        &addr,
        "--token",
        MOD_TOKEN,
        "--json",
        "--timeout",
        timeout,
        "--flow",
        "1s",
    ];
    args.extend(extra);
    let out = output(&args).await;
    (out.status.code().expect("an exit code"), json(&out))
}

/// The check named `id` in a report.
fn check<'a>(report: &'a Value, id: &str) -> &'a Value {
    report["checks"]
        .as_array()
        .expect("checks")
        .iter()
        .find(|c| c["id"] == id)
        .unwrap_or_else(|| panic!("no check {id} in {report:#}"))
}

/// The ids of the checks with `verdict`.
fn with_verdict(report: &Value, verdict: &str) -> Vec<String> {
    report["checks"]
        .as_array()
        .expect("checks")
        .iter()
        .filter(|c| c["verdict"] == verdict)
        .map(|c| c["id"].as_str().expect("an id").to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_mod_passes_the_clean_simulated_mod() {
    let (mut sim, addr) = mod_sim(&[]).await;
    // A generous bound: nothing in a clean run waits for it.
    let (code, report) = check_mod(&addr, "5s", &["--call", r#"sim/echo={"text":"héllo"}"#]).await;
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(report["ok"], true);
    assert_eq!(report["subject"], "mod");
    assert!(with_verdict(&report, "fail").is_empty(), "{report:#}");
    assert!(with_verdict(&report, "tolerated").is_empty(), "{report:#}");
    // Only what the simulated mod does not offer is skipped.
    assert_eq!(
        with_verdict(&report, "skip"),
        ["methods.events-list"],
        "{report:#}"
    );
    for id in [
        "handshake.welcome",
        "methods.tools-list",
        "methods.attention-current",
        "errors.unknown-method",
        "methods.tools-call sim/echo",
        "concurrency.pipelined",
        "framing.headers-in",
        "framing.utf8-request",
        "framing.large",
        "concurrency.events",
        "events.seq",
        "framing.utf8-answer",
        "framing.headers-out",
        "envelope.answers",
        "envelope.events",
        "connection.drop",
    ] {
        let c = check(&report, id);
        assert_eq!(c["verdict"], "pass", "{c:#}");
        assert!(
            c["section"].as_str().is_some_and(|s| s.starts_with('§')),
            "{c:#}"
        );
    }
    assert_eq!(
        check(&report, "handshake.welcome")["schema"],
        "methods/session.welcome.response.json"
    );
    // Events flowed and were followed.
    let flow = check(&report, "concurrency.events")["detail"]
        .as_str()
        .expect("detail")
        .to_string();
    assert!(flow.contains("on 3 channels"), "{flow}");
    // The text form says the same, one line per check and a count.
    let out = output(&[
        "check-mod",
        &addr.to_string(),
        "--token",
        MOD_TOKEN,
        "--timeout",
        "1s",
        "--flow",
        "300ms",
    ])
    .await;
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("pass       framing.utf8-request"), "{text}");
    assert!(
        text.trim_end().ends_with("0 tolerated, 0 fail, 1 skipped"),
        "{text}"
    );
    sim.kill().await.expect("kill the simulated mod");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_mod_names_a_mod_that_counts_characters_and_suggests_the_shield() {
    let (mut sim, addr) = mod_sim(&["--defect", "count-chars"]).await;
    let (code, report) = check_mod(&addr, "1s", &[]).await;
    assert_eq!(code, 1, "{report:#}");
    let c = check(&report, "framing.utf8-request");
    assert_eq!(c["verdict"], "fail", "{c:#}");
    let detail = c["detail"].as_str().expect("detail");
    assert!(
        detail.contains("counts Content-Length in characters, not bytes")
            && detail.contains("hung until 3 more bytes came")
            && detail.contains("with \\u escapes is answered"),
        "{detail}"
    );
    assert!(
        c["hint"]
            .as_str()
            .expect("a hint")
            .contains("--ascii-requests"),
        "{c:#}"
    );
    // Its answers carry raw UTF-8 counted the same way.
    let c = check(&report, "framing.utf8-answer");
    assert_eq!(c["verdict"], "fail", "{c:#}");
    assert!(
        c["detail"]
            .as_str()
            .expect("detail")
            .contains("in characters"),
        "{c:#}"
    );
    assert_eq!(
        with_verdict(&report, "fail"),
        ["framing.utf8-request", "framing.utf8-answer"],
        "{report:#}"
    );
    sim.kill().await.expect("kill the simulated mod");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_mod_names_a_mod_that_writes_header_and_body_apart() {
    let (mut sim, addr) = mod_sim(&["--defect", "split-writes"]).await;
    let (code, report) = check_mod(&addr, "1s", &[]).await;
    assert_eq!(code, 1, "{report:#}");
    let c = check(&report, "concurrency.events");
    assert_eq!(c["verdict"], "fail", "{c:#}");
    assert!(
        c["detail"]
            .as_str()
            .expect("detail")
            .contains("written apart and another frame came between them"),
        "{c:#}"
    );
    assert!(
        c["hint"].as_str().expect("a hint").contains("one write"),
        "{c:#}"
    );
    // Lost frames lose events; nothing else is blamed.
    let failed = with_verdict(&report, "fail");
    assert!(
        failed
            .iter()
            .all(|id| ["concurrency.events", "events.seq"].contains(&id.as_str())),
        "{report:#}"
    );
    sim.kill().await.expect("kill the simulated mod");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_mod_names_a_mod_that_crashes_when_a_connection_drops_mid_request() {
    let (mut sim, addr) = mod_sim(&["--defect", "crash-on-drop"]).await;
    let (code, report) = check_mod(&addr, "1s", &[]).await;
    assert_eq!(code, 1, "{report:#}");
    let c = check(&report, "connection.drop");
    assert_eq!(c["verdict"], "fail", "{c:#}");
    assert!(
        c["detail"]
            .as_str()
            .expect("detail")
            .contains("no longer welcomes one"),
        "{c:#}"
    );
    assert_eq!(
        with_verdict(&report, "fail"),
        ["connection.drop"],
        "{report:#}"
    );
    // The simulated mod did crash, and says so.
    let status = tokio::time::timeout(Duration::from_secs(10), sim.wait())
        .await
        .expect("the crashed mod exits")
        .expect("wait");
    assert_eq!(status.code(), Some(1));
    let mut err = String::new();
    use tokio::io::AsyncReadExt;
    sim.stderr
        .take()
        .expect("stderr")
        .read_to_string(&mut err)
        .await
        .expect("read stderr");
    assert!(err.contains("the simulated mod crashed"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_mod_tolerates_answers_with_both_result_and_error_one_null() {
    let (mut sim, addr) = mod_sim(&["--defect", "both-result-and-error"]).await;
    let (code, report) = check_mod(&addr, "1s", &[]).await;
    assert_eq!(
        code, 0,
        "a deviation the relay absorbs is no failure: {report:#}"
    );
    let c = check(&report, "envelope.answers");
    assert_eq!(c["verdict"], "tolerated", "{c:#}");
    assert!(
        c["detail"]
            .as_str()
            .expect("detail")
            .contains("both result and error, error null"),
        "{c:#}"
    );
    assert_eq!(
        with_verdict(&report, "tolerated"),
        ["envelope.answers"],
        "{report:#}"
    );
    sim.kill().await.expect("kill the simulated mod");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_mod_runs_a_stdio_mod_and_refuses_unclear_targets() {
    let out = output(&[
        "check-mod",
        "--token",
        MOD_TOKEN,
        "--json",
        "--timeout",
        "1s",
        "--flow",
        "300ms",
        "--command",
        BIN,
        "mod-sim",
        "--stdio",
        "--token",
        MOD_TOKEN,
    ])
    .await;
    let report = json(&out);
    assert!(out.status.success(), "{report:#}");
    assert!(report["target"]
        .as_str()
        .expect("target")
        .starts_with("stdio: "));
    // One connection for its life: the drop is not asked.
    assert_eq!(check(&report, "connection.drop")["verdict"], "skip");
    assert_eq!(check(&report, "framing.utf8-request")["verdict"], "pass");
    for (args, says) in [
        (vec!["check-mod"], "give the mod's address"),
        (
            vec!["check-mod", "127.0.0.1:1", "--command", "x"],
            "not both",
        ),
        (
            vec!["check-mod", "--command", "/nonexistent/mod"],
            "not an executable",
        ),
        (
            vec!["check-mod", "127.0.0.1:1", "--call", "sim/echo=[1]"],
            "a JSON object",
        ),
    ] {
        let out = output(&args).await;
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(
            one_line(&out).contains(says),
            "{args:?}: {}",
            one_line(&out)
        );
    }
    // An address nothing listens on is a failed check, said in one line of the report.
    let free = free_addr().to_string();
    let out = output(&["check-mod", &free, "--timeout", "300ms"]).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stdout).contains("cannot connect"));
}

/// The frame of a `tools/call` of `sim/echo` with raw (unescaped) UTF-8 in its arguments.
fn raw_echo(id: &str, text: &str) -> Vec<u8> {
    let body = serde_json::to_vec(&json!({"v": "gabp/1", "id": id, "type": "request",
        "method": "tools/call", "params": {"name": "sim/echo", "arguments": {"text": text}}}))
    .expect("JSON");
    assert!(!body.is_ascii(), "the request carries raw UTF-8");
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shield_gets_raw_utf8_through_to_a_mod_that_counts_characters() {
    let (mut sim, mod_addr) = mod_sim(&["--defect", "count-chars", "--rate", "100"]).await;
    let data = tempfile::tempdir().expect("a data dir");
    let relay = |shielded: bool, dir: &str| {
        let mut args = vec![
            "--upstream".to_string(),
            mod_addr.to_string(),
            "--upstream-token".into(),
            MOD_TOKEN.into(),
            "--listen".into(),
            "127.0.0.1:0".into(),
            "--token".into(),
            BRIDGE_TOKEN.into(),
            "--request-timeout".into(),
            "1s".into(),
            "--data-dir".into(),
            data.path().join(dir).display().to_string(),
        ];
        if shielded {
            args.push("--ascii-requests".into());
        }
        args
    };
    let shielded_args = relay(true, "shielded");
    let shielded = serve(&shielded_args.iter().map(String::as_str).collect::<Vec<_>>()).await;
    let (mut c, _) = Client::connect_hello(&shielded.addr, BRIDGE_TOKEN)
        .await
        .expect("hello through the shielded route");
    for text in ["héllo", "€ 🎮 ü"] {
        let id = gabp_client::new_id();
        c.send_body(&raw_echo(&id, text)).await.expect("send");
        let answer = c.response_to(&id).await.expect("an answer");
        assert_eq!(answer["result"]["echo"]["text"], text, "{answer}");
    }
    drop(c);
    shielded.stop_cleanly().await;
    // The recording keeps what the bridge sent, byte for byte.
    let out = output(&[
        "export",
        "--data-dir",
        &data.path().join("shielded").display().to_string(),
        "--all",
    ])
    .await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows = String::from_utf8_lossy(&out.stdout);
    assert!(
        rows.contains("héllo"),
        "the recording holds the raw request"
    );

    // Without the shield the same request hangs at the mod: the relay's timeout answers it.
    let bare_args = relay(false, "bare");
    let bare = serve(&bare_args.iter().map(String::as_str).collect::<Vec<_>>()).await;
    let (mut c, _) = Client::connect_hello(&bare.addr, BRIDGE_TOKEN)
        .await
        .expect("hello through the bare route");
    let id = gabp_client::new_id();
    c.send_body(&raw_echo(&id, "héllo")).await.expect("send");
    let answer = c.response_to(&id).await.expect("an answer");
    assert_eq!(answer["error"]["code"], -32001, "{answer}");
    drop(c);
    bare.stop_cleanly().await;
    sim.kill().await.expect("kill the simulated mod");
}

/// A `check-bridge` process reporting at `timeout` at the latest, and the address it listens
/// on.
async fn check_bridge(timeout: &str) -> (Child, Addr) {
    let mut child = relay()
        .args([
            "check-bridge",
            "--token",
            BRIDGE_TOKEN,
            "--json",
            "--timeout",
            timeout,
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn check-bridge");
    let mut lines = BufReader::new(child.stderr.take().expect("stderr")).lines();
    let find = async {
        while let Some(line) = lines.next_line().await.expect("read stderr") {
            if let Some(a) = line.strip_prefix("check-bridge listening on ") {
                return a.parse::<Addr>().expect("an address");
            }
        }
        panic!("check-bridge said no address");
    };
    let addr = tokio::time::timeout(Duration::from_secs(20), find)
        .await
        .expect("in time");
    (child, addr)
}

/// What `check-bridge` reported, and its exit code.
async fn bridge_report(child: Child) -> (i32, Value) {
    let out = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
        .await
        .expect("check-bridge reports")
        .expect("wait");
    (out.status.code().expect("an exit code"), json(&out))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_bridge_passes_the_projects_own_client() {
    let (child, addr) = check_bridge("20s").await;
    let (mut c, welcome) = Client::connect_hello(&addr, BRIDGE_TOKEN)
        .await
        .expect("hello");
    assert_eq!(welcome["agentId"], "gabp-check");
    let tools = c.call("tools/list", json!({})).await.expect("tools");
    assert_eq!(tools["tools"][0]["name"], "check/echo");
    let echo = c
        .call(
            "tools/call",
            json!({"name": "check/echo", "arguments": {"text": "héllo"}}),
        )
        .await
        .expect("echo");
    assert_eq!(echo["echo"]["text"], "héllo");
    let fail = c
        .request("tools/call", json!({"name": "check/fail", "arguments": {}}))
        .await
        .expect("an answer");
    assert!(fail["error"]["code"].is_i64(), "{fail}");
    c.subscribe(&["check/tick"]).await.expect("subscribe");
    for seq in 0..5 {
        let e = c.next_event().await.expect("an event");
        assert_eq!(e["seq"], seq);
    }
    c.call("tools/list", json!({}))
        .await
        .expect("still talking");
    drop(c);
    let (code, report) = bridge_report(child).await;
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(report["subject"], "bridge");
    assert!(with_verdict(&report, "fail").is_empty(), "{report:#}");
    assert!(with_verdict(&report, "tolerated").is_empty(), "{report:#}");
    assert!(with_verdict(&report, "skip").is_empty(), "{report:#}");
    assert!(
        check(&report, "robustness")["detail"]
            .as_str()
            .expect("detail")
            .contains("an error answer"),
        "{report:#}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_bridge_passes_the_relay_as_a_bridge() {
    let (child, addr) = check_bridge("3s").await;
    let data = tempfile::tempdir().expect("a data dir");
    let relay = serve(&[
        "--upstream",
        &addr.to_string(),
        "--upstream-token",
        BRIDGE_TOKEN,
        "--listen",
        "127.0.0.1:0",
        "--data-dir",
        &data.path().display().to_string(),
    ])
    .await;
    let (code, report) = bridge_report(child).await;
    relay.stop_cleanly().await;
    assert_eq!(code, 0, "{report:#}");
    for id in [
        "framing.requests",
        "handshake.hello",
        "envelope.requests",
        "events.subscribe",
        "robustness",
    ] {
        assert_eq!(check(&report, id)["verdict"], "pass", "{report:#}");
    }
    assert!(report["peer"]
        .as_str()
        .expect("peer")
        .starts_with("gabp-relay/"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_bridge_names_what_a_deviating_bridge_sends() {
    let (child, addr) = check_bridge("20s").await;
    let mut c = Client::connect(&addr).await.expect("connect");
    c.length_only_headers = true;
    // A request before hello; then a hello without a launchId on an unknown platform.
    let early = c.request("tools/list", json!({})).await.expect("an answer");
    assert_eq!(early["error"]["code"], -31001);
    let hello = c
        .request(
            "session/hello",
            json!({"token": BRIDGE_TOKEN, "bridgeVersion": "odd/1", "platform": "amiga"}),
        )
        .await
        .expect("welcome");
    assert!(hello["result"].is_object(), "{hello}");
    // The legacy `parameters`, and Content-Length counted in characters.
    let legacy = c
        .call(
            "tools/call",
            json!({"name": "check/echo", "parameters": {"a": 1}}),
        )
        .await
        .expect("echo");
    assert_eq!(legacy["echo"]["a"], 1);
    let body = serde_json::to_vec(&json!({"v": "gabp/1", "id": gabp_client::new_id(),
        "type": "request", "method": "tools/list", "params": {"note": "é"}}))
    .expect("JSON");
    let chars = String::from_utf8_lossy(&body).chars().count();
    let mut wire = format!("Content-Length: {chars}\r\n\r\n").into_bytes();
    wire.extend(&body);
    c.send_raw(&wire).await.expect("send");
    tokio::time::sleep(Duration::from_millis(200)).await;
    drop(c);
    let (code, report) = bridge_report(child).await;
    assert_eq!(code, 1, "{report:#}");
    let hello = check(&report, "handshake.hello");
    assert_eq!(hello["verdict"], "fail", "{hello:#}");
    let said = hello["detail"].as_str().expect("detail");
    assert!(
        said.contains("\"tools/list\" before session/hello"),
        "{said}"
    );
    assert!(said.contains("launchId"), "{said}");
    let call = check(&report, "methods.tools-call");
    assert_eq!(call["verdict"], "tolerated", "{call:#}");
    assert!(
        call["detail"]
            .as_str()
            .expect("detail")
            .contains("legacy `parameters`"),
        "{call:#}"
    );
    let framing = check(&report, "framing.requests");
    assert_eq!(framing["verdict"], "fail", "{framing:#}");
    assert!(
        framing["detail"]
            .as_str()
            .expect("detail")
            .contains("counted in characters"),
        "{framing:#}"
    );
}
