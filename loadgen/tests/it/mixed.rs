//! Mixed subscription sets through the real binary: `run --one-channel-bridges N` puts N of the
//! reading bridges on the first channel only, and refuses what it could not measure as asked.

use super::loadgen;

#[tokio::test]
async fn a_bridge_on_one_channel_gets_that_channels_share_of_the_events() {
    let out = loadgen(&[
        "run",
        "--bridges",
        "2",
        "--one-channel-bridges",
        "1",
        "--rate",
        "3000",
        "--warmup",
        "300ms",
        "--duration",
        "2s",
        "--json",
    ])
    .await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let relay = &doc["relay"];
    let (published, delivered) = (
        relay["published"].as_f64().expect("published"),
        relay["delivered"].as_f64().expect("delivered"),
    );
    assert_eq!(doc["scenario"]["one_channel_bridges"], 1);
    assert_eq!(relay["unannounced_gaps"], 0);
    // One bridge takes all three channels, the other about a third of the events.
    let share = delivered / published - 1.0;
    assert!(
        (0.2..0.5).contains(&share),
        "the one-channel bridge got {share:.2} of {published} events"
    );
}

#[tokio::test]
async fn what_cannot_be_measured_as_asked_is_refused() {
    for (args, says) in [
        (
            &["run", "--bridges", "2", "--one-channel-bridges", "1"][..],
            "fixed --rate",
        ),
        (
            &[
                "run",
                "--bridges",
                "2",
                "--one-channel-bridges",
                "3",
                "--rate",
                "100",
            ][..],
            "more than the reading bridges",
        ),
        (
            &[
                "run",
                "--bridges",
                "2",
                "--one-channel-bridges",
                "1",
                "--rate",
                "100",
                "--baseline",
            ][..],
            "raw forwarder",
        ),
    ] {
        let out = loadgen(args).await;
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} ran");
        assert!(err.contains(says), "{args:?}: {err}");
    }
}
