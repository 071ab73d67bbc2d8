//! The docs cannot drift from the product: every relative link and `#anchor` in the Markdown
//! resolves; each guide's `sh` blocks run, in order, against the built binaries; the config
//! reference lists exactly the keys the config file accepts, and `deploy/relay.toml` names them
//! all and parses; and no page tells the history of its making (a numbered work session or issue).

use std::collections::{BTreeSet, HashMap};
use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::{Component, Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::BIN;

/// The clone this runs in (not the one that compiled the binary: see `deploy.rs`).
fn repo() -> PathBuf {
    let manifest = std::env::var_os("CARGO_MANIFEST_DIR")
        .map_or_else(|| env!("CARGO_MANIFEST_DIR").into(), PathBuf::from);
    manifest
        .parent()
        .expect("the relay crate sits in the workspace")
        .to_path_buf()
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every Markdown file of the docs: the top-level pages and everything under `docs/`.
fn markdown_files() -> Vec<PathBuf> {
    let root = repo();
    let mut files: Vec<PathBuf> = ["README.md", "ARCHITECTURE.md", "BENCHMARKS.md"]
        .iter()
        .map(|f| root.join(f))
        .collect();
    let mut dirs = vec![root.join("docs")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "md") {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

/// The lines of `text` outside fenced code blocks, with their 1-based numbers.
fn prose_lines(text: &str) -> Vec<(usize, &str)> {
    let mut fenced = false;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if !fenced {
            out.push((i + 1, line));
        }
    }
    out
}

/// `line` with inline code spans (`` `…` ``) blanked out, so `[a](b)` inside one is no link.
fn without_code_spans(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut in_code = false;
    for c in line.chars() {
        if c == '`' {
            in_code = !in_code;
            out.push(' ');
        } else {
            out.push(if in_code { ' ' } else { c });
        }
    }
    out
}

/// The targets of the inline links `[text](target)` on a line (a title after the target is
/// dropped).
fn link_targets(line: &str) -> Vec<String> {
    let line = without_code_spans(line);
    let mut out = Vec::new();
    let mut rest = line.as_str();
    while let Some(at) = rest.find("](") {
        let after = &rest[at + 2..];
        let Some(end) = after.find(')') else { break };
        let target = after[..end].split_whitespace().next().unwrap_or("");
        out.push(target.to_string());
        rest = &after[end..];
    }
    out
}

/// GitHub's anchor for a heading: lower case, punctuation dropped (letters, digits, `-`, `_`
/// and spaces kept), spaces made `-`.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == '-' || *c == '_' || *c == ' ')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors a Markdown file's headings get, repeated ones numbered `-1`, `-2`, … as GitHub
/// does.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut out = BTreeSet::new();
    for (_, line) in prose_lines(text) {
        let Some(title) = line.strip_prefix('#') else {
            continue;
        };
        let title = title.trim_start_matches('#');
        if !title.starts_with(' ') {
            continue;
        }
        let base = slug(&title.replace('`', ""));
        let n = seen.entry(base.clone()).or_insert(0);
        out.insert(if *n == 0 {
            base.clone()
        } else {
            format!("{base}-{n}")
        });
        *n += 1;
    }
    out
}

/// `path` with `.` and `..` resolved lexically (the target need not exist yet).
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

#[test]
fn every_relative_link_and_anchor_resolves() {
    let root = repo();
    let mut broken = Vec::new();
    let mut checked = 0;
    for file in markdown_files() {
        let text = read(&file);
        let shown = file
            .strip_prefix(&root)
            .unwrap_or(&file)
            .display()
            .to_string();
        for (n, line) in prose_lines(&text) {
            for target in link_targets(line) {
                if target.is_empty()
                    || target.starts_with("http://")
                    || target.starts_with("https://")
                    || target.starts_with("mailto:")
                {
                    continue;
                }
                checked += 1;
                let (path, anchor) = match target.split_once('#') {
                    Some((p, a)) => (p, Some(a)),
                    None => (target.as_str(), None),
                };
                let dest = if path.is_empty() {
                    file.clone()
                } else {
                    normalize(&file.parent().expect("a file has a parent").join(path))
                };
                if !dest.starts_with(&root) || !dest.exists() {
                    broken.push(format!("{shown}:{n}: {target}: no such file"));
                    continue;
                }
                if let Some(anchor) = anchor {
                    if dest.extension().is_none_or(|e| e != "md") {
                        broken.push(format!(
                            "{shown}:{n}: {target}: an anchor into a non-Markdown file"
                        ));
                    } else if !anchors(&read(&dest)).contains(anchor) {
                        broken.push(format!(
                            "{shown}:{n}: {target}: no heading has the anchor #{anchor}"
                        ));
                    }
                }
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
    assert!(
        checked > 50,
        "only {checked} relative links found: is the parser still reading them?"
    );
}

#[test]
fn the_link_checker_knows_github_anchors_and_code_spans() {
    assert_eq!(slug("Events, seq and drops"), "events-seq-and-drops");
    assert_eq!(slug(&"`[[route.bridge]]`".replace('`', "")), "routebridge");
    let text = "# A\n## Notes\n```sh\n# not a heading\n```\n## Notes\n";
    let a = anchors(text);
    assert!(
        a.contains("notes") && a.contains("notes-1") && !a.contains("not-a-heading"),
        "{a:?}"
    );
    assert_eq!(link_targets("see [x](a.md#b) and `[y](c.md)`"), ["a.md#b"]);
}

#[test]
fn no_page_tells_the_history_of_its_making() {
    // As `grep -rn "session [0-9]\|issue [0-9]"` over the docs and every Markdown file.
    let mut files = markdown_files();
    let root = repo();
    let mut dirs = vec![root.clone()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let path = entry.expect("a directory entry").path();
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if path.is_dir() && !name.starts_with('.') && name != "target" && name != "docs" {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "md") && !files.contains(&path) {
                files.push(path);
            }
        }
    }
    let mut found = Vec::new();
    for file in &files {
        for (i, line) in read(file).lines().enumerate() {
            let bytes = line.as_bytes();
            for word in ["session ", "issue "] {
                for (at, _) in line.match_indices(word) {
                    if bytes.get(at + word.len()).is_some_and(u8::is_ascii_digit) {
                        found.push(format!(
                            "{}:{}: {line}",
                            file.strip_prefix(&root).unwrap_or(file).display(),
                            i + 1
                        ));
                    }
                }
            }
        }
    }
    assert!(
        found.is_empty(),
        "history in the docs (say what is, not how it came to be):\n{}",
        found.join("\n")
    );
}

/// The `sh` blocks of a guide, in order.
fn sh_blocks(text: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut current: Option<String> = None;
    for line in text.lines() {
        let fence = line.trim_start();
        match &mut current {
            None if fence == "```sh" => current = Some(String::new()),
            Some(block) if fence == "```" => {
                blocks.push(std::mem::take(block));
                current = None;
            }
            Some(block) => {
                block.push_str(line);
                block.push('\n');
            }
            None => {}
        }
    }
    assert!(current.is_none(), "an `sh` block is not closed");
    blocks
}

/// Where the release binaries are: beside the `gabp-relay` this test was built with.
fn bin_dir() -> PathBuf {
    let relay = Path::new(BIN);
    let dir = relay
        .parent()
        .expect("the binary is in a directory")
        .to_path_buf();
    let loadgen = dir.join("gabp-loadgen");
    assert!(
        loadgen.exists(),
        "{} is missing: the guides use it (cargo build --release -p gabp-loadgen)",
        loadgen.display()
    );
    dir
}

/// The Python environment `scripts/setup --test` makes (the guides read it from `GABP_VENV`).
fn venv() -> PathBuf {
    let home = std::env::var_os("HOME").expect("HOME is set");
    let venv = std::env::var_os("GABP_VENV").map_or_else(
        || Path::new(&home).join(".cache/gabp-relay/venv"),
        PathBuf::from,
    );
    let ok = Command::new(venv.join("bin/python"))
        .args(["-c", "import duckdb, polars, mcp, mcap"])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        ok,
        "{} lacks duckdb, polars, mcp or mcap: run scripts/setup --test",
        venv.display()
    );
    venv
}

/// Runs a guide's `sh` blocks as one bash script in an empty directory, with the release
/// binaries first on `PATH` and `HOME` and `XDG_CONFIG_HOME` inside that directory; whatever it
/// left running is killed with its process group. Returns what it printed.
fn run_guide(name: &str) -> String {
    let guide = repo().join("docs/guides").join(name);
    let blocks = sh_blocks(&read(&guide));
    assert!(blocks.len() >= 5, "{name}: only {} sh blocks", blocks.len());
    let dir = tempfile::tempdir().expect("a temp dir");
    let script = format!("set -euo pipefail\n{}", blocks.join("\n"));
    std::fs::write(dir.path().join("guide.sh"), &script).expect("write the script");
    let path = format!(
        "{}:{}",
        bin_dir().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let venv = venv();
    let log = dir.path().join("guide.log");
    let out = std::fs::File::create(&log).expect("the log");
    let mut child = Command::new("bash")
        .arg("guide.sh")
        .current_dir(dir.path())
        .env("PATH", path)
        .env("HOME", dir.path())
        .env("XDG_CONFIG_HOME", dir.path().join(".config"))
        .env("GABP_VENV", &venv)
        // The clone, for a guide that installs from it (`pip install "$GABP_CLONE/python"`).
        .env("GABP_CLONE", repo())
        .env_remove("GABP_RELAY_TOKEN")
        .env_remove("GABP_RELAY_DATA_DIR")
        .env_remove("GABP_UPSTREAM_TOKEN")
        .env_remove("GABP_LOG")
        .stdin(Stdio::null())
        .stdout(out.try_clone().expect("the log again"))
        .stderr(out)
        .process_group(0)
        .spawn()
        .expect("bash runs");
    let group = nix::unistd::Pid::from_raw(i32::try_from(child.id()).expect("a pid"));
    let started = Instant::now();
    let bound = Duration::from_secs(120);
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for bash") {
            break Some(status);
        }
        if started.elapsed() > bound {
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    // Whatever the guide started in the background goes with it.
    let _ = nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGKILL);
    let _ = child.wait();
    let mut printed = String::new();
    std::fs::File::open(&log)
        .and_then(|mut f| f.read_to_string(&mut printed))
        .expect("read the log");
    let took = started.elapsed();
    match status {
        None => panic!("{name} did not finish within {bound:?}:\n{printed}"),
        Some(s) if !s.success() => panic!("{name} failed ({s}) after {took:?}:\n{printed}"),
        Some(_) => eprintln!("{name}: ran in {took:.1?}"),
    }
    printed
}

#[test]
fn guide_recording_experiments_runs() {
    let out = run_guide("recording-experiments.md");
    // Two seeds × three episodes × three channels, counted by DuckDB.
    let rows = out
        .lines()
        .filter(|l| l.starts_with('│') && l.contains("/"))
        .count();
    assert_eq!(rows, 18, "one row per seed, episode and channel:\n{out}");
    assert!(out.contains("ppo-42-seed-2.html"), "{out}");
    assert!(
        out.contains("for 2 sessions"),
        "one report for the experiment: {out}"
    );
}

#[test]
fn guide_many_agents_runs() {
    let out = run_guide("many-agents.md");
    for said in [
        "-32008",                            // the builder, while the planner holds the lease
        "has role observe",                  // the dashboard's tool call
        "refused by tools = [\"sim/echo\"]", // the assistant's sim_emit
        "assistant-checked",
    ] {
        assert!(
            out.contains(said),
            "the guide's output lacks {said:?}:\n{out}"
        );
    }
}

#[test]
fn guide_measuring_a_mod_runs() {
    let out = run_guide("measuring-a-mod.md");
    assert!(out.contains("latency_us.p50"), "{out}");
    // compare names its inputs and lists the settings that differ; overhead weighs the relay.
    assert!(out.contains("A = direct: call, mod "), "{out}");
    assert!(out.contains("Settings that differ"), "{out}");
    assert!(out.contains("median of 3 rounds (min–max)"), "{out}");
    assert!(out.contains("THE RELAY IS"), "{out}");
    assert!(out.contains("THROUGH A BYTE PIPE"), "{out}");
    assert!(out.contains("concurrency 4 on one connection"), "{out}");
    assert!(
        out.contains("ratio (relay delivered / baseline delivered)"),
        "{out}"
    );
    // games measures every layout and says each check's verdict.
    assert!(
        out.contains("one relay for 2 games costs no more CPU than 2 relays"),
        "{out}"
    );
}

#[test]
fn guide_python_runs() {
    let out = run_guide("python.md");
    for said in [
        "echo {'echo': {'hello': 'world'}}",
        "error -32000 tool failed on purpose",
        "episode 1 saw world/tick seqs",
        "with no gap",
        "marks [('episode-start', {'episode': 1}), ('episode-end', {'episode': 1})]",
        "tool calls in the episode ['sim/echo']",
        "replay paused",
        "notice stepping",
        "stepped through world/tick seqs",
        "back at the episode's start:",
        "paused at ",
    ] {
        assert!(
            out.contains(said),
            "the guide's output lacks {said:?}:\n{out}"
        );
    }
}

#[test]
fn guide_agent_testing_runs() {
    let out = run_guide("agent-testing.md");
    for said in [
        "calls match: 3 calls", // the unchanged agent
        "replay exited 0",
        "changed  call 3 (made as call 3): tools/call sim/echo", // the changed one
        "/params/arguments/move: recorded \"right\", got \"up\"",
        "error -32004",
        "replay exited 1",
        "same: False",
    ] {
        assert!(
            out.contains(said),
            "the guide's output lacks {said:?}:\n{out}"
        );
    }
}

#[test]
fn guide_mod_authors_runs() {
    let out = run_guide("mod-authors.md");
    for said in [
        "0 tolerated, 0 fail, 1 skipped", // the clean mod
        "check-mod exited 1",             // the one counting characters
        "counts Content-Length in characters, not bytes",
        "hint: count Content-Length in bytes",
        "pass       methods.tools-call sim/echo  §4.2   answered with a result", // shielded
        "\"code\":-32001",                                                       // not shielded
        "bridge listening on", // check-bridge's report
        "0 tolerated, 0 fail, 0 skipped",
    ] {
        assert!(
            out.contains(said),
            "the guide's output lacks {said:?}:\n{out}"
        );
    }
}

/// The keys a config table accepts, as serde's own "unknown field" error lists them.
fn accepted_keys(toml: &str) -> BTreeSet<String> {
    let e = gabp_relay::config::FileConfig::parse(toml, "probe.toml")
        .expect_err("an unknown key is refused");
    let text = e.to_string();
    let list = text
        .split_once("expected one of ")
        .unwrap_or_else(|| panic!("no list of expected keys in {text:?}"))
        .1;
    list.split('`')
        .skip(1)
        .step_by(2)
        .map(String::from)
        .collect()
}

/// The keys a table of `docs/reference/config.md` lists, under the heading that names it.
fn documented_keys(page: &str, heading: &str) -> BTreeSet<String> {
    let mut keys = BTreeSet::new();
    let mut inside = false;
    for line in page.lines() {
        if line.starts_with("## ") {
            inside = line == heading;
            continue;
        }
        if inside {
            if let Some(key) = line
                .strip_prefix("| `")
                .and_then(|rest| rest.split_once('`'))
                .map(|(k, _)| k)
            {
                keys.insert(key.to_string());
            }
        }
    }
    assert!(!keys.is_empty(), "no keys under {heading:?}");
    keys
}

#[test]
fn the_config_reference_lists_exactly_the_keys_the_config_accepts() {
    // A key nothing resembles, so the error lists every key instead of suggesting one.
    const PROBE: &str = "qqqqqqqqqqqq = 1";
    let tables = [
        ("## Top level", format!("{PROBE}\n")),
        ("## `[[route]]`", format!("[[route]]\n{PROBE}\n")),
        (
            "## `[[route.bridge]]`",
            format!("[[route]]\n[[route.bridge]]\n{PROBE}\n"),
        ),
        ("## `[ship]`", format!("[ship]\n{PROBE}\n")),
    ];
    let page = read(&repo().join("docs/reference/config.md"));
    let example = read(&repo().join("deploy/relay.toml"));
    let mut problems = Vec::new();
    for (heading, probe) in &tables {
        let accepted = accepted_keys(probe);
        assert!(accepted.len() > 5, "{heading}: {accepted:?}");
        let documented = documented_keys(&page, heading);
        for k in accepted.difference(&documented) {
            problems.push(format!("{heading}: `{k}` is accepted but not documented"));
        }
        for k in documented.difference(&accepted) {
            problems.push(format!("{heading}: `{k}` is documented but not accepted"));
        }
        for k in &accepted {
            // Set, or shown commented out where it is one way among several.
            let named = example.lines().any(|l| {
                let l = l.trim_start().trim_start_matches('#').trim_start();
                l.strip_prefix(k.as_str())
                    .is_some_and(|r| r.trim_start().starts_with('='))
                    || (k == "route" && l.starts_with("[[route]]"))
                    || (k == "bridge" && l.starts_with("[[route.bridge]]"))
                    || (k == "ship" && l.starts_with("[ship]"))
            });
            if !named {
                problems.push(format!("{heading}: deploy/relay.toml does not name `{k}`"));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    gabp_relay::config::FileConfig::parse(&example, "deploy/relay.toml")
        .expect("deploy/relay.toml parses into the config types");
}

#[test]
fn completions_are_scripts_their_shells_accept() {
    let script = |shell: &str| {
        let out = Command::new(BIN)
            .args(["completions", shell])
            .output()
            .expect("gabp-relay runs");
        assert!(out.status.success(), "completions {shell}: {out:?}");
        String::from_utf8(out.stdout).expect("UTF-8")
    };
    let bash = script("bash");
    assert!(
        bash.contains("complete -F") && bash.contains("gabp-relay"),
        "{bash}"
    );
    let dir = tempfile::tempdir().expect("a temp dir");
    let file = dir.path().join("gabp-relay.bash");
    std::fs::write(&file, &bash).expect("write the script");
    let checked = Command::new("bash")
        .arg("-n")
        .arg(&file)
        .status()
        .expect("bash runs");
    assert!(checked.success(), "bash -n refuses the completion script");
    assert!(script("zsh").starts_with("#compdef gabp-relay"));
    assert!(script("fish").contains("complete -c gabp-relay"));
    let refused = Command::new(BIN)
        .args(["completions", "tcsh"])
        .output()
        .expect("gabp-relay runs");
    assert_eq!(
        refused.status.code(),
        Some(2),
        "an unknown shell is a usage error"
    );
}
