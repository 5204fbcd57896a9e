//! Snapshots of tables and the blocks they reference, for checkpoints.
//!
//! [`Table::snapshot`] copies a table's whole index under its lock (items with
//! their slots, keys, windows, priorities and sample counts; free slots and
//! generations, so future keys continue as they would have; selector order and
//! random generator; limiter and counters) and pins every block its items
//! reference. The table keeps running while the caller writes the referenced
//! rows: pinned blocks are never reused, and rows an item references are never
//! written again, so the copy is consistent without copy-on-write.
//!
//! [`Table::restore`] rebuilds a table from a snapshot over a store whose rows
//! were written back at the same row numbers (see [`Store::reserve_blocks`]).
//! Every field is checked; anything inconsistent is [`Error::Corrupt`].

use std::collections::VecDeque;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::extensions::{ItemEvent, Saved};
use crate::item::{for_each_block, window_len, Item, RowRange, Window};
use crate::rate_limiter::RateLimiter;
use crate::selectors::Rng;
use crate::store::Store;
use super::{Slot, State, Table, TableConfig};

/// One item of a snapshot.
#[derive(Clone, Debug, PartialEq)]
pub struct ItemRecord {
    pub slot: u32,
    pub key: u64,
    pub seq: u64,
    pub ranges: Vec<RowRange>,
    pub priority: f64,
    pub times_sampled: u32,
    /// The item's attribute record (empty without attributes).
    pub attributes: Vec<u8>,
    /// With groups: 1 a group's leader, 2 another member, 3 pending (0 otherwise).
    pub group_role: u8,
}

/// Everything a table needs to continue exactly where it was.
#[derive(Clone, Debug)]
pub struct TableSnapshot {
    pub config: TableConfig,
    /// In insertion order.
    pub items: Vec<ItemRecord>,
    /// The generation of every slot, present or free.
    pub generations: Vec<u32>,
    /// Free slots, in the order they will be reused (last first).
    pub free_slots: Vec<u32>,
    pub next_seq: u64,
    /// num_inserts, num_samples, num_evictions, num_deletes, num_store_evictions.
    pub counters: [u64; 5],
    pub limiter_inserts: u64,
    pub limiter_samples: u64,
    pub blocked_insert_seconds: f64,
    pub blocked_sample_seconds: f64,
    /// The random generator, as JSON.
    pub rng: String,
    pub sampler_order: Option<Vec<u32>>,
    pub remover_order: Option<Vec<u32>>,
    /// Each extension's state, in the order of `config.extensions` (a default
    /// `Saved`, as a checkpoint from before extensions gives, starts it empty).
    pub extensions: Vec<Saved>,
    /// The policy version and its counters (tables with a `version` attribute;
    /// None restores version 0 and zero counts).
    pub versions: Option<serde_json::Value>,
    /// The group counters (tables with `group_size`).
    pub groups: Option<serde_json::Value>,
}

/// References on blocks; released when dropped.
pub struct Pins {
    store: Store,
    blocks: Vec<u32>,
}

impl Pins {
    /// The pinned blocks, ascending.
    pub fn blocks(&self) -> &[u32] {
        &self.blocks
    }

    /// Compresses the pinned blocks' compressed columns: a restore calls it once
    /// it has written every row (before any item over the blocks is published).
    pub fn compress(&self) {
        for &b in &self.blocks {
            // SAFETY: the blocks are reserved for the restore, whose rows are all
            // written now and are not written again before a new lease.
            unsafe { self.store.columns().compress_block(b) };
        }
    }

    /// Lets these blocks go early (a checkpoint wrote their rows); others stay.
    /// `done` must be sorted.
    pub fn release_blocks(&mut self, done: &[u32]) {
        let alloc = self.store.allocator();
        self.blocks.retain(|b| {
            let release = done.binary_search(b).is_ok();
            if release {
                alloc.release(*b);
            }
            !release
        });
    }

