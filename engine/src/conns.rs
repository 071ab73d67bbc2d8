//! Who gets a place on an HTTP listener (the metrics port, the MCP endpoint): at most `max`
//! connections at once, at most `per_peer` from one IP address, and at most `per_identity`
//! served connections of one identity.
//!
//! A connection is *served* once it has sent a request the listener accepts (a whole request on
//! the metrics port; a request with a valid token on the MCP endpoint). A connection arriving
//! at either bound closes the oldest connection in its way (its peer's at the per-peer bound,
//! anyone's at the total) that is not served, so connections that sent nothing, trickle, or
//! fail authentication never keep out a client that sends its request. When every connection in
//! the way is served, the new one gets no place: [`Conns::admit_socket`] says so, and [`Conns::freed`]
//! waits for a place to end. Among unserved connections, one whose request is already waiting
//! in the kernel (sent, not yet read by its task on a busy relay) is closed last: an idle flood
//! must not evict a client only because the relay was slow to read it.
//!
//! A served connection belongs to the identity of its latest request ([`Served::mark_by`];
//! the metrics port has none: [`Served::mark`]). One identity holds at most `per_identity`
//! served connections: when one more of its connections is served, its oldest other served
//! connection is closed. A served connection is never closed to make room for another
//! identity's, so with `per_identity` below `per_peer` and `max`, one token holder can never
//! fill the listener, or one address's places, with connections nobody may close: what it
//! leaves is free or held by unserved connections, which a newcomer closes as above.
//!
//! This module keeps the books and asks the kernel how many bytes wait on a socket; it never
//! reads or writes one, and a connection closed to make room learns it from [`Place::closed`].

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::os::fd::RawFd;
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
    per_identity: usize,
}

#[derive(Default)]
struct Open {
    next: u64,
    by_age: BTreeMap<u64, Entry>,
}

/// Whom a connection is served for.
#[derive(Clone, PartialEq, Eq)]
enum Owner {
    /// Not served yet: it may be closed to make room.
    Nobody,
    /// Served, for no identity (the metrics port).
    Anyone,
    /// Served for this identity (its name).
    Identity(Arc<str>),
}

struct Entry {
    peer: IpAddr,
    close: CancellationToken,
    owner: Owner,
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

    /// Still counted: not yet told to close.
    fn open(&self) -> bool {
        !self.close.is_cancelled()
    }

    fn served(&self) -> bool {
        self.owner != Owner::Nobody
    }
}

/// Marks a connection served (cheap to clone into a request handler).
#[derive(Clone)]
pub struct Served {
    id: u64,
    conns: Conns,
}

impl Served {
    /// From now on this connection is never closed to make room (the metrics port: no
    /// identity).
    pub fn mark(&self) {
        self.conns.serve(self.id, Owner::Anyone);
    }

    /// From now on this connection belongs to `identity` and is never closed to make room
    /// for another connection, only for one more of `identity`'s beyond its share.
    pub fn mark_by(&self, identity: &str) {
        self.conns.serve(self.id, Owner::Identity(identity.into()));
    }
}

/// One connection's place; dropping it frees the place.
pub struct Place {
    id: u64,
    close: CancellationToken,
    conns: Conns,
}

impl Place {
    /// Resolves when the connection is closed to make room for a newer one.
    pub fn closed(&self) -> WaitForCancellationFuture<'_> {
        self.close.cancelled()
    }

    /// The handle that marks this connection served.
    pub fn served(&self) -> Served {
        Served {
            id: self.id,
            conns: self.conns.clone(),
        }
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        self.conns.open.lock().by_age.remove(&self.id);
        self.conns.freed.notify_one();
    }
}

impl Conns {
    /// Places for `max` connections at once, `per_peer` of them from one address (no bound
    /// per identity until [`Conns::per_identity`]).
    pub fn new(max: usize, per_peer: usize) -> Conns {
        let max = max.max(1);
        Conns {
            open: Arc::default(),
            freed: Arc::default(),
            max,
            per_peer: per_peer.clamp(1, max),
            per_identity: max,
        }
    }

    /// The same, with at most `n` served connections of one identity.
    pub fn per_identity(mut self, n: usize) -> Conns {
        self.per_identity = n.clamp(1, self.max);
        self
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
        let close = CancellationToken::new();
        open.by_age.insert(
            id,
            Entry {
                peer,
                close: close.clone(),
                owner: Owner::Nobody,
                fd,
            },
        );
        Some(Place {
            id,
            close,
            conns: self.clone(),
        })
    }

