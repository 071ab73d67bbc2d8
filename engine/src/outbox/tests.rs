//! The outbox's unit tests: policies, bounds, order, and waiting for room.

use super::*;

fn ev(ch: &str, seq: u64) -> Arc<EventFrame> {
    Arc::new(EventFrame {
        channel: ch.into(),
        seq,
        wire: Bytes::from(vec![b'x'; 10]),
        keep: false,
    })
}

fn events(b: &Batch) -> Vec<(&str, u64)> {
    b.frames
        .iter()
        .flat_map(|f| match f {
            Frame::Event(e) => vec![(&*e.channel, e.seq)],
            Frame::Run { run, from, to } => run.events[*from as usize..*to as usize]
                .iter()
                .map(|e| (&*e.channel, e.seq))
                .collect(),
            Frame::Control(_) => vec![],
        })
        .collect()
}

#[test]
fn ordered_notices_keep_their_place_and_are_never_dropped() {
    let o = Outbox::new(OnSlow::DropOldest, 3, 1 << 20);
    o.offer(&ev("a", 0));
    let notice = EventFrame {
        channel: "relay/session".into(),
        seq: 0,
        wire: Bytes::from_static(b"n"),
        keep: true,
    };
    o.push_notice(Arc::new(notice));
    for s in 1..6 {
        o.offer(&ev("a", s));
    }
    let mut b = Batch::default();
    o.take(&mut b).expect("open");
    assert_eq!(
        events(&b),
        vec![("relay/session", 0), ("a", 3), ("a", 4), ("a", 5)]
    );
    assert_eq!(
        b.drops,
        vec![DropRun {
            channel: "a".into(),
            from: 0,
            to: 2,
            count: 3,
            policy: "drop-oldest",
        }]
    );
}

#[test]
fn drop_oldest_keeps_newest_and_records_runs() {
    let o = Outbox::new(OnSlow::DropOldest, 3, 1 << 20);
    for s in 0..5 {
        o.offer(&ev("a", s));
    }
    o.push_control(Bytes::from_static(b"resp"));
    let mut b = Batch::default();
    o.take(&mut b).expect("open");
    assert_eq!(events(&b), vec![("a", 2), ("a", 3), ("a", 4)]);
    assert_eq!(
        b.drops,
        vec![DropRun {
            channel: "a".into(),
            from: 0,
            to: 1,
            count: 2,
            policy: "drop-oldest",
        }]
    );
    assert_eq!(b.frames.len(), 4, "control frames are never dropped");
    assert_eq!(o.dropped(), 2);
}

#[test]
fn control_frames_keep_their_place_among_events() {
    // A response queued after events stays after them, even when older events are dropped
    // around it: the bridge sees the mod's order.
    let o = Outbox::new(OnSlow::DropOldest, 2, 1 << 20);
    o.offer(&ev("a", 0));
    o.offer(&ev("a", 1));
    o.push_control(Bytes::from_static(b"resp"));
    o.offer(&ev("a", 2));
    let mut b = Batch::default();
    o.take(&mut b).expect("open");
    let order: Vec<String> = b
        .frames
        .iter()
        .map(|f| match f {
            Frame::Event(e) => format!("e{}", e.seq),
            Frame::Run { .. } => unreachable!("no run was offered"),
            Frame::Control(_) => "resp".into(),
        })
        .collect();
    assert_eq!(order, vec!["e1", "resp", "e2"]);
}

#[test]
fn byte_bound_applies() {
    let o = Outbox::new(OnSlow::DropOldest, 100, 25);
    for s in 0..4 {
        o.offer(&ev("a", s));
    }
    assert_eq!(o.depth().events, 2);
}

#[test]
fn control_frames_past_their_bound_cut_the_bridge() {
    let o = Outbox::new(OnSlow::DropOldest, 100, 25);
    assert!(
        o.push_control(Bytes::from(vec![b'r'; 40])),
        "one always fits"
    );
    assert!(!o.is_closed());
    assert!(!o.push_control(Bytes::from(vec![b'r'; 10])));
    assert!(o.cut_signal().is_cancelled());
    assert_eq!(o.cut_reason(), Some(CutReason::ControlBacklog));
    assert_eq!(
        o.depth(),
        Depth::default(),
        "what was queued is freed at once"
    );
}

