//! Who gets a place on an HTTP listener (the metrics port, the MCP endpoint): at most `max`
//! connections at once, and at most `per_peer` from one IP address.
//!
//! A connection is *served* once it has sent a request the listener accepts (a whole request on
//! the metrics port; a request with a valid token on the MCP endpoint). A connection arriving
//! at either bound closes the oldest connection in its way (its peer's at the per-peer bound,
//! anyone's at the total) that is not served, so connections that sent nothing, trickle, or
//! fail authentication never keep out a client that sends its request. When every connection in
//! the way is served, the new one gets no place: [`Conns::admit`] says so, and [`Conns::freed`]
//! waits for a place to end. Among unserved connections, one whose request is already waiting
//! in the kernel (sent, not yet read by its task on a busy relay) is closed last: an idle flood
//! must not evict a client only because the relay was slow to read it. This module keeps the
//! books and asks the kernel how many bytes wait on a socket; it never reads or writes one,
//! and a connection closed to make room learns it from [`Place::closed`].

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::Notify;
use tokio_util::sync::{CancellationToken, WaitForCancellationFuture};

/// A listener's open connections, oldest first.
#[derive(Clone)]
pub struct Conns {
    open: Arc<Mutex<Open>>,
    freed: Arc<Notify>,
    max: usize,
    per_peer: usize,
}

#[derive(Default)]
struct Open {
    next: u64,
    by_age: BTreeMap<u64, Entry>,
}

struct Entry {
    peer: IpAddr,
    close: CancellationToken,
    served: Served,
    /// Its socket, to ask how many bytes wait unread (a number the kernel may since have
    /// given to another socket once the connection ended: only ever used for that question).
    fd: Option<RawFd>,
}

impl Entry {
    /// Whether bytes the peer sent wait unread on its socket.
    fn has_waiting_bytes(&self) -> bool {
        let Some(fd) = self.fd else {
            return false;
        };
        let mut n: libc::c_int = 0;
        // SAFETY: FIONREAD writes one int through the pointer, which points at `n`; on a
        // descriptor that is no longer a socket it fails and changes nothing.
        #[allow(unsafe_code)]
        let r = unsafe { libc::ioctl(fd, libc::FIONREAD, &mut n) };
        r == 0 && n > 0
    }
}

impl Entry {
    /// Still counted: not yet told to close.
    fn open(&self) -> bool {
        !self.close.is_cancelled()
    }
}

/// Marks a connection served (cheap to clone into a request handler).
#[derive(Clone, Default)]
pub struct Served(Arc<AtomicBool>);

impl Served {
    /// From now on this connection is never closed to make room.
    pub fn mark(&self) {
        self.0.store(true, Ordering::Relaxed);
    }

    fn get(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

/// One connection's place; dropping it frees the place.
pub struct Place {
    id: u64,
    close: CancellationToken,
    served: Served,
    conns: Conns,
}

impl Place {
    /// Resolves when the connection is closed to make room for a newer one.
    pub fn closed(&self) -> WaitForCancellationFuture<'_> {
        self.close.cancelled()
    }

    /// The handle that marks this connection served.
    pub fn served(&self) -> Served {
        self.served.clone()
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        self.conns.open.lock().by_age.remove(&self.id);
        self.conns.freed.notify_one();
    }
}

impl Conns {
    /// Places for `max` connections at once, `per_peer` of them from one address.
    pub fn new(max: usize, per_peer: usize) -> Conns {
        Conns {
            open: Arc::default(),
            freed: Arc::default(),
            max: max.max(1),
            per_peer: per_peer.clamp(1, max.max(1)),
        }
    }

    /// A place for a connection from `peer`, closing the oldest unserved connection in its way
    /// (from `peer` when it holds `per_peer`, from anyone when all `max` are taken); `None` when
    /// every connection in the way is served.
    #[cfg(test)]
    pub fn admit(&self, peer: IpAddr) -> Option<Place> {
        self.admit_socket(peer, None)
    }

    /// A place for a connection from `peer` on socket `fd`, as `admit` gives one: while its request waits unread
    /// in the kernel, it is closed to make room only after every unserved connection that
    /// sent nothing.
    pub fn admit_socket(&self, peer: IpAddr, fd: Option<RawFd>) -> Option<Place> {
        let mut open = self.open.lock();
        let from_peer = open
            .by_age
            .values()
            .filter(|e| e.open() && e.peer == peer)
            .count();
        if from_peer >= self.per_peer && !close_oldest_unserved(&open, Some(peer)) {
            return None;
        }
        let total = open.by_age.values().filter(|e| e.open()).count();
        if total >= self.max && !close_oldest_unserved(&open, None) {
            return None;
        }
        let id = open.next;
        open.next += 1;
        let (close, served) = (CancellationToken::new(), Served::default());
        open.by_age.insert(
            id,
            Entry {
                peer,
                close: close.clone(),
                served: served.clone(),
                fd,
            },
        );
        Some(Place {
            id,
            close,
            served,
            conns: self.clone(),
        })
    }

