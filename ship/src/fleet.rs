//! The fleet key: the shared secret that makes a shipped message one a relay of the fleet
//! produced. It owns reading and making key files, the HMAC-SHA256 every message carries, and
//! the message id derived from it; it does no I/O with NATS and decides nothing about what a
//! collector does with a message that fails (see [`super::collect`]).
//!
//! A signature covers everything a collector uses: the session (the subject's last token), the
//! kind, the first frame of a chunk, and the body (a catalog snapshot's sequence number, route
//! and state are in its body). A message moved to another session's subject, given another
//! first frame or kind, or changed in one byte no longer verifies. The `Nats-Msg-Id` holds the
//! first 128 bits of the signature, so nobody without the key can publish a message under the
//! id a genuine one will have and get that one dropped as a duplicate.

use std::fmt;
use std::io::{Read, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

use gabp_storage::SessionId;
use ring::{digest, hmac};
use subtle::ConstantTimeEq;

/// Header with the signing key's id (not secret: it tells keys apart, as in a rotation).
pub const KEY_ID: &str = "Gabp-Key";
/// Header with the signature, 64 hex digits.
pub const MAC: &str = "Gabp-Mac";

/// The fewest random bytes a key holds.
pub const MIN_KEY_BYTES: usize = 32;
/// The largest key file read (a key is 32 bytes; anything this big is the wrong file).
const MAX_FILE: u64 = 4096;
/// Domain separation: a MAC over a message of this format, version 1.
const CONTEXT: &[u8] = b"gabp-relay fleet message v1\n";
/// What a key's id is the MAC of.
const ID_CONTEXT: &[u8] = b"gabp-relay fleet key id";

/// What a message carries: the `Gabp-Kind` header's value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A stored chunk, unchanged.
    Chunk,
    /// A JSON catalog snapshot.
    Catalog,
}

impl Kind {
    /// The header value.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Chunk => "chunk",
            Kind::Catalog => "catalog",
        }
    }
}

/// What a signature covers, besides the key.
#[derive(Debug, Clone, Copy)]
pub struct Covered<'a> {
    /// The session, as the subject names it.
    pub session: SessionId,
    /// What the body is.
    pub kind: Kind,
    /// A chunk's first frame (0 for a catalog snapshot).
    pub first: u64,
    /// The payload.
    pub body: &'a [u8],
}

impl Covered<'_> {
    /// Feeds the canonical encoding: fixed-size fields, then the body last, so that no two
    /// different messages encode alike.
    fn feed(&self, mut update: impl FnMut(&[u8])) {
        update(CONTEXT);
        update(self.session.as_bytes());
        update(&[match self.kind {
            Kind::Chunk => b'k',
            Kind::Catalog => b'c',
        }]);
        update(&self.first.to_be_bytes());
        update(&(self.body.len() as u64).to_be_bytes());
        update(self.body);
    }

    /// The SHA-256 of what is covered: the content id of a message shipped unsigned (anyone
    /// can compute it; it only keeps re-sends idempotent).
    pub fn digest(&self) -> [u8; 32] {
        let mut d = digest::Context::new(&digest::SHA256);
        self.feed(|b| d.update(b));
        d.finish().as_ref().try_into().expect("SHA-256 is 32 bytes")
    }
}

/// A key's public name: the first 8 bytes of an HMAC of a fixed text under it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct KeyId([u8; 8]);

impl fmt::Display for KeyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&hex(&self.0))
    }
}

/// A fleet key, loaded. Its bytes never leave it (not in `Debug`, logs or errors).
#[derive(Clone)]
pub struct FleetKey {
    key: hmac::Key,
    id: KeyId,
}

impl fmt::Debug for FleetKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FleetKey({})", self.id)
    }
}

impl FleetKey {
    /// A key from its bytes (at least [`MIN_KEY_BYTES`]).
    pub fn from_bytes(bytes: &[u8]) -> Result<FleetKey, String> {
        if bytes.len() < MIN_KEY_BYTES {
            return Err(format!(
                "{} bytes: a fleet key holds at least {MIN_KEY_BYTES} random bytes (`gabp-relay fleet-key new -o FILE` makes one)",
                bytes.len()
            ));
        }
        let key = hmac::Key::new(hmac::HMAC_SHA256, bytes);
        let tag = hmac::sign(&key, ID_CONTEXT);
        let id = KeyId(tag.as_ref()[..8].try_into().expect("8 of 32 bytes"));
        Ok(FleetKey { key, id })
    }

