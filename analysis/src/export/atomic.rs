//! How an output file or directory appears: whole or not at all, and nothing left behind by a
//! run that was interrupted, however it died.
//!
//! A file is written unnamed (`O_TMPFILE`) in the target's directory and given a name only once
//! complete, so a run killed mid-write (SIGKILL runs no cleanup) leaves nothing: the kernel
//! frees an unnamed file with its last descriptor. Where the file system cannot make unnamed
//! files, and for directories (a Parquet export), the work file or dir is hidden and named
//! after the process (`.gabp-output-<pid>-…`); the next export into the same directory removes
//! those whose process is gone.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// Prefix of a single-file output's hidden work file.
const OUTPUT_PREFIX: &str = ".gabp-output-";

/// Writes into a private temporary file beside `path`, renamed over it only once `write`
/// succeeded: a failed export never truncates `path`, and a symlink there to a file is
/// replaced, never followed. A FIFO, device or socket at `path` (a named pipe, `/dev/null`),
/// or a symlink to one (`/dev/stdout`), is written into, never replaced by a file. `-` is
/// standard output.
pub fn write_atomically<T, E: From<std::io::Error>>(
    path: &Path,
    write: impl FnOnce(&mut File) -> Result<T, E>,
) -> Result<T, E> {
    if super::is_stdout(path) {
        use std::os::fd::AsFd;
        // A second descriptor of stdout: same file position and flags (`>>` still appends).
        let fd = std::io::stdout().as_fd().try_clone_to_owned()?;
        return write(&mut File::from(fd));
    }
    // Through `/proc` (`/dev/stdout`, `/dev/fd/N`, a link or a linked dir leading there) only
    // this process's own standard output or error is written, found by what it is, not by how
    // the path spells it: any other descriptor is the recording being read, the runtime's own,
    // or a caller's, and nothing else in `/proc` takes an output.
    match through_proc(path) {
        Proc::No => {}
        Proc::Stream(mut own) => return write(&mut own),
        Proc::Refused(why) => {
            return Err(std::io::Error::new(std::io::ErrorKind::PermissionDenied, why).into())
        }
    }
    // Everything below happens in one directory, opened once and then named through its
    // descriptor: a link on the way to it swapped meanwhile (`dirl/out`, `dirl` moving between
    // two dirs) cannot make the check land in one directory and the write in another.
    let dir = PinnedDir::of_output(path)?;
    let base = dir.base();
    let target = dir.target(path, "file")?;
    if let Some(mut stream) = open_stream(&target, path)? {
        return write(&mut stream);
    }
    if is_link_to_a_directory(&target) {
        // The rename below would replace the link, not the directory it leads to.
        return Err(std::io::Error::new(
            std::io::ErrorKind::IsADirectory,
            format!("{} is a symbolic link to a directory", path.display()),
        )
        .into());
    }
    match unnamed_file(base) {
        Some(mut f) => {
            let out = write(&mut f)?;
            f.sync_all()?;
            give_name(&f, base, &target)?;
            Ok(out)
        }
        None => {
            sweep_leftovers(base, OUTPUT_PREFIX, false);
            let mut tmp = tempfile::Builder::new()
                .prefix(&work_prefix(OUTPUT_PREFIX))
                .tempfile_in(base)?;
            let out = write(tmp.as_file_mut())?;
            tmp.as_file().sync_all()?;
            tmp.persist(&target).map_err(|e| e.error)?;
            Ok(out)
        }
    }
}

/// The directory an output goes into, opened once (`O_PATH`) and from then on named through its
/// descriptor (`/proc/self/fd/N`), so that every step of an output (the checks, the work file
/// or dir, the final rename) happens in the one directory it was opened as, whatever links on
/// the way to it are swapped meanwhile.
pub(super) struct PinnedDir {
    _fd: File,
    base: PathBuf,
}