    /// Resolves once a place has been freed since the last call (possibly before this one):
    /// [`Conns::admit`] may succeed then.
    pub async fn freed(&self) {
        self.freed.notified().await;
    }
}

/// Tells the oldest open, unserved connection (of `peer`, if given) to close, preferring one
/// with nothing waiting unread; false if none.
fn close_oldest_unserved(open: &Open, peer: Option<IpAddr>) -> bool {
    let unserved = || {
        open.by_age
            .values()
            .filter(move |e| e.open() && !e.served.get() && peer.is_none_or(|p| e.peer == p))
    };
    let victim = unserved()
        .find(|e| !e.has_waiting_bytes())
        .or_else(|| unserved().next());
    match victim {
        Some(e) => {
            e.close.cancel();
            true
        }
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([10, 0, 0, last])
    }

    #[test]
    fn a_full_listener_closes_its_oldest_unserved_connection() {
        let conns = Conns::new(3, 3);
        let a = conns.admit(ip(1)).expect("room");
        let b = conns.admit(ip(2)).expect("room");
        let c = conns.admit(ip(3)).expect("room");
        a.served().mark();
        let d = conns.admit(ip(4)).expect("b makes room");
        assert!(b.close.is_cancelled() && !a.close.is_cancelled());
        drop(b);
        let e = conns.admit(ip(5)).expect("c makes room");
        assert!(c.close.is_cancelled());
        d.served().mark();
        e.served().mark();
        assert!(
            conns.admit(ip(6)).is_none(),
            "every open connection is served"
        );
        drop(d);
        assert!(conns.admit(ip(6)).is_some(), "a place freed");
    }

    #[test]
    fn one_peer_makes_room_among_its_own_connections_first() {
        let conns = Conns::new(10, 2);
        let other = conns.admit(ip(9)).expect("room");
        let a1 = conns.admit(ip(1)).expect("room");
        let a2 = conns.admit(ip(1)).expect("room");
        let _a3 = conns.admit(ip(1)).expect("a1 makes room");
        assert!(a1.close.is_cancelled());
        assert!(!other.close.is_cancelled() && !a2.close.is_cancelled());
        a2.served().mark();
        _a3.served().mark();
        assert!(
            conns.admit(ip(1)).is_none(),
            "the peer's places are all served"
        );
        assert!(conns.admit(ip(2)).is_some(), "other peers still get in");
    }

    #[tokio::test]
    async fn a_freed_place_wakes_a_waiter() {
        let conns = Conns::new(1, 1);
        let a = conns.admit(ip(1)).expect("room");
        a.served().mark();
        assert!(conns.admit(ip(2)).is_none());
        let waiter = tokio::spawn({
            let conns = conns.clone();
            async move {
                conns.freed().await;
                conns.admit(ip(2)).is_some()
            }
        });
        drop(a);
        assert!(waiter.await.expect("joined"));
    }

    #[test]
    fn a_connection_whose_request_waits_unread_is_closed_after_the_idle_ones() {
        use std::io::Write;
        use std::os::fd::AsRawFd;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        let mut client = std::net::TcpStream::connect(addr).expect("connect");
        let (waiting, _) = listener.accept().expect("accept");
        let idle_client = std::net::TcpStream::connect(addr).expect("connect");
        let (idle, _) = listener.accept().expect("accept");
        client.write_all(b"GET / HTTP/1.1\r\n\r\n").expect("write");
        // The bytes are in the kernel once FIONREAD says so (loopback: at once, in practice).
        let probe = Entry {
            peer: ip(1),
            close: CancellationToken::new(),
            served: Served::default(),
            fd: Some(waiting.as_raw_fd()),
        };
        while !probe.has_waiting_bytes() {
            std::thread::yield_now();
        }
        let conns = Conns::new(2, 2);
        let first = conns
            .admit_socket(ip(1), Some(waiting.as_raw_fd()))
            .expect("room");
        let second = conns
            .admit_socket(ip(1), Some(idle.as_raw_fd()))
            .expect("room");
        let _third = conns.admit(ip(1)).expect("the idle one makes room");
        assert!(second.close.is_cancelled(), "the idle one goes first");
        assert!(
            !first.close.is_cancelled(),
            "the older one's request waits unread"
        );
        drop(idle_client);
    }
}