    /// Resolves once a place has been freed since the last call (possibly before this one):
    /// [`Conns::admit_socket`] may succeed then.
    pub async fn freed(&self) {
        self.freed.notified().await;
    }

    /// Connection `id` is served for `owner`; for an identity that now holds more than its
    /// share, its oldest other served connection is told to close.
    fn serve(&self, id: u64, owner: Owner) {
        let mut open = self.open.lock();
        let Some(entry) = open.by_age.get_mut(&id) else {
            return;
        };
        if entry.owner == owner {
            return;
        }
        entry.owner = owner.clone();
        if !matches!(owner, Owner::Identity(_)) {
            return;
        }
        let mut mine = open
            .by_age
            .iter()
            .filter(|(_, e)| e.open() && e.owner == owner);
        if mine.clone().count() <= self.per_identity {
            return;
        }
        // Oldest first; never the connection whose request is being served now.
        if let Some((_, oldest)) = mine.find(|(other, _)| **other != id) {
            oldest.close.cancel();
        }
    }
}

/// Tells the oldest open, unserved connection (of `peer`, if given) to close, preferring one
/// with nothing waiting unread; false if none.
fn close_oldest_unserved(open: &Open, peer: Option<IpAddr>) -> bool {
    let unserved = || {
        open.by_age
            .values()
            .filter(move |e| e.open() && !e.served() && peer.is_none_or(|p| e.peer == p))
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

    #[test]
    fn one_identity_holds_at_most_its_share_of_served_connections() {
        let conns = Conns::new(6, 6).per_identity(2);
        let other = conns.admit(ip(9)).expect("room");
        other.served().mark_by("b");
        let a: Vec<Place> = (0..4).map(|_| conns.admit(ip(1)).expect("room")).collect();
        a[0].served().mark_by("a");
        a[1].served().mark_by("a");
        // The same identity again on a served connection changes nothing.
        a[1].served().mark_by("a");
        assert!(!a[0].close.is_cancelled() && !a[1].close.is_cancelled());
        a[2].served().mark_by("a");
        assert!(
            a[0].close.is_cancelled(),
            "a's oldest makes room for its third"
        );
        assert!(!a[1].close.is_cancelled() && !a[2].close.is_cancelled());
        a[3].served().mark_by("a");
        assert!(a[1].close.is_cancelled());
        assert!(
            !other.close.is_cancelled(),
            "another identity's is never closed"
        );
        // A connection that changes identity counts for the new one only.
        let c = conns.admit(ip(1)).expect("room");
        c.served().mark_by("a");
        assert!(a[2].close.is_cancelled());
        c.served().mark_by("b");
        assert!(!other.close.is_cancelled() && !a[3].close.is_cancelled());
    }

    #[test]
    fn a_listener_full_of_one_identity_still_admits_another() {
        let conns = Conns::new(4, 4).per_identity(2);
        let mut a: Vec<Place> = Vec::new();
        for _ in 0..8 {
            let p = conns
                .admit(ip(1))
                .expect("one identity never fills the listener");
            p.served().mark_by("a");
            a.push(p);
            a.retain(|p| !p.close.is_cancelled());
        }
        assert_eq!(a.len(), 2);
        let b = conns.admit(ip(1)).expect("room for another identity");
        b.served().mark_by("b");
        assert!(a.iter().all(|p| !p.close.is_cancelled()));
    }

    #[test]
    fn unserved_connections_make_room_before_any_identity_gives_up_one() {
        let conns = Conns::new(3, 3).per_identity(2);
        let a1 = conns.admit(ip(1)).expect("room");
        let idle = conns.admit(ip(2)).expect("room");
        let a2 = conns.admit(ip(1)).expect("room");
        a1.served().mark_by("a");
        a2.served().mark_by("a");
        let b = conns.admit(ip(3)).expect("the idle one makes room");
        assert!(idle.close.is_cancelled());
        b.served().mark_by("b");
        assert!(!a1.close.is_cancelled() && !a2.close.is_cancelled());
        assert!(
            conns.admit(ip(4)).is_none(),
            "served connections are never closed for a newcomer"
        );
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
            owner: Owner::Nobody,
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