#[test]
fn disconnect_cuts_and_block_reports_full() {
    let o = Outbox::new(OnSlow::Disconnect, 1, 1 << 20);
    assert_eq!(o.offer(&ev("a", 0)), Offer::Queued);
    assert_eq!(o.offer(&ev("a", 1)), Offer::Disconnected);
    assert!(o.is_closed());
    assert!(o.cut_signal().is_cancelled());
    let mut b = Batch::default();
    assert!(o.take(&mut b).is_none(), "a cut bridge gets nothing more");

    let o = Outbox::new(OnSlow::Block, 1, 1 << 20);
    assert_eq!(o.offer(&ev("a", 0)), Offer::Queued);
    assert_eq!(o.offer(&ev("a", 1)), Offer::Full);
    assert_eq!(o.dropped(), 0);
}

#[tokio::test]
async fn block_waits_for_bytes_not_only_frames() {
    // The byte bound is reached first: `space` must not return until the refused event
    // fits (it used to check frames only, and the mod reader spun).
    let o = Arc::new(Outbox::new(OnSlow::Block, 100, 25));
    assert_eq!(o.offer(&ev("a", 0)), Offer::Queued);
    assert_eq!(o.offer(&ev("a", 1)), Offer::Queued);
    assert_eq!(o.offer(&ev("a", 2)), Offer::Full);
    let waiting = tokio::time::timeout(std::time::Duration::from_millis(50), o.space()).await;
    assert!(waiting.is_err(), "no room yet: space() waits");
    let o2 = o.clone();
    let taker = tokio::spawn(async move {
        let mut b = Batch::default();
        o2.take(&mut b).expect("open");
    });
    tokio::time::timeout(std::time::Duration::from_secs(5), o.space())
        .await
        .expect("room after the writer took");
    taker.await.expect("taker");
    assert_eq!(o.offer(&ev("a", 2)), Offer::Queued);
}

/// What a take hands over counts as unwritten until the taker says what the socket left: a
/// resume waiting for room (`events_below`, which counts both) must never see the bytes in
/// neither place, or a bridge that reads nothing is sent its history twice over.
#[tokio::test]
async fn taken_bytes_count_as_unwritten_until_the_taker_says_otherwise() {
    let o = Outbox::new(OnSlow::DropOldest, 100, 1 << 20);
    for s in 0..3 {
        o.offer(&ev("a", s));
    }
    o.note_unwritten(0);
    let mut b = Batch::default();
    o.take(&mut b).expect("open");
    assert_eq!(o.depth().event_bytes, 0);
    assert_eq!(
        o.unwritten(),
        30,
        "three frames of 10 bytes taken, none written yet"
    );
    let waiting = tokio::time::timeout(
        std::time::Duration::from_millis(20),
        o.events_below(100, 20),
    )
    .await;
    assert!(
        waiting.is_err(),
        "30 bytes taken and unwritten are over a room of 20"
    );
    o.note_unwritten(0);
    tokio::time::timeout(std::time::Duration::from_secs(5), o.events_below(100, 20))
        .await
        .expect("room once the socket took them");
}

