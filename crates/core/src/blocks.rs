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

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU32, Ordering};

use parking_lot::Mutex;

use crate::error::{Error, Result};

pub struct BlockAllocator {
    block_steps: u32,
    refcounts: Box<[AtomicU32]>,
    state: Mutex<AllocState>,
}

struct AllocState {
    free: VecDeque<u32>,
    /// Leased blocks, oldest lease first, as `(block, lease number)`; entries whose
    /// block was freed or leased again since are stale and skipped.
    order: VecDeque<(u32, u32)>,
    leases: Vec<u32>,
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
            }),
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
        let previous = self.refcounts[block as usize].fetch_add(1, Ordering::AcqRel);
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
        let previous = self.refcounts[block as usize].fetch_sub(1, Ordering::AcqRel);
        debug_assert!(previous > 0, "released block {block} that nobody held");
        if previous == 1 {
            self.state.lock().free.push_back(block);
        }
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
    /// A fresh block with one reference owned by the caller.
    fn lease(&mut self) -> Result<u32>;
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
    pub fn take(&mut self, source: &mut impl BlockSource, rows: u32) -> Result<Run> {
        debug_assert!(rows > 0);
        let bs = source.columns().block_steps();
        let (block, used) = match self.current {
            Some((b, used)) if used < bs => (b, used),
            other => {
                let fresh = source.lease()?;
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

    /// Gives up the current block.
    pub fn close(&mut self, source: &mut impl BlockSource) {
        if let Some((b, _)) = self.current.take() {
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
    fn cursor_fills_a_block_before_leasing_the_next() {
        use crate::signature::{DType, Field, Signature};
        let sig = Signature::new(vec![Field::new("x", DType::Int8, vec![]).unwrap()]).unwrap();
        let mut s = crate::Store::new(sig, 12, 4, None).unwrap();
        let mut c = Cursor::default();
        let r1 = c.take(&mut s, 3).unwrap();
        let r2 = c.take(&mut s, 3).unwrap();
        let r3 = c.take(&mut s, 3).unwrap();
        assert_eq!((r1.block, r1.start, r1.len), (0, 0, 3));
        assert_eq!((r2.block, r2.start, r2.len), (0, 3, 1));
        assert_eq!((r3.block, r3.start, r3.len), (1, 4, 3));
        // Block 0 was full and nobody retained it: it is free again.
        assert_eq!(s.block_refcount(0), 0);
        c.close(&mut s);
        assert_eq!(s.free_blocks(), 3);
    }
}