impl PinnedDir {
    /// Pins the directory the output at `path` goes into; refuses one that really is in
    /// `/proc` (nothing there takes an output) and names a missing one.
    pub(super) fn of_output(path: &Path) -> std::io::Result<Self> {
        let dir = output_dir(path)?;
        let fd = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_PATH | libc::O_DIRECTORY)
            .open(dir)
            .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", dir.display())))?;
        let base = PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()));
        if std::fs::read_link(&base).is_ok_and(|real| real.starts_with("/proc")) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::PermissionDenied,
                format!(
                    "{} lies in /proc, which takes no output: refused",
                    path.display()
                ),
            ));
        }
        Ok(Self { _fd: fd, base })
    }

    /// The pinned directory, as a path that stays valid while `self` lives.
    pub(super) fn base(&self) -> &Path {
        &self.base
    }

    /// The output's own name inside the pinned directory; `what` (file, directory) is for the
    /// error when `path` names none (`.`, `..`).
    pub(super) fn target(&self, path: &Path, what: &str) -> std::io::Result<PathBuf> {
        let name = path.file_name().ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("{} names no {what}", path.display()),
            )
        })?;
        Ok(self.base.join(name))
    }
}

/// Whether `path` is a symbolic link that leads to a directory, also when written with a
/// trailing slash (`link/`, which the system would follow to the directory itself): an output
/// there would replace the link, not the directory it names.
pub fn is_link_to_a_directory(path: &Path) -> bool {
    let named: PathBuf = path.components().collect();
    std::fs::symlink_metadata(&named).is_ok_and(|m| m.is_symlink())
        && std::fs::metadata(&named).is_ok_and(|m| m.is_dir())
}

/// The directory `path` is in (`.` for a bare name).
fn parent_of(path: &Path) -> &Path {
    match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    }
}

/// The directory an output at `path` goes into, or an error naming it when there is none.
fn output_dir(path: &Path) -> std::io::Result<&Path> {
    let dir = parent_of(path);
    match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => Ok(dir),
        Ok(_) => Err(std::io::Error::new(
            std::io::ErrorKind::NotADirectory,
            format!("{} is not a directory", dir.display()),
        )),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(std::io::Error::new(
            std::io::ErrorKind::NotFound,
            format!("the directory {} does not exist", dir.display()),
        )),
        Err(e) => Err(e),
    }
}

/// The stream (a named pipe, a device such as `/dev/null`) at `path` or behind links there,
/// opened for writing; `None` when `path` is anything else (a file or link to be replaced, a
/// new name). Decided on the object the path opens, not on what it named a moment before: the
/// path is opened once without access (`O_PATH`, which opens no device), that very object is
/// checked, and it is then reopened through its descriptor, so a link swapped meanwhile
/// changes nothing. A pipe or socket with no name of its own (another process's descriptor,
/// seen through `/proc`) is refused unless it is this process's standard output or error.
/// `shown` is the path as the user gave it, for the error.
fn open_stream(path: &Path, shown: &Path) -> std::io::Result<Option<File>> {
    let Ok(pinned) = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH)
        .open(path)
    else {
        return Ok(None);
    };
    let md = pinned.metadata()?;
    let t = md.file_type();
    if !(t.is_fifo() || t.is_char_device() || t.is_socket()) {
        return Ok(None);
    }
    if let Some(own) = own_stream(&md) {
        return Ok(Some(own));
    }
    let pinned_at = PathBuf::from(format!("/proc/self/fd/{}", pinned.as_raw_fd()));
    let named = std::fs::read_link(&pinned_at)
        .is_ok_and(|real| real.is_absolute() && !real.starts_with("/proc"));
    if !named {
        return Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            format!(
                "{} leads to a pipe or socket with no name of its own, not this process's standard output or error: refused",
                shown.display()
            ),
        ));
    }
    std::fs::OpenOptions::new()
        .write(true)
        .open(&pinned_at)
        .map(Some)
}