    /// Takes over `other`'s pins on the same store: afterwards `self` holds each
    /// block of either once (a block pinned by both is released once).
    pub fn absorb(&mut self, mut other: Pins) {
        assert!(self.store.same(&other.store), "pins of two different stores");
        let alloc = self.store.allocator();
        for b in std::mem::take(&mut other.blocks) {
            match self.blocks.binary_search(&b) {
                Ok(_) => alloc.release(b),
                Err(at) => self.blocks.insert(at, b),
            }
        }
    }

    /// Copies `dst.len() / row_bytes` whole rows of column `col` from `row` on
    /// into `dst`. Every block they fall in must be pinned here: pinned blocks are
    /// not reused, so their rows do not change while they are read.
    pub fn read_rows(&self, col: usize, row: u64, dst: &mut [u8]) -> Result<()> {
        let store = &self.store;
        let Some(f) = store.signature().fields().get(col) else {
            return Err(Error::InvalidArgument(format!("column {col} does not exist")));
        };
        let rb = f.row_bytes();
        if rb == 0 || dst.len() % rb != 0 {
            return Err(Error::InvalidArgument(format!("field '{}': {} bytes are not whole rows of {rb}", f.name, dst.len())));
        }
        let rows = (dst.len() / rb) as u64;
        if rows == 0 {
            return Ok(());
        }
        if row + rows > store.capacity() || rows > u32::MAX as u64 {
            return Err(Error::InvalidArgument(format!("field '{}': rows {row}..{} are outside the store", f.name, row + rows)));
        }
        let bs = store.block_steps() as u64;
        if let Some(b) = (row / bs..=(row + rows - 1) / bs).find(|&b| self.blocks.binary_search(&(b as u32)).is_err()) {
            return Err(Error::InvalidArgument(format!("rows {row}..{} fall in block {b}, which is not pinned", row + rows)));
        }
        // SAFETY: every block the rows fall in is pinned by `self` (checked above), so
        // no writer reuses them during the copy.
        unsafe { store.columns().read_stored(col, &[RowRange { start: row, len: rows as u32 }], dst) };
        Ok(())
    }
}

impl Drop for Pins {
    fn drop(&mut self) {
        for &b in &self.blocks {
            self.store.allocator().release(b);
        }
    }
}

fn corrupt(table: &str, what: impl std::fmt::Display) -> Error {
    Error::Corrupt(format!("table '{table}': {what}"))
}

impl Table {
    /// A consistent copy of the index plus a pin on every referenced block.
    pub fn snapshot(&self) -> (TableSnapshot, Pins) {
        self.snapshot_pinning(true)
    }

    /// [`Table::snapshot`]; with `pin` false the pins hold no block (an index saved in
    /// place, whose rows are not copied: see `SaveOptions::in_place`).
    pub(crate) fn snapshot_pinning(&self, pin: bool) -> (TableSnapshot, Pins) {
        let sh = &*self.shared;
        let st = sh.state.lock();
        let mut items: Vec<ItemRecord> = Vec::with_capacity(st.size as usize);
        let mut blocks: Vec<u32> = Vec::new();
        for (slot, s) in st.slots.iter().enumerate() {
            if let Some(item) = &s.item {
                for_each_block(item.window.ranges(), sh.store.block_steps(), |b| blocks.push(b));
                items.push(ItemRecord {
                    slot: slot as u32,
                    key: item.key,
                    seq: item.seq,
                    ranges: item.window.ranges().to_vec(),
                    priority: item.priority,
                    times_sampled: item.times_sampled,
                    attributes: st.records.get(slot as u32).to_vec(),
                    group_role: st.groups.as_ref().map_or(0, |g| g.role_code(slot as u32)),
                });
            }
        }
        blocks.sort_unstable();
        blocks.dedup();
        if !pin {
            blocks.clear();
        }
        let alloc = sh.store.allocator();
        for &b in &blocks {
            alloc.retain(b); // live: items reference it, and we hold the table lock
        }
        items.sort_by_key(|i| i.seq);
        let snapshot = TableSnapshot {
            config: sh.config.clone(),
            items,
            generations: st.slots.iter().map(|s| s.generation).collect(),
            free_slots: st.free_slots.clone(),
            next_seq: st.next_seq,
            counters: [st.num_inserts, st.num_samples, st.num_evictions, st.num_deletes, st.num_store_evictions],
            limiter_inserts: st.limiter.inserts,
            limiter_samples: st.limiter.samples,
            blocked_insert_seconds: st.limiter.blocked_insert.as_secs_f64(),
            blocked_sample_seconds: st.limiter.blocked_sample.as_secs_f64(),
            rng: serde_json::to_string(&st.rng).expect("a PCG state serialises"),
            sampler_order: st.sampler.order(),
            remover_order: st.remover.order(),
            extensions: st.ext.save(&st.slots.iter().map(|s| s.window).collect::<Vec<_>>()),
            versions: st.versions.as_ref().map(|v| v.save()),
            groups: st.groups.as_ref().map(|g| g.save()),
        };
        (snapshot, Pins { store: sh.store.clone(), blocks })
    }

