//! `gabp-relay repair`: the one path that lets RocksDB salvage a damaged data dir, and only
//! after a full copy of it has been made, so nothing it discards is lost for good.
//!
//! In order, keeping as much as can be read: a missing `CURRENT` is rewritten to name the newest
//! manifest; then a read-write open replays the write-ahead logs skipping unreadable records,
//! or else stopping at the first one; only if both fail (a corrupt manifest, a lost table) does RocksDB's own RepairDB
//! rebuild the manifest from the table files (it cannot map log records of column families it
//! finds no table for, so it comes last).

use std::path::{Path, PathBuf};

use crate::dir::{lock_holder, make_private};
use crate::error::StoreError;
use crate::store::{Store, StoreOptions};
use crate::SessionId;

/// What a repair did.
#[derive(Debug, Clone)]
pub struct RepairReport {
    /// Where the untouched copy of the data dir was kept.
    pub backup: PathBuf,
    /// Files and bytes in the data dir before.
    pub before: (usize, u64),
    /// Files and bytes in the data dir after.
    pub after: (usize, u64),
    /// Sessions in the catalog after the repair.
    pub sessions: usize,
    /// Sessions a dead relay left `recording`, now marked ended by crash.
    pub crashed: Vec<SessionId>,
    /// What was done, one short line each.
    pub steps: Vec<String>,
    /// What the repair could not bring back (files RocksDB moved to `lost/`, sessions that
    /// still fail their check); empty only when every session checks sound.
    pub lost: Vec<String>,
}

/// Every file under `dir` (recursively), relative to it, with its size; empty if no such dir.
fn files_under(dir: &Path) -> Vec<(PathBuf, u64)> {
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in rd.flatten() {
        let Ok(m) = e.metadata() else { continue };
        if m.is_dir() {
            for (f, n) in files_under(&e.path()) {
                out.push((PathBuf::from(e.file_name()).join(f), n));
            }
        } else {
            out.push((PathBuf::from(e.file_name()), m.len()));
        }
    }
    out
}

fn usage(dir: &Path) -> std::io::Result<(usize, u64)> {
    let mut n = (0, 0);
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        let m = e.metadata()?;
        if m.is_dir() {
            let (f, b) = usage(&e.path())?;
            n = (n.0 + f, n.1 + b);
        } else {
            n = (n.0 + 1, n.1 + m.len());
        }
    }
    Ok(n)
}

fn copy_dir(from: &Path, to: &Path, copied: &mut dyn FnMut(u64)) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new().mode(0o700).create(to)?;
    for e in std::fs::read_dir(from)? {
        let e = e?;
        let ty = e.file_type()?;
        let dest = to.join(e.file_name());
        if ty.is_dir() {
            copy_dir(&e.path(), &dest, copied)?;
        } else if ty.is_file() {
            let n = std::fs::copy(e.path(), &dest)?;
            std::fs::File::open(&dest)?.sync_all()?;
            copied(n);
        }
    }
    std::fs::File::open(to)?.sync_all()
}

/// Copies `path` aside to `<path>.bak-<unix seconds>`, then lets RocksDB repair it (rebuilding
/// the manifest from the table files and turning write-ahead logs into tables), then opens it
/// as the relay would, marking sessions of a dead relay as ended by crash.
pub fn repair(path: &Path) -> Result<RepairReport, StoreError> {
    repair_with(path, &mut |_| {})
}

/// How far a repair has got, for a command's progress.
#[derive(Debug, Clone, Copy)]
pub enum RepairProgress {
    /// Copying the data dir aside: bytes copied of all.
    Copying {
        /// Copied so far.
        bytes: u64,
        /// The data dir's size.
        of: u64,
    },
    /// Checking the repaired sessions: frames read of all the catalog lists.
    Checking {
        /// Read so far.
        frames: u64,
        /// Every session's frames.
        of: u64,
    },
}

