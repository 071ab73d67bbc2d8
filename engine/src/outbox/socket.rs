//! A bridge's write side: its socket, the frames taken from its outbox on their way into it,
//! and the slot that decides who may write.
//!
//! Two parties write to a bridge, never at once: its writer task, and the mod reader, which
//! writes directly when the writer is idle (as Redis and nats-server write from the thread that
//! read the message). The direct write saves a task wake-up and a context switch per burst of
//! events for every bridge, which on a small machine is most of the cost of fan-out at moderate
//! rates. Whoever holds the [`BridgeSocket`] writes; it never waits in the reader: what the
//! socket does not take at once stays queued here, in order, and the writer task finishes it.
//!
//! The socket lives in a [`SocketSlot`]. The writer task takes it out as a [`Lease`], which puts
//! it back when dropped (also when the task is aborted mid-write) unless the writer
//! [retires](Lease::retire) it; the mod reader only ever writes in place, under the slot's lock,
//! through [`SocketSlot::try_idle`]. Neither can leave the slot empty by mistake. This module
//! must not decide policy (cuts, closes): it reports what the socket did.

use std::collections::VecDeque;
use std::io::IoSlice;
use std::os::fd::RawFd;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use gabp_proto::{encode_frame, message};
use gabp_rt::net::BoxWrite;
use serde_json::json;
use tokio::io::{AsyncWrite, AsyncWriteExt};

use parking_lot::{MappedMutexGuard, Mutex, MutexGuard};

use super::{Batch, Frame};

/// Linux takes at most 1024 buffers per `writev` (IOV_MAX).
const MAX_IOV: usize = 512;

/// The socket and the frames queued for it.
pub struct BridgeSocket {
    /// The bridge's connection number (for recording its notices).
    pub conn: u32,
    write: BoxWrite,
    /// Wire frames not yet accepted by the socket, in order; `skip` bytes of the first one
    /// already went out.
    queue: VecDeque<Frame>,
    skip: usize,
    /// The bytes of `queue` not yet accepted.
    unwritten: usize,
    /// The relay's seq for this bridge's `relay/dropped` notices.
    notice_seq: u64,
    /// Scratch for taking from the outbox, kept for its allocations.
    pub batch: Batch,
    /// The socket's descriptor, to ask the kernel what the peer has not read yet.
    fd: Option<RawFd>,
}

impl std::fmt::Debug for BridgeSocket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BridgeSocket")
            .field("queued", &self.queue.len())
            .field("notice_seq", &self.notice_seq)
            .finish()
    }
}

/// What [`BridgeSocket::stage`] queued.
#[derive(Debug, Default)]
pub struct Staged {
    /// Events queued.
    pub events: u64,
    /// Bodies of the `relay/dropped` notices written, for the recording.
    pub notices: Vec<Bytes>,
}

impl BridgeSocket {
    /// A sink writing to bridge `conn`'s socket.
    pub fn new(conn: u32, write: BoxWrite) -> BridgeSocket {
        BridgeSocket {
            conn,
            write,
            queue: VecDeque::new(),
            skip: 0,
            unwritten: 0,
            notice_seq: 0,
            batch: Batch::default(),
            fd: None,
        }
    }

    /// Lets the write deadline tell a slow peer from a stuck one by the bytes it has yet to
    /// read (`fd` is the socket `write` writes to, open as long as it is).
    pub fn with_fd(mut self, fd: Option<RawFd>) -> BridgeSocket {
        self.fd = fd;
        self
    }

    /// Bytes the kernel holds for the peer, sent or not, that it has not taken yet.
    fn peer_unread(&self) -> Option<usize> {
        let fd = self.fd?;
        let mut n: libc::c_int = 0;
        // SAFETY: `fd` is the open socket `self.write` owns, and TIOCOUTQ writes one int to
        // the pointer, which points at `n`.
        #[allow(unsafe_code)]
        let r = unsafe { libc::ioctl(fd, libc::TIOCOUTQ, &mut n) };
        (r == 0).then(|| usize::try_from(n).unwrap_or(0))
    }

    /// Whether everything queued has been written.
    pub fn is_idle(&self) -> bool {
        self.queue.is_empty()
    }

