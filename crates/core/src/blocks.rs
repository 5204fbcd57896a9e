//! Blocks: the unit of allocation, reference counting and reuse.
//!
//! A store's rows are cut into blocks of `block_steps` consecutive rows. The
//! allocator hands free blocks out in the order they came free (a FIFO, so that
//! blocks freed by FIFO eviction are reused in order and consecutive leases tend to
//! be adjacent in memory). A block's reference count is the number of live items,
//! samples being collected and writers that still hold it; when it drops to zero the
//! block returns to the free queue. Counts are atomics, so retaining and releasing
//! never takes a lock; only the free queue is guarded, and it is a leaf lock (no
//! other lock is taken while it is held).
//!
//! # Epochs
//! A sample whose rows a device reads after the draw has returned (the GPU path's
//! gathers run on a CUDA stream) holds no reference per block. It pins an *epoch*
//! instead, before it draws: while any epoch is pinned, a block whose last reference
//! goes waits in *limbo*, tagged with the newest epoch handed out so far, rather than
//! returning to the free queue. It is freed once every epoch up to its tag has been
//! unpinned: an epoch pinned later began its draw after the block's items were gone,
//! so it cannot read the block. One pin per batch replaces a reference per item
//! (a random cache miss each), and the device's completion (a CUDA event) unpins it.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use parking_lot::{Condvar, Mutex};

use crate::error::{Error, Result};
use crate::wait::Wait;

pub struct BlockAllocator {
    block_steps: u32,
    refcounts: Box<[AtomicU32]>,
    state: Mutex<AllocState>,
    /// Signalled when an unpin freed blocks out of limbo.
    reclaimed: Condvar,
    /// Set by the first pin: from then on a lease may wait for limbo (see [`BlockAllocator::wait_for_limbo`]).
    pinned_ever: AtomicBool,
}

struct AllocState {
    free: VecDeque<u32>,
    /// Leased blocks, oldest lease first, as `(block, lease number)`; entries whose
    /// block was freed or leased again since are stale and skipped.
    order: VecDeque<(u32, u32)>,
    leases: Vec<u32>,
    /// The next epoch to hand out.
    next_epoch: u64,
    /// Pinned epochs and how many pins each has.
    pinned: BTreeMap<u64, u32>,
    /// Blocks freed while epochs were pinned, as `(newest epoch handed out then, block)`;
    /// tags never decrease along the queue.
    limbo: VecDeque<(u64, u32)>,
}

impl AllocState {
    /// A block whose last reference went: free, or in limbo while epochs are pinned.
    fn give_back(&mut self, block: u32) {
        if self.pinned.is_empty() {
            self.free.push_back(block);
        } else {
            self.limbo.push_back((self.next_epoch - 1, block));
        }
    }

    /// Frees the blocks of limbo that no pinned epoch can read; returns how many.
    fn reclaim(&mut self) -> usize {
        let oldest = self.pinned.keys().next().copied().unwrap_or(u64::MAX);
        let mut freed = 0;
        while let Some(&(tag, block)) = self.limbo.front() {
            if tag >= oldest {
                break;
            }
            self.limbo.pop_front();
            self.free.push_back(block);
            freed += 1;
        }
        freed
    }
}

impl BlockAllocator {
    pub fn new(num_blocks: u32, block_steps: u32) -> BlockAllocator {
        BlockAllocator {
            block_steps,
            refcounts: (0..num_blocks).map(|_| AtomicU32::new(0)).collect(),
            state: Mutex::new(AllocState {
                free: (0..num_blocks).collect(),
                order: VecDeque::new(),
                leases: vec![0; num_blocks as usize],
                next_epoch: 0,
                pinned: BTreeMap::new(),
                limbo: VecDeque::new(),
            }),
            reclaimed: Condvar::new(),
            pinned_ever: AtomicBool::new(false),
        }
    }

    pub fn block_steps(&self) -> u32 {
        self.block_steps
    }

    pub fn num_blocks(&self) -> u32 {
        self.refcounts.len() as u32
    }

