//! Shared-memory regions: a file under /dev/shm (or a chosen directory), created
//! with mode 0600, mapped read-write, and removed when its owner drops it.
//!
//! This module and [`crate::store`] are the only places that touch raw memory.

use std::fs::OpenOptions;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

use memmap2::MmapMut;

use crate::error::{Error, Result};

static REGION_COUNTER: AtomicU64 = AtomicU64::new(0);
const GIB: f64 = (1u64 << 30) as f64;

/// Bytes an unprivileged user may still allocate in the file system of `dir`.
fn free_bytes(dir: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    // SAFETY: statvfs is plain old data; all-zero bytes are a valid value.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a valid NUL-terminated path and `st` a writable statvfs.
    let rc = unsafe { libc::statvfs(c.as_ptr(), &mut st) };
    (rc == 0).then(|| st.f_bavail as u64 * st.f_frsize as u64)
}

/// The directory new regions go to: /dev/shm where it exists, else the temp dir.
pub fn default_directory() -> PathBuf {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        shm.to_path_buf()
    } else {
        std::env::temp_dir()
    }
}

/// A mapped file that only this user can open.
pub struct Region {
    // Kept alive for the mapping; all access goes through `base`.
    _map: MmapMut,
    base: NonNull<u8>,
    path: PathBuf,
    /// Created (and so removed on drop) by this handle.
    owner: bool,
}

// SAFETY: `Region` owns its mapping; the raw `base` pointer is only dereferenced by
// `Store`, which hands out disjoint rows to writers and reads rows only while the
// blocks that hold them are referenced (see `store.rs`).
unsafe impl Send for Region {}
// SAFETY: as above; shared access never creates overlapping `&mut` slices.
unsafe impl Sync for Region {}

impl Region {
    /// Creates a new region of `len` bytes (at least one page) in `directory`.
    pub fn create(directory: &Path, len: usize) -> Result<Region> {
        let len = len.max(4096);
        // tmpfs allocates on first touch and answers a full file system with SIGBUS,
        // not an error: refuse up front what cannot fit.
        if let Some(free) = free_bytes(directory) {
            if len as u64 > free {
                return Err(Error::ResourceExhausted(format!(
                    "a store of {:.2} GiB does not fit in {} ({:.2} GiB free): lower the capacity or \
                     pass another directory",
                    len as f64 / GIB,
                    directory.display(),
                    free as f64 / GIB
                )));
            }
        }
        let name = format!(
            "reprise-{}-{}-{:08x}",
            std::process::id(),
            REGION_COUNTER.fetch_add(1, Ordering::Relaxed),
            rand::random::<u32>()
        );
        let path = directory.join(name);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .map_err(|e| Error::Io(format!("cannot create shared memory file {}: {e}", path.display())))?;
        let cleanup = |e: String| {
            let _ = std::fs::remove_file(&path);
            Error::Io(e)
        };
        file.set_len(len as u64).map_err(|e| {
            cleanup(format!("cannot size shared memory file {} to {len} bytes: {e}", path.display()))
        })?;
        // SAFETY: the file was just created by us with O_EXCL and mode 0600; no other
        // process maps it yet, and we never truncate it while mapped.
        let mut map = unsafe { MmapMut::map_mut(&file) }
            .map_err(|e| cleanup(format!("cannot map {} ({len} bytes): {e}", path.display())))?;
        let base = NonNull::new(map.as_mut_ptr()).expect("mmap never returns a null mapping");
        Ok(Region { _map: map, base, path, owner: true })
    }

