//! Logging set-up shared by every binary: `tracing` to stderr, filtered by `GABP_LOG`
//! (an `EnvFilter` directive such as `debug` or `gabp_relay=trace`), colour only on a terminal.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

/// Installs the global subscriber. `default` is the filter used when `GABP_LOG` is unset or
/// invalid (`"info"` for the relay, `"warn"` for the load generator). Calling it twice is harmless.
pub fn init(default: &str) {
    init_silencing(default, &[]);
}

/// [`init`], with the targets in `silenced` off whatever `GABP_LOG` says: libraries whose
/// own logs may carry secrets (the NATS client prints server addresses with their
/// credentials at debug level).
pub fn init_silencing(default: &str, silenced: &[&str]) {
    let mut filter =
        EnvFilter::try_from_env("GABP_LOG").unwrap_or_else(|_| EnvFilter::new(default));
    for target in silenced {
        if let Ok(d) = format!("{target}=off").parse() {
            filter = filter.add_directive(d);
        }
    }
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
