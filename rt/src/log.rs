//! Logging set-up shared by every binary: `tracing` to stderr, filtered by `GABP_LOG`
//! (an `EnvFilter` directive such as `debug` or `gabp_relay=trace`), colour only on a terminal.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

/// Installs the global subscriber. `default` is the filter used when `GABP_LOG` is unset or
/// invalid (`"info"` for the relay, `"warn"` for the load generator). Calling it twice is harmless.
pub fn init(default: &str) {
    let filter = EnvFilter::try_from_env("GABP_LOG").unwrap_or_else(|_| EnvFilter::new(default));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_target(false)
        .try_init();
}

/// Installs a subscriber for tests: output captured per test (shown when a test fails).
pub fn init_for_tests() {
    let filter = EnvFilter::try_from_env("GABP_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_test_writer()
        .try_init();
}