    /// Queues what [`BridgeSocket::batch`] holds, emptying it: drop runs first as `relay/dropped`
    /// notices (they stand where the gap is), then the latest state notices, then the frames in
    /// the order they were queued.
    pub fn stage(&mut self) -> Staged {
        let mut staged = Staged::default();
        for d in self.batch.drops.drain(..) {
            let body = message::event(
                "relay/dropped",
                self.notice_seq,
                json!({"channel": &*d.channel, "fromSeq": d.from, "toSeq": d.to, "count": d.count, "policy": d.policy}),
            );
            self.notice_seq += 1;
            let mut wire = BytesMut::with_capacity(gabp_proto::codec::frame_len(body.len()));
            encode_frame(&body, &mut wire);
            self.unwritten += wire.len();
            self.queue.push_back(Frame::Control(wire.freeze()));
            staged.notices.push(body);
        }
        // The latest state notices (coalesced): already recorded where they were made.
        for ev in self.batch.latest.drain(..) {
            self.unwritten += ev.wire.len();
            self.queue.push_back(Frame::Event(ev));
        }
        for f in &self.batch.frames {
            staged.events += f.events();
            self.unwritten += f.bytes().len();
        }
        if self.queue.is_empty() {
            // Nothing left from before: take the batch's ring whole (no copy).
            std::mem::swap(&mut self.queue, &mut self.batch.frames);
        } else {
            self.queue.extend(self.batch.frames.drain(..));
        }
        staged
    }

    /// One `writev` attempt of what is queued; `Ready(Ok(0))` only when nothing is queued.
    fn poll_write_queued(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<usize>> {
        let mut slices: Vec<IoSlice<'_>> = Vec::with_capacity(self.queue.len().min(MAX_IOV));
        for (i, p) in self.queue.iter().take(MAX_IOV).enumerate() {
            let b = p.bytes();
            slices.push(IoSlice::new(if i == 0 { &b[self.skip..] } else { b }));
        }
        if slices.is_empty() {
            return Poll::Ready(Ok(0));
        }
        let n = std::task::ready!(Pin::new(&mut self.write).poll_write_vectored(cx, &slices))?;
        if n == 0 {
            return Poll::Ready(Err(std::io::ErrorKind::WriteZero.into()));
        }
        self.advance(n);
        Poll::Ready(Ok(n))
    }

    fn advance(&mut self, mut n: usize) {
        self.unwritten -= n;
        while n > 0 {
            let Some(front) = self.queue.front() else {
                return;
            };
            let left = front.bytes().len() - self.skip;
            if n < left {
                self.skip += n;
                return;
            }
            n -= left;
            self.skip = 0;
            self.queue.pop_front();
        }
    }

    /// Writes what the socket takes without waiting. `Ok(true)`: everything went out;
    /// `Ok(false)`: the socket is full and the rest stays queued for [`BridgeSocket::flush`].
    pub fn write_now(&mut self) -> std::io::Result<bool> {
        // Nothing waits on this context: a full socket just ends the attempt. The writer task,
        // which finishes the job, registers its own waker when it polls.
        let mut cx = Context::from_waker(Waker::noop());
        while !self.queue.is_empty() {
            match self.poll_write_queued(&mut cx) {
                Poll::Ready(Ok(_)) => {}
                Poll::Ready(Err(e)) => return Err(e),
                Poll::Pending => return Ok(false),
            }
        }
        Ok(true)
    }

    /// Writes everything queued, waiting for the socket as long as the peer keeps reading: an
    /// error of kind `TimedOut` when, for `deadline` (the write deadline), the socket accepted
    /// nothing and the peer read nothing of what the kernel held for it.
    pub async fn flush(&mut self, deadline: Duration) -> std::io::Result<()> {
        while !self.queue.is_empty() {
            let unread = self.peer_unread();
            match tokio::time::timeout(
                deadline,
                std::future::poll_fn(|cx| self.poll_write_queued(cx)),
            )
            .await
            {
                Ok(r) => {
                    r?;
                }
                // Slow, not stuck: the kernel says a socket has room only once much of its
                // send buffer (autotuned to megabytes) has drained, which takes a peer reading
                // a few KB/s longer than the deadline.
                Err(_)
                    if self
                        .peer_unread()
                        .zip(unread)
                        .is_some_and(|(now, was)| now < was) => {}
                Err(_) => return Err(std::io::ErrorKind::TimedOut.into()),
            }
        }
        // A burst of big frames leaves a big ring behind; give it back once written.
        if self.queue.capacity() > 4096 {
            self.queue.shrink_to(64);
        }
        Ok(())
    }

    /// Bytes queued and not yet accepted by the socket.
    pub fn queued_bytes(&self) -> usize {
        debug_assert_eq!(
            self.unwritten,
            self.queue.iter().map(|f| f.bytes().len()).sum::<usize>() - self.skip
        );
        self.unwritten
    }

    /// Shuts the socket's write side.
    pub async fn shutdown(&mut self) {
        let _ = self.write.shutdown().await;
    }
}

/// The slot a bridge's socket lives in between writes (one per outbox).
#[derive(Debug, Default)]
pub struct SocketSlot(Mutex<Option<BridgeSocket>>);

impl SocketSlot {
    /// Puts the bridge's socket in the slot, once, when the bridge connects.
    pub fn install(&self, socket: BridgeSocket) {
        let old = self.0.lock().replace(socket);
        debug_assert!(old.is_none(), "a bridge has one socket");
    }