    /// Rebuilds a table from `snap` over `store`, whose referenced rows hold the
    /// snapshot's data. The store must not already have a table of that name.
    pub fn restore(snap: &TableSnapshot, store: &Store) -> Result<Table> {
        let name = snap.config.name.clone();
        Table::check_config(&snap.config, store)?;
        let rng: Rng = serde_json::from_str(&snap.rng).map_err(|e| corrupt(&name, format!("random generator state: {e}")))?;
        let n_slots = snap.generations.len();
        let mut slots: Vec<Slot> = snap.generations.iter().map(|&generation| Slot { generation, window: 0, item: None }).collect();
        let mut state = State::new(&snap.config, rng);
        let mut used = vec![false; n_slots];
        let mut last_seq = None;
        for r in &snap.items {
            let s = r.slot as usize;
            if s >= n_slots || used[s] {
                return Err(corrupt(&name, format!("item {} has slot {} (slots: {n_slots}, or used twice)", r.key, r.slot)));
            }
            if r.key != ((snap.generations[s] as u64) << 32 | r.slot as u64) {
                return Err(corrupt(&name, format!("item key {} does not match slot {} generation {}", r.key, r.slot, snap.generations[s])));
            }
            if last_seq.is_some_and(|l| r.seq <= l) || r.seq >= snap.next_seq {
                return Err(corrupt(&name, format!("item {} has sequence {} out of order", r.key, r.seq)));
            }
            last_seq = Some(r.seq);
            if r.ranges.is_empty() || r.ranges.iter().any(|g| g.len == 0 || g.start + g.len as u64 > store.capacity()) {
                return Err(corrupt(&name, format!("item {} has rows outside the store ({} steps)", r.key, store.capacity())));
            }
            if !r.priority.is_finite() || r.priority < 0.0 {
                return Err(corrupt(&name, format!("item {} has priority {}", r.key, r.priority)));
            }
            if r.attributes.len() != snap.config.attributes.record() {
                return Err(corrupt(&name, format!(
                    "item {} has a {}-byte attribute record; the table's attributes take {}",
                    r.key,
                    r.attributes.len(),
                    snap.config.attributes.record()
                )));
            }
            used[s] = true;
        }
        let mut free_seen = vec![false; n_slots];
        for &f in &snap.free_slots {
            let f = f as usize;
            if f >= n_slots || used[f] || free_seen[f] {
                return Err(corrupt(&name, format!("free slot {f} is out of range or in use")));
            }
            free_seen[f] = true;
        }
        if snap.free_slots.len() + snap.items.len() != n_slots {
            return Err(corrupt(&name, "slots are neither free nor used"));
        }
        if snap.items.iter().filter(|r| r.group_role != 3).count() as u64 > snap.config.max_size {
            return Err(corrupt(&name, format!("{} items, more than max_size {}", snap.items.len(), snap.config.max_size)));
        }
        if let (Some(v), Some(saved)) = (&mut state.versions, &snap.versions) {
            v.restore(saved).map_err(|e| corrupt(&name, e))?;
        }
        let alloc = store.allocator();
        for r in &snap.items {
            let s = r.slot as usize;
            state.records.set(r.slot, &r.attributes);
            let window = Window::from_ranges(r.ranges.clone());
            for_each_block(window.ranges(), store.block_steps(), |b| {
                if state.block_items.len() <= b as usize {
                    state.block_items.resize_with(b as usize + 1, VecDeque::new);
                }
                state.block_items[b as usize].push_back(r.slot);
            });
            if state.groups.is_none() {
                state.sampler.insert(r.slot, r.seq, r.priority);
                state.remover.insert(r.slot, r.seq, r.priority);
                if let Some(v) = &mut state.versions {
                    let version = v.of(&r.attributes);
                    v.added(r.slot, version);
                }
            }
            let length = window_len(window.ranges()) as u32;
            state.max_length = state.max_length.max(length);
            state.count_length(length, true);
            slots[s].item = Some(Item {
                key: r.key,
                seq: r.seq,
                length,
                window,
                priority: r.priority,
                times_sampled: r.times_sampled,
            });
        }
        let admitted = match &mut state.groups {
            None => snap.items.len() as u64,
            Some(_) => restore_groups(&mut state, snap).map_err(|e| corrupt(&name, e))?,
        };
        let mut limiter = RateLimiter::new(snap.config.rate_limiter);
        limiter.inserts = snap.limiter_inserts;
        limiter.samples = snap.limiter_samples;
        let seconds = |what: &str, s: f64| {
            Duration::try_from_secs_f64(s).map_err(|_| corrupt(&name, format!("{what} is {s} seconds")))
        };
        limiter.blocked_insert = seconds("blocked insert time", snap.blocked_insert_seconds)?;
        limiter.blocked_sample = seconds("blocked sample time", snap.blocked_sample_seconds)?;
        state.limiter = limiter;
        if let Some(order) = &snap.sampler_order {
            if !state.sampler.set_order(order) {
                return Err(corrupt(&name, "sampler order does not match the items"));
            }
        }
        if let Some(order) = &snap.remover_order {
            if !state.remover.set_order(order) {
                return Err(corrupt(&name, "remover order does not match the items"));
            }
        }
        let live: Vec<ItemEvent> = snap
            .items
            .iter()
            .map(|r| ItemEvent { slot: r.slot, seq: r.seq, priority: r.priority, times_sampled: r.times_sampled })
            .collect();
        state.ext.restore(&snap.extensions, &live).map_err(|e| corrupt(&name, e))?;
        if let Some(windows) = state.ext.saved_windows(&snap.extensions) {
            // Checked by UniqueSamples' restore: whole numbers below 2^32.
            for r in &snap.items {
                slots[r.slot as usize].window = windows.get(r.slot as usize).map_or(0, |&w| w as u32);
            }
        }
        // References last: every check above is done, nothing can fail now (and
        // if registering the name does, dropping the table releases them).
        for r in &snap.items {
            for_each_block(&r.ranges, store.block_steps(), |b| {
                if alloc.refcount(b) == 0 {
                    // The caller reserved the blocks it wrote; anything else is a bug.
                    panic!("restoring table '{name}': block {b} was not reserved");
                }
                alloc.retain(b)
            });
        }
        state.slots = slots;
        state.free_slots = snap.free_slots.clone();
        state.size = admitted;
        state.next_seq = snap.next_seq;
        [state.num_inserts, state.num_samples, state.num_evictions, state.num_deletes, state.num_store_evictions] = snap.counters;
        Table::register(snap.config.clone(), store, state)
    }
}

