//! The integration tests of gabp-relay, all in this one binary (one link of the relay and
//! RocksDB, not one per file): a module per subject, and `support` for what they share — the
//! `gabp-relay` binary run as a user would run it, logged `serve`s, scripted hostile mods, and an
//! in-process relay on loopback (`support::in_process`). A new test file is a module here: a
//! file directly in `relay/tests/` would be built and linked as a binary of its own.

mod accept_backoff;
mod analysis_episodes;
mod analysis_export;
mod analysis_mcap;
mod analysis_parquet;
mod backpressure;
mod bounds;
mod catalog_counts;
mod check;
mod cli;
mod cli_commands;
mod cli_secrets;
mod cli_signals;
mod cli_status;
mod cli_strangers;
mod cli_wrap;
mod deploy;
mod disk;
mod docs;
mod emfile;
mod front_limits;
mod health;
mod hostile;
mod hostile_mod;
mod hostile_stdio;
mod identity;
mod lease;
mod matrix;
mod mcp;
mod mcp_limits;
mod progress;
mod prune;
mod python_client;
mod race;
mod record_order;
mod recording;
mod reload;
mod replay;
mod replay_calls;
mod replay_controls;
mod report;
mod resume;
mod secret_names;
mod semantics;
mod ship;
mod slow_bridges;
mod slow_disk;
mod stats_memory;
mod storage_faults;
mod storage_privacy;
mod support;

/// Every integration test of the relay is a module of this binary: a `.rs` file, or a
/// directory with a `main.rs`, directly in `relay/tests/` would be built and linked (the whole
/// relay and RocksDB) as a test binary of its own.
#[test]
fn relay_tests_holds_this_binary_only() {
    // The clone this runs in, not the one that compiled this binary.
    let tests = std::env::var_os("CARGO_MANIFEST_DIR")
        .map_or_else(
            || env!("CARGO_MANIFEST_DIR").into(),
            std::path::PathBuf::from,
        )
        .join("tests");
    let mut others = Vec::new();
    for entry in std::fs::read_dir(&tests).expect("relay/tests") {
        let path = entry.expect("entry").path();
        let binary = if path.is_dir() {
            path.join("main.rs").exists()
        } else {
            path.extension().is_some_and(|e| e == "rs")
        };
        if binary && !path.ends_with("it") {
            others.push(path);
        }
    }
    assert!(
        others.is_empty(),
        "test binaries beside relay/tests/it (make each a module of it/main.rs): {others:?}"
    );
}