    /// Reads a key file: 64 or more hex digits (what `fleet-key new` writes; surrounding
    /// whitespace ignored) or 32 or more raw bytes. Refused, as ssh refuses a private key, when
    /// group or others may read or write it.
    pub fn load(path: &Path) -> Result<FleetKey, String> {
        let at = |m: String| format!("fleet key {}: {m}", path.display());
        let f = std::fs::File::open(path).map_err(|e| at(e.to_string()))?;
        let meta = f.metadata().map_err(|e| at(e.to_string()))?;
        if !meta.is_file() {
            return Err(at("not a regular file".into()));
        }
        let mode = meta.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            return Err(at(format!(
                "permissions {mode:04o} are too open (group or others may read it): chmod 600 {}",
                path.display()
            )));
        }
        if meta.len() > MAX_FILE {
            return Err(at(format!(
                "{} bytes: not a key file (a key is {MIN_KEY_BYTES} bytes, or {} hex digits)",
                meta.len(),
                2 * MIN_KEY_BYTES
            )));
        }
        let mut raw = Vec::new();
        f.take(MAX_FILE)
            .read_to_end(&mut raw)
            .map_err(|e| at(e.to_string()))?;
        let text = raw.trim_ascii();
        let key = if !text.is_empty() && text.iter().all(u8::is_ascii_hexdigit) {
            if text.len() % 2 != 0 {
                return Err(at(format!(
                    "{} hex digits: an odd count is not whole bytes",
                    text.len()
                )));
            }
            unhex(text)
        } else {
            raw
        };
        FleetKey::from_bytes(&key).map_err(at)
    }

    /// Its public id.
    pub fn id(&self) -> KeyId {
        self.id
    }

    /// The signature of `c`.
    pub fn sign(&self, c: &Covered<'_>) -> [u8; 32] {
        let mut m = hmac::Context::with_key(&self.key);
        c.feed(|b| m.update(b));
        m.sign()
            .as_ref()
            .try_into()
            .expect("HMAC-SHA256 is 32 bytes")
    }

    /// Whether `mac` (as the header carries it, hex) is `c`'s signature under this key;
    /// compared in constant time.
    pub fn verify(&self, c: &Covered<'_>, mac: &str) -> bool {
        let Some(given) = parse_mac(mac) else {
            return false;
        };
        bool::from(self.sign(c).ct_eq(&given))
    }
}

/// A header's 64 hex digits as 32 bytes.
fn parse_mac(s: &str) -> Option<[u8; 32]> {
    let s = s.as_bytes();
    if s.len() != 64 || !s.iter().all(u8::is_ascii_hexdigit) {
        return None;
    }
    unhex(s).try_into().ok()
}

/// The key id a header names, if it is one.
pub fn parse_key_id(s: &str) -> Option<KeyId> {
    let s = s.as_bytes();
    if s.len() != 16 || !s.iter().all(u8::is_ascii_hexdigit) {
        return None;
    }
    unhex(s).try_into().ok().map(KeyId)
}