/// `offer_all` on a run is exactly `offer` on each of its events in turn: same queue, same
/// drop runs, same counts, whatever the policy, the bounds, the run lengths, a kept notice or a
/// control frame in between.
#[test]
fn a_run_offered_at_once_equals_its_events_offered_one_by_one() {
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move |n: u64| {
        rng = rng
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (rng >> 33) % n
    };
    for policy in [OnSlow::DropOldest, OnSlow::Block, OnSlow::Disconnect] {
        for round in 0..50 {
            let (frames, bytes) = (1 + next(12) as usize, 20 + next(200) as usize);
            let one = Outbox::new(policy, frames, bytes);
            let all = Outbox::new(policy, frames, bytes);
            let mut seqs = [0u64; 2];
            for _ in 0..20 {
                let run: Vec<Arc<EventFrame>> = (0..next(9))
                    .map(|_| {
                        let c = next(2) as usize;
                        seqs[c] += 1;
                        Arc::new(EventFrame {
                            channel: ["a", "b"][c].into(),
                            seq: seqs[c],
                            wire: Bytes::from(vec![b'x'; 1 + next(30) as usize]),
                            keep: false,
                        })
                    })
                    .collect();
                let mut stopped = None;
                let mut queued = 0;
                for e in &run {
                    match one.offer(e) {
                        Offer::Queued | Offer::QueuedAfterDrop(_) => queued += 1,
                        other => {
                            stopped = Some(other);
                            break;
                        }
                    }
                }
                let done = all.offer_all(&run);
                assert_eq!(done.queued, queued, "{policy:?} round {round}");
                if let Some(s) = stopped {
                    assert_eq!(done.outcome, s, "{policy:?} round {round}");
                }
                match next(4) {
                    0 => {
                        for o in [&one, &all] {
                            o.push_control(Bytes::from_static(b"ctl"));
                        }
                    }
                    1 => {
                        let n = Arc::new(EventFrame {
                            channel: "relay/session".into(),
                            seq: 0,
                            wire: Bytes::from_static(b"n"),
                            keep: true,
                        });
                        for o in [&one, &all] {
                            o.push_notice(n.clone());
                        }
                    }
                    2 => {
                        let (mut b1, mut b2) = (Batch::default(), Batch::default());
                        assert_eq!(one.take(&mut b1).is_some(), all.take(&mut b2).is_some());
                        assert_eq!(b1.drops, b2.drops);
                        let bytes = |b: &Batch| -> Vec<Vec<u8>> {
                            b.frames.iter().map(|f| f.bytes().to_vec()).collect()
                        };
                        assert_eq!(events(&b1), events(&b2), "{policy:?} round {round}");
                        assert_eq!(bytes(&b1), bytes(&b2));
                    }
                    _ => {}
                }
                assert_eq!(one.depth(), all.depth());
                assert_eq!(one.dropped(), all.dropped());
                assert_eq!(one.is_closed(), all.is_closed());
            }
        }
    }
}

#[test]
fn contiguous_not_retained_ranges_not_yet_taken_are_one_notice() {
    let o = Outbox::new(OnSlow::DropOldest, 10, 1 << 20);
    assert!(o.push_gap("a".into(), 10, 19));
    assert!(o.push_gap("a".into(), 20, 24));
    // Another channel, and a range that does not follow, stay notices of their own.
    assert!(o.push_gap("b".into(), 25, 26));
    assert!(o.push_gap("a".into(), 30, 31));
    let mut b = Batch::default();
    o.take(&mut b).expect("open");
    let runs: Vec<(&str, u64, u64, u64)> = b
        .drops
        .iter()
        .map(|d| (&*d.channel, d.from, d.to, d.count))
        .collect();
    assert_eq!(
        runs,
        [("a", 10, 24, 15), ("b", 25, 26, 2), ("a", 30, 31, 2)]
    );
    // Once taken, the next range is a notice of its own.
    assert!(o.push_gap("a".into(), 32, 33));
    b.drops.clear();
    o.take(&mut b).expect("open");
    assert_eq!(b.drops.len(), 1);
}

/// A run of the events `(channel, seq, wire length)`, each frame's bytes saying which it is.
fn run_of(evs: &[(&str, u64, usize)]) -> Arc<EventRun> {
    let mut wire = Vec::new();
    let mut events = Vec::new();
    for &(ch, seq, len) in evs {
        wire.extend((0..len).map(|i| (seq as usize * 7 + i + ch.len()) as u8));
        events.push(RunEvent {
            channel: ch.into(),
            seq,
            end: wire.len() as u32,
        });
    }
    Arc::new(EventRun {
        wire: Bytes::from(wire),
        events,
    })
}

/// The events of `run` as frames of their own.
fn singles(run: &EventRun) -> Vec<Arc<EventFrame>> {
    (0..run.events.len())
        .map(|i| {
            Arc::new(EventFrame {
                channel: run.events[i].channel.clone(),
                seq: run.events[i].seq,
                wire: run.wire.slice(run.start(i)..run.events[i].end as usize),
                keep: false,
            })
        })
        .collect()
}

#[test]
fn a_run_is_one_entry_and_loses_its_oldest_events_one_by_one() {
    let o = Outbox::new(OnSlow::DropOldest, 5, 1 << 20);
    let run = run_of(&[
        ("a", 0, 3),
        ("b", 0, 4),
        ("a", 1, 5),
        ("a", 2, 6),
        ("b", 1, 7),
        ("a", 3, 8),
        ("b", 2, 9),
        ("a", 4, 10),
    ]);
    let done = o.offer_run(&run, 0);
    assert_eq!((done.queued, done.dropped), (8, 3));
    assert_eq!(done.outcome, Offer::QueuedAfterDrop(3));
    let d = o.depth();
    assert_eq!(
        (d.events, d.event_bytes, d.controls),
        (5, 6 + 7 + 8 + 9 + 10, 0)
    );
    let mut b = Batch::default();
    o.take(&mut b).expect("open");
    assert_eq!(b.frames.len(), 1, "one entry for the run's events");
    assert_eq!(
        events(&b),
        vec![("a", 2), ("b", 1), ("a", 3), ("b", 2), ("a", 4)]
    );
    assert_eq!(b.frames[0].bytes(), &run.wire[3 + 4 + 5..]);
    assert_eq!(b.frames[0].events(), 5);
    let drops: Vec<(&str, u64, u64)> = b
        .drops
        .iter()
        .map(|d| (&*d.channel, d.from, d.to))
        .collect();
    assert_eq!(drops, vec![("a", 0, 1), ("b", 0, 0)]);
}

