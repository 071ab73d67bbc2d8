//! The process's file creation mode: every file it creates private to its user. Called by
//! every command that writes a data dir or an archive, before the first file is made.

/// Makes every file this process creates from now on private (umask 077): RocksDB creates its
/// tables, logs and manifests 0644 otherwise, readable by anyone who can reach the data dir.
pub fn private_file_modes() {
    // SAFETY: umask(2) only sets the process's file mode creation mask; no pointers.
    #[allow(unsafe_code)]
    unsafe {
        libc::umask(0o077);
    }
}
