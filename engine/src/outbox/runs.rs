//! A read burst's published events gathered into shared runs ([`EventRun`]): consecutive
//! events with the same subscribers are written back to back into one buffer as they are
//! published, and each run is offered to each of its subscribers as one queue entry, so the
//! per-subscriber work (queueing, staging, one `writev` buffer) is paid per run, not per event.
//!
//! A run's buffer has a fixed room ([`RUN_BYTES`], or one event's size if larger) and is never
//! reallocated while it fills: an event that does not fit starts a new run. A run filled less
//! than half is copied into a buffer of its own size when sealed (the big one is reused), so
//! whoever holds any part of a run holds at most about twice the bytes of the events in it: a
//! bridge subscribed to a rare channel never keeps a burst-sized buffer alive per event it
//! holds.

use std::sync::Arc;

use bytes::{Bytes, BytesMut};

use super::{EventRun, RunEvent, Subscriber};

/// The room of a run's buffer (a larger event gets a run of its own size).
pub const RUN_BYTES: usize = 64 * 1024;

/// The runs of one burst, in publish order; the last one still open.
#[derive(Debug, Default)]
pub struct Runs {
    sealed: Vec<(Arc<Vec<Subscriber>>, Arc<EventRun>)>,
    open: Option<Open>,
    /// Whether the last buffer handed out was `scratch` (an event nobody subscribes to).
    to_scratch: bool,
    /// Where events with no subscriber are written (the resume window copies them from here).
    scratch: BytesMut,
    /// The buffer of a run that was copied out when sealed, for the next run.
    spare: BytesMut,
}

#[derive(Debug)]
struct Open {
    subscribers: Arc<Vec<Subscriber>>,
    buf: BytesMut,
    events: Vec<RunEvent>,
}

impl Runs {
    /// The buffer to append the next event's wire frame (at most `len` bytes) to, for
    /// `subscribers`: the open run's when it is for the same bridges and has room, else a new
    /// run's (the open one is sealed). Follow the append with [`Runs::written`].
    pub fn buffer_for(
        &mut self,
        subscribers: Option<&Arc<Vec<Subscriber>>>,
        len: usize,
    ) -> &mut BytesMut {
        let Some(subscribers) = subscribers.filter(|s| !s.is_empty()) else {
            self.to_scratch = true;
            self.scratch.clear();
            return &mut self.scratch;
        };
        self.to_scratch = false;
        let fits = self.open.as_ref().is_some_and(|o| {
            o.buf.capacity() - o.buf.len() >= len && same_bridges(&o.subscribers, subscribers)
        });
        if !fits {
            self.seal();
            let mut buf = std::mem::take(&mut self.spare);
            buf.clear();
            buf.reserve(len.max(RUN_BYTES));
            self.open = Some(Open {
                subscribers: subscribers.clone(),
                buf,
                events: Vec::new(),
            });
        }
        &mut self.open.as_mut().expect("a run was opened above").buf
    }

    /// Notes that the event (`channel`, `seq`) was appended to the buffer [`Runs::buffer_for`]
    /// gave last.
    pub fn written(&mut self, channel: &Arc<str>, seq: u64) {
        if self.to_scratch {
            return;
        }
        let open = self.open.as_mut().expect("buffer_for opened a run");
        open.events.push(RunEvent {
            channel: channel.clone(),
            seq,
            end: u32::try_from(open.buf.len()).expect("a run is smaller than 4 GiB"),
        });
    }

    /// Whether no event is waiting to be offered.
    pub fn is_empty(&self) -> bool {
        self.sealed.is_empty() && self.open.as_ref().is_none_or(|o| o.events.is_empty())
    }

    /// Every run, in publish order, with who gets it; the burst starts over.
    pub fn take(&mut self) -> Vec<(Arc<Vec<Subscriber>>, Arc<EventRun>)> {
        self.seal();
        std::mem::take(&mut self.sealed)
    }

    fn seal(&mut self) {
        let Some(Open {
            subscribers,
            buf,
            events,
        }) = self.open.take()
        else {
            return;
        };
        if events.is_empty() {
            self.spare = buf;
            return;
        }
        let wire = if buf.len() * 2 >= buf.capacity() {
            buf.freeze()
        } else {
            let wire = Bytes::copy_from_slice(&buf);
            self.spare = buf;
            wire
        };
        self.sealed
            .push((subscribers, Arc::new(EventRun { wire, events })));
    }
}

/// Whether two subscriber lists name the same bridges in the same order (each channel has its
/// own list, so lists are compared by who is in them).
fn same_bridges(a: &Arc<Vec<Subscriber>>, b: &Arc<Vec<Subscriber>>) -> bool {
    Arc::ptr_eq(a, b)
        || (a.len() == b.len()
            && a.iter()
                .zip(b.iter())
                .all(|(x, y)| x.0 == y.0 && Arc::ptr_eq(&x.1, &y.1)))
}
