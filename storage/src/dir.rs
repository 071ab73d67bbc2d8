//! The data dir on the file system: who may record into it (owner, mode, symlinks), making
//! it private, and finding the process that holds RocksDB's lock.

use std::path::Path;

use crate::error::StoreError;

/// Whether `path` holds any file RocksDB writes: a dir without one is no damaged data dir
/// (nothing for `repair` to work on) but some other dir, or an empty one.
pub(crate) fn holds_rocksdb_files(path: &Path) -> Result<bool, StoreError> {
    for e in std::fs::read_dir(path)? {
        let name = e?.file_name();
        let n = name.to_string_lossy();
        // Only what a database can be rebuilt from: a manifest, tables, logs, blobs. Not
        // `CURRENT` or `OPTIONS-*` alone (a user's file of that name was "repaired" into an
        // empty database), nor `LOG`, `LOCK` or `IDENTITY`, plain names other programs use.
        if n.starts_with("MANIFEST-")
            || numbered(&n, ".sst")
            || numbered(&n, ".log")
            || numbered(&n, ".blob")
        {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Whether `name` is a file number and `ext`, as RocksDB names its tables, logs and blobs
/// (`000123.log`): a user's `app.log` beside them does not make a dir a data dir.
fn numbered(name: &str, ext: &str) -> bool {
    name.strip_suffix(ext)
        .is_some_and(|stem| !stem.is_empty() && stem.bytes().all(|b| b.is_ascii_digit()))
}

/// The refusal of a data dir this user may not use, said as a permissions problem (never as
/// damage for `repair`): `what` it cannot do.
pub(crate) fn permission_denied(path: &Path, what: &str) -> StoreError {
    StoreError::Open {
        path: path.display().to_string(),
        reason: format!("permission denied: this user cannot {what} (check its owner and mode)"),
    }
}

/// Refuses, as a permissions problem, a data dir this user cannot reach (a directory above it
/// is not searchable), or, when it exists, cannot list and search (and write into, with
/// `write`, which also refuses a read-only file system). A missing path or one that is no
/// directory passes: callers say what that means.
pub(crate) fn check_access(path: &Path, write: bool) -> Result<(), StoreError> {
    use nix::unistd::{access, AccessFlags};
    match std::fs::metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => Err(permission_denied(
            path,
            "reach it (a directory above it is not searchable)",
        )),
        Ok(m) if m.is_dir() => {
            let mut need = AccessFlags::R_OK | AccessFlags::X_OK;
            if write {
                need |= AccessFlags::W_OK;
            }
            match access(path, need) {
                Err(nix::errno::Errno::EACCES) => Err(permission_denied(
                    path,
                    if write {
                        "list, search and write into it"
                    } else {
                        "list and search it"
                    },
                )),
                Err(nix::errno::Errno::EROFS) => Err(StoreError::Open {
                    path: path.display().to_string(),
                    reason: "it is on a read-only file system; nothing was changed".into(),
                }),
                _ => Ok(()),
            }
        }
        _ => Ok(()),
    }
}

/// The refusal of a dir that holds files but none RocksDB wrote.
pub(crate) fn not_a_data_dir(path: &Path) -> StoreError {
    StoreError::Open {
        path: path.display().to_string(),
        reason: "it holds no RocksDB files (no MANIFEST, table or log file), so it is \
                 not a gabp-relay data dir; nothing was changed"
            .into(),
    }
}

/// An exclusive `flock` on a data dir's `LOCK` file, held for as long as a relay (or collector)
/// records into the dir. RocksDB's own lock on that file (an fcntl lock, independent of this
/// one) is let go whenever the recorder reopens the database after an I/O error, and a full
/// disk can keep it closed for minutes; this one is not, so [`lock_holder`] finds the relay all
/// along: commands that change a data dir keep refusing it, and read commands keep showing its
/// sessions as recording, not as ended by a crash.
#[derive(Debug)]
pub(crate) struct DirHold {
    _file: std::fs::File,
}

impl DirHold {
    /// Takes the hold on the `LOCK` file of a data dir this process has just opened
    /// read-write; refused (as [`StoreError::Locked`]) while another process holds it.
    pub(crate) fn take(dir: &Path) -> Result<DirHold, StoreError> {
        let file = std::fs::File::open(dir.join("LOCK"))?;
        match file.try_lock() {
            Ok(()) => Ok(DirHold { _file: file }),
            Err(std::fs::TryLockError::WouldBlock) => Err(StoreError::Locked {
                path: dir.display().to_string(),
                pid: lock_holder(dir),
            }),
            Err(std::fs::TryLockError::Error(e)) => Err(e.into()),
        }
    }
}

/// The pid holding the data dir's `LOCK` file, from /proc/locks: RocksDB's fcntl lock, or a
/// recording relay's `DirHold`, which it keeps while RocksDB's lock is let go.
pub fn lock_holder(dir: &Path) -> Option<u32> {
    locks_on(dir).first().map(|&(_, pid)| pid)
}

/// The locks held on the data dir's `LOCK` file, as /proc/locks lists them: the kind
/// (`POSIX` for RocksDB's fcntl lock, `FLOCK` for a relay's hold) and the pid that took it.
/// A file is named there by device and inode: inode numbers alone repeat across file systems.
pub fn locks_on(dir: &Path) -> Vec<(String, u32)> {
    use nix::sys::stat::{major, minor};
    use std::os::unix::fs::MetadataExt;
    let (Ok(m), Ok(locks)) = (
        std::fs::metadata(dir.join("LOCK")),
        std::fs::read_to_string("/proc/locks"),
    ) else {
        return Vec::new();
    };
    // "1: POSIX  ADVISORY  WRITE 1234 08:01:5678 0 EOF" (major and minor in hex); a waiter's
    // line has "->" after the number, so no holder's fields line up with it.
    let id = format!("{:02x}:{:02x}:{}", major(m.dev()), minor(m.dev()), m.ino());
    locks
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            if f.get(5) != Some(&id.as_str()) {
                return None;
            }
            Some((f.get(1)?.to_string(), f.get(4)?.parse().ok()?))
        })
        .collect()
}