    /// Takes a free block with a reference count of one, owned by the caller.
    pub fn lease(&self) -> Result<u32> {
        let mut st = self.state.lock();
        let block = st.free.pop_front().ok_or_else(|| self.full_error())?;
        st.leases[block as usize] = st.leases[block as usize].wrapping_add(1);
        let stamp = st.leases[block as usize];
        st.order.push_back((block, stamp));
        if st.order.len() > 2 * self.refcounts.len() + 64 {
            let AllocState { order, leases, .. } = &mut *st;
            order.retain(|&(b, s)| leases[b as usize] == s && self.refcount(b) > 0);
        }
        drop(st);
        let previous = self.refcounts[block as usize].swap(1, Ordering::AcqRel);
        debug_assert_eq!(previous, 0, "a free block had references");
        Ok(block)
    }

    pub(crate) fn full_error(&self) -> Error {
        Error::ResourceExhausted(format!(
            "store is full: all {} blocks ({} steps) are held by writers, samples being collected \
             or items of tables that keep their items when the store is full (queues and stacks); \
             give the store a larger capacity or lower those tables' max_size",
            self.num_blocks(),
            self.num_blocks() as u64 * self.block_steps as u64
        ))
    }

    /// The leased block with the oldest lease, taken out of the lease order (give it
    /// back with [`BlockAllocator::requeue`] if it stays leased).
    pub fn oldest_leased(&self) -> Option<u32> {
        let mut st = self.state.lock();
        while let Some((b, stamp)) = st.order.pop_front() {
            if st.leases[b as usize] == stamp && self.refcount(b) > 0 {
                return Some(b);
            }
        }
        None
    }

    /// Puts a still-leased block back at the young end of the lease order.
    pub fn requeue(&self, block: u32) {
        let mut st = self.state.lock();
        let stamp = st.leases[block as usize];
        st.order.push_back((block, stamp));
    }

    /// Adds a reference to a block the caller already holds a reference to.
    pub fn retain(&self, block: u32) {
        self.retain_n(block, 1)
    }

    /// Adds `n` references at once (see [`BlockAllocator::retain`]).
    pub fn retain_n(&self, block: u32, n: u32) {
        let previous = self.refcounts[block as usize].fetch_add(n, Ordering::AcqRel);
        debug_assert!(previous > 0, "retained block {block} that nobody held");
    }

    /// Takes specific free blocks out of the free queue with one reference each
    /// (restoring a checkpoint). Fails, changing nothing, if one is not free.
    pub fn reserve(&self, blocks: &[u32]) -> Result<()> {
        let mut st = self.state.lock();
        let mut wanted = vec![false; self.refcounts.len()];
        for &b in blocks {
            wanted[b as usize] = true;
        }
        let found = st.free.iter().filter(|&&b| wanted[b as usize]).count();
        if found != blocks.len() {
            return Err(Error::InvalidArgument(format!(
                "{} of the {} blocks to restore are in use; restore into a new store",
                blocks.len() - found,
                blocks.len()
            )));
        }
        st.free.retain(|&b| !wanted[b as usize]);
        // Leased now, as far as store-pressure eviction is concerned: their items
        // must be evictable like any others once the restore is done.
        for &b in blocks {
            st.leases[b as usize] = st.leases[b as usize].wrapping_add(1);
            let stamp = st.leases[b as usize];
            st.order.push_back((b, stamp));
        }
        drop(st);
        for &b in blocks {
            self.refcounts[b as usize].store(1, Ordering::Release);
        }
        Ok(())
    }

    /// Drops a reference; the last one returns the block to the free queue.
    pub fn release(&self, block: u32) {
        self.release_n(block, 1)
    }

    /// Drops `n` references at once (see [`BlockAllocator::release`]).
    pub fn release_n(&self, block: u32, n: u32) {
        let previous = self.refcounts[block as usize].fetch_sub(n, Ordering::AcqRel);
        debug_assert!(previous >= n, "released block {block} more times than it was held");
        if previous == n {
            self.state.lock().give_back(block);
        }
    }