/// Offering runs gives a bridge exactly what offering their events one by one gives: the same
/// events, bytes, drop ranges and outcomes, under every policy and bound.
#[test]
fn runs_and_single_events_queue_drop_and_refuse_alike() {
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let mut next = move |n: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % n
    };
    for policy in [OnSlow::DropOldest, OnSlow::Block, OnSlow::Disconnect] {
        for (max_frames, max_bytes) in [(4, 1 << 20), (1 << 20, 100), (7, 60), (1, 1)] {
            let by_run = Outbox::new(policy, max_frames, max_bytes);
            let one_by_one = Outbox::new(policy, max_frames, max_bytes);
            let mut seqs = [0u64; 3];
            for _ in 0..60 {
                let evs: Vec<(&str, u64, usize)> = (0..1 + next(12))
                    .map(|_| {
                        let c = next(3) as usize;
                        seqs[c] += 1;
                        (["a", "b", "c"][c], seqs[c] - 1, 1 + next(30) as usize)
                    })
                    .collect();
                let run = run_of(&evs);
                let from = next(3) as usize;
                let got = by_run.offer_run(&run, from);
                let want = one_by_one.offer_all(&singles(&run)[from.min(evs.len())..]);
                assert_eq!(got, want, "{policy:?} {max_frames} {max_bytes}");
                assert_eq!(by_run.depth(), one_by_one.depth());
                if next(4) == 0 {
                    let (mut a, mut b) = (Batch::default(), Batch::default());
                    let (ra, rb) = (by_run.take(&mut a), one_by_one.take(&mut b));
                    assert_eq!(ra.is_some(), rb.is_some());
                    assert_eq!(events(&a), events(&b));
                    assert_eq!(a.drops, b.drops);
                    let bytes = |b: &Batch| -> Vec<u8> {
                        b.frames.iter().flat_map(|f| f.bytes().to_vec()).collect()
                    };
                    assert_eq!(bytes(&a), bytes(&b));
                }
            }
            assert_eq!(by_run.dropped(), one_by_one.dropped());
            assert_eq!(by_run.is_closed(), one_by_one.is_closed());
        }
    }
}

#[test]
fn runs_split_by_subscribers_and_by_room_and_copy_out_what_they_barely_use() {
    let a: Arc<Vec<Subscriber>> = Arc::new(vec![(1, Arc::new(Outbox::new(OnSlow::Block, 9, 9)))]);
    let b: Arc<Vec<Subscriber>> = Arc::new(vec![(2, Arc::new(Outbox::new(OnSlow::Block, 9, 9)))]);
    // The same bridges in another channel's list are the same subscribers.
    let a_again: Arc<Vec<Subscriber>> = Arc::new(a.as_ref().clone());
    let mut runs = Runs::default();
    let write = |runs: &mut Runs, subs: Option<&Arc<Vec<Subscriber>>>, seq: u64, len: usize| {
        runs.buffer_for(subs, len)
            .extend(std::iter::repeat_n(seq as u8, len));
        runs.written(&Arc::from("c"), seq);
    };
    write(&mut runs, Some(&a), 0, 10);
    write(&mut runs, Some(&a_again), 1, 20);
    write(&mut runs, None, 2, 5);
    write(&mut runs, Some(&b), 3, 30);
    write(&mut runs, Some(&a), 4, RUN_BYTES - 100);
    write(&mut runs, Some(&a), 5, 200);
    write(&mut runs, Some(&a), 6, 3 * RUN_BYTES);
    assert!(!runs.is_empty());
    let taken = runs.take();
    assert!(runs.is_empty());
    let shape: Vec<(u32, Vec<u64>, usize)> = taken
        .iter()
        .map(|(subs, run)| {
            (
                subs[0].0,
                run.events.iter().map(|e| e.seq).collect(),
                run.wire.len(),
            )
        })
        .collect();
    assert_eq!(
        shape,
        vec![
            (1, vec![0, 1], 30),
            (2, vec![3], 30),
            (1, vec![4], RUN_BYTES - 100),
            (1, vec![5], 200),
            (1, vec![6], 3 * RUN_BYTES),
        ],
        "an event nobody gets is in no run; a run ends where its room does"
    );
    for (_, run) in &taken {
        for (i, e) in run.events.iter().enumerate() {
            assert!(run.wire[run.start(i)..e.end as usize]
                .iter()
                .all(|&x| x == e.seq as u8));
        }
    }
}