/// A second descriptor of this process's standard output or error, if `to` is the same
/// object (device and inode): what it is, whatever path led there.
fn own_stream(to: &std::fs::Metadata) -> Option<File> {
    use std::os::fd::AsFd;
    use std::os::unix::fs::MetadataExt;
    let (stdout, stderr) = (std::io::stdout(), std::io::stderr());
    let found = [stdout.as_fd(), stderr.as_fd()].into_iter().find_map(|fd| {
        let own = File::from(fd.try_clone_to_owned().ok()?);
        let m = own.metadata().ok()?;
        ((m.dev(), m.ino()) == (to.dev(), to.ino())).then_some(own)
    });
    found
}

/// Where an output path leads when it passes through `/proc`.
enum Proc {
    /// Nowhere in `/proc`: an ordinary path.
    No,
    /// This process's standard output or error (a second descriptor of it).
    Stream(File),
    /// Somewhere in `/proc` that takes no output; why, said with the path.
    Refused(String),
}

/// Whether `path`, or a link on the way from it, lies in `/proc` (by where its directory
/// really is, so relative links and linked dirs count), and if so whether what it leads to is
/// this process's standard output or error (by device and inode).
fn through_proc(path: &Path) -> Proc {
    let in_proc =
        |p: &Path| std::fs::canonicalize(parent_of(p)).is_ok_and(|d| d.starts_with("/proc"));
    let mut at = path.to_path_buf();
    // As many links as the kernel follows (`ELOOP` past that: the open says so later).
    for _ in 0..=40 {
        if in_proc(&at) {
            let refused = |what: &str| Proc::Refused(format!("{} {what}: refused", path.display()));
            let Ok(to) = std::fs::metadata(path) else {
                return refused("lies in /proc, which takes no output");
            };
            return match own_stream(&to) {
                Some(own) => Proc::Stream(own),
                None => refused(
                    "leads to a descriptor that is not this process's standard output or error",
                ),
            };
        }
        match std::fs::read_link(&at) {
            Ok(next) if next.is_absolute() => at = next,
            Ok(next) => at = parent_of(&at).join(next),
            Err(_) => return Proc::No,
        }
    }
    Proc::No
}

/// A private file in `dir` with no name, or `None` where the file system makes none.
fn unnamed_file(dir: &Path) -> Option<File> {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .mode(0o600)
        .custom_flags(libc::O_TMPFILE)
        .open(dir)
        .ok()
}