    /// Pins a new epoch (see the module doc): until [`BlockAllocator::unpin`], no block
    /// whose last reference goes from now on is reused. Pin before drawing.
    pub fn pin(&self) -> u64 {
        self.pinned_ever.store(true, Ordering::Relaxed);
        let mut st = self.state.lock();
        let epoch = st.next_epoch;
        st.next_epoch += 1;
        *st.pinned.entry(epoch).or_insert(0) += 1;
        epoch
    }

    /// Unpins an epoch [`BlockAllocator::pin`] returned; blocks no pinned epoch can
    /// read any more leave limbo for the free queue.
    pub fn unpin(&self, epoch: u64) {
        let mut st = self.state.lock();
        match st.pinned.get_mut(&epoch) {
            Some(n) if *n > 1 => *n -= 1,
            Some(_) => {
                st.pinned.remove(&epoch);
            }
            None => {
                debug_assert!(false, "unpinned epoch {epoch} that was not pinned");
                return;
            }
        }
        if st.reclaim() > 0 {
            self.reclaimed.notify_all();
        }
    }

    /// True once an epoch was ever pinned (a lease may then wait for limbo).
    pub fn pinned_ever(&self) -> bool {
        self.pinned_ever.load(Ordering::Relaxed)
    }

    /// Blocks in limbo: free of references, waiting for pinned epochs to end.
    pub fn limbo_blocks(&self) -> usize {
        self.state.lock().limbo.len()
    }

    /// When no block is free but some are in limbo, waits up to `timeout` for an
    /// unpin to free one. Returns whether a block is free.
    pub fn wait_for_limbo(&self, timeout: Duration) -> bool {
        let mut st = self.state.lock();
        if st.free.is_empty() && !st.limbo.is_empty() {
            let deadline = std::time::Instant::now() + timeout;
            while st.free.is_empty() && !st.limbo.is_empty() {
                if self.reclaimed.wait_until(&mut st, deadline).timed_out() {
                    break;
                }
            }
        }
        !st.free.is_empty()
    }

    pub fn refcount(&self, block: u32) -> u32 {
        self.refcounts[block as usize].load(Ordering::Acquire)
    }

    pub fn free_blocks(&self) -> usize {
        self.state.lock().free.len()
    }
}

/// Where a writer's blocks come from: the store's own allocator in process, or
/// the process that owns the store, over a socket, for local clients (same host).
///
/// # Safety
/// A writer writes the rows of the blocks it leases through
/// [`Columns::write_rows`](crate::columns::Columns::write_rows), relying on this
/// contract: `lease` returns a block of `columns()` that nobody else holds, reads or
/// writes until it is freed; the block is not freed (so not leased again) while any
/// reference taken by `lease` or `retain` has not been given back by `release`.
pub unsafe trait BlockSource {
    fn columns(&self) -> &crate::columns::Columns;
    /// A fresh block with one reference owned by the caller. Waits (for blocks
    /// in limbo, or for the server that owns the store) within `wait`.
    fn lease(&mut self, wait: Wait<'_>) -> Result<u32>;
    fn retain(&mut self, block: u32);
    fn release(&mut self, block: u32);
    /// A count that grows each time the store was found full (see
    /// [`crate::Store::pressure`]); sources that cannot tell keep it at 0.
    fn pressure(&self) -> u64 {
        0
    }
}

/// A run of rows inside one block: rows `[start, start + len)` of the store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Run {
    pub block: u32,
    pub start: u64,
    pub len: u32,
}

/// Fills blocks row by row. The cursor holds one reference on its current block
/// and gives it up when the block is full (or when the cursor is closed).
#[derive(Default)]
pub struct Cursor {
    current: Option<(u32, u32)>,
}

impl Cursor {
    /// The next run of at most `rows` rows, in the current block or in a block
    /// newly leased from `source`. The caller gets no reference of its own on the
    /// run's block.
    pub fn take(&mut self, source: &mut impl BlockSource, rows: u32, wait: Wait<'_>) -> Result<Run> {
        debug_assert!(rows > 0);
        let bs = source.columns().block_steps();
        let (block, used) = match self.current {
            Some((b, used)) if used < bs => (b, used),
            other => {
                let fresh = source.lease(wait)?;
                // SAFETY: the block was just leased to us: nobody else holds it.
                unsafe { source.columns().reset_block(fresh) };
                if let Some((old, _)) = other {
                    source.release(old);
                }
                (fresh, 0)
            }
        };
        let len = rows.min(bs - used);
        self.current = Some((block, used + len));
        Ok(Run { block, start: block as u64 * bs as u64 + used as u64, len })
    }

