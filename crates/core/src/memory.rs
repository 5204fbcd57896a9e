//! Shared-memory regions: a file under /dev/shm (or a chosen directory), created
//! with mode 0600, mapped read-write, and removed when its owner drops it.
//!
//! A region is backed by huge pages when its directory hands them out: a hugetlbfs
//! mount (pages from the kernel's pool, `vm.nr_hugepages`) or a tmpfs mounted with
//! `huge=always`, `within_size` or `advise` (every mapping is advised). /dev/shm is
//! usually `huge=never`. [`backing`] says which a directory is; a region created
//! with `huge_pages` refuses a directory that cannot give them.
//!
//! This module and [`crate::store`] are the only places that touch raw memory.

use std::fs::OpenOptions;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

use memmap2::MmapMut;

use crate::error::{Error, Result};
use crate::invalid;

static REGION_COUNTER: AtomicU64 = AtomicU64::new(0);
const GIB: f64 = (1u64 << 30) as f64;
/// The transparent huge page size (x86-64 and most arm64 kernels).
const HUGE: usize = 2 << 20;
const HUGETLBFS_MAGIC: i64 = 0x9584_58f6;
const TMPFS_MAGIC: i64 = 0x0102_1994;

/// How the files of a directory are backed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Backing {
    /// hugetlbfs: every page is a huge page of `page` bytes, reserved from the
    /// kernel's pool when the file is mapped.
    HugeTlb { page: usize },
    /// tmpfs mounted with `huge=<mode>` (or `shmem_enabled` forcing it): huge pages
    /// where the kernel can find them.
    Transparent { mode: String },
    /// Small pages only; `why` says what the directory is.
    Small { why: String },
}

impl Backing {
    pub fn is_huge(&self) -> bool {
        !matches!(self, Backing::Small { .. })
    }
}

/// The option value of `key` in a comma list (`rw,size=8g,huge=always`).
fn mount_option<'a>(options: &'a str, key: &str) -> Option<&'a str> {
    options.split(',').find_map(|o| o.strip_prefix(key)?.strip_prefix('='))
}

/// The super-block options of the mount that holds `dir` (the longest mount point
/// that is a prefix of its canonical path), from /proc/self/mountinfo.
fn mount_options(dir: &Path) -> Option<String> {
    let dir = dir.canonicalize().ok()?;
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let mut best: Option<(usize, String)> = None;
    for line in info.lines() {
        // id parent major:minor root mount-point options [optional...] - fstype source super-options
        let mut fields = line.split(' ');
        let point = fields.nth(4)?.replace("\\040", " ");
        let (_, after) = line.split_once(" - ")?;
        let options = after.split(' ').nth(2).unwrap_or("").to_string();
        let depth = point.len();
        if dir.starts_with(&point) && best.as_ref().is_none_or(|(d, _)| depth >= *d) {
            best = Some((depth, options));
        }
    }
    best.map(|(_, o)| o)
}

/// The kernel's override for every tmpfs (`deny`, `force`) or None.
fn shmem_override() -> Option<String> {
    let s = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/shmem_enabled").ok()?;
    let mode = s.split_once('[')?.1.split_once(']')?.0.to_string();
    matches!(mode.as_str(), "deny" | "force").then_some(mode)
}

/// statfs(2) of `directory`: its kind, page size and free space.
fn file_system(directory: &Path) -> Result<libc::statfs> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(directory.as_os_str().as_bytes())
        .map_err(|_| invalid!("directory {} holds a NUL byte", directory.display()))?;
    // SAFETY: statfs is plain old data; all-zero bytes are a valid value.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a valid NUL-terminated path and `st` a writable statfs.
    if unsafe { libc::statfs(c.as_ptr(), &mut st) } != 0 {
        let e = std::io::Error::last_os_error();
        return Err(Error::Io(format!("cannot use {} for shared memory: {e}", directory.display())));
    }
    Ok(st)
}

