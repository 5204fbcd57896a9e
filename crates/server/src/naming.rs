//! Where a local server's socket lives, telling live servers from stale ones, and
//! cleaning up after servers that died without closing.

use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

use reprise_core::error::{Error, Result};

fn uid() -> u32 {
    // SAFETY: getuid has no preconditions and cannot fail.
    unsafe { libc::getuid() }
}

/// `$XDG_RUNTIME_DIR/reprise` or `/tmp/reprise-<uid>`: created 0700, and refused if
/// another user owns it or others can enter it.
pub fn socket_dir() -> Result<PathBuf> {
    let dir = match std::env::var_os("XDG_RUNTIME_DIR").map(PathBuf::from) {
        Some(d) if d.is_dir() => d.join("reprise"),
        _ => std::env::temp_dir().join(format!("reprise-{}", uid())),
    };
    match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(Error::Io(format!("cannot create {}: {e}", dir.display()))),
    }
    let meta = std::fs::symlink_metadata(&dir).map_err(|e| Error::Io(format!("cannot stat {}: {e}", dir.display())))?;
    if !meta.is_dir() || meta.uid() != uid() || meta.permissions().mode() & 0o077 != 0 {
        return Err(Error::Io(format!(
            "{} must be a directory owned by this user with mode 0700; remove it or set XDG_RUNTIME_DIR",
            dir.display()
        )));
    }
    Ok(dir)
}

/// Checks a server name: letters, digits, '-', '_' and '.', not starting with '.'.
pub fn check_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && !name.starts_with('.')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
    if ok {
        Ok(())
    } else {
        Err(Error::InvalidArgument(format!(
            "server name {name:?}: expected 1 to 64 letters, digits, '-', '_' or '.', not starting with '.'"
        )))
    }
}

/// Takes the name: an exclusive `flock` on `<dir>/<name>.lock`, held for the
/// server's life and dropped by the kernel when its process dies. Whoever holds it
/// owns the socket path, so a socket found there now is a dead server's and is
/// removed. Two servers starting at once cannot both win.
pub fn claim_name(dir: &Path, name: &str) -> Result<NameLock> {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::OpenOptionsExt;
    let lock_path = dir.join(format!("{name}.lock"));
    // A holder removes the lock file when it stops; a file we opened just before
    // that is no longer the name's, so check we locked the file at the path.
    for _ in 0..16 {
        let lock = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&lock_path)
            .map_err(|e| Error::Io(format!("cannot open {}: {e}", lock_path.display())))?;
        // SAFETY: flock on a file descriptor we own; no memory is involved.
        if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            return Err(Error::InvalidArgument(format!(
                "a replay server named '{name}' is already running (unix://{}); stop it or choose another name",
                dir.join(format!("{name}.sock")).display()
            )));
        }
        let held = lock.metadata().map(|m| (m.dev(), m.ino())).ok();
        let at_path = std::fs::metadata(&lock_path).map(|m| (m.dev(), m.ino())).ok();
        if held.is_none() || held != at_path {
            continue;
        }
        let socket = dir.join(format!("{name}.sock"));
        match std::fs::remove_file(&socket) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(Error::Io(format!("cannot remove the stale socket {}: {e}", socket.display()))),
        }
        return Ok(NameLock { _file: lock, path: lock_path });
    }
    Err(Error::Io(format!("could not take the lock {} (it kept changing)", lock_path.display())))
}

/// A server's hold on its name. Dropping it removes the lock file, still holding
/// the lock, so a stopped server leaves nothing behind.
pub struct NameLock {
    _file: std::fs::File,
    path: PathBuf,
}

impl Drop for NameLock {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

fn alive(pid: i32) -> bool {
    // SAFETY: kill with signal 0 only checks whether the process exists.
    let rc = unsafe { libc::kill(pid, 0) };
    rc == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// Removes this user's `reprise-<pid>-*` shared-memory files whose process is
/// gone (a server or store owner killed before it could clean up). Returns them.
pub fn remove_stale_stores(dir: &Path) -> Vec<PathBuf> {
    let mut removed = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else { return removed };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix("reprise-")) else { continue };
        let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<i32>().ok()) else { continue };
        let mine = entry.metadata().map(|m| m.uid() == uid() && m.is_file()).unwrap_or(false);
        if mine && pid > 0 && pid != std::process::id() as i32 && !alive(pid) && std::fs::remove_file(entry.path()).is_ok() {
            removed.push(entry.path());
        }
    }
    removed
}

/// The user id of the process at the other end of `stream`.
pub fn peer_uid(stream: &UnixStream) -> Option<u32> {
    use std::os::fd::AsRawFd;
    let mut cred = libc::ucred { pid: 0, uid: 0, gid: 0 };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` and `len` are valid for writes of a ucred; the fd is open.
    let rc = unsafe {
        libc::getsockopt(stream.as_raw_fd(), libc::SOL_SOCKET, libc::SO_PEERCRED, &mut cred as *mut _ as *mut libc::c_void, &mut len)
    };
    (rc == 0).then_some(cred.uid)
}

pub fn my_uid() -> u32 {
    uid()
}

/// True once the peer has closed its end (checked without reading).
pub fn peer_closed(stream: &UnixStream) -> bool {
    use std::os::fd::AsRawFd;
    let mut fds = libc::pollfd { fd: stream.as_raw_fd(), events: libc::POLLRDHUP, revents: 0 };
    // SAFETY: one valid pollfd, zero timeout.
    let rc = unsafe { libc::poll(&mut fds, 1, 0) };
    rc > 0 && fds.revents & (libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR) != 0
}