    /// Rows left in the current block (0 when the next `take` leases one).
    pub fn room(&self, block_steps: u32) -> u32 {
        self.current.map_or(0, |(_, used)| block_steps - used)
    }

    /// Gives up the current block. Its compressed columns (if any) are compressed
    /// as they are: the caller has written every row it took, and no one writes
    /// the rest before the block is leased again.
    pub fn close(&mut self, source: &mut impl BlockSource) {
        if let Some((b, _)) = self.current.take() {
            // SAFETY: the cursor's rows are written (the caller's writes return
            // before it closes) and the block is still ours until the release.
            unsafe { source.columns().compress_block(b) };
            source.release(b);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_return_to_the_free_queue_on_last_release() {
        let a = BlockAllocator::new(2, 4);
        let b = a.lease().unwrap();
        a.retain(b);
        assert_eq!(a.refcount(b), 2);
        a.release(b);
        assert_eq!(a.free_blocks(), 1);
        a.release(b);
        assert_eq!(a.free_blocks(), 2);
    }

    #[test]
    fn full_allocator_names_the_problem() {
        let a = BlockAllocator::new(1, 8);
        a.lease().unwrap();
        let e = a.lease().unwrap_err().to_string();
        assert!(e.contains("store is full") && e.contains("8 steps"), "{e}");
    }

    #[test]
    fn freed_blocks_are_reused_in_order() {
        let a = BlockAllocator::new(3, 1);
        let x: Vec<u32> = (0..3).map(|_| a.lease().unwrap()).collect();
        assert_eq!(x, vec![0, 1, 2]);
        a.release(1);
        a.release(0);
        assert_eq!(a.lease().unwrap(), 1);
        assert_eq!(a.lease().unwrap(), 0);
    }

    #[test]
    fn lease_order_skips_freed_blocks() {
        let a = BlockAllocator::new(3, 1);
        let (x, y, z) = (a.lease().unwrap(), a.lease().unwrap(), a.lease().unwrap());
        a.release(x);
        assert_eq!(a.oldest_leased(), Some(y));
        a.requeue(y);
        assert_eq!(a.oldest_leased(), Some(z));
        assert_eq!(a.oldest_leased(), Some(y));
        assert_eq!(a.oldest_leased(), None);
    }

    #[test]
    fn blocks_freed_under_a_pinned_epoch_wait_in_limbo_until_it_ends() {
        let a = BlockAllocator::new(4, 1);
        let (x, y, z) = (a.lease().unwrap(), a.lease().unwrap(), a.lease().unwrap());
        a.release(x); // no pin: free at once
        assert_eq!((a.free_blocks(), a.limbo_blocks()), (2, 0));
        let e1 = a.pin();
        a.release(y); // e1 may read y
        let e2 = a.pin();
        a.release(z); // e1 and e2 may read z
        assert_eq!((a.free_blocks(), a.limbo_blocks()), (2, 2));
        a.unpin(e2); // e1 still pinned: neither y nor z can be reused
        assert_eq!((a.free_blocks(), a.limbo_blocks()), (2, 2));
        a.unpin(e1);
        assert_eq!((a.free_blocks(), a.limbo_blocks()), (4, 0));
        // Freed in order, after the blocks that were free before.
        let order: Vec<u32> = (0..4).map(|_| a.lease().unwrap()).collect();
        assert_eq!(&order[2..], &[y, z]);
    }

    #[test]
    fn an_epoch_pinned_after_a_free_does_not_hold_the_block() {
        let a = BlockAllocator::new(2, 1);
        let (x, y) = (a.lease().unwrap(), a.lease().unwrap());
        let e1 = a.pin();
        a.release(x); // tagged e1
        let e2 = a.pin(); // began after x was gone
        a.unpin(e1);
        assert_eq!((a.free_blocks(), a.limbo_blocks()), (1, 0), "x waited for an epoch that cannot read it");
        a.release(y); // tagged e2
        assert_eq!(a.limbo_blocks(), 1);
        assert!(a.wait_for_limbo(Duration::from_millis(1)), "x is free: no wait");
        a.unpin(e2);
        assert_eq!((a.free_blocks(), a.limbo_blocks()), (2, 0));
    }

    #[test]
    fn a_lease_waiting_for_limbo_wakes_when_the_epoch_ends() {
        let a = std::sync::Arc::new(BlockAllocator::new(1, 1));
        let x = a.lease().unwrap();
        let e = a.pin();
        a.release(x);
        assert!(a.lease().is_err());
        let b = a.clone();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            b.unpin(e);
        });
        assert!(a.wait_for_limbo(Duration::from_secs(10)));
        assert_eq!(a.lease().unwrap(), x);
        t.join().unwrap();
        assert!(!a.wait_for_limbo(Duration::from_millis(1)), "nothing free, nothing in limbo: no wait");
    }