/// A reader of the fill (the status a test polls, a resume sizing its next batch) sees what
/// a take moves either still queued or already unwritten, never in both: read as two figures
/// one after the other, a take between them showed a bridge that reads nothing holding twice
/// its bound (`resume::a_bridge_that_does_not_read…` failed with "held 2092920 bytes", twice
/// the room it had filled).
#[test]
fn the_fill_is_read_at_one_moment_across_a_take() {
    const ROOM: usize = 1000;
    let o = Arc::new(Outbox::new(OnSlow::DropOldest, 1 << 20, 1 << 20));
    let stop = Arc::new(AtomicBool::new(false));
    // Fills to the room whenever there is some, as a resume's catch-up does.
    let filler = {
        let (o, stop) = (o.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut seq = 0;
            while !stop.load(Ordering::Relaxed) {
                let d = o.depth();
                if d.event_bytes + d.unwritten + 10 <= ROOM {
                    o.offer(&ev("a", seq));
                    seq += 1;
                }
            }
        })
    };
    // Takes and has it written at once, as a writer on a socket with room does.
    let taker = {
        let (o, stop) = (o.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut b = Batch::default();
            let mut takes = 0u64;
            while !stop.load(Ordering::Relaxed) {
                o.take(&mut b).expect("open");
                // A while in the socket, as a writer's flush takes.
                for _ in 0..100 {
                    std::hint::spin_loop();
                }
                b.frames.clear();
                o.note_unwritten(0);
                takes += 1;
            }
            takes
        })
    };
    let mut most = 0;
    for _ in 0..1_000_000 {
        let d = o.depth();
        most = most.max(d.event_bytes + d.unwritten);
    }
    stop.store(true, Ordering::Relaxed);
    filler.join().expect("filler");
    let takes = taker.join().expect("taker");
    assert!(takes > 0, "the taker never ran");
    assert!(most <= ROOM, "read {most} bytes held for a room of {ROOM}");
}

fn notice(ch: &str, seq: u64) -> Arc<EventFrame> {
    Arc::new(EventFrame {
        channel: ch.into(),
        seq,
        wire: Bytes::from(vec![b'n'; 100]),
        keep: true,
    })
}

#[test]
fn notices_are_bounded_apart_from_events_and_past_the_bound_the_bridge_is_cut() {
    let o = Outbox::new(OnSlow::DropOldest, 4, 1 << 20);
    for s in 0..4 {
        assert!(o.push_notice(notice("relay/session", s)));
    }
    // Events still fit beside them, as many as the event bound holds.
    for s in 0..4 {
        assert_eq!(o.offer(&ev("a", s)), Offer::Queued);
    }
    assert_eq!((o.depth().events, o.depth().notices), (4, 4));
    assert!(!o.push_notice(notice("relay/session", 4)));
    assert_eq!(o.cut_reason(), Some(CutReason::NoticeBacklog));
}

#[test]
fn a_state_notice_not_yet_taken_is_replaced_by_the_newest() {
    let o = Outbox::new(OnSlow::DropOldest, 4, 1 << 20);
    o.offer(&ev("a", 0));
    for s in 0..100_000 {
        assert!(o.set_latest(notice("relay/lease", s)));
    }
    assert_eq!((o.depth().notices, o.depth().notice_bytes), (1, 100));
    let mut b = Batch::default();
    o.take(&mut b).expect("open");
    assert_eq!(b.latest.len(), 1);
    assert_eq!(b.latest[0].seq, 99_999);
    assert_eq!(events(&b), vec![("a", 0)]);
    assert!(o.set_latest(notice("relay/lease", 100_000)));
    assert_eq!(o.depth().notices, 1, "a new one after the take");
}