impl Store {
    /// Takes the given blocks out of the free queue (for writing a checkpoint's
    /// rows back at their row numbers), oldest first: store pressure evicts the
    /// items of the first ones first. They are held by the returned pins.
    pub fn reserve_blocks(&self, blocks: &[u32]) -> Result<Pins> {
        let pins = self.reserve_blocks_in_place(blocks)?;
        for &b in &pins.blocks {
            // SAFETY: just reserved: taken out of the allocator for the caller alone.
            unsafe { self.columns().reset_block(b) };
        }
        Ok(pins)
    }

    /// [`Store::reserve_blocks`] for blocks whose rows are already in place (a
    /// file store reopened): their compressed columns stay as they are.
    pub fn reserve_blocks_in_place(&self, blocks: &[u32]) -> Result<Pins> {
        let mut sorted = blocks.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        if sorted.len() != blocks.len() {
            return Err(Error::Corrupt("a block to restore is listed twice".into()));
        }
        if let Some(&b) = sorted.iter().find(|&&b| b >= self.num_blocks()) {
            return Err(Error::Corrupt(format!("block {b} is outside the store ({} blocks)", self.num_blocks())));
        }
        // In the given order: it becomes the order in which store pressure evicts.
        self.allocator().reserve(blocks)?;
        Ok(Pins { store: self.clone(), blocks: sorted })
    }

