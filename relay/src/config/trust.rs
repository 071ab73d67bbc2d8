//! What the config file may be trusted with: who may have written it, and its token files.

use std::path::Path;

/// Reads a token file; an empty one is refused (it would let anyone in with an empty token).
pub(super) fn read_token_file(path: &Path) -> Result<String, String> {
    let token = std::fs::read_to_string(path)
        .map(|s| s.trim().to_string())
        .map_err(|e| format!("cannot read token file {}: {}", path.display(), io_text(&e)))?;
    if token.is_empty() {
        return Err(format!("token file {} is empty", path.display()));
    }
    Ok(token)
}

/// An I/O error as words, without the `(os error N)` tail.
pub(super) fn io_text(e: &std::io::Error) -> String {
    let s = e.to_string();
    match s.find(" (os error") {
        Some(i) => s[..i].to_string(),
        None => s,
    }
}

/// Refuses a config that someone other than this user (or root) could have written: its
/// `upstream_command` runs as this user and its tokens guard the routes.
pub(super) fn check_trusted(meta: &std::fs::Metadata) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt;
    let (uid, me) = (meta.uid(), nix::unistd::geteuid().as_raw());
    if uid != me && uid != 0 {
        return Err(format!(
            "owned by uid {uid}, not by this user (uid {me}) or root; refusing to load a config another user controls"
        ));
    }
    let mode = meta.mode() & 0o7777;
    if mode & 0o022 != 0 {
        return Err(format!(
            "writable by group or others (mode {mode:04o}); refusing to load it (chmod go-w fixes this)"
        ));
    }
    Ok(())
}
