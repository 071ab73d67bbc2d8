//! A slow disk for tests: a FUSE passthrough file system (served by this test process on a few
//! threads) over a backing directory, where every write costs its bytes over a bandwidth and
//! every fsync a fixed latency, both on one simulated device shared by all callers, like a
//! single slow drive. The test changes the device's speed while it runs (`Device::set`).
//!
//! Only what the relay and RocksDB use is served: lookup, attributes, create/open/read/write,
//! truncate, mkdir, unlink, rmdir, rename, directory listing, fsync. File locks are left to the
//! kernel (no lock handlers), preallocation is refused (RocksDB then writes without it).

use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::{DirBuilderExt, FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, OpenFlags,
    RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry,
    ReplyOpen, ReplyWrite, Request, TimeOrNow, WriteFlags,
};

const TTL: Duration = Duration::from_secs(1);

/// The simulated drive: one queue, so concurrent writers share its bandwidth.
#[derive(Debug, Default)]
pub struct Device {
    /// Bytes per second written; 0 is unlimited.
    bandwidth: AtomicU64,
    /// Latency of one fsync, in microseconds.
    fsync_us: AtomicU64,
    /// When the drive is next idle.
    busy_until: Mutex<Option<Instant>>,
    /// Totals, for the test's report.
    pub written: AtomicU64,
    pub fsyncs: AtomicU64,
    pub delayed_us: AtomicU64,
}

impl Device {
    /// Sets the drive's speed from now on.
    pub fn set(&self, bytes_per_sec: u64, fsync: Duration) {
        self.bandwidth.store(bytes_per_sec, Ordering::SeqCst);
        self.fsync_us
            .store(fsync.as_micros() as u64, Ordering::SeqCst);
    }

    /// Queues `cost` on the drive and waits until the drive has served it.
    fn occupy(&self, cost: Duration) {
        if cost.is_zero() {
            return;
        }
        let done = {
            let mut busy = self.busy_until.lock().expect("device lock");
            let now = Instant::now();
            let start = busy.map_or(now, |b| b.max(now));
            let done = start + cost;
            *busy = Some(done);
            done
        };
        let wait = done.saturating_duration_since(Instant::now());
        self.delayed_us
            .fetch_add(wait.as_micros() as u64, Ordering::Relaxed);
        std::thread::sleep(wait);
    }

    fn write(&self, bytes: usize) {
        self.written.fetch_add(bytes as u64, Ordering::Relaxed);
        let bw = self.bandwidth.load(Ordering::SeqCst);
        if bw > 0 {
            self.occupy(Duration::from_secs_f64(bytes as f64 / bw as f64));
        }
    }

    fn fsync(&self) {
        self.fsyncs.fetch_add(1, Ordering::Relaxed);
        self.occupy(Duration::from_micros(self.fsync_us.load(Ordering::SeqCst)));
    }
}

/// The passthrough file system over `root`, slowed by `dev`.
pub struct SlowFs {
    root_ino: u64,
    dev: Arc<Device>,
    /// Inode (the backing file's, except the root's, which FUSE calls 1) to its backing path.
    paths: Mutex<HashMap<u64, PathBuf>>,
    files: Mutex<HashMap<u64, Arc<File>>>,
    next_fh: AtomicU64,
}

/// A mounted slow disk; unmounted (lazily) when dropped.
pub struct Mounted {
    pub dev: Arc<Device>,
    _session: fuser::BackgroundSession,
}

/// Mounts a slow passthrough of `backing` on `mountpoint`.
pub fn mount(backing: &Path, mountpoint: &Path) -> std::io::Result<Mounted> {
    detach_dead_mounts();
    let dev = Arc::new(Device::default());
    let root_ino = std::fs::metadata(backing)?.ino();
    let fs = SlowFs {
        root_ino,
        dev: dev.clone(),
        paths: Mutex::new(HashMap::from([(1, backing.to_path_buf())])),
        files: Mutex::new(HashMap::new()),
        next_fh: AtomicU64::new(1),
    };
    let mut cfg = fuser::Config::default();
    cfg.mount_options = vec![
        fuser::MountOption::FSName("gabp-slowfs".into()),
        fuser::MountOption::RW,
    ];
    cfg.n_threads = Some(4);
    let session = fuser::spawn_mount(fs, mountpoint, &cfg)?;
    Ok(Mounted {
        dev,
        _session: session,
    })
}