    /// Takes the socket out for a write that may wait (the writer task); it goes back when the
    /// lease is dropped. `None` while a lease is out, or once the socket is retired or
    /// discarded.
    pub fn lease(&self) -> Option<Lease<'_>> {
        let socket = self.0.lock().take()?;
        Some(Lease {
            slot: self,
            socket: Some(socket),
        })
    }

    /// The socket in place, under the slot's lock, if no lease is out, nobody holds the lock and
    /// nothing is left queued in it: the mod reader's direct write. Never waits.
    pub fn try_idle(&self) -> Option<MappedMutexGuard<'_, BridgeSocket>> {
        let guard = self.0.try_lock()?;
        MutexGuard::try_map(guard, |s| s.as_mut().filter(|s| s.is_idle())).ok()
    }

    /// Drops the socket if it is in the slot (the connection task, resetting a cut bridge).
    pub fn discard(&self) {
        let socket = self.0.lock().take();
        drop(socket);
    }
}

/// A bridge's socket taken out of its slot by the writer task; put back when dropped (also
/// when the task is aborted mid-write), so the slot is empty only while a write is under way.
#[derive(Debug)]
pub struct Lease<'a> {
    slot: &'a SocketSlot,
    /// `Some` until dropped or retired.
    socket: Option<BridgeSocket>,
}

impl Lease<'_> {
    /// Drops the socket instead of putting it back: the writer is done with the bridge.
    pub fn retire(mut self) {
        self.socket = None;
    }
}

impl std::ops::Deref for Lease<'_> {
    type Target = BridgeSocket;
    fn deref(&self) -> &BridgeSocket {
        self.socket
            .as_ref()
            .expect("a lease holds its socket until dropped")
    }
}

impl std::ops::DerefMut for Lease<'_> {
    fn deref_mut(&mut self) -> &mut BridgeSocket {
        self.socket
            .as_mut()
            .expect("a lease holds its socket until dropped")
    }
}