    /// Writes whole rows of column `col` starting at `row`, into blocks the
    /// caller reserved with [`Store::reserve_blocks`].
    pub fn write_reserved(&self, pins: &Pins, col: usize, row: u64, bytes: &[u8]) -> Result<()> {
        let sig = self.signature();
        let Some(f) = sig.fields().get(col) else {
            return Err(Error::Corrupt(format!("column {col} does not exist")));
        };
        let rb = f.row_bytes();
        if rb == 0 || bytes.len() % rb != 0 {
            return Err(Error::Corrupt(format!("field '{}': {} bytes are not whole rows of {rb}", f.name, bytes.len())));
        }
        let rows = (bytes.len() / rb) as u64;
        if rows == 0 {
            return Ok(());
        }
        if row + rows > self.capacity() {
            return Err(Error::Corrupt(format!("field '{}': rows {row}..{} are outside the store", f.name, row + rows)));
        }
        let bs = self.block_steps() as u64;
        for b in row / bs..=(row + rows - 1) / bs {
            if pins.blocks.binary_search(&(b as u32)).is_err() {
                return Err(Error::Corrupt(format!("rows {row}..{} fall in block {b}, which was not reserved", row + rows)));
            }
        }
        // SAFETY: every block the rows fall in is reserved by `pins` (checked above):
        // taken out of the allocator for this restore, referenced by no item yet.
        unsafe { self.columns().write_rows(col, row, bytes) };
        Ok(())
    }
}

/// Rebuilds the groups of a restored table from its items' roles and group ids:
/// admitted groups go back into the selectors (leader first, with the members'
/// priority sum, under the group's oldest version), pending members wait again
/// with their timeout counted from now. Returns how many items are admitted.
fn restore_groups(state: &mut State, snap: &TableSnapshot) -> std::result::Result<u64, String> {
    let g = state.groups.as_mut().expect("a table with groups");
    let mut live: std::collections::BTreeMap<i64, Vec<&ItemRecord>> = std::collections::BTreeMap::new();
    let now = std::time::Instant::now();
    for r in &snap.items {
        let id = g.id_of(&r.attributes);
        match r.group_role {
            1 | 2 => live.entry(id).or_default().push(r),
            3 => g.restore_pending(r.slot, id, now),
            other => return Err(format!("item {} has group role {other}; expected 1, 2 or 3", r.key)),
        }
    }
    let mut admitted = 0;
    for (id, mut members) in live {
        members.sort_by_key(|r| (r.group_role, r.seq));
        if members.iter().filter(|r| r.group_role == 1).count() != 1 {
            return Err(format!("group {id} has {} leaders; expected one", members.iter().filter(|r| r.group_role == 1).count()));
        }
        let leader = members[0];
        let priority: f64 = members.iter().map(|r| r.priority).sum();
        state.sampler.insert(leader.slot, leader.seq, priority);
        state.remover.insert(leader.slot, leader.seq, priority);
        if let Some(v) = &mut state.versions {
            let oldest = members.iter().map(|r| v.of(&r.attributes)).min().expect("a group has members");
            v.added(leader.slot, oldest);
        }
        admitted += members.len() as u64;
        let g = state.groups.as_mut().expect("a table with groups");
        g.admitted(id, members.iter().map(|r| r.slot).collect(), false);
    }
    let g = state.groups.as_mut().expect("a table with groups");
    if let Some(saved) = &snap.groups {
        g.restore_counters(saved)?;
    }
    Ok(admitted)
}