    /// Maps an existing region file of at least `len` bytes (made by another
    /// process of this user). Dropping the mapping leaves the file in place.
    pub fn open(path: &Path, len: usize) -> Result<Region> {
        let len = len.max(4096);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(|e| Error::Io(format!("cannot open shared memory file {}: {e}", path.display())))?;
        let actual = file.metadata().map_err(|e| Error::Io(format!("cannot stat {}: {e}", path.display())))?.len();
        if actual < len as u64 {
            return Err(Error::Corrupt(format!(
                "shared memory file {} holds {actual} bytes, the store needs {len}",
                path.display()
            )));
        }
        // SAFETY: the owner never truncates the file while it exists; we map only
        // the `len` bytes checked above.
        let mut map = unsafe { memmap2::MmapOptions::new().len(len).map_mut(&file) }
            .map_err(|e| Error::Io(format!("cannot map {} ({len} bytes): {e}", path.display())))?;
        let base = NonNull::new(map.as_mut_ptr()).expect("mmap never returns a null mapping");
        Ok(Region { _map: map, base, path: path.to_path_buf(), owner: false })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn base(&self) -> *mut u8 {
        self.base.as_ptr()
    }

    /// Mapped length in bytes.
    pub fn len(&self) -> usize {
        self._map.len()
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        if self.owner {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}


/// Asks the kernel to back `v`'s buffer with transparent huge pages (where THP is
/// in `madvise` mode). Large random-access indexes (sum trees, item slots) then
/// miss the TLB far less often. Only a hint: failures are ignored.
pub fn advise_huge_pages<T>(v: &[T]) {
    advise_huge_pages_raw(v.as_ptr() as usize, std::mem::size_of_val(v));
}

/// [`advise_huge_pages`] for a whole allocation, also the part not yet written
/// (a `Vec`'s spare capacity: advised before first touch, it is faulted in as
/// huge pages).
pub fn advise_huge_pages_vec<T>(v: &Vec<T>) {
    advise_huge_pages_raw(v.as_ptr() as usize, v.capacity() * std::mem::size_of::<T>());
}

fn advise_huge_pages_raw(at: usize, bytes: usize) {
    const HUGE: usize = 2 << 20;
    if bytes < HUGE {
        return;
    }
    let start = at.next_multiple_of(HUGE);
    let end = (at + bytes) & !(HUGE - 1);
    if end > start {
        // SAFETY: [start, end) lies inside a live allocation; MADV_HUGEPAGE
        // changes only how the kernel backs the pages, never their contents.
        unsafe {
            libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE);
        }
    }
}

/// Hints the CPU to start loading `value` (used before random accesses to many
/// items of a large table).
#[inline]
pub fn prefetch<T>(value: &T) {
    #[cfg(target_arch = "x86_64")]
    {
        let start = value as *const T as usize;
        let end = start + std::mem::size_of::<T>().max(1) - 1;
        // Every cache line the value touches (a value may straddle two).
        for line in (start & !63..=end).step_by(64) {
            // SAFETY: a prefetch never faults and changes no memory; the lines hold
            // parts of a valid reference.
            unsafe { std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(line as *const i8) };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = value;
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn region_file_is_private_and_removed_on_drop() {
        let r = Region::create(&default_directory(), 10_000).unwrap();
        let path = r.path().to_path_buf();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 10_000);
        drop(r);
        assert!(!path.exists());
    }

    #[test]
    fn a_region_larger_than_the_file_system_is_refused() {
        let e = Region::create(&default_directory(), usize::MAX / 4).err().unwrap().to_string();
        assert!(e.contains("does not fit") && e.contains("GiB free"), "{e}");
    }

    #[test]
    fn an_attached_region_sees_the_owners_bytes_and_leaves_the_file() {
        let owner = Region::create(&default_directory(), 8192).unwrap();
        // SAFETY: byte 100 is inside the 8192-byte mapping; nothing else touches it.
        unsafe { *owner.base().add(100) = 42 };
        let other = Region::open(owner.path(), 8192).unwrap();
        // SAFETY: as above, through the second mapping of the same file.
        let seen = unsafe { *other.base().add(100) };
        assert_eq!(seen, 42);
        drop(other);
        assert!(owner.path().exists());
        assert!(Region::open(owner.path(), 1 << 20).err().unwrap().to_string().contains("holds 8192 bytes"));
    }

    #[test]
    fn missing_directory_is_a_clear_error() {
        let e = Region::create(Path::new("/nonexistent-reprise-dir"), 100).err().unwrap();
        assert!(e.to_string().contains("/nonexistent-reprise-dir"), "{e}");
    }
}