/// [`repair`], telling `progress` how far it has got (a file copied, 4,096 frames checked).
pub fn repair_with(
    path: &Path,
    progress: &mut dyn FnMut(RepairProgress),
) -> Result<RepairReport, StoreError> {
    let p = path.display().to_string();
    crate::dir::check_access(path, true)?;
    if !path.is_dir() {
        return Err(StoreError::NoDataDir(p));
    }
    if path.join("LOCK").exists() {
        if let Some(pid) = lock_holder(path) {
            return Err(StoreError::Locked {
                path: p,
                pid: Some(pid),
            });
        }
    }
    if !crate::dir::holds_rocksdb_files(path)? {
        // An empty or mistyped dir: "repairing" it would create a fresh, empty database and a
        // backup of nothing, and report success.
        return Err(crate::dir::not_a_data_dir(path));
    }
    let before = usage(path)?;
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default();
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "gabp-data".into());
    // Two repairs within one second each keep their own copy: `-2`, `-3`, … after the first.
    let backup = (1..)
        .map(|n| match n {
            1 => path.with_file_name(format!("{name}.bak-{secs}")),
            n => path.with_file_name(format!("{name}.bak-{secs}-{n}")),
        })
        .find(|b| !b.exists())
        .expect("an unused backup name");
    let mut bytes = 0;
    let mut copied = |n: u64| {
        bytes += n;
        progress(RepairProgress::Copying {
            bytes,
            of: before.1,
        });
    };
    if let Err(e) = copy_dir(path, &backup, &mut copied) {
        // Only our own partial copy is removed; the data dir is untouched.
        let _ = std::fs::remove_dir_all(&backup);
        return Err(StoreError::Open {
            path: p,
            reason: format!(
                "cannot keep a copy at {} ({e}); nothing repaired",
                backup.display()
            ),
        });
    }
    // Any failure from here on names the path and the copy (a read-only dir, say, fails
    // only after the copy was made).
    let (with_copy, p2) = (backup.clone(), p.clone());
    let result = (|| -> Result<RepairReport, StoreError> {
        let lost_before = files_under(&path.join("lost"));
        let mut steps = Vec::new();
        if !path.join("CURRENT").exists() {
            let newest = std::fs::read_dir(path)?
                .filter_map(|e| e.ok()?.file_name().into_string().ok())
                .filter_map(|n| Some((n.strip_prefix("MANIFEST-")?.parse::<u64>().ok()?, n)))
                .max();
            if let Some((_, name)) = newest {
                std::fs::write(path.join("CURRENT"), format!("{name}\n"))?;
                steps.push(format!("rewrote CURRENT to name {name}"));
            }
        }
        let mut opened = None;
        let mut salvaged = false;
        // First as a relay opens it (only a torn last record is tolerated): if that works, no
        // write-ahead log record needs skipping.
        match Store::open(path, StoreOptions::default()) {
            Ok(s) => {
                steps.push("it opens as it is: no write-ahead log record had to be skipped".into());
                opened = Some(s);
            }
            Err(e) => steps.push(format!("it does not open as it is: {}", e.detail())),
        }
        for (mode, what) in [
            (
                rocksdb::DBRecoveryMode::SkipAnyCorruptedRecord,
                "replayed the write-ahead logs, skipping records that could not be read",
            ),
            (
                rocksdb::DBRecoveryMode::PointInTime,
                "replayed the write-ahead logs up to the first record that could not be read",
            ),
        ] {
            if opened.is_some() {
                break;
            }
            match Store::open_salvaging(path, mode) {
                Ok(s) => {
                    steps.push(what.to_string());
                    salvaged = true;
                    opened = Some(s);
                    break;
                }
                // The reason only: the error's own advice ("run repair") makes no sense here.
                Err(e) => steps.push(format!("could not open it that way: {}", e.detail())),
            }
        }
        let mut lost = Vec::new();
        let store = match opened {
            Some(s) => s,
            None => {
                steps.push(
                    "rebuilt it with RocksDB's repair (manifest from the table files)".into(),
                );
                let mut o = rocksdb::Options::default();
                o.create_missing_column_families(true);
                rocksdb::DB::repair(&o, path).map_err(|e| StoreError::Open {
                    path: p.clone(),
                    reason: format!("repair failed ({e}); the copy is at {}", backup.display()),
                })?;
                Store::reopen(path, StoreOptions::default()).map_err(|e| StoreError::Open {
                    path: p.clone(),
                    reason: format!(
                        "still unreadable after RocksDB's repair ({}); the untouched copy is at {}",
                        e.detail(),
                        backup.display()
                    ),
                })?
            }
        };
        if salvaged {
            // What the salvaging open replayed is only in memory, and the damaged log is still
            // live: an ordinary open would stop at its bad record again and find fewer writes
            // than the mark below. Written out as tables, the old log is obsolete.
            store.flush_tables()?;
        }
        // A log that went missing or was cut short reads as less: say what was committed and is
        // gone, then mark what is here, so the repaired dir opens.
        if let (Some(committed), held) = store.committed_and_held() {
            if committed > held {
                lost.push(format!(
                    "{} committed write(s) are missing: the write-ahead log is gone or shorter than what was synced (what they held is only in the copy, if there)",
                    committed - held
                ));
            }
        }
        store.mark_committed()?;
        let crashed = store.recover_crashed()?;
        let metas = store.sessions()?;
        let sessions = metas.len();
        // Verify, never assume: what RocksDB set aside, and every session's own check.
        if salvaged {
            // What the unreadable records held (and, cut at the first, all after it) is gone here.
            lost.push(
                "write-ahead log records that could not be read were dropped (what they held is only in the copy)"
                    .to_string(),
            );
        }
        let moved: Vec<(PathBuf, u64)> = files_under(&path.join("lost"))
            .into_iter()
            .filter(|f| !lost_before.contains(f))
            .collect();
        if !moved.is_empty() {
            let bytes: u64 = moved.iter().map(|f| f.1).sum();
            let names: Vec<String> = moved.iter().map(|f| f.0.display().to_string()).collect();
            lost.push(format!(
                "{} file(s) RocksDB could not use ({bytes} bytes: {}) were moved to lost/",
                moved.len(),
                names.join(", ")
            ));
        }
        let of = metas.iter().map(|m| m.frames).sum();
        let mut checked = 0;
        for m in &metas {
            let r = store.check_session_with(m.id, &mut |n| {
                progress(RepairProgress::Checking {
                    frames: checked + n,
                    of,
                })
            })?;
            checked += m.frames;
            if !r.ok() {
                lost.push(format!(
                    "session {} is not sound ({} frames readable; {})",
                    m.id,
                    r.frames,
                    r.problems.first().map(String::as_str).unwrap_or_default()
                ));
            }
        }
        drop(store);
        // The mark must name what the next ordinary open finds, whichever way this one opened.
        let unseen = Store::remark_as_read(path)?;
        if unseen > 0 {
            lost.push(format!(
                "{unseen} write(s) replayed by the repair are not found by an ordinary open of the repaired dir (they are in the copy)"
            ));
        }
        // RocksDB's repair creates `lost/` and new files with the process's default modes.
        make_private(path)?;
        Ok(RepairReport {
            backup,
            before,
            after: usage(path)?,
            sessions,
            crashed,
            steps,
            lost,
        })
    })();
    result.map_err(|e| {
        let copy = with_copy.display().to_string();
        match e {
            StoreError::Open { path, reason } if reason.contains(&copy) => {
                StoreError::Open { path, reason }
            }
            StoreError::Open { reason, .. } => StoreError::Open {
                path: p2,
                reason: format!("{reason}; the untouched copy is at {copy}"),
            },
            e => StoreError::Open {
                path: p2,
                reason: format!("{}; the untouched copy is at {copy}", e.detail()),
            },
        }
    })
}
