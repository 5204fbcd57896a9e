//! Durable file stores: commits that put a file store's items on disk while it runs,
//! so that a process killed with the store open loses nothing a commit covered.
//!
//! # A commit
//! 1. pins a new epoch of the store (see `blocks`' module doc);
//! 2. takes every table's index (a moment each);
//! 3. writes the columns' dirty pages back (`msync`): the rows of every item in
//!    those indexes were written before its item existed, so they are on disk now;
//! 4. writes the indexes as a checkpoint *in place* (its rows stay in the columns
//!    file) into `index/ckpt-<ns>`, renamed into place and the directory synced;
//! 5. answers the flushes waiting for it and unpins the epoch of the commit before
//!    (whose index the next commit removes: loading takes the newest).
//!
//! # Why the rows of a committed index stay as they are
//! A block is reused only after its last reference goes (no item, writer or sample
//! holds it). From the moment a commit pins its epoch, a block whose last reference
//! goes waits in limbo until that epoch is unpinned, which step 5 of the *next*
//! commit does only once a newer index is on disk. So no block that the newest
//! index on disk references is ever rewritten: after a crash, [`crate::checkpoint::load`]
//! of that index over the columns file (`reserve_blocks_in_place`) finds every
//! item's rows as they were when it was committed. Rows written after the commit
//! went into other blocks (free when the commit ran) or past the committed rows of
//! a block a writer still held, which the index does not reference.
//!
//! # Group commit
//! One commit runs at a time. A caller (a writer's flush, a server's answer to one)
//! needs a commit that *started* after its items were in their tables: it runs one
//! if none is running, or waits for the running one to end and then for the next,
//! which the first waiter to wake starts. However many flushes arrive during a
//! commit, they share the next one. A commit's cost is an `msync` of what was
//! written since the last one plus writing every table's index (about 64 bytes an
//! item), so it grows with the tables, not with the flushes.
//!
//! # Room
//! While a commit's epoch is pinned, blocks whose items went wait for the next
//! commit. A lease that finds none free commits (`Store::lease_block`), and a full
//! store evicts its oldest blocks in groups (1/64 of its blocks) so that one commit
//! frees many.
//!
//! Compressed columns are not durable: compressing a block rewrites it in place
//! (its frames in the slot, then its raw pages punched out) after the commit that
//! may reference its raw rows, so a crash could leave neither on disk.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use crate::checkpoint::{self, SaveOptions};
use crate::error::{Error, Result};
use crate::invalid;
use crate::store::{CommitStats, Commits, Store};
use crate::table::Table;

/// The commits of one durable file store (see the module doc).
pub struct Durable {
    /// Where the committed indexes go (`<store directory>/index`).
    index: PathBuf,
    state: Mutex<CommitState>,
    ended: Condvar,
}

#[derive(Default)]
struct CommitState {
    /// Commits started; commit `n` is the `n`-th.
    started: u64,
    /// Commits ended (they end in order: one runs at a time).
    ended: u64,
    running: bool,
    /// The newest commit that succeeded.
    succeeded: u64,
    /// Why the newest failed commit failed.
    failure: Option<String>,
    /// The epoch pinned by the newest successful commit: it keeps that commit's rows
    /// (a number, not an [`crate::store::Epoch`], which would hold the store that holds this).
    epoch: Option<u64>,
    /// The index the newest successful commit wrote.
    written: Option<PathBuf>,
    /// The one it replaced, which the next commit removes (loading takes the newest).
    stale: Option<PathBuf>,
    /// Time spent in commits, and their count, for `stats`.
    busy: Duration,
    last: Duration,
}

/// Makes the file store `store` durable: from now on [`Store::commit`] puts every
/// item of its tables on disk, with their indexes in `index`. Refused for a store in
/// memory, one with compressed fields, or twice.
pub fn make_durable(store: &Store, index: &Path) -> Result<()> {
    if !store.persistent() {
        return Err(invalid!("durable stores are file stores: this store is in shared memory"));
    }
    if let Some(f) = store.signature().fields().iter().find(|f| f.compress.is_some()) {
        return Err(invalid!(
            "a durable store cannot have compressed fields yet (field '{}' is {}): compressing a block rewrites \
             rows a commit may refer to; store it raw, or drop durable",
            f.name,
            f.describe()
        ));
    }
    let durable = Durable { index: index.to_path_buf(), state: Mutex::new(CommitState::default()), ended: Condvar::new() };
    store.set_commits(Box::new(durable))
}