/// Links the complete unnamed file `f` into `dir` under a hidden name, then renames that over
/// `path` (a link cannot replace an existing file; the rename does, atomically).
fn give_name(f: &File, dir: &Path, path: &Path) -> std::io::Result<()> {
    let fd_path = PathBuf::from(format!("/proc/self/fd/{}", f.as_raw_fd()));
    let prefix = work_prefix(OUTPUT_PREFIX);
    for _ in 0..16 {
        let named = dir.join(format!("{prefix}{}", uuid::Uuid::new_v4().simple()));
        match nix::unistd::linkat(
            nix::fcntl::AT_FDCWD,
            &fd_path,
            nix::fcntl::AT_FDCWD,
            &named,
            nix::fcntl::AtFlags::AT_SYMLINK_FOLLOW,
        ) {
            Ok(()) => {
                return std::fs::rename(&named, path).inspect_err(|_| {
                    let _ = std::fs::remove_file(&named);
                });
            }
            Err(nix::errno::Errno::EEXIST) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Err(std::io::Error::new(
        std::io::ErrorKind::AlreadyExists,
        "no free name for the output's work file",
    ))
}

/// The file inside a work dir that says this program made it: the sweep removes no dir
/// without it, however its name looks.
const WORK_MARK: &str = ".gabp-work-dir";

/// A hidden work dir in `parent`, named after this process and marked as ours (0700).
pub(super) fn work_dir(parent: &Path, prefix: &str) -> std::io::Result<tempfile::TempDir> {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::Builder::new()
        .prefix(&work_prefix(prefix))
        .permissions(std::fs::Permissions::from_mode(0o700))
        .tempdir_in(parent)?;
    File::create(dir.path().join(WORK_MARK))?;
    Ok(dir)
}

/// Takes the mark off a work dir about to become an output.
pub(super) fn unmark(dir: &Path) -> std::io::Result<()> {
    std::fs::remove_file(dir.join(WORK_MARK))
}

/// `prefix` followed by this process's id: what [`sweep_leftovers`] reads back.
pub(super) fn work_prefix(prefix: &str) -> String {
    format!("{prefix}{}-", std::process::id())
}

/// Removes the work files (or, with `dirs`, directories) named `prefix<pid>-XXXXXX` in `dir`
/// whose process is gone: what an export killed mid-write left. Best effort, silent: it never
/// touches a live process's work, a symlink, the other kind, nor any name of another shape
/// (the suffix is exactly the six letters and digits `tempfile` makes).
pub(super) fn sweep_leftovers(dir: &Path, prefix: &str, dirs: bool) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix(prefix))
            .and_then(|rest| rest.split_once('-'))
            .filter(|(_, suffix)| {
                suffix.len() == 6 && suffix.bytes().all(|b| b.is_ascii_alphanumeric())
            })
            .and_then(|(pid, _)| pid.parse::<i32>().ok())
            .filter(|&pid| pid > 0)
        else {
            continue;
        };
        // Ours, not a look-alike: a dir is private, this user's and carries our mark; a file
        // is private and this user's (the unnamed-file fallback makes it so). Another user's
        // look-alike in a shared dir (`/tmp`) is never removed.
        let ours = e.file_type().is_ok_and(|t| {
            use std::os::unix::fs::MetadataExt;
            if t.is_symlink() {
                false
            } else if dirs {
                t.is_dir()
                    && e.metadata().is_ok_and(|m| {
                        m.mode() & 0o777 == 0o700 && m.uid() == nix::unistd::geteuid().as_raw()
                    })
                    && std::fs::symlink_metadata(e.path().join(WORK_MARK))
                        .is_ok_and(|m| m.is_file())
            } else {
                t.is_file()
                    && e.metadata().is_ok_and(|m| {
                        m.mode() & 0o777 == 0o600 && m.uid() == nix::unistd::geteuid().as_raw()
                    })
            }
        });
        if !ours {
            continue;
        }
        let gone = matches!(
            nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None),
            Err(nix::errno::Errno::ESRCH)
        );
        if !gone {
            continue;
        }
        let p = e.path();
        let _ = if dirs {
            std::fs::remove_dir_all(&p)
        } else {
            std::fs::remove_file(&p)
        };
    }
}