impl Drop for Lease<'_> {
    fn drop(&mut self) {
        if let Some(socket) = self.socket.take() {
            *self.slot.0.lock() = Some(socket);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::outbox::{DropRun, EventFrame};
    use std::sync::Arc;
    use tokio::io::AsyncReadExt;

    fn event(seq: u64, body: &str) -> Arc<EventFrame> {
        Arc::new(EventFrame {
            channel: Arc::from("c"),
            seq,
            wire: Bytes::from(body.to_string()),
            keep: false,
        })
    }

    #[tokio::test]
    async fn partial_writes_keep_order_and_the_writer_finishes_them() {
        // A 64-byte pipe: most of a big batch cannot go out at once.
        let (a, mut b) = tokio::io::duplex(64);
        let mut sink = BridgeSocket::new(1, Box::pin(a));
        sink.batch.drops.push(DropRun {
            channel: Arc::from("c"),
            from: 0,
            to: 1,
            count: 2,
            policy: "drop-oldest",
        });
        sink.batch
            .frames
            .push_back(Frame::Control(Bytes::from_static(b"CTRL")));
        let mut expected = Vec::new();
        for i in 2..200u64 {
            let body = format!("<event {i}>");
            sink.batch.frames.push_back(Frame::Event(event(i, &body)));
            expected.extend_from_slice(body.as_bytes());
        }
        let staged = sink.stage();
        assert_eq!(staged.events, 198);
        assert_eq!(staged.notices.len(), 1);
        assert!(!sink.write_now().expect("no error"), "the pipe is full");
        assert!(!sink.is_idle());
        let reader = tokio::spawn(async move {
            let mut all = Vec::new();
            b.read_to_end(&mut all).await.expect("read");
            all
        });
        sink.flush(Duration::from_secs(10)).await.expect("flush");
        assert!(sink.is_idle());
        sink.shutdown().await;
        let all = reader.await.expect("reader");
        let text = String::from_utf8(all).expect("utf8");
        let notice = text.find("relay/dropped").expect("notice first");
        let ctrl = text.find("CTRL").expect("control");
        assert!(notice < ctrl, "the notice precedes the control frame");
        assert!(text.ends_with(std::str::from_utf8(&expected).expect("utf8")));
    }

    #[tokio::test]
    async fn a_socket_that_takes_nothing_fails_the_flush_at_the_deadline() {
        let (a, _b) = tokio::io::duplex(64);
        let mut sink = BridgeSocket::new(1, Box::pin(a));
        sink.batch
            .frames
            .push_back(Frame::Control(Bytes::from(vec![b'x'; 1000])));
        sink.stage();
        let started = std::time::Instant::now();
        let err = sink
            .flush(Duration::from_millis(100))
            .await
            .expect_err("nobody reads");
        assert_eq!(err.kind(), std::io::ErrorKind::TimedOut);
        assert!(started.elapsed() < Duration::from_secs(5));
        assert_eq!(sink.queued_bytes(), 1000 - 64, "what the pipe took is gone");
    }

    #[test]
    fn a_lease_goes_back_when_dropped_and_only_a_retired_one_leaves_the_slot_empty() {
        let (a, _b) = tokio::io::duplex(64);
        let slot = SocketSlot::default();
        slot.install(BridgeSocket::new(7, Box::pin(a)));
        let lease = slot.lease().expect("installed");
        assert_eq!(lease.conn, 7);
        assert!(slot.lease().is_none(), "one lease at a time");
        assert!(
            slot.try_idle().is_none(),
            "the reader cannot write while a lease is out"
        );
        drop(lease);
        assert!(slot.try_idle().is_some(), "back in the slot");
        let mut lease = slot.lease().expect("back");
        lease
            .batch
            .frames
            .push_back(Frame::Control(Bytes::from(vec![b'x'; 1000])));
        lease.stage();
        assert!(!lease.write_now().expect("no error"));
        drop(lease);
        assert!(
            slot.try_idle().is_none(),
            "not idle: the writer finishes it"
        );
        slot.lease().expect("back").retire();
        assert!(slot.lease().is_none(), "retired");
    }

    #[tokio::test]
    async fn an_aborted_writer_puts_the_socket_back() {
        let (a, _b) = tokio::io::duplex(64);
        let slot = std::sync::Arc::new(SocketSlot::default());
        slot.install(BridgeSocket::new(1, Box::pin(a)));
        let s = slot.clone();
        let (held, is_held) = tokio::sync::oneshot::channel();
        let writer = tokio::spawn(async move {
            let mut lease = s.lease().expect("installed");
            lease
                .batch
                .frames
                .push_back(Frame::Control(Bytes::from(vec![b'x'; 1000])));
            lease.stage();
            let _ = held.send(());
            let _ = lease.flush(Duration::from_secs(3600)).await;
        });
        is_held.await.expect("the writer holds the lease");
        writer.abort();
        let _ = writer.await;
        assert!(slot.lease().is_some(), "the aborted write's socket is back");
    }
}
