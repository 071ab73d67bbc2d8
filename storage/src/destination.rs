//! Where sessions are shipped to, as a fingerprint that stays the same across versions and
//! machines: the key every ship cursor is stored under, and what retention asks about before
//! it deletes a session. Knows nothing of NATS.

/// Where sessions are shipped to, as an identity: the stream (its name and when it was
/// created, so a stream deleted and made again, or one of the same name on another cluster,
/// is another destination) and the subject prefix the messages go under.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Destination(pub u64);

impl Destination {
    /// The destination of messages under `subject_prefix` in stream `stream`, created at
    /// `created_ns` (nanoseconds since the epoch, as the server reports it).
    pub fn new(stream: &str, created_ns: i128, subject_prefix: &str) -> Destination {
        let mut h = Fnv::default();
        h.write(stream.as_bytes());
        h.write(&[0]);
        h.write(&created_ns.to_be_bytes());
        h.write(subject_prefix.as_bytes());
        Destination(h.0)
    }
}

/// FNV-1a: a fingerprint that stays the same across versions and machines (std's hasher
/// does not promise to).
pub(crate) struct Fnv(pub(crate) u64);

impl Default for Fnv {
    fn default() -> Self {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
}

impl Fnv {
    pub(crate) fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3);
        }
    }
}
