//! The committed mark: a file beside RocksDB's (`COMMITTED`) naming the sequence number of the
//! last write the recorder saw synced. RocksDB cannot tell a write-ahead log that is missing or
//! cut short from one that never held more (a log is named in the MANIFEST only once closed), so
//! a data dir whose log went would read as an older, smaller recording. With the mark, an open
//! that finds fewer writes than were committed refuses, and `repair` says what is gone.
//!
//! The mark only ever names writes already synced, so a torn last write (a crash mid-commit,
//! which RocksDB tolerates) is never below it. It is replaced atomically (written aside,
//! synced, renamed, the directory synced).

use std::io::Write;
use std::path::Path;

/// The mark's file name in the data dir.
pub const FILE: &str = "COMMITTED";

/// The committed sequence number, if the data dir has a mark (`Err` for an unreadable one).
pub fn read(dir: &Path) -> Result<Option<u64>, String> {
    match std::fs::read_to_string(dir.join(FILE)) {
        Ok(text) => text
            .trim()
            .parse()
            .map(Some)
            .map_err(|_| format!("its {FILE} mark is unreadable")),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!("its {FILE} mark cannot be read: {e}")),
    }
}

/// Replaces the mark with `seq`, durably.
pub fn write(dir: &Path, seq: u64) -> std::io::Result<()> {
    let aside = dir.join(format!("{FILE}.new"));
    let mut f = std::fs::File::create(&aside)?;
    writeln!(f, "{seq}")?;
    f.sync_all()?;
    drop(f);
    std::fs::rename(&aside, dir.join(FILE))?;
    std::fs::File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mark_reads_back_and_a_garbled_one_is_an_error() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert_eq!(read(dir.path()), Ok(None));
        write(dir.path(), 42).expect("write");
        write(dir.path(), 43).expect("replace");
        assert_eq!(read(dir.path()), Ok(Some(43)));
        assert!(!dir.path().join("COMMITTED.new").exists());
        std::fs::write(dir.path().join(FILE), "4x").expect("garble");
        assert!(read(dir.path()).is_err());
    }
}