impl Commits for Durable {
    /// Returns once a commit that started after this call began has ended: every
    /// item in `store`'s tables before the call is on disk, or the error of the
    /// commit that failed.
    fn commit(&self, store: &Store) -> Result<()> {
        let mut st = self.state.lock();
        let need = st.started + 1;
        loop {
            if st.ended >= need {
                return match st.succeeded >= need {
                    true => Ok(()),
                    false => Err(Error::Io(st.failure.clone().unwrap_or_default())),
                };
            }
            if st.running {
                self.ended.wait(&mut st);
                continue;
            }
            st.running = true;
            st.started += 1;
            let n = st.started;
            let first = st.written.is_none();
            let stale = st.stale.take();
            drop(st);
            let began = Instant::now();
            // The index two commits back: not removed by the commit that made it stale,
            // so that its flushes were answered without waiting for the removal.
            if let Some(path) = stale {
                let _ = std::fs::remove_dir_all(path);
            }
            let outcome = self.run(store, first);
            st = self.state.lock();
            st.running = false;
            st.ended = n;
            let took = began.elapsed();
            st.last = took;
            st.busy += took;
            let older = match outcome {
                Ok((epoch, kept)) => {
                    st.succeeded = n;
                    st.stale = std::mem::replace(&mut st.written, kept);
                    st.epoch.replace(epoch)
                }
                Err(e) => {
                    st.failure = Some(format!("the durable store's commit failed, so the items since the last one are not on disk: {e}"));
                    None
                }
            };
            self.ended.notify_all();
            drop(st);
            // The previous commit's blocks may be reused from now on (a newer index is on disk).
            if let Some(epoch) = older {
                store.allocator().unpin(epoch);
            }
            st = self.state.lock();
        }
    }

    fn stats(&self) -> CommitStats {
        let st = self.state.lock();
        CommitStats { commits: st.succeeded, seconds: st.busy.as_secs_f64(), last_seconds: st.last.as_secs_f64() }
    }
}

impl Durable {
    /// One commit (the module doc's steps 1 to 4); returns its pinned epoch and index.
    /// The `first` of this store also removes what earlier runs left (before any other
    /// commit can have written one).
    fn run(&self, store: &Store, first: bool) -> Result<(u64, Option<PathBuf>)> {
        let epoch = store.allocator().pin();
        match write_index(store, &self.index) {
            Ok(kept) => {
                if let (true, Some(kept)) = (first, &kept) {
                    prune(&self.index, kept);
                }
                Ok((epoch, kept))
            }
            Err(e) => {
                store.allocator().unpin(epoch);
                Err(e)
            }
        }
    }

}

/// Writes the index of every table over the file store `store` in place into a new
/// `ckpt-<ns>` under `index` (the columns are written back after the indexes are
/// taken and before they are written) and removes the older ones; with no table,
/// writes the columns back and removes `index`. Returns the new index.
pub fn save_index(store: &Store, index: &Path) -> Result<Option<PathBuf>> {
    // Blocks whose items go while the index is written are not reused before it is
    // on disk (the save holds no pins on the blocks it references).
    let _epoch = store.pin();
    let kept = write_index(store, index)?;
    if let Some(kept) = &kept {
        prune(index, kept);
    }
    Ok(kept)
}

/// [`save_index`] but for removing the older indexes and pinning an epoch, which
/// the caller holds across it (a commit keeps its own until the next).
fn write_index(store: &Store, index: &Path) -> Result<Option<PathBuf>> {
    if !store.persistent() {
        return Err(invalid!("only a file store's index is saved in place"));
    }
    let tables = Table::over(store);
    if tables.is_empty() {
        store.columns().sync()?;
        match std::fs::remove_dir_all(index) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(Error::Io(format!("cannot remove {}: {e}", index.display())))
            }
            _ => return Ok(None),
        }
    }
    let kept = checkpoint::save(index, &tables, SaveOptions { in_place: true, ..Default::default() })?;
    Ok(Some(kept))
}