/// Lowercase hex.
pub fn hex(bytes: &[u8]) -> String {
    use fmt::Write;
    let mut s = String::with_capacity(2 * bytes.len());
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

/// Hex digits (checked by the caller, even count) as bytes.
fn unhex(digits: &[u8]) -> Vec<u8> {
    let v = |c: u8| match c {
        b'0'..=b'9' => c - b'0',
        b'a'..=b'f' => c - b'a' + 10,
        _ => c.to_ascii_lowercase() - b'a' + 10,
    };
    digits
        .chunks_exact(2)
        .map(|p| (v(p[0]) << 4) | v(p[1]))
        .collect()
}

/// Writes a new key (32 bytes from the system's random source, as hex) to `path`, created
/// with mode 0600; refuses to overwrite a file there. Returns the key's id.
pub fn new_key_file(path: &Path) -> Result<KeyId, String> {
    let at = |m: String| format!("{}: {m}", path.display());
    let mut bytes = [0u8; MIN_KEY_BYTES];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut bytes)
        .map_err(|_| "the system's random source failed".to_string())?;
    let key = FleetKey::from_bytes(&bytes)?;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| {
            if e.kind() == std::io::ErrorKind::AlreadyExists {
                at(
                    "exists: a fleet key is never overwritten (remove it first to replace it)"
                        .into(),
                )
            } else {
                at(e.to_string())
            }
        })?;
    // A umask cannot widen 0600, but a file made through an existing ACL could be: set it.
    f.set_permissions(std::fs::Permissions::from_mode(0o600))
        .and_then(|()| writeln!(f, "{}", hex(&bytes)))
        .and_then(|()| f.sync_all())
        .map_err(|e| at(e.to_string()))?;
    Ok(key.id())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn covered(body: &[u8]) -> Covered<'_> {
        Covered {
            session: SessionId::from_u128(7),
            kind: Kind::Chunk,
            first: 42,
            body,
        }
    }

    #[test]
    fn a_signature_binds_session_kind_first_frame_and_body() {
        let k = FleetKey::from_bytes(&[7u8; 32]).expect("key");
        let c = covered(b"frames");
        let mac = hex(&k.sign(&c));
        assert!(k.verify(&c, &mac));
        assert!(k.verify(&c, &mac.to_uppercase()), "hex in either case");
        let others = [
            Covered {
                session: SessionId::from_u128(8),
                ..c
            },
            Covered {
                kind: Kind::Catalog,
                ..c
            },
            Covered { first: 43, ..c },
            covered(b"frameS"),
            covered(b"frames\0"),
        ];
        for o in others {
            assert!(!k.verify(&o, &mac), "{o:?}");
        }
        let other_key = FleetKey::from_bytes(&[8u8; 32]).expect("key");
        assert!(!other_key.verify(&c, &mac));
        assert_ne!(other_key.id(), k.id());
        for bad in ["", "zz", &mac[..63], &format!("{mac}0")] {
            assert!(!k.verify(&c, bad), "{bad}");
        }
    }

    #[test]
    fn key_files_are_read_as_hex_or_raw_and_refused_when_others_may_read_them() {
        let dir = tempfile::tempdir().expect("tmp");
        let p = dir.path().join("fleet.key");
        let id = new_key_file(&p).expect("new");
        let meta = std::fs::metadata(&p).expect("meta");
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        assert_eq!(FleetKey::load(&p).expect("load").id(), id);
        let e = new_key_file(&p).expect_err("no overwrite");
        assert!(e.contains("never overwritten"), "{e}");
        // Hex and the same bytes raw are the same key.
        let text = std::fs::read_to_string(&p).expect("read");
        let raw = dir.path().join("raw.key");
        std::fs::write(&raw, unhex(text.trim().as_bytes())).expect("write");
        std::fs::set_permissions(&raw, std::fs::Permissions::from_mode(0o400)).expect("chmod");
        assert_eq!(FleetKey::load(&raw).expect("raw").id(), id);
        // Too open, too short, not whole bytes, too big, missing.
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o640)).expect("chmod");
        let e = FleetKey::load(&p).expect_err("group-readable");
        assert!(
            e.contains("0640 are too open") && e.contains("chmod 600"),
            "{e}"
        );
        assert!(!e.contains(text.trim()), "no key in the error: {e}");
        let cases: [(&[u8], &str); 4] = [
            (b"abcd\n", "at least 32"),
            (&[b'a'; 65], "odd count"),
            (&[1u8; 31], "at least 32"),
            (&[0u8; 5000], "not a key file"),
        ];
        for (i, (content, says)) in cases.iter().enumerate() {
            let f = dir.path().join(format!("k{i}"));
            std::fs::write(&f, content).expect("write");
            std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).expect("chmod");
            let e = FleetKey::load(&f).expect_err("refused");
            assert!(e.contains(says), "{e}");
        }
        let e = FleetKey::load(&dir.path().join("none")).expect_err("missing");
        assert!(e.contains("fleet key") && e.contains("none"), "{e}");
        assert!(parse_key_id(&id.to_string()) == Some(id));
    }
}