/// The effective uid of this process (the owner of /proc/self), if /proc is mounted.
fn effective_uid() -> Option<u32> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").ok().map(|m| m.uid())
}

/// Makes sure `path` is a data dir this process may record into: creates it 0700 when absent
/// and returns whether it is new (empty), so only then may RocksDB create a database in it.
pub(crate) fn prepare_writable_dir(path: &Path, allow_symlink: bool) -> Result<bool, StoreError> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let unsafe_dir = |reason: String| StoreError::Unsafe {
        path: path.display().to_string(),
        reason,
    };
    let link = match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            create_private_dir(path).map_err(|e| StoreError::Open {
                path: path.display().to_string(),
                reason: e.to_string(),
            })?;
            return Ok(true);
        }
        Err(e) => return Err(e.into()),
        Ok(m) => m,
    };
    if link.file_type().is_symlink() && !allow_symlink {
        return Err(unsafe_dir(
            "it is a symlink (pass --allow-symlinked-data-dir if that is intended)".into(),
        ));
    }
    let m = std::fs::metadata(path)?;
    if !m.is_dir() {
        return Err(unsafe_dir("it is not a directory".into()));
    }
    if let Some(uid) = effective_uid() {
        if m.uid() != uid {
            return Err(unsafe_dir(format!(
                "it is owned by uid {}, not by this user (uid {uid})",
                m.uid()
            )));
        }
    }
    if m.permissions().mode() & 0o022 != 0 {
        return Err(unsafe_dir(format!(
            "it is writable by group or others (mode {:o}; chmod 700 it)",
            m.permissions().mode() & 0o777
        )));
    }
    Ok(std::fs::read_dir(path)?.next().is_none())
}

/// Takes group and other permissions off `dir` and everything under it (owner bits kept:
/// dirs end 0700, RocksDB's files 0600), as the README promises for a data dir.
pub(crate) fn make_private(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let tighten = |p: &Path, m: &std::fs::Metadata| {
        let mode = m.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode & 0o700))
        } else {
            Ok(())
        }
    };
    tighten(dir, &std::fs::metadata(dir)?)?;
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        let ty = e.file_type()?;
        if ty.is_dir() {
            make_private(&e.path())?;
        } else if ty.is_file() {
            tighten(&e.path(), &e.metadata()?)?;
        }
    }
    Ok(())
}

fn create_private_dir(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    if !path.exists() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(path)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::holds_rocksdb_files;

    #[test]
    fn only_rocksdb_names_make_a_dir_look_like_a_data_dir() {
        let dir = tempfile::tempdir().expect("tempdir");
        for other in [
            "app.log",
            "error.log",
            "notes.sst",
            "x.blob",
            ".log",
            "LOGS",
            "current",
            "LOG",
            "LOCK",
            "LOG.old.1796425256960690",
            "IDENTITY",
            "OPTIONS-000001",
        ] {
            std::fs::write(dir.path().join(other), b"x").expect("write");
        }
        std::fs::write(dir.path().join("CURRENT"), b"MANIFEST-000016\n").expect("write");
        assert!(!holds_rocksdb_files(dir.path()).expect("read"));
        for ours in ["000012.log", "000009.sst", "7.blob", "MANIFEST-000016"] {
            let one = tempfile::tempdir().expect("tempdir");
            std::fs::write(one.path().join(ours), b"x").expect("write");
            assert!(holds_rocksdb_files(one.path()).expect("read"), "{ours}");
        }
    }
}
