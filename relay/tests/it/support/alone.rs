//! A test that reads this process's memory (VmRSS) runs in a process of its own: the one test
//! binary runs other tests beside it, whose memory would count as its own.

use std::process::Stdio;

/// Set in the child [`in_own_process`] starts.
const ALONE: &str = "GABP_TEST_ALONE";

/// In the test process: runs test `name` (`module_path!()` and the function's name) alone in a
/// child process of this binary, asserts it passed, and returns `false` (the caller returns).
/// In that child: returns `true` (the caller runs the test's body).
pub async fn in_own_process(module: &str, test: &str) -> bool {
    if std::env::var_os(ALONE).is_some() {
        return true;
    }
    let name = format!("{}::{test}", module.split_once("::").map_or("", |(_, m)| m));
    let exe = std::env::current_exe().expect("test binary");
    let out = tokio::process::Command::new(exe)
        .args([name.as_str(), "--exact", "--test-threads", "1"])
        .env(ALONE, "1")
        .stdin(Stdio::null())
        .output()
        .await
        .expect("run the test alone");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("test result: ok. 1 passed;"),
        "{name}, run alone: {}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    false
}
