//! Where a local server's socket lives, telling live servers from stale ones, and
//! cleaning up after servers that died without closing.

use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

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

/// How long a start waits for a name's lock held by someone else before it calls the
/// name taken: a live server holds it for its life, a sweep (`remove_stale_names`)
/// for a few system calls.
const CLAIM_PATIENCE: Duration = Duration::from_millis(100);

/// Takes the name: an exclusive `flock` on `<dir>/<name>.lock`, held for the
/// server's life and dropped by the kernel when its process dies. Whoever holds it
/// owns the socket path, so a socket found there now is a dead server's and is
/// removed. Two servers starting at once cannot both win.
pub fn claim_name(dir: &Path, name: &str) -> Result<NameLock> {
    match try_claim(dir, name, CLAIM_PATIENCE)? {
        Some(lock) => Ok(lock),
        None => Err(Error::InvalidArgument(format!(
            "a replay server named '{name}' is already running (unix://{}); stop it or choose another name",
            dir.join(format!("{name}.sock")).display()
        ))),
    }
}

/// [`claim_name`], answering `None` when the lock stays held for `patience`.
fn try_claim(dir: &Path, name: &str, patience: Duration) -> Result<Option<NameLock>> {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::OpenOptionsExt;
    let lock_path = dir.join(format!("{name}.lock"));
    let deadline = Instant::now() + patience;
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
        while unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            if Instant::now() >= deadline {
                return Ok(None);
            }
            std::thread::sleep(Duration::from_millis(2));
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
        return Ok(Some(NameLock { _file: lock, path: lock_path }));
    }
    Err(Error::Io(format!("could not take the lock {} (it kept changing)", lock_path.display())))
}

/// A server's hold on its name. Dropping it removes the lock file, still holding
/// the lock, so a stopped server leaves nothing behind (its socket is removed
/// before, by the server, also under the lock).
pub struct NameLock {
    _file: std::fs::File,
    path: PathBuf,
}

impl Drop for NameLock {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Removes what servers that died without stopping (killed, or exited without
/// dropping their server) left in `dir`: every name whose `.sock` or `.lock` is
/// there but whose lock nobody holds is claimed, which removes its socket, and
/// released, which removes its lock file. Safe under the lock scheme: a live
/// server holds its lock, and one starting meanwhile waits out the few system
/// calls a claim lasts (`CLAIM_PATIENCE`). Returns the names cleaned.
pub fn remove_stale_names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = match std::fs::read_dir(dir) {
        Ok(entries) => entries
            .flatten()
            .filter_map(|e| {
                let file = e.file_name().into_string().ok()?;
                let name = file.strip_suffix(".sock").or_else(|| file.strip_suffix(".lock"))?;
                check_name(name).is_ok().then(|| name.to_string())
            })
            .collect(),
        Err(_) => return Vec::new(),
    };
    names.sort();
    names.dedup();
    names.retain(|name| matches!(try_claim(dir, name, Duration::ZERO), Ok(Some(_))));
    names
}

/// Removes this user's `reprise-<pid>-*` shared-memory files whose process is
/// gone (a server or store owner killed before it could clean up). Returns them.
pub fn remove_stale_stores(dir: &Path) -> Vec<PathBuf> {
    reprise_core::remove_stale_regions(dir)
}

/// The user id and process id of the process at the other end of `stream`.
pub fn peer_cred(stream: &UnixStream) -> Option<(u32, i32)> {
    use std::os::fd::AsRawFd;
    let mut cred = libc::ucred { pid: 0, uid: 0, gid: 0 };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` and `len` are valid for writes of a ucred; the fd is open.
    let rc = unsafe {
        libc::getsockopt(stream.as_raw_fd(), libc::SOL_SOCKET, libc::SO_PEERCRED, &mut cred as *mut _ as *mut libc::c_void, &mut len)
    };
    (rc == 0).then_some((cred.uid, cred.pid))
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

#[cfg(test)]
mod tests {
    use super::*;

    fn private_dir(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("reprise-naming-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::DirBuilder::new().mode(0o700).create(&dir).expect("a fresh private directory");
        dir
    }

    fn files(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> =
            std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        names.sort();
        names
    }

    #[test]
    fn a_released_name_leaves_no_lock_file() {
        let dir = private_dir("release");
        let lock = claim_name(&dir, "a").unwrap();
        assert_eq!(files(&dir), ["a.lock"]);
        drop(lock);
        assert!(files(&dir).is_empty());
        std::fs::remove_dir(&dir).unwrap();
    }

    #[test]
    fn stale_names_are_removed_and_held_ones_kept() {
        let dir = private_dir("sweep");
        for f in ["dead.sock", "dead.lock", "orphan.sock", "lockonly.lock", ".hidden.sock", "notes.txt"] {
            std::fs::write(dir.join(f), b"").unwrap();
        }
        let live = claim_name(&dir, "live").unwrap();
        std::fs::write(dir.join("live.sock"), b"").unwrap();
        assert_eq!(remove_stale_names(&dir), ["dead", "lockonly", "orphan"]);
        assert_eq!(files(&dir), [".hidden.sock", "live.lock", "live.sock", "notes.txt"]);
        drop(live);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_claim_waits_out_a_brief_holder_but_not_a_live_one() {
        use std::os::fd::AsRawFd;
        let dir = private_dir("patience");
        // Another process's sweep: it holds the name's lock for a moment.
        let sweep = std::fs::OpenOptions::new().write(true).create(true).truncate(false).open(dir.join("n.lock")).unwrap();
        // SAFETY: flock on a file descriptor we own.
        assert_eq!(unsafe { libc::flock(sweep.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) }, 0);
        let released = std::thread::spawn(move || {
            std::thread::sleep(CLAIM_PATIENCE / 4);
            drop(sweep);
        });
        let held = claim_name(&dir, "n").expect("the claim waits for the sweep to finish");
        released.join().unwrap();
        let start = Instant::now();
        let e = claim_name(&dir, "n").err().expect("a second claim of a held name fails");
        assert!(e.to_string().contains("already running"), "{e}");
        assert!(start.elapsed() >= CLAIM_PATIENCE);
        drop(held);
        assert!(files(&dir).is_empty());
        std::fs::remove_dir(&dir).unwrap();
    }
}