/// Detaches the slow disks whose serving process is gone (a test run killed before its
/// mounts were dropped leaves them, and each answers only "not connected" from then on). A
/// live one, another test's in this run, answers and is left alone.
fn detach_dead_mounts() {
    let Ok(table) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return;
    };
    for line in table.lines() {
        // `ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS [TAGS] - TYPE SOURCE SUPER-OPTIONS`
        let Some((head, tail)) = line.split_once(" - ") else {
            continue;
        };
        if tail.split(' ').nth(1) != Some("gabp-slowfs") {
            continue;
        }
        let Some(point) = head.split(' ').nth(4) else {
            continue;
        };
        let dead =
            std::fs::metadata(point).is_err_and(|e| e.raw_os_error() == Some(libc::ENOTCONN));
        if dead {
            let _ = std::process::Command::new("umount")
                .args(["-l", point])
                .status();
            let _ = std::fs::remove_dir(point);
        }
    }
}

fn ts(secs: i64, nsecs: i64) -> SystemTime {
    if secs >= 0 {
        UNIX_EPOCH + Duration::new(secs as u64, nsecs as u32)
    } else {
        UNIX_EPOCH
    }
}

impl SlowFs {
    fn ino_of(&self, m: &std::fs::Metadata) -> u64 {
        if m.ino() == self.root_ino {
            1
        } else {
            m.ino()
        }
    }

    fn attr(&self, m: &std::fs::Metadata) -> FileAttr {
        FileAttr {
            ino: INodeNo(self.ino_of(m)),
            size: m.size(),
            blocks: m.blocks(),
            atime: ts(m.atime(), m.atime_nsec()),
            mtime: ts(m.mtime(), m.mtime_nsec()),
            ctime: ts(m.ctime(), m.ctime_nsec()),
            crtime: UNIX_EPOCH,
            kind: FileType::from_std(m.file_type()).unwrap_or(FileType::RegularFile),
            perm: (m.mode() & 0o7777) as u16,
            nlink: m.nlink() as u32,
            uid: m.uid(),
            gid: m.gid(),
            rdev: m.rdev() as u32,
            blksize: 4096,
            flags: 0,
        }
    }

    fn path(&self, ino: INodeNo) -> Result<PathBuf, Errno> {
        self.paths
            .lock()
            .expect("paths")
            .get(&ino.0)
            .cloned()
            .ok_or(Errno::ENOENT)
    }

    fn child(&self, parent: INodeNo, name: &OsStr) -> Result<PathBuf, Errno> {
        Ok(self.path(parent)?.join(name))
    }

    /// Stats `p` and remembers its inode's path.
    fn remember(&self, p: PathBuf) -> Result<FileAttr, Errno> {
        let m = std::fs::symlink_metadata(&p).map_err(Errno::from)?;
        let attr = self.attr(&m);
        self.paths.lock().expect("paths").insert(attr.ino.0, p);
        Ok(attr)
    }

    fn file(&self, fh: FileHandle) -> Result<Arc<File>, Errno> {
        self.files
            .lock()
            .expect("files")
            .get(&fh.0)
            .cloned()
            .ok_or(Errno::EBADF)
    }

    fn keep(&self, f: File) -> FileHandle {
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        self.files.lock().expect("files").insert(fh, Arc::new(f));
        FileHandle(fh)
    }
}

fn open_options(flags: i32) -> OpenOptions {
    let mut o = OpenOptions::new();
    match flags & libc::O_ACCMODE {
        libc::O_WRONLY => o.write(true),
        libc::O_RDWR => o.read(true).write(true),
        _ => o.read(true),
    };
    if flags & libc::O_APPEND != 0 {
        o.append(true);
    }
    // Creation and truncation arrive as their own requests; pass the remaining flags on.
    o.custom_flags(flags & !(libc::O_ACCMODE | libc::O_CREAT | libc::O_EXCL | libc::O_TRUNC));
    o
}

mod ops;
