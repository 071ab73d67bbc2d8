//! `gabp-loadgen` run as a process against simulated mods and relays: one test binary, a
//! module per command.

mod call;
mod chaos;
mod games;
mod interrupt;
mod measure;
mod mixed;
mod peers;
mod report;

/// The `gabp-loadgen` under test.
const BIN: &str = env!("CARGO_BIN_EXE_gabp-loadgen");

/// `gabp-loadgen` with `args`, run to its end (two minutes at most).
async fn loadgen(args: &[&str]) -> std::process::Output {
    let run = tokio::process::Command::new(BIN)
        .args(args)
        .kill_on_drop(true)
        .output();
    tokio::time::timeout(std::time::Duration::from_secs(120), run)
        .await
        .expect("finished in time")
        .expect("ran")
}