    #[test]
    fn cursor_fills_a_block_before_leasing_the_next() {
        use crate::signature::{DType, Field, Signature};
        let sig = Signature::new(vec![Field::new("x", DType::Int8, vec![]).unwrap()]).unwrap();
        let mut s = crate::Store::new(sig, 12, 4, None).unwrap();
        let mut c = Cursor::default();
        let r1 = c.take(&mut s, 3, Wait::default()).unwrap();
        let r2 = c.take(&mut s, 3, Wait::default()).unwrap();
        let r3 = c.take(&mut s, 3, Wait::default()).unwrap();
        assert_eq!((r1.block, r1.start, r1.len), (0, 0, 3));
        assert_eq!((r2.block, r2.start, r2.len), (0, 3, 1));
        assert_eq!((r3.block, r3.start, r3.len), (1, 4, 3));
        // Block 0 was full and nobody retained it: it is free again.
        assert_eq!(s.block_refcount(0), 0);
        c.close(&mut s);
        assert_eq!(s.free_blocks(), 3);
    }
}

/// Reference changes of a run of table operations under one lock, applied per
/// block instead of per item: consecutive retains (or releases) of one block
/// become one atomic step. Off (every change applied at once) unless begun; the
/// table ends the run before it lets go of its lock. Pending retains are applied
/// before any release, so no count dips to zero while an item still needs it.
#[derive(Default)]
pub(crate) struct RefBatch {
    on: bool,
    retain: Option<(u32, u32)>,
    release: Option<(u32, u32)>,
}

impl RefBatch {
    pub(crate) fn begin(&mut self) {
        self.on = true;
    }

    #[inline]
    pub(crate) fn retain(&mut self, alloc: &BlockAllocator, block: u32) {
        if !self.on {
            return alloc.retain(block);
        }
        match &mut self.retain {
            Some((b, n)) if *b == block => *n += 1,
            pending => {
                if let Some((b, n)) = pending.replace((block, 1)) {
                    alloc.retain_n(b, n);
                }
            }
        }
    }

    #[inline]
    pub(crate) fn release(&mut self, alloc: &BlockAllocator, block: u32) {
        if !self.on {
            return alloc.release(block);
        }
        match &mut self.release {
            Some((b, n)) if *b == block => *n += 1,
            _ => {
                self.apply_retains(alloc);
                if let Some((b, n)) = self.release.replace((block, 1)) {
                    alloc.release_n(b, n);
                }
            }
        }
    }

    fn apply_retains(&mut self, alloc: &BlockAllocator) {
        if let Some((b, n)) = self.retain.take() {
            alloc.retain_n(b, n);
        }
    }

    /// Applies what is pending and turns batching off.
    pub(crate) fn end(&mut self, alloc: &BlockAllocator) {
        self.apply_retains(alloc);
        if let Some((b, n)) = self.release.take() {
            alloc.release_n(b, n);
        }
        self.on = false;
    }
}
