//! A headless Chromium run on a page file, with no network: the DOM after the page's scripts
//! ran (`--dump-dom`) and a screenshot. Used by the report tests of both binaries; the
//! browser is Debian's `chromium` (installed by `scripts/setup`).

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// How long one browser run may take before it is killed.
const RUN_LIMIT: Duration = Duration::from_secs(90);

/// The Chromium on `PATH`, if any.
pub fn find() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    ["chromium", "chromium-browser"].iter().find_map(|name| {
        std::env::split_paths(&path)
            .map(|d| d.join(name))
            .find(|p| p.is_file())
    })
}

/// Whether this process runs as root (where the tests insist on a browser: set-up installs it).
pub fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .map(|l| l.split_whitespace().nth(1) == Some("0"))
        })
        .unwrap_or(false)
}

fn run(chromium: &Path, page: &Path, extra: &[String]) -> Result<String, String> {
    let page = page
        .canonicalize()
        .map_err(|e| format!("{}: {e}", page.display()))?;
    let profile = tempfile::tempdir().map_err(|e| format!("a browser profile dir: {e}"))?;
    let mut child = Command::new(chromium)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            "--no-default-browser-check",
            "--hide-scrollbars",
            // Run every task the page queued (a CSP violation report is one) before the dump.
            "--virtual-time-budget=2000",
            // No network at all: every host resolves nowhere.
            "--host-resolver-rules=MAP * ~NOTFOUND",
            "--proxy-server=127.0.0.1:9",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .args(extra)
        .arg(format!("file://{}", page.display()))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("starting {}: {e}", chromium.display()))?;
    let mut out = child.stdout.take().expect("piped");
    let mut err = child.stderr.take().expect("piped");
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        s
    });
    let err_reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let deadline = Instant::now() + RUN_LIMIT;
    let status = loop {
        match child.try_wait() {
            Ok(Some(st)) => break st,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(50)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("the browser took longer than {RUN_LIMIT:?}"));
            }
        }
    };
    let stdout = reader.join().unwrap_or_default();
    let stderr = err_reader.join().unwrap_or_default();
    if !status.success() {
        let last = stderr.lines().last().unwrap_or("");
        return Err(format!("the browser exited with {status}: {last}"));
    }
    Ok(stdout)
}

/// The page's DOM after its scripts ran.
pub fn dump_dom(chromium: &Path, page: &Path) -> Result<String, String> {
    run(chromium, page, &["--dump-dom".to_string()])
}

/// A PNG screenshot of the page at `size` (width, height) written to `png`.
pub fn screenshot(
    chromium: &Path,
    page: &Path,
    png: &Path,
    size: (u32, u32),
) -> Result<(), String> {
    run(
        chromium,
        page,
        &[
            format!("--screenshot={}", png.display()),
            format!("--window-size={},{}", size.0, size.1),
        ],
    )?;
    let bytes = std::fs::read(png).map_err(|e| format!("{}: {e}", png.display()))?;
    if bytes.len() < 1000 || !bytes.starts_with(b"\x89PNG\r\n\x1a\n") {
        return Err(format!(
            "{} is not a PNG with a picture in it",
            png.display()
        ));
    }
    Ok(())
}

/// The browser for a test: `None` (after printing SKIPPED) where it is missing and the test
/// runs unprivileged; as root (where `scripts/setup` installs it) a missing browser fails.
pub fn for_test() -> Option<PathBuf> {
    match find() {
        Some(p) => Some(p),
        None if is_root() => {
            panic!("chromium is missing: run scripts/setup (apt-get install chromium)")
        }
        None => {
            eprintln!("SKIPPED: chromium is not installed (scripts/setup installs it)");
            None
        }
    }
}

/// Where a test keeps its artifacts (screenshots): `report-artifacts` in the target dir the
/// running test binary lives in (`target/release/deps/…`).
pub fn artifact_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap_or_default();
    let dir = exe
        .ancestors()
        .nth(3)
        .map_or_else(std::env::temp_dir, Path::to_path_buf)
        .join("report-artifacts");
    let _ = std::fs::create_dir_all(&dir);
    dir
}