/// Removes every index under `index` but `kept` (best effort: a leftover one is
/// older, and the newest complete one is the one loaded).
fn prune(index: &Path, kept: &Path) {
    let Ok(entries) = std::fs::read_dir(index) else { return };
    for entry in entries.flatten() {
        let path = entry.path();
        if path != kept && entry.file_name().to_string_lossy().starts_with("ckpt-") {
            let _ = std::fs::remove_dir_all(path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::tests::{config, put, signature, TempDir};
    use crate::checkpoint::{load, LoadOptions};
    use crate::rate_limiter::RateLimiterConfig;
    use crate::selectors::SelectorSpec;
    use crate::signature::{DType, Field, Signature};

    fn durable_store(dir: &TempDir, capacity: u64) -> Store {
        std::fs::create_dir_all(&dir.0).unwrap();
        let store = Store::create_file(signature(), capacity, 4, &dir.0.join("columns")).unwrap();
        make_durable(&store, &dir.0.join("index")).unwrap();
        store
    }

    fn table(store: &Store, max_size: u64) -> Table {
        let limiter = RateLimiterConfig::min_size(1).unwrap();
        Table::new(config("t", SelectorSpec::Uniform, SelectorSpec::Fifo, max_size, limiter), store).unwrap()
    }

    /// The items of the newest committed index, loaded over the columns file in place.
    fn committed_keys(dir: &TempDir) -> Vec<u64> {
        let index = checkpoint::latest(&dir.0.join("index")).unwrap();
        let loaded = load(&index, LoadOptions::default()).unwrap();
        let mut keys: Vec<u64> = loaded.tables[0].items().iter().map(|i| i.key).collect();
        keys.sort_unstable();
        keys
    }

    #[test]
    fn blocks_whose_items_went_after_a_commit_are_reused_only_after_the_next() {
        let dir = TempDir::new("durable-limbo");
        let store = durable_store(&dir, 64);
        let t = table(&store, 50);
        let keys = put(&t, 4, 4, 0, &[1.0; 4]); // four blocks of four steps
        store.commit().unwrap();
        let free = store.free_blocks();
        assert_eq!(t.delete(&keys[..2]), 2);
        // The committed index still refers to those two blocks: they wait.
        assert_eq!((store.free_blocks(), store.limbo_blocks()), (free, 2));
        store.commit().unwrap();
        assert_eq!((store.free_blocks(), store.limbo_blocks()), (free + 2, 0));
        assert_eq!(store.durable().unwrap().stats().commits, 2);
    }

    #[test]
    fn the_newest_index_holds_what_the_last_commit_covered() {
        let dir = TempDir::new("durable-newest");
        let store = durable_store(&dir, 256);
        let t = table(&store, 50);
        let mut committed = put(&t, 5, 2, 0, &[1.0; 5]);
        store.commit().unwrap();
        let gone = put(&t, 3, 2, 100, &[1.0; 3]); // not committed
        assert_eq!(t.delete(&committed[..1]), 1);
        committed.sort_unstable();
        let names: Vec<_> = std::fs::read_dir(dir.0.join("index")).unwrap().collect();
        assert_eq!(names.len(), 1, "older indexes are removed");
        assert_eq!(committed_keys(&dir), committed);
        assert!(gone.iter().all(|k| !committed.contains(k)));
    }

    #[test]
    fn a_full_durable_store_evicts_a_group_per_commit() {
        let dir = TempDir::new("durable-full");
        let store = durable_store(&dir, 64 * 4 * 2); // 128 blocks: groups of 2
        assert_eq!(crate::store::durable_eviction_group(store.num_blocks()), 2);
        let t = table(&store, 500);
        for round in 0..8 {
            put(&t, 64, 4, round * 1000, &[1.0; 64]);
        }
        assert!(t.info().num_store_evictions > 0);
        let commits = store.durable().unwrap().stats().commits;
        assert!(commits > 0 && commits < 2 * 128, "{commits} commits for 384 evicted blocks");
    }

    #[test]
    fn a_failed_commit_says_why_and_a_later_one_succeeds() {
        let dir = TempDir::new("durable-fail");
        let store = durable_store(&dir, 64);
        let t = table(&store, 50);
        put(&t, 2, 2, 0, &[1.0; 2]);
        std::fs::write(dir.0.join("index"), b"a file where the index directory goes").unwrap();
        let e = store.commit().unwrap_err().to_string();
        assert!(e.starts_with("the durable store's commit failed, so the items since the last one are not on disk"), "{e}");
        std::fs::remove_file(dir.0.join("index")).unwrap();
        store.commit().unwrap();
        assert_eq!(committed_keys(&dir).len(), 2);
    }

    /// `{key: act values of its steps}` of `table`'s items, read through a snapshot.
    fn contents(table: &Table) -> std::collections::BTreeMap<u64, Vec<i64>> {
        let (snap, pins) = table.snapshot();
        snap.items
            .iter()
            .map(|item| {
                let mut values = Vec::new();
                for r in &item.ranges {
                    let mut buf = vec![0u8; r.len as usize * 8];
                    pins.read_rows(1, r.start, &mut buf).unwrap();
                    values.extend(buf.chunks(8).map(|b| i64::from_ne_bytes(b.try_into().unwrap())));
                }
                (item.key, values)
            })
            .collect()
    }

    #[derive(Clone, Debug)]
    enum Op {
        /// Insert `n` items of `steps` steps.
        Insert(usize, usize),
        /// Delete every item whose key is `k` modulo `m`.
        Delete(u64, u64),
        Commit,
        /// Load the newest index over the columns file, as a restart after a crash would.
        Crash,
    }

    fn op() -> impl proptest::strategy::Strategy<Value = Op> {
        use proptest::prelude::*;
        prop_oneof![
            4 => (1usize..12, 1usize..4).prop_map(|(n, s)| Op::Insert(n, s)),
            1 => (0u64..3, 2u64..5).prop_map(|(k, m)| Op::Delete(k, m)),
            2 => Just(Op::Commit),
            1 => Just(Op::Crash),
        ]
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig { cases: 48, ..Default::default() })]

        /// Against a reference (each item's rows as inserted, the table's contents at each
        /// commit): whatever runs after a commit (inserts that fill the store many times
        /// over, FIFO and store evictions, deletes), the newest index on disk loads with
        /// every item's rows as they were inserted, and with exactly the items the last
        /// commit saw when no lease committed since (a full store's leases commit too).
        #[test]
        fn the_newest_index_always_loads_what_its_commit_saw(ops in proptest::collection::vec(op(), 1..40)) {
            let dir = TempDir::new("durable-prop");
            let store = durable_store(&dir, 64); // 16 blocks of 4 steps
            let t = table(&store, 24);
            let mut committed: Option<(u64, std::collections::BTreeMap<u64, Vec<i64>>)> = None;
            let mut inserted = std::collections::BTreeMap::new();
            let mut next = 0i64;
            let commits = || store.durable().unwrap().stats().commits;
            for op in ops {
                match op {
                    Op::Insert(n, steps) => {
                        let keys = put(&t, n, steps, next, &vec![1.0; n]);
                        for (i, key) in keys.into_iter().enumerate() {
                            let first = next + (i * steps) as i64;
                            inserted.insert(key, (first..first + steps as i64).collect::<Vec<i64>>());
                        }
                        next += (n * steps) as i64;
                    }
                    Op::Delete(k, m) => {
                        let keys: Vec<u64> = t.items().iter().map(|i| i.key).filter(|key| key % m == k).collect();
                        t.delete(&keys);
                    }
                    Op::Commit => {
                        store.commit().unwrap();
                        committed = Some((commits(), contents(&t)));
                    }
                    Op::Crash => {
                        let Some((at, want)) = &committed else { continue };
                        let index = checkpoint::latest(&dir.0.join("index")).unwrap();
                        let loaded = load(&index, LoadOptions::default()).unwrap();
                        let got = contents(&loaded.tables[0]);
                        for (key, values) in &got {
                            proptest::prop_assert_eq!(Some(values), inserted.get(key), "item {} changed its rows", key);
                        }
                        if commits() == *at {
                            proptest::prop_assert_eq!(&got, want);
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn only_a_raw_file_store_becomes_durable_once() {
        let dir = TempDir::new("durable-refused");
        let memory = Store::new(signature(), 64, 4, None).unwrap();
        let e = make_durable(&memory, &dir.0.join("index")).unwrap_err().to_string();
        assert_eq!(e, "durable stores are file stores: this store is in shared memory");
        memory.unlink();
        std::fs::create_dir_all(&dir.0).unwrap();
        let packed = Signature::new(vec![Field::new("img", DType::UInt8, vec![8, 8]).unwrap().compressed(Some(3)).unwrap()]).unwrap();
        let store = Store::create_file(packed, 64, 4, &dir.0.join("packed")).unwrap();
        let e = make_durable(&store, &dir.0.join("index")).unwrap_err().to_string();
        assert!(e.starts_with("a durable store cannot have compressed fields yet (field 'img' is"), "{e}");
        assert!(store.durable().is_none());
        let store = durable_store(&dir, 64);
        assert_eq!(make_durable(&store, &dir.0.join("index")).unwrap_err().to_string(), "this store is already durable");
    }
}