/// Bytes an unprivileged user may still allocate in a file system.
#[allow(clippy::unnecessary_cast)] // the fields' widths differ between targets
fn free_bytes(st: &libc::statfs) -> u64 {
    st.f_bavail as u64 * st.f_frsize as u64
}

/// How files created in `directory` are backed.
pub fn backing(directory: &Path) -> Result<Backing> {
    Ok(backing_of(directory, &file_system(directory)?))
}

fn backing_of(directory: &Path, st: &libc::statfs) -> Backing {
    #[allow(clippy::unnecessary_cast)] // f_type's width differs between targets
    let kind = st.f_type as i64;
    if kind == HUGETLBFS_MAGIC {
        return Backing::HugeTlb { page: st.f_bsize as usize };
    }
    if kind != TMPFS_MAGIC {
        return Backing::Small { why: format!("{} is not on a tmpfs or hugetlbfs", directory.display()) };
    }
    let mode = mount_options(directory).and_then(|o| mount_option(&o, "huge").map(str::to_string));
    let mode = mode.unwrap_or_else(|| "never".to_string());
    match shmem_override().as_deref() {
        Some("force") => Backing::Transparent { mode: "force".into() },
        Some(_) => Backing::Small { why: format!("{} is on a tmpfs, and shmem_enabled is deny", directory.display()) },
        None if mode == "never" => {
            Backing::Small { why: format!("{} is on a tmpfs mounted with huge=never", directory.display()) }
        }
        None => Backing::Transparent { mode },
    }
}

/// Huge pages free in the kernel's pool of the default size (HugePages_Free).
fn free_huge_pages() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    info.lines().find_map(|l| l.strip_prefix("HugePages_Free:")?.trim().parse().ok())
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

/// Whether process `pid` exists (one of another user counts too).
fn alive(pid: i32) -> bool {
    // SAFETY: kill with signal 0 only checks whether the process exists.
    let rc = unsafe { libc::kill(pid, 0) };
    rc == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// This user's region files in `dir` (`reprise-<pid>-*`) whose creating process is
/// gone: stores of an owner killed before it could remove them (SIGKILL, or a
/// SIGTERM nobody handled). With their sizes in bytes. A file of a live process,
/// or of another user, is never listed.
pub fn stale_regions(dir: &Path) -> Vec<(PathBuf, u64)> {
    use std::os::unix::fs::MetadataExt;
    // SAFETY: getuid has no preconditions.
    let me = unsafe { libc::getuid() };
    let mut stale = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else { return stale };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix("reprise-")) else { continue };
        let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<i32>().ok()) else { continue };
        let Ok(meta) = entry.metadata() else { continue };
        if meta.is_file() && meta.uid() == me && pid > 0 && pid != std::process::id() as i32 && !alive(pid) {
            stale.push((entry.path(), meta.len()));
        }
    }
    stale.sort();
    stale
}

/// Removes [`stale_regions`] of `dir`; returns what it removed.
pub fn remove_stale_regions(dir: &Path) -> Vec<PathBuf> {
    stale_regions(dir).into_iter().filter(|(p, _)| std::fs::remove_file(p).is_ok()).map(|(p, _)| p).collect()
}

