//! The `relay/status` answer a bridge gets, cut to fit `--max-body`: the relay never sends a
//! frame its own limit would refuse, however many bridges, subscriptions or channels it holds.
//!
//! The full status goes out when it fits. Otherwise the channel list and the bridge list keep
//! as many entries as fit, in order (channels first: they describe the session), and say how
//! many were left out (`session.channelsOmitted`, `bridgesOmitted`). Per-route figures
//! (events, drops, queues) stay whole in `--metrics`.

use bytes::Bytes;
use gabp_proto::message;
use serde_json::{json, Value};

/// The answer to `relay/status` request `id`: `status` whole if its body fits in `max_body`
/// bytes, else with its lists cut to fit; `None` if even the lists left empty do not fit.
pub(super) fn answer(id: &str, mut status: Value, max_body: usize) -> Option<Bytes> {
    let whole = message::result_response(id, status.clone());
    if whole.len() <= max_body {
        return Some(whole);
    }
    let channels = take_list(&mut status["session"], "channels");
    let bridges = take_list(&mut status, "bridges");
    if status["session"].is_object() {
        status["session"]["channelsOmitted"] = json!(channels.len());
    }
    status["bridgesOmitted"] = json!(bridges.len());
    let mut left = max_body.checked_sub(message::result_response(id, status.clone()).len())?;
    // Each kept entry costs its bytes and a comma; the omitted counts only shrink.
    let mut keep = |list: &[Value]| -> usize {
        list.iter()
            .take_while(|v| {
                let cost = message::to_ascii_json(v).len() + 1;
                let fits = cost <= left;
                if fits {
                    left -= cost;
                }
                fits
            })
            .count()
    };
    let kept_channels = if status["session"].is_object() {
        keep(&channels)
    } else {
        0
    };
    let kept_bridges = keep(&bridges);
    if status["session"].is_object() {
        status["session"]["channels"] = Value::Array(channels[..kept_channels].to_vec());
        status["session"]["channelsOmitted"] = json!(channels.len() - kept_channels);
    }
    status["bridges"] = Value::Array(bridges[..kept_bridges].to_vec());
    status["bridgesOmitted"] = json!(bridges.len() - kept_bridges);
    let cut = message::result_response(id, status);
    debug_assert!(cut.len() <= max_body, "{} > {max_body}", cut.len());
    (cut.len() <= max_body).then_some(cut)
}

/// Takes the array `key` out of `v` (empty if `v` has none).
fn take_list(v: &mut Value, key: &str) -> Vec<Value> {
    match v.get_mut(key).map(Value::take) {
        Some(Value::Array(list)) => list,
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "550e8400-e29b-41d4-a716-446655440000";

    fn status(bridges: usize, channels: usize) -> Value {
        json!({
            "route": "default",
            "session": {"id": "s", "channels": (0..channels).map(|i| json!({"channel": format!("game/channel-{i}"), "events": i})).collect::<Vec<_>>()},
            "bridges": (0..bridges).map(|i| json!({"conn": i, "name": "ünïcode", "subscriptions": ["a/b", "c/d"]})).collect::<Vec<_>>(),
        })
    }

    #[test]
    fn a_status_that_fits_goes_out_whole() {
        let s = status(3, 3);
        let whole = message::result_response(ID, s.clone());
        assert_eq!(answer(ID, s, whole.len()), Some(whole));
    }

    #[test]
    fn lists_are_cut_to_the_limit_and_say_how_many_were_left_out() {
        for limit in [600, 1024, 1500, 4096, 10_000] {
            for (bridges, channels) in [(0, 200), (200, 0), (50, 50), (1, 1)] {
                let full = message::result_response(ID, status(bridges, channels)).len();
                let Some(got) = answer(ID, status(bridges, channels), limit) else {
                    panic!("{limit} {bridges} {channels}: even empty lists did not fit");
                };
                assert!(got.len() <= limit, "{} > {limit}", got.len());
                let v: Value = serde_json::from_slice(&got).expect("json");
                let r = &v["result"];
                let shown_b = r["bridges"].as_array().expect("bridges").len();
                let shown_c = r["session"]["channels"].as_array().expect("channels").len();
                if full <= limit {
                    assert!(r.get("bridgesOmitted").is_none());
                    continue;
                }
                assert_eq!(
                    shown_b + r["bridgesOmitted"].as_u64().expect("omitted") as usize,
                    bridges
                );
                assert_eq!(
                    shown_c + r["session"]["channelsOmitted"].as_u64().expect("omitted") as usize,
                    channels
                );
                // Kept in order, and nothing more would have fit.
                if shown_c < channels {
                    assert_eq!(shown_b, 0);
                }
                for (i, b) in r["bridges"].as_array().expect("bridges").iter().enumerate() {
                    assert_eq!(b["conn"], i);
                }
            }
        }
    }

    #[test]
    fn a_limit_below_the_bare_status_gets_none() {
        assert_eq!(answer(ID, status(5, 5), 100), None);
    }
}
