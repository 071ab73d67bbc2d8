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

impl Filesystem for SlowFs {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        match self.child(parent, name).and_then(|p| self.remember(p)) {
            Ok(a) => reply.entry(&TTL, &a, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr) {
        let m = match fh.map(|fh| self.file(fh)) {
            Some(Ok(f)) => f.metadata().map_err(Errno::from),
            _ => self
                .path(ino)
                .and_then(|p| std::fs::symlink_metadata(p).map_err(Errno::from)),
        };
        match m {
            Ok(m) => reply.attr(&TTL, &self.attr(&m)),
            Err(e) => reply.error(e),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<TimeOrNow>,
        _mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let r = (|| -> Result<std::fs::Metadata, Errno> {
            let p = self.path(ino)?;
            if let Some(mode) = mode {
                std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode & 0o7777))
                    .map_err(Errno::from)?;
            }
            if let Some(size) = size {
                match fh.map(|fh| self.file(fh)) {
                    Some(Ok(f)) => f.set_len(size),
                    _ => OpenOptions::new()
                        .write(true)
                        .open(&p)
                        .and_then(|f| f.set_len(size)),
                }
                .map_err(Errno::from)?;
            }
            std::fs::symlink_metadata(&p).map_err(Errno::from)
        })();
        match r {
            Ok(m) => reply.attr(&TTL, &self.attr(&m)),
            Err(e) => reply.error(e),
        }
    }

    fn mkdir(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let r = self.child(parent, name).and_then(|p| {
            std::fs::DirBuilder::new()
                .mode(mode & !umask & 0o7777)
                .create(&p)
                .map_err(Errno::from)?;
            self.remember(p)
        });
        match r {
            Ok(a) => reply.entry(&TTL, &a, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        match self
            .child(parent, name)
            .and_then(|p| std::fs::remove_file(p).map_err(Errno::from))
        {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        match self
            .child(parent, name)
            .and_then(|p| std::fs::remove_dir(p).map_err(Errno::from))
        {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        if flags.bits() != 0 {
            reply.error(Errno::EINVAL);
            return;
        }
        let r = (|| -> Result<(), Errno> {
            let from = self.child(parent, name)?;
            let to = self.child(newparent, newname)?;
            std::fs::rename(&from, &to).map_err(Errno::from)?;
            // Every remembered path under the old name now lives under the new one.
            let mut paths = self.paths.lock().expect("paths");
            for p in paths.values_mut() {
                if *p == from {
                    p.clone_from(&to);
                } else if let Ok(rest) = p.strip_prefix(&from) {
                    *p = to.join(rest);
                }
            }
            Ok(())
        })();
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let r = self
            .path(ino)
            .and_then(|p| open_options(flags.0).open(p).map_err(Errno::from));
        match r {
            Ok(f) => reply.opened(self.keep(f), FopenFlags::empty()),
            Err(e) => reply.error(e),
        }
    }

    fn create(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let r = (|| -> Result<(FileAttr, File), Errno> {
            let p = self.child(parent, name)?;
            let mut o = open_options(flags);
            o.write(true).create(true).mode(mode & !umask & 0o7777);
            if flags & libc::O_EXCL != 0 {
                o.create_new(true);
            }
            if flags & libc::O_TRUNC != 0 {
                o.truncate(true);
            }
            let f = o.open(&p).map_err(Errno::from)?;
            Ok((self.remember(p)?, f))
        })();
        match r {
            Ok((a, f)) => {
                let fh = self.keep(f);
                reply.created(&TTL, &a, Generation(0), fh, FopenFlags::empty());
            }
            Err(e) => reply.error(e),
        }
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<fuser::LockOwner>,
        reply: ReplyData,
    ) {
        let r = self.file(fh).and_then(|f| {
            let mut buf = vec![0u8; size as usize];
            let mut got = 0;
            while got < buf.len() {
                match f.read_at(&mut buf[got..], offset + got as u64) {
                    Ok(0) => break,
                    Ok(n) => got += n,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(Errno::from(e)),
                }
            }
            buf.truncate(got);
            Ok(buf)
        });
        match r {
            Ok(b) => reply.data(&b),
            Err(e) => reply.error(e),
        }
    }

    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        flags: OpenFlags,
        _lock_owner: Option<fuser::LockOwner>,
        reply: ReplyWrite,
    ) {
        self.dev.write(data.len());
        let r = self.file(fh).and_then(|f| {
            if flags.0 & libc::O_APPEND != 0 {
                use std::io::Write;
                (&*f).write_all(data)
            } else {
                f.write_all_at(data, offset)
            }
            .map_err(Errno::from)
        });
        match r {
            Ok(()) => reply.written(data.len() as u32),
            Err(e) => reply.error(e),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: fuser::LockOwner,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<fuser::LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.files.lock().expect("files").remove(&fh.0);
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.dev.fsync();
        let r = self.file(fh).and_then(|f| {
            if datasync {
                f.sync_data()
            } else {
                f.sync_all()
            }
            .map_err(Errno::from)
        });
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let r = (|| -> Result<Vec<(u64, FileType, std::ffi::OsString)>, Errno> {
            let p = self.path(ino)?;
            let mut v = vec![
                (ino.0, FileType::Directory, ".".into()),
                (ino.0, FileType::Directory, "..".into()),
            ];
            for e in std::fs::read_dir(&p).map_err(Errno::from)? {
                let e = e.map_err(Errno::from)?;
                let m = e.metadata().map_err(Errno::from)?;
                let kind = FileType::from_std(m.file_type()).unwrap_or(FileType::RegularFile);
                v.push((self.ino_of(&m), kind, e.file_name()));
            }
            Ok(v)
        })();
        match r {
            Ok(v) => {
                for (i, (ino, kind, name)) in v.into_iter().enumerate().skip(offset as usize) {
                    if reply.add(INodeNo(ino), i as u64 + 1, kind, name) {
                        break;
                    }
                }
                reply.ok();
            }
            Err(e) => reply.error(e),
        }
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.dev.fsync();
        match self.path(ino).and_then(|p| {
            File::open(p)
                .and_then(|d| d.sync_all())
                .map_err(Errno::from)
        }) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: fuser::ReplyStatfs) {
        // Plenty of room: this disk is slow, not full.
        reply.statfs(1 << 24, 1 << 23, 1 << 23, 1 << 20, 1 << 19, 4096, 255, 4096);
    }

    fn access(&self, _req: &Request, _ino: INodeNo, _mask: fuser::AccessFlags, reply: ReplyEmpty) {
        reply.ok();
    }
}