/// [`remove_stale_regions`] once per directory per process: the first store a
/// process creates in a directory sweeps it, as a local server's start does.
fn sweep_once(dir: &Path) {
    use std::collections::HashSet;
    use std::sync::{Mutex, OnceLock};
    static SWEPT: OnceLock<Mutex<HashSet<PathBuf>>> = OnceLock::new();
    let first = SWEPT.get_or_init(Default::default).lock().map(|mut s| s.insert(dir.to_path_buf())).unwrap_or(false);
    if first {
        let removed = remove_stale_regions(dir);
        if !removed.is_empty() {
            tracing::info!(target: "reprise", "removed {} store files of processes that are gone: {:?}", removed.len(), removed);
        }
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
    /// Creates a new region of `len` bytes (at least one page) in `directory`. With
    /// `huge_pages`, a directory that cannot back it with huge pages is refused and
    /// the length is rounded up to whole huge pages (hugetlbfs always rounds).
    #[cfg(test)]
    pub fn create(directory: &Path, len: usize, huge_pages: bool) -> Result<Region> {
        Region::create_sparse(directory, len, len, huge_pages)
    }

    /// [`Region::create`] for a region of which at most `need` bytes are ever
    /// allocated at once (the rest stays sparse: compressed columns keep each block
    /// either raw or compressed, see `columns`): the free-space check asks for `need`.
    pub fn create_sparse(directory: &Path, len: usize, need: usize, huge_pages: bool) -> Result<Region> {
        let st = file_system(directory)?;
        sweep_once(directory);
        let backing = backing_of(directory, &st);
        if let (true, Backing::Small { why }) = (huge_pages, &backing) {
            return Err(invalid!(
                "huge_pages=True needs a directory that hands out huge pages, but {why}: pass a \
                 hugetlbfs mount (mount -t hugetlbfs none DIR, with vm.nr_hugepages set) or a \
                 tmpfs mounted with huge=within_size (mount -t tmpfs -o huge=within_size,size=SIZE \
                 none DIR) as directory"
            ));
        }
        let len = match backing {
            Backing::HugeTlb { page } => len.max(1).next_multiple_of(page),
            _ if huge_pages => len.max(1).next_multiple_of(HUGE),
            _ => len.max(4096),
        };
        // tmpfs allocates on first touch and answers a full file system with SIGBUS,
        // not an error: refuse up front what cannot fit. (hugetlbfs reserves its
        // pages when the file is mapped and answers there.)
        if !matches!(backing, Backing::HugeTlb { .. }) {
            let free = free_bytes(&st);
            if need.min(len) as u64 > free {
                return Err(Error::ResourceExhausted(format!(
                    "a store of {:.2} GiB does not fit in {} ({:.2} GiB free): lower the capacity or \
                     pass another directory",
                    need.min(len) as f64 / GIB,
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
        let cleanup = |e: Error| {
            let _ = std::fs::remove_file(&path);
            e
        };
        file.set_len(len as u64).map_err(|e| {
            cleanup(Error::Io(format!("cannot size shared memory file {} to {len} bytes: {e}", path.display())))
        })?;
        // SAFETY: the file was just created by us with O_EXCL and mode 0600; no other
        // process maps it yet, and we never truncate it while mapped.
        let mut map = unsafe { MmapMut::map_mut(&file) }.map_err(|e| {
            cleanup(match backing {
                Backing::HugeTlb { page } if e.raw_os_error() == Some(libc::ENOMEM) => {
                    Error::ResourceExhausted(format!(
                        "a store of {:.2} GiB needs {} huge pages of {} MiB in {}, and the kernel's pool \
                         has {} free: raise vm.nr_hugepages or lower the capacity",
                        len as f64 / GIB,
                        len / page,
                        page >> 20,
                        directory.display(),
                        free_huge_pages().map_or("an unknown number".to_string(), |n| n.to_string())
                    ))
                }
                _ => Error::Io(format!("cannot map {} ({len} bytes): {e}", path.display())),
            })
        })?;
        let base = NonNull::new(map.as_mut_ptr()).expect("mmap never returns a null mapping");
        advise_huge_pages_raw(base.as_ptr() as usize, len);
        Ok(Region { _map: map, base, path, owner: true })
    }

    /// Creates a region at exactly `path` (a new file, mode 0600) that outlives
    /// its handles: nothing removes it (a file store's columns, reopened later with
    /// [`Region::open`]). The free-space check asks for `need` bytes.
    pub fn create_file(path: &Path, len: usize, need: usize) -> Result<Region> {
        let directory = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
        let st = file_system(directory)?;
        let free = free_bytes(&st);
        if need.min(len) as u64 > free {
            return Err(Error::ResourceExhausted(format!(
                "a file store of {:.2} GiB does not fit in {} ({:.2} GiB free): lower the capacity or pass another \
                 directory",
                need.min(len) as f64 / GIB,
                directory.display(),
                free as f64 / GIB
            )));
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .map_err(|e| Error::Io(format!("cannot create the store file {}: {e}", path.display())))?;
        let len = len.max(4096);
        let made = file
            .set_len(len as u64)
            .map_err(|e| Error::Io(format!("cannot size the store file {} to {len} bytes: {e}", path.display())))
            // SAFETY: the file was just created by us with O_EXCL and mode 0600; nothing
            // else maps it yet, and it is never truncated while mapped.
            .and_then(|()| unsafe { MmapMut::map_mut(&file) }.map_err(|e| Error::Io(format!("cannot map {}: {e}", path.display()))));
        let mut map = match made {
            Ok(m) => m,
            Err(e) => {
                let _ = std::fs::remove_file(path);
                return Err(e);
            }
        };
        let base = NonNull::new(map.as_mut_ptr()).expect("mmap never returns a null mapping");
        Ok(Region { _map: map, base, path: path.to_path_buf(), owner: false })
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
        // On a huge=advise tmpfs, pages first touched through this mapping are huge
        // too (a hint; nothing on other file systems).
        advise_huge_pages_raw(base.as_ptr() as usize, len);
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

    /// Writes the region's dirty pages to its file and waits for them (msync).
    pub fn sync(&self) -> Result<()> {
        self._map.flush().map_err(|e| Error::Io(format!("cannot write {} back: {e}", self.path.display())))
    }

    /// Tells the kernel that rows are read at random (`MADV_RANDOM`): a page fault
    /// reads its page, not the 128 KiB of readahead meant for sequential reads, which
    /// on a file store larger than memory would evict 31 pages for every one used.
    /// Only a hint: failures are ignored.
    pub fn advise_random(&self) {
        // SAFETY: the range is this region's own mapping; MADV_RANDOM changes no data.
        unsafe { libc::madvise(self.base().cast(), self.len(), libc::MADV_RANDOM) };
    }

    /// Bytes the file behind the region takes in its file system now (pages written
    /// and not given back; a sparse region's holes count for nothing); 0 once the
    /// file is removed. (No descriptor is kept open for this: a region holds none.)
    pub fn allocated_bytes(&self) -> u64 {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(&self.path).map_or(0, |m| m.blocks() * 512)
    }

    /// Gives the whole pages inside `[offset, offset + len)` back to the file system
    /// (`MADV_REMOVE`: a hole; they read as zeros until written again). Partial pages
    /// at either end are kept. Returns false where the file system cannot punch holes
    /// (the bytes then stay as they were, and allocated).
    ///
    /// # Safety
    /// No one may read the range expecting its old bytes, nor write it, during or
    /// after the call, until its owner writes it again.
    pub unsafe fn remove(&self, offset: usize, len: usize) -> bool {
        const PAGE: usize = 4096;
        let end = (offset + len).min(self.len()) / PAGE * PAGE;
        let start = offset.next_multiple_of(PAGE);
        if start >= end {
            return true;
        }
        // SAFETY: the pages are inside the mapping (clamped above); MADV_REMOVE on a
        // shared file mapping punches a hole in the file, which the caller's contract
        // allows.
        let rc = unsafe { libc::madvise(self.base().add(start).cast(), end - start, libc::MADV_REMOVE) };
        rc == 0
    }

    /// Bytes of this mapping that this process reaches through huge pages now
    /// (hugetlbfs pages, or tmpfs huge pages mapped whole), from /proc/self/smaps.
    /// Pages not yet touched count for nothing.
    pub fn huge_page_bytes(&self) -> u64 {
        let Ok(smaps) = std::fs::read_to_string("/proc/self/smaps") else { return 0 };
        let start = format!("{:x}-", self.base.as_ptr() as usize);
        let mut kib = 0u64;
        let mut inside = false;
        for line in smaps.lines() {
            let header = line.split(' ').next().is_some_and(|r| r.contains('-') && !r.ends_with(':'));
            if header {
                inside = line.starts_with(&start);
                continue;
            }
            if !inside {
                continue;
            }
            let Some((key, value)) = line.split_once(':') else { continue };
            if matches!(key, "ShmemPmdMapped" | "FilePmdMapped" | "Shared_Hugetlb" | "Private_Hugetlb") {
                kib += value.trim().trim_end_matches("kB").trim().parse::<u64>().unwrap_or(0);
            }
        }
        kib * 1024
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
        let r = Region::create(&default_directory(), 10_000, false).unwrap();
        let path = r.path().to_path_buf();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 10_000);
        drop(r);
        assert!(!path.exists());
    }

    #[test]
    fn a_region_larger_than_the_file_system_is_refused() {
        let e = Region::create(&default_directory(), usize::MAX / 4, false).err().unwrap().to_string();
        assert!(e.contains("does not fit") && e.contains("GiB free"), "{e}");
    }

    #[test]
    fn an_attached_region_sees_the_owners_bytes_and_leaves_the_file() {
        let owner = Region::create(&default_directory(), 8192, false).unwrap();
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
    fn mount_options_are_read_by_key() {
        assert_eq!(mount_option("rw,size=8g,huge=within_size", "huge"), Some("within_size"));
        assert_eq!(mount_option("rw,nohuge=1,size=8g", "huge"), None);
        assert_eq!(mount_option("rw,size=8g", "huge"), None);
        // "/" is always mounted.
        assert!(mount_options(Path::new("/")).is_some());
    }

    #[test]
    fn huge_pages_on_small_pages_are_refused_and_leave_no_file() {
        let dirs = [default_directory(), std::env::temp_dir()];
        let Some(parent) = dirs.iter().find(|d| !backing(d).unwrap().is_huge()) else {
            return; // every candidate directory hands out huge pages on this machine
        };
        // A directory of its own on the same file system: other tests create files
        // in the shared ones meanwhile.
        let dir = parent.join(format!("reprise-huge-test-{}", std::process::id()));
        std::fs::create_dir(&dir).unwrap();
        let e = Region::create(&dir, 10_000, true).err().unwrap().to_string();
        assert!(e.contains("huge_pages=True needs") && e.contains(&dir.display().to_string()), "{e}");
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
        // Without huge pages the same directory works, at the asked length.
        let r = Region::create(&dir, 10_000, false).unwrap();
        assert_eq!(r.len(), 10_000);
        assert_eq!(r.huge_page_bytes(), 0);
        drop(r);
        std::fs::remove_dir(&dir).unwrap();
    }

    #[test]
    fn only_files_of_processes_that_are_gone_are_stale() {
        let dir = std::env::temp_dir().join(format!("reprise-stale-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead = child.id();
        child.wait().unwrap();
        // SAFETY: getppid has no preconditions.
        let parent = unsafe { libc::getppid() };
        for (pid, tag) in [(dead, "dead"), (std::process::id(), "mine"), (parent as u32, "live")] {
            std::fs::write(dir.join(format!("reprise-{pid}-0-{tag}")), b"x").unwrap();
        }
        std::fs::write(dir.join("unrelated-file"), b"x").unwrap();
        let stale: Vec<String> = stale_regions(&dir).iter().map(|(p, _)| p.file_name().unwrap().to_string_lossy().into_owned()).collect();
        assert_eq!(stale, [format!("reprise-{dead}-0-dead")]);
        assert_eq!(remove_stale_regions(&dir).len(), 1);
        assert!(stale_regions(&dir).is_empty());
        let left = std::fs::read_dir(&dir).unwrap().count();
        assert_eq!(left, 3, "the live, own and unrelated files stay");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn missing_directory_is_a_clear_error() {
        let e = Region::create(Path::new("/nonexistent-reprise-dir"), 100, false).err().unwrap();
        assert!(e.to_string().contains("/nonexistent-reprise-dir"), "{e}");
    }
}