#[cfg(test)]
pub(super) mod tests {
    use std::io::{Read, Write};
    use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};

    use super::{sweep_leftovers, work_prefix, write_atomically};

    fn names(dir: &std::path::Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .expect("ls")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    /// A named pipe in `dir` and a thread reading it to the end.
    fn pipe_with_reader(
        dir: &std::path::Path,
    ) -> (std::path::PathBuf, std::thread::JoinHandle<String>) {
        let fifo = dir.join("pipe");
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .expect("mkfifo runs");
        assert!(made.success());
        let reader = {
            let fifo = fifo.clone();
            std::thread::spawn(move || {
                let mut got = String::new();
                std::fs::File::open(fifo)
                    .expect("open to read")
                    .read_to_string(&mut got)
                    .expect("read");
                got
            })
        };
        (fifo, reader)
    }

    /// A named pipe at the output path is written into and stays a pipe (a root user's
    /// `-o /dev/null` must never replace the device with a file); a file is still replaced
    /// whole.
    #[test]
    fn a_fifo_is_written_into_and_a_file_replaced() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (fifo, reader) = pipe_with_reader(dir.path());
        write_atomically(&fifo, |f| -> Result<(), std::io::Error> {
            f.write_all(b"through the pipe")
        })
        .expect("written");
        assert_eq!(reader.join().expect("reader"), "through the pipe");
        let t = std::fs::symlink_metadata(&fifo)
            .expect("still there")
            .file_type();
        assert!(t.is_fifo(), "the pipe was replaced by {t:?}");

        let file = dir.path().join("out.txt");
        std::fs::write(&file, "old").expect("write");
        write_atomically(&file, |f| -> Result<(), std::io::Error> {
            f.write_all(b"new")
        })
        .expect("written");
        assert_eq!(std::fs::read_to_string(&file).expect("read"), "new");
    }

    /// While an output is being written nothing of it has a name in the directory (a run
    /// killed then leaves nothing), and once done only the output is there, private.
    #[test]
    fn an_output_being_written_has_no_name_until_it_is_complete() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("other"), "x").expect("write");
        let out = dir.path().join("out.jsonl");
        let seen = write_atomically(&out, |f| -> Result<Vec<String>, std::io::Error> {
            f.write_all(b"a line\n")?;
            Ok(names(dir.path()))
        })
        .expect("written");
        assert_eq!(seen, ["other"], "a work file had a name while writing");
        assert_eq!(names(dir.path()), ["other", "out.jsonl"]);
        assert_eq!(std::fs::read_to_string(&out).expect("read"), "a line\n");
        let mode = std::fs::metadata(&out).expect("meta").permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    /// A failed write leaves neither the output nor anything else.
    #[test]
    fn a_failed_output_leaves_nothing() {
        let dir = tempfile::tempdir().expect("tempdir");
        let out = dir.path().join("out.jsonl");
        let r = write_atomically(&out, |f| -> Result<(), std::io::Error> {
            f.write_all(b"half")?;
            Err(std::io::Error::other("stopped"))
        });
        assert!(r.is_err());
        assert!(names(dir.path()).is_empty(), "{:?}", names(dir.path()));
    }

    #[test]
    fn an_output_in_a_missing_directory_names_the_directory_not_a_work_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let out = dir.path().join("nowhere").join("r.html");
        let e = write_atomically(&out, |_| -> Result<(), std::io::Error> { Ok(()) })
            .expect_err("refused");
        let msg = e.to_string();
        assert!(
            msg.contains("nowhere") && msg.contains("does not exist"),
            "{msg}"
        );
        assert!(!msg.contains(".gabp-"), "{msg}");
    }

    /// What a killed export left (its process gone) is removed; a live process's work, names
    /// of any other shape (a user's own `.gabp-output-<pid>-mine`), the other kind of entry and
    /// symlinks are not.
    #[test]
    fn leftovers_of_gone_processes_are_swept_and_nothing_else() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut child = std::process::Command::new("true").spawn().expect("spawn");
        let dead = child.id();
        child.wait().expect("reaped");
        let p = ".gabp-output-";
        let gone_file = format!("{p}{dead}-aB3xY9");
        let gone_as_dir = format!("{p}{dead}-dEf456");
        let live = format!("{}xYz789", work_prefix(p));
        let users = format!("{p}{dead}-mine");
        use std::os::unix::fs::PermissionsExt;
        let chmod = |n: &str, mode: u32| {
            std::fs::set_permissions(dir.path().join(n), std::fs::Permissions::from_mode(mode))
                .expect("chmod")
        };
        for n in [
            &gone_file,
            &live,
            &users,
            &format!("{p}abc"),
            &"keep.txt".to_string(),
        ] {
            std::fs::write(dir.path().join(n), "x").expect("write");
            chmod(n, 0o600);
        }
        // The same shape, but readable by others: not a work file of ours.
        let shared = format!("{p}{dead}-sHrd01");
        std::fs::write(dir.path().join(&shared), "x").expect("write");
        chmod(&shared, 0o644);
        std::fs::create_dir_all(dir.path().join(&gone_as_dir).join("inner")).expect("mkdir");
        std::fs::write(dir.path().join(&gone_as_dir).join(super::WORK_MARK), "").expect("mark");
        chmod(&gone_as_dir, 0o700);
        // Marked and of our shape, but open to others (not how this program makes one).
        let open_dir = format!("{p}{dead}-OpEnD1");
        std::fs::create_dir_all(dir.path().join(&open_dir)).expect("mkdir");
        std::fs::write(dir.path().join(&open_dir).join(super::WORK_MARK), "").expect("mark");
        chmod(&open_dir, 0o755);
        // A user's dir of exactly our shape, without our mark.
        let users_dir = format!("{p}{dead}-Qwerty");
        std::fs::create_dir_all(dir.path().join(&users_dir)).expect("mkdir");
        std::fs::write(dir.path().join(&users_dir).join("notes.txt"), "mine").expect("write");
        let link = format!("{p}{dead}-LiNk00");
        std::os::unix::fs::symlink("keep.txt", dir.path().join(&link)).expect("symlink");
        sweep_leftovers(dir.path(), p, false);
        let mut want = vec![
            gone_as_dir.clone(),
            format!("{p}abc"),
            link.clone(),
            live.clone(),
            users.clone(),
            shared.clone(),
            users_dir.clone(),
            open_dir.clone(),
            "keep.txt".to_string(),
        ];
        want.sort();
        assert_eq!(
            names(dir.path()),
            want,
            "files: only the gone process's file goes"
        );
        sweep_leftovers(dir.path(), p, true);
        want.retain(|n| *n != gone_as_dir);
        assert_eq!(
            names(dir.path()),
            want,
            "dirs: only the gone process's dir goes"
        );
        assert_eq!(
            std::fs::read_to_string(dir.path().join("keep.txt")).expect("kept"),
            "x"
        );
    }

    /// Whether `path` leads to this process's standard output or error.
    fn is_stream(path: &std::path::Path) -> bool {
        matches!(super::through_proc(path), super::Proc::Stream(_))
    }

    /// `/dev/stdout`-like links (into `/proc/self/fd`) and links to pipes are written
    /// through, never replaced; a link to a file is replaced, its target untouched.
    #[test]
    fn links_to_streams_are_written_through_and_links_to_files_replaced() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (fifo, reader) = pipe_with_reader(dir.path());
        let link = dir.path().join("to-pipe");
        std::os::unix::fs::symlink(&fifo, &link).expect("symlink");
        write_atomically(&link, |f| -> Result<(), std::io::Error> {
            f.write_all(b"via link")
        })
        .expect("written");
        assert_eq!(reader.join().expect("reader"), "via link");
        assert!(std::fs::symlink_metadata(&link)
            .expect("meta")
            .file_type()
            .is_symlink());

        let stdout_like = dir.path().join("stdout");
        std::os::unix::fs::symlink("/proc/self/fd/1", &stdout_like).expect("symlink");
        assert!(is_stream(&stdout_like), "a link to /proc/self/fd/1");
        // However the path spells it: a relative link, a linked directory.
        let depth = dir.path().components().count();
        let relative = dir.path().join("relative-stdout");
        std::os::unix::fs::symlink(format!("{}proc/self/fd/1", "../".repeat(depth)), &relative)
            .expect("symlink");
        assert!(is_stream(&relative), "a relative link to /proc/self/fd/1");
        let fd_dir = dir.path().join("fds");
        std::os::unix::fs::symlink("/proc/self/fd", &fd_dir).expect("symlink");
        assert!(is_stream(&fd_dir.join("1")), "fds/1 through a linked dir");
        assert!(is_stream(&fd_dir.join("2")), "fds/2 through a linked dir");
        // Any other descriptor of this process (here a file it has open, as an export has the
        // recording's tables open) is refused, never written.
        let victim = dir.path().join("open.sst");
        std::fs::write(&victim, "table").expect("write");
        let open = std::fs::File::open(&victim).expect("open");
        use std::os::fd::AsRawFd;
        // An inherited pipe is a descriptor too: a caller's, not an output's.
        let (pipe_read, pipe_write) = std::io::pipe().expect("pipe");
        let n = open.as_raw_fd();
        for link_to in [
            format!("/proc/self/fd/{n}"),
            format!("/dev/fd/{n}"),
            format!("/proc/{}/fd/{n}", std::process::id()),
            format!("{}proc/self/fd/{n}", "../".repeat(depth)),
            format!("{}/{n}", fd_dir.display()),
            format!("{}/{}", fd_dir.display(), pipe_write.as_raw_fd()),
            format!("{}/nothing-here", fd_dir.display()),
        ] {
            let link = dir.path().join("fd-link");
            let _ = std::fs::remove_file(&link);
            std::os::unix::fs::symlink(&link_to, &link).expect("symlink");
            let via_link = write_atomically(&link, |f| -> Result<(), std::io::Error> {
                f.write_all(b"x")
            });
            assert!(via_link.is_err(), "{link_to}: written");
            let direct = write_atomically(std::path::Path::new(&link_to), |f| f.write_all(b"x"));
            assert!(direct.is_err(), "{link_to} given directly: written");
            assert_eq!(
                std::fs::read_to_string(&victim).expect("read"),
                "table",
                "{link_to}"
            );
        }
        drop(open);
        drop(pipe_write);
        let mut nothing = String::new();
        std::io::Read::read_to_string(&mut &pipe_read, &mut nothing).expect("read");
        assert_eq!(nothing, "", "the inherited pipe was written");
        assert!(is_stream(std::path::Path::new("/dev/stdout")));
        assert!(is_stream(std::path::Path::new("/dev/stderr")));

        let target = dir.path().join("target.txt");
        std::fs::write(&target, "precious").expect("write");
        let to_file = dir.path().join("to-file");
        std::os::unix::fs::symlink(&target, &to_file).expect("symlink");
        write_atomically(&to_file, |f| -> Result<(), std::io::Error> {
            f.write_all(b"new")
        })
        .expect("written");
        assert_eq!(std::fs::read_to_string(&target).expect("read"), "precious");
        assert!(std::fs::symlink_metadata(&to_file).expect("meta").is_file());

        // A link to a directory is neither replaced nor written through, with or without a
        // trailing slash.
        let to_dir = dir.path().join("to-dir");
        std::os::unix::fs::symlink(dir.path(), &to_dir).expect("symlink");
        let before = names(dir.path());
        for given in [to_dir.clone(), to_dir.join("")] {
            let e = write_atomically(&given, |f| -> Result<(), std::io::Error> {
                f.write_all(b"new")
            })
            .expect_err("written through a link to a directory");
            assert_eq!(e.kind(), std::io::ErrorKind::IsADirectory, "{e}");
            assert!(std::fs::symlink_metadata(&to_dir)
                .expect("meta")
                .is_symlink());
            assert_eq!(names(dir.path()), before);
        }
    }

    /// A thread that points `link` at each of `targets` in turn (a new link renamed over it,
    /// so the name always exists, from before this returns) until `stop`; joining it gives the
    /// number of swaps.
    pub(crate) fn swapping(
        link: &std::path::Path,
        targets: [std::path::PathBuf; 2],
        stop: &std::sync::Arc<std::sync::atomic::AtomicBool>,
    ) -> std::thread::JoinHandle<u64> {
        let (link, stop) = (link.to_path_buf(), stop.clone());
        // The link exists before this returns: outputs through it work from the first one.
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&targets[1], &link).expect("symlink");
        std::thread::spawn(move || {
            let tmp = link.with_extension("next");
            let mut swaps = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let _ = std::fs::remove_file(&tmp);
                std::os::unix::fs::symlink(&targets[(swaps % 2) as usize], &tmp).expect("symlink");
                std::fs::rename(&tmp, &link).expect("rename");
                swaps += 1;
            }
            swaps
        })
    }

    /// A link swapped between a named pipe and another descriptor of this process while
    /// outputs are written through it (the check and the open are not one step for a path):
    /// the other descriptor's file is never written, however the swaps fall.
    #[test]
    fn a_link_swapped_while_it_is_checked_never_leads_to_another_descriptor() {
        use std::os::fd::AsRawFd;
        use std::sync::atomic::{AtomicBool, Ordering};
        use std::sync::Arc;
        let dir = tempfile::tempdir().expect("tempdir");
        let fifo = dir.path().join("pipe");
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .expect("mkfifo runs");
        assert!(made.success());
        let victim = dir.path().join("open.sst");
        std::fs::write(&victim, "table").expect("write");
        let open = std::fs::File::open(&victim).expect("open");
        let link = dir.path().join("out");
        let stop = Arc::new(AtomicBool::new(false));
        let reader = {
            let (fifo, stop) = (fifo.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let mut sink = Vec::new();
                    if let Ok(mut f) = std::fs::File::open(&fifo) {
                        let _ = f.read_to_end(&mut sink);
                    }
                }
            })
        };
        let swapper = swapping(
            &link,
            [
                fifo.clone(),
                std::path::PathBuf::from(format!("/proc/self/fd/{}", open.as_raw_fd())),
            ],
            &stop,
        );
        for _ in 0..2000 {
            let _ = write_atomically(&link, |f| -> Result<(), std::io::Error> {
                f.write_all(b"overwritten")
            });
        }
        stop.store(true, Ordering::Relaxed);
        let swaps = swapper.join().expect("swapper");
        // The reader may be waiting for a writer: one more opening lets it see the stop (not
        // waiting itself, in case the reader has already gone).
        let _ = std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&fifo);
        reader.join().expect("reader");
        assert!(swaps > 100, "the link hardly moved ({swaps} swaps)");
        assert_eq!(std::fs::read_to_string(&victim).expect("read"), "table");
    }

    /// A linked parent dir swapped while outputs are written through it (`dirl/9`, `dirl`
    /// moving between a dir holding a named pipe and one holding a link to a file): the pipe is
    /// never replaced by a file and no work file is left in either dir.
    #[test]
    fn a_parent_swapped_while_writing_never_replaces_a_pipe_or_leaves_work_files() {
        use std::os::fd::AsRawFd;
        use std::sync::atomic::{AtomicBool, Ordering};
        use std::sync::Arc;
        let dir = tempfile::tempdir().expect("tempdir");
        let (real, other) = (dir.path().join("real"), dir.path().join("other"));
        std::fs::create_dir(&real).expect("mkdir");
        std::fs::create_dir(&other).expect("mkdir");
        let fifo = real.join("9");
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .expect("mkfifo runs");
        assert!(made.success());
        std::fs::write(dir.path().join("target"), "T").expect("write");
        std::os::unix::fs::symlink("../target", other.join("9")).expect("symlink");
        let dirl = dir.path().join("dirl");
        let stop = Arc::new(AtomicBool::new(false));
        // Drains the pipe without ever waiting for a writer, so it stops when told.
        let reader = {
            let (fifo, stop) = (fifo.clone(), stop.clone());
            std::thread::spawn(move || {
                let f = std::fs::OpenOptions::new()
                    .read(true)
                    .custom_flags(libc::O_NONBLOCK)
                    .open(&fifo)
                    .expect("open to read");
                let mut buf = vec![0u8; 1 << 16];
                while !stop.load(Ordering::Relaxed) {
                    if let Err(e) = (&f).read(&mut buf) {
                        assert_eq!(e.kind(), std::io::ErrorKind::WouldBlock, "{e}");
                        std::thread::yield_now();
                    }
                }
                f.as_raw_fd()
            })
        };
        let swapper = swapping(&dirl, [real.clone(), other.clone()], &stop);
        let out = dirl.join("9");
        for _ in 0..2000 {
            let _ = write_atomically(&out, |f| -> Result<(), std::io::Error> {
                f.write_all(b"export")
            });
            if !std::fs::symlink_metadata(&fifo).is_ok_and(|m| m.file_type().is_fifo()) {
                break;
            }
        }
        stop.store(true, Ordering::Relaxed);
        let swaps = swapper.join().expect("swapper");
        reader.join().expect("reader");
        assert!(swaps > 100, "the link hardly moved ({swaps} swaps)");
        assert!(
            std::fs::symlink_metadata(&fifo).is_ok_and(|m| m.file_type().is_fifo()),
            "the pipe was replaced by a file"
        );
        for d in [&real, &other] {
            let work: Vec<String> = names(d)
                .into_iter()
                .filter(|n| n.starts_with(".gabp-"))
                .collect();
            assert!(work.is_empty(), "{}: {work:?}", d.display());
        }
    }
}
