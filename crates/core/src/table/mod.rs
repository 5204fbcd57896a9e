//! Tables: items over one store, a sampler, a remover, `max_size`,
//! `max_times_sampled` and a rate limiter.
//!
//! One mutex guards a table's index (items, selectors, limiter, counters) and is
//! held only for index work: step data is never copied under it. Blocking inserts
//! and samples wait on two condition variables with the lock released.
//!
//! Keys are `generation << 32 | slot`: a slot is a dense index into the item
//! array, reused after its item leaves, with a new generation, so a stale key (an
//! item evicted since it was sampled) is recognised in O(1) and skipped.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::Instant;

use parking_lot::{Condvar, Mutex, MutexGuard};
use rand::SeedableRng;

use crate::attributes::{Attributes, Records};
use crate::blocks::RefBatch;
use crate::error::{Error, Partial, Result};
use crate::extensions::{ExtensionSpec, Extensions, ItemEvent};
use crate::invalid;
use crate::item::{check_priority, for_each_block, window_len, Item, NewItem};
use crate::rate_limiter::{RateLimiter, RateLimiterConfig};
use crate::selectors::{Pick, Prioritized, Rng, Selector, SelectorSpec};
use crate::store::{Store, TableOverStore};
use crate::wait::{SlowWait, Wait};

#[derive(Clone, Debug)]
pub struct TableConfig {
    pub name: String,
    pub sampler: SelectorSpec,
    pub remover: SelectorSpec,
    pub max_size: u64,
    /// 0 = unlimited.
    pub max_times_sampled: u32,
    pub rate_limiter: RateLimiterConfig,
    /// `None` seeds from the operating system.
    pub seed: Option<u64>,
    /// When a writer needs a block and the store has none free, may this table's
    /// items in the oldest block be evicted? (False for queues and stacks, whose
    /// items are meant to be consumed, never dropped.)
    pub evict_when_store_full: bool,
    /// The sampler's picks are made outside the table, from a mirror of its items
    /// (GPU selection in `reprise.torch`): see [`crate::selectors::external`].
    pub external_selection: bool,
    /// Observers told of every insert, draw, update and removal
    /// ([`ExtensionSpec::defaults`]: every built-in).
    pub extensions: Vec<ExtensionSpec>,
    /// Named per-item scalars given at insert and returned with every draw.
    pub attributes: Attributes,
    /// Never draw an item whose `version` attribute is below the table's version
    /// minus this (None: no bound). Needs an int64 attribute `version`.
    pub max_staleness: Option<u64>,
    /// Items become sampleable in whole groups (None: one by one). Needs an
    /// int64 attribute `group`.
    pub groups: Option<GroupConfig>,
}

/// Counters and settings reported by `info()`.
#[derive(Clone, Debug, PartialEq)]
pub struct TableInfo {
    pub name: String,
    pub size: u64,
    pub max_size: u64,
    pub max_times_sampled: u32,
    pub sampler: String,
    pub remover: String,
    pub num_inserts: u64,
    pub num_samples: u64,
    pub num_evictions: u64,
    pub num_deletes: u64,
    /// Evictions (included in `num_evictions`) made to free store blocks.
    pub num_store_evictions: u64,
    pub rate_limiter: RateLimiterConfig,
    pub limiter_inserts: u64,
    pub limiter_samples: u64,
    pub blocked_insert_seconds: f64,
    pub blocked_sample_seconds: f64,
    /// The table's policy version (None without an int64 attribute `version`).
    pub version: Option<i64>,
    /// Items removed because `set_version` made them stale.
    pub stale_removed: u64,
    /// Items dropped at commit because they were already stale.
    pub stale_dropped: u64,
    /// With `group_size`: the group settings and figures (live, pending,
    /// pending_items, admitted, dropped, partial, duplicates).
    pub groups: Option<serde_json::Value>,
    /// The item attributes: `(name, numpy dtype)` in order.
    pub attributes: Vec<(String, String)>,
    /// The table's store: bytes its columns would take raw at full capacity, and
    /// bytes their file takes now (compressed blocks, pages written). Shared by
    /// every table over the store.
    pub store_raw_bytes: u64,
    pub store_stored_bytes: u64,
}

/// One item as `items()` reports it.
#[derive(Clone, Debug, PartialEq)]
pub struct ItemInfo {
    pub key: u64,
    pub priority: f64,
    pub times_sampled: u32,
    pub length: u32,
}

pub(crate) struct Slot {
    pub(crate) generation: u32,
    /// The `UniqueSamples` window that last drew this slot's item (0: none). It
    /// lives here, in what was padding, because every draw touches the slot anyway.
    pub(crate) window: u32,
    pub(crate) item: Option<Item>,
}

pub(crate) struct State {
    pub(crate) slots: Vec<Slot>,
    pub(crate) free_slots: Vec<u32>,
    pub(crate) size: u64,
    pub(crate) sampler: Box<dyn Selector>,
    pub(crate) remover: Box<dyn Selector>,
    pub(crate) limiter: RateLimiter,
    pub(crate) rng: Rng,
    pub(crate) next_seq: u64,
    pub(crate) num_inserts: u64,
    pub(crate) num_samples: u64,
    pub(crate) num_evictions: u64,
    pub(crate) num_deletes: u64,
    pub(crate) num_store_evictions: u64,
    pub(crate) picks: Vec<Pick>,
    /// For each store block, the slots of the items that reference it (oldest
    /// first while removals are FIFO).
    pub(crate) block_items: Vec<VecDeque<u32>>,
    /// The longest item ever inserted, in steps (cluster mode pads rows to it).
    pub(crate) max_length: u32,
    /// External selection: how many items of each length the table holds (a
    /// device-resident draw sizes its batch from the shortest and longest).
    pub(crate) lengths: Option<BTreeMap<u32, u64>>,
    /// Cluster mode: inserts wait while a global draw reads this table's figures.
    pub(crate) frozen: bool,
    /// The table's `max_size` (admitting a group evicts to stay within it).
    pub(crate) max_size: u64,
    /// Group admission (tables with `group_size`).
    pub(crate) groups: Option<Groups>,
    pub(crate) ext: Extensions,
    /// Each slot's attribute record.
    pub(crate) records: Records,
    /// The policy version and staleness index (tables with an int64 `version` attribute).
    pub(crate) versions: Option<Versions>,
    /// Block references of the insert run under way (see [`RefBatch`]).
    pub(crate) refs: RefBatch,
}

pub(crate) struct Shared {
    pub(crate) config: TableConfig,
    pub(crate) store: Store,
    pub(crate) state: Mutex<State>,
    /// Signalled when inserting may have become possible.
    pub(crate) insert_cv: Condvar,
    /// Signalled when sampling may have become possible.
    pub(crate) sample_cv: Condvar,
}

/// A handle to one table; clones share it.
#[derive(Clone)]
pub struct Table {
    pub(crate) shared: Arc<Shared>,
}

/// The key an insert returns for an item it dropped as stale (no item has it:
/// every key's generation is at least 1).
pub const DROPPED: u64 = 0;

fn key_of(generation: u32, slot: u32) -> u64 {
    ((generation as u64) << 32) | slot as u64
}

fn slot_of(key: u64) -> (u32, u32) {
    ((key >> 32) as u32, key as u32)
}

/// How a wait on a condition variable ended.
enum Woke {
    /// Notified, or a poll slice passed: check again.
    Again,
    TimedOut,
    Interrupted,
}

impl State {
    /// An empty table's state.
    pub(crate) fn new(config: &TableConfig, rng: Rng) -> State {
        // Slots are read at random by every draw: reserve them up front (address
        // space only) and ask for huge pages, so a large table does not pay a TLB
        // miss on nearly every pick.
        let slots = Vec::with_capacity(config.max_size.min(1 << 24) as usize);
        crate::memory::advise_huge_pages_vec(&slots);
        State {
            slots,
            free_slots: Vec::new(),
            size: 0,
            sampler: if config.external_selection {
                config.sampler.build_external(config.max_times_sampled)
            } else {
                config.sampler.build()
            },
            remover: config.remover.build(),
            limiter: RateLimiter::new(config.rate_limiter),
            rng,
            next_seq: 0,
            num_inserts: 0,
            num_samples: 0,
            num_evictions: 0,
            num_deletes: 0,
            num_store_evictions: 0,
            picks: Vec::new(),
            block_items: Vec::new(),
            max_length: 0,
            lengths: config.external_selection.then(BTreeMap::new),
            frozen: false,
            ext: Extensions::new(&config.extensions),
            records: Records::new(config.attributes.record()),
            max_size: config.max_size,
            groups: config.groups.and_then(|g| Groups::new(g, &config.attributes)),
            versions: Versions::new(&config.attributes, config.max_staleness),
            refs: RefBatch::default(),
        }
    }

    fn lookup(&self, key: u64) -> Option<u32> {
        let (generation, slot) = slot_of(key);
        let s = self.slots.get(slot as usize)?;
        (s.generation == generation && s.item.is_some()).then_some(slot)
    }

    /// Counts an item of `length` steps in or out of [`State::lengths`].
    pub(crate) fn count_length(&mut self, length: u32, added: bool) {
        let Some(lengths) = &mut self.lengths else { return };
        if added {
            *lengths.entry(length).or_insert(0) += 1;
        } else if let Some(n) = lengths.get_mut(&length) {
            *n -= 1;
            if *n == 0 {
                lengths.remove(&length);
            }
        }
    }

    fn item(&mut self, slot: u32) -> &mut Item {
        self.slots[slot as usize].item.as_mut().expect("selected slot holds an item")
    }

    /// Removes the unit `slot` belongs to: the item, or with groups every member
    /// of its group (admitted or pending). Returns how many items left.
    fn remove(&mut self, slot: u32, store: &Store) -> u64 {
        let Some(groups) = &mut self.groups else {
            self.remove_one(slot, true, store);
            self.size -= 1;
            return 1;
        };
        let admitted = matches!(groups.role(slot), Role::Leader | Role::Member);
        let slots = groups.take_unit(slot);
        for (k, &s) in slots.iter().enumerate() {
            // Only an admitted group's leader is in the selectors.
            self.remove_one(s, admitted && k == 0, store);
        }
        if admitted {
            self.size -= slots.len() as u64;
        }
        slots.len() as u64
    }

    /// Removes the item in `slot` (from the selectors when `selected`) and
    /// releases its blocks.
    fn remove_one(&mut self, slot: u32, selected: bool, store: &Store) {
        let item = self.slots[slot as usize].item.take().expect("removed slot holds an item");
        self.count_length(item.length, false);
        if let Some(v) = &mut self.versions {
            v.removed(slot);
        }
        let event = ItemEvent { slot, seq: item.seq, priority: item.priority, times_sampled: item.times_sampled };
        self.ext.removed(event);
        if selected {
            self.sampler.remove(slot);
            self.remover.remove(slot);
        }
        self.free_slots.push(slot);
        let alloc = store.allocator();
        let (block_items, refs) = (&mut self.block_items, &mut self.refs);
        for_each_block(item.window.ranges(), store.block_steps(), |b| {
            let slots = &mut block_items[b as usize];
            let at = slots.iter().position(|&s| s == slot).expect("item listed under its block");
            // Removing the oldest (the usual, FIFO case) keeps the order, so the next
            // oldest is found first again.
            if at == 0 {
                slots.pop_front();
            } else {
                slots.swap_remove_back(at);
            }
            refs.release(alloc, b)
        });
    }

    /// Inserts `new` with attribute record `record` (empty without attributes):
    /// into the selectors, or with groups as a pending member, admitting its
    /// group when it is complete.
    fn insert(&mut self, new: &NewItem, record: &[u8], store: &Store) -> u64 {
        let slot = match self.free_slots.pop() {
            Some(s) => {
                self.slots[s as usize].generation = self.slots[s as usize].generation.wrapping_add(1).max(1);
                s
            }
            None => {
                self.slots.push(Slot { generation: 1, window: 0, item: None });
                (self.slots.len() - 1) as u32
            }
        };
        let alloc = store.allocator();
        let (block_items, refs) = (&mut self.block_items, &mut self.refs);
        for_each_block(new.window.ranges(), store.block_steps(), |b| {
            if block_items.len() <= b as usize {
                block_items.resize_with(b as usize + 1, VecDeque::new);
            }
            block_items[b as usize].push_back(slot);
            refs.retain(alloc, b)
        });
        let seq = self.next_seq;
        self.next_seq += 1;
        let key = key_of(self.slots[slot as usize].generation, slot);
        let length = window_len(new.window.ranges()) as u32;
        self.max_length = self.max_length.max(length);
        self.count_length(length, true);
        self.slots[slot as usize].window = 0;
        self.records.set(slot, record);
        self.slots[slot as usize].item = Some(Item {
            key,
            seq,
            window: new.window.clone(),
            length,
            priority: new.priority,
            times_sampled: 0,
        });
        self.limiter.inserts += 1;
        self.num_inserts += 1;
        self.ext.inserted(ItemEvent { slot, seq, priority: new.priority, times_sampled: 0 });
        match &mut self.groups {
            None => self.select(slot, new.priority, seq, record),
            Some(g) => {
                let id = g.id_of(record);
                if let Some(slots) = g.arrived(slot, id, Instant::now()) {
                    self.admit(id, slots, false, store);
                }
            }
        }
        key
    }

    /// Drops or admits the groups whose timeout has passed (reads the clock only
    /// for a table whose groups time out).
    #[inline]
    pub(crate) fn expire_groups(&mut self, store: &Store) {
        if self.groups.as_ref().is_some_and(|g| g.config.timeout.is_some()) {
            self.expire_groups_at(Instant::now(), store)
        }
    }

    /// [`State::expire_groups`] as of `now` (tests move the clock).
    pub(crate) fn expire_groups_at(&mut self, now: Instant, store: &Store) {
        let Some(g) = &mut self.groups else { return };
        if g.config.timeout.is_none() {
            return;
        }
        let expired = g.expire(now);
        for slots in expired.drop {
            for s in slots {
                self.remove_one(s, false, store);
            }
        }
        for slots in expired.admit {
            let id = self.groups.as_ref().map_or(0, |g| g.id_of(self.records.get(slots[0])));
            self.admit(id, slots, true, store);
        }
    }

    /// Whether an arriving item (its `record`) is already stale; if so it is
    /// dropped, and with groups so is the rest of its pending group (a group is as
    /// old as its oldest member).
    fn dropped_stale(&mut self, record: &[u8], store: &Store) -> bool {
        if !self.versions.as_ref().is_some_and(|v| v.is_stale(record)) {
            return false;
        }
        let mut dropped = 1;
        if let Some(slot) = self.groups.as_ref().and_then(|g| g.pending_of(g.id_of(record))) {
            dropped += self.remove(slot, store);
        }
        if let Some(v) = &mut self.versions {
            v.stale_dropped += dropped;
        }
        true
    }

    /// What a draw picks among: admitted groups with groups, else items.
    pub(crate) fn units(&self) -> u64 {
        self.groups.as_ref().map_or(self.size, |g| g.live_groups())
    }

    /// Puts a sampleable unit (an item, or a group's leader) into the selectors
    /// and the version index.
    fn select(&mut self, slot: u32, priority: f64, seq: u64, record: &[u8]) {
        self.sampler.insert(slot, seq, priority);
        self.remover.insert(slot, seq, priority);
        self.size += 1;
        if let Some(v) = &mut self.versions {
            let version = v.of(record);
            v.added(slot, version);
        }
    }

    /// Admits group `id` (its pending `slots`, oldest first): evicts whole units
    /// until the table has room for its items, then makes the first member the
    /// leader, selected with the sum of the members' priorities and indexed under
    /// the group's oldest version.
    fn admit(&mut self, id: i64, slots: Vec<u32>, partial: bool, store: &Store) {
        let members = slots.len() as u64;
        while self.size + members > self.max_size && self.size > 0 {
            let victim = self.remover.pick(&mut self.rng);
            let gone = self.remove(victim.slot, store);
            self.num_evictions += gone;
        }
        let leader = slots[0];
        let priority: f64 = slots.iter().map(|&s| self.slots[s as usize].item.as_ref().map_or(0.0, |i| i.priority)).sum();
        let seq = self.slots[leader as usize].item.as_ref().map_or(0, |i| i.seq);
        let oldest = self.versions.as_ref().map(|v| slots.iter().map(|&s| v.of(self.records.get(s))).min().unwrap_or(0));
        self.sampler.insert(leader, seq, priority);
        self.remover.insert(leader, seq, priority);
        self.size += members;
        if let (Some(v), Some(oldest)) = (&mut self.versions, oldest) {
            v.added(leader, oldest);
        }
        self.groups.as_mut().expect("admitting a group").admitted(id, slots, partial);
    }
}

impl Table {
    pub fn new(config: TableConfig, store: &Store) -> Result<Table> {
        Self::check_config(&config, store)?;
        let rng = match config.seed {
            Some(seed) => Rng::seed_from_u64(seed),
            None => Rng::seed_from_u64(rand::random()),
        };
        let state = State::new(&config, rng);
        Self::register(config, store, state)
    }

    /// The checks of a new table's configuration against its store.
    pub(crate) fn check_config(config: &TableConfig, store: &Store) -> Result<()> {
        if config.name.is_empty() {
            return Err(invalid!("table names must be non-empty"));
        }
        if config.max_size == 0 {
            return Err(invalid!("table '{}': max_size must be >= 1, got 0", config.name));
        }
        if config.max_size > store.capacity() {
            return Err(invalid!(
                "table '{}': max_size {} is larger than the store can hold ({} steps; every item \
                 holds at least one step): raise the store's capacity or lower max_size",
                config.name,
                config.max_size,
                store.capacity()
            ));
        }
        if config.max_size > u32::MAX as u64 {
            return Err(invalid!("table '{}': max_size must be < 2^32, got {}", config.name, config.max_size));
        }
        for (role, spec) in [("sampler", config.sampler), ("remover", config.remover)] {
            spec.validate().map_err(|e| invalid!("table '{}' {role}: {e}", config.name))?;
        }
        ExtensionSpec::validate_list(&config.extensions).map_err(|e| invalid!("table '{}': {e}", config.name))?;
        if config.max_staleness.is_some() {
            config.attributes.version("max_staleness").map_err(|e| invalid!("table '{}': {e}", config.name))?;
        }
        if let Some(g) = config.groups {
            match config.attributes.find(groups::GROUP).map(|i| config.attributes.specs()[i].dtype) {
                Some(crate::DType::Int64) => {}
                Some(other) => return Err(invalid!("table '{}': group_size needs the attribute 'group' to be int64, got {}", config.name, other.name())),
                None => return Err(invalid!(
                    "table '{}': group_size needs an int64 attribute 'group' naming each item's group; the table's attributes are {:?}",
                    config.name,
                    config.attributes.names()
                )),
            }
            if g.size == 0 || g.size as u64 > config.max_size {
                return Err(invalid!("table '{}': group_size must be 1 to max_size ({}), got {}", config.name, config.max_size, g.size));
            }
            if config.external_selection {
                return Err(invalid!("table '{}': groups are selected on the host; selection_device cannot be used with group_size", config.name));
            }
        }
        if store.find_table(&config.name).is_some() {
            return Err(invalid!("a table named '{}' already exists on this store", config.name));
        }
        Ok(())
    }

    /// Makes the table of `state` and registers its name on `store` (if that
    /// fails, dropping the table releases what its items reference).
    pub(crate) fn register(config: TableConfig, store: &Store, state: State) -> Result<Table> {
        let shared = Arc::new(Shared {
            config,
            store: store.clone(),
            state: Mutex::new(state),
            insert_cv: Condvar::new(),
            sample_cv: Condvar::new(),
        });
        let weak: std::sync::Weak<dyn TableOverStore> = Arc::downgrade(&shared) as _;
        store.register_table(&shared.config.name, weak)?;
        Ok(Table { shared })
    }

    /// The live table named `name` over `store`, if there is one.
    pub(crate) fn find(store: &Store, name: &str) -> Option<Table> {
        let shared = store.find_table(name)?.into_any().downcast::<Shared>().ok()?;
        Some(Table { shared })
    }

    /// The live tables over `store`, in the order they were made.
    pub(crate) fn over(store: &Store) -> Vec<Table> {
        store.tables().into_iter().filter_map(|t| Some(Table { shared: t.into_any().downcast::<Shared>().ok()? })).collect()
    }

    /// How many handles to this table exist (this one included): 1 means nothing
    /// else — no server, no other client of this process — holds it.
    pub fn handles(&self) -> usize {
        Arc::strong_count(&self.shared)
    }

    /// Why inserting one item (`inserting`) or sampling `want` cannot proceed now, in
    /// the rate limiter's words without its question (see `RateLimiter::reason`);
    /// None when the limiter lets it proceed.
    pub fn blocked_because(&self, inserting: bool, want: u64) -> Option<String> {
        let st = self.shared.state.lock();
        match st.limiter.reason(inserting, st.size, want) {
            (why, Some(_)) => Some(why),
            (_, None) => None,
        }
    }

    pub fn name(&self) -> &str {
        &self.shared.config.name
    }

    pub fn config(&self) -> &TableConfig {
        &self.shared.config
    }

    pub fn store(&self) -> &Store {
        &self.shared.store
    }

    pub fn size(&self) -> u64 {
        let mut st = self.shared.state.lock();
        st.expire_groups(&self.shared.store);
        st.size
    }

    /// Checks many priorities (see [`Table::check_priority`]); `what(i)` names the
    /// i-th in an error. One pass with no per-item work in the common case.
    pub fn check_priorities(&self, priorities: &[f64], what: impl Fn(usize) -> String) -> Result<()> {
        let c = &self.shared.config;
        let may_overflow = [c.sampler, c.remover]
            .iter()
            .any(|s| matches!(s, SelectorSpec::Prioritized { priority_exponent } if *priority_exponent > 1.0));
        if !may_overflow && priorities.iter().all(|&p| p.is_finite() && p >= 0.0) {
            return Ok(());
        }
        for (i, &p) in priorities.iter().enumerate() {
            self.check_priority(p, || what(i))?;
        }
        Ok(())
    }

    /// Checks a priority for this table: finite, >= 0, and with a finite weight
    /// under a Prioritized selector's exponent.
    pub fn check_priority(&self, priority: f64, what: impl Fn() -> String) -> Result<()> {
        check_priority(priority, &what)?;
        let c = &self.shared.config;
        for spec in [c.sampler, c.remover] {
            if let SelectorSpec::Prioritized { priority_exponent } = spec {
                if !Prioritized::weight(priority_exponent, priority).is_finite() {
                    return Err(invalid!(
                        "{}: priority {priority} overflows to infinity under priority_exponent {priority_exponent}",
                        what()
                    ));
                }
            }
        }
        Ok(())
    }

    fn check_items(&self, items: &[NewItem]) -> Result<()> {
        let capacity = self.shared.store.capacity();
        for (i, item) in items.iter().enumerate() {
            let len = window_len(item.window.ranges());
            if len == 0 || len > u32::MAX as u64 {
                return Err(invalid!("table '{}': item {i} has {len} steps; expected 1 to 2^32-1", self.name()));
            }
            if item.window.ranges().iter().any(|r| r.len == 0 || r.start + r.len as u64 > capacity) {
                return Err(invalid!("table '{}': item {i} has rows outside the store", self.name()));
            }
            self.check_priority(item.priority, || format!("table '{}' item {i}", self.name()))?;
        }
        Ok(())
    }

    /// Inserts items whose rows the caller holds references on, in order, waiting
    /// for the rate limiter as needed. `attributes` holds each item's attribute
    /// record, end to end (empty for a table without attributes). When the
    /// deadline passes first, fails with `Timeout` whose partial result lists the
    /// keys inserted so far. An item already stale under `max_staleness` is
    /// dropped (counted in `stale_dropped`; its key is [`DROPPED`]).
    pub fn insert<'w>(&self, items: &[NewItem], attributes: &[u8], wait: impl Into<Wait<'w>>) -> Result<Vec<u64>> {
        self.check_items(items)?;
        self.check_records(items.len(), attributes)?;
        self.insert_checked(items, attributes, wait.into())
    }

    /// Checks that `records` holds attribute records for `n` items.
    pub fn check_records(&self, n: usize, records: &[u8]) -> Result<()> {
        self.shared.config.attributes.check_records(self.name(), n, records)
    }

    /// [`Table::insert`] for items whose windows, priorities and records were checked.
    pub(crate) fn insert_checked(&self, items: &[NewItem], records: &[u8], wait: Wait<'_>) -> Result<Vec<u64>> {
        let sh = &*self.shared;
        let deadline = wait.deadline();
        let record = sh.config.attributes.record();
        let record_of = |i: usize| &records[i * record..(i + 1) * record];
        let mut keys = Vec::with_capacity(items.len());
        let mut slow = SlowWait::lazy();
        let mut st = sh.state.lock();
        st.expire_groups(&sh.store);
        if let Some(g) = &st.groups {
            // A member of a group that is complete already is refused up front,
            // before anything changes.
            let mut arriving: BTreeMap<i64, usize> = BTreeMap::new();
            for i in 0..items.len() {
                *arriving.entry(g.id_of(record_of(i))).or_default() += 1;
            }
            if let Some((id, n)) = arriving.iter().find(|&(&id, &n)| g.is_duplicate(id, n)) {
                return Err(invalid!(
                    "table '{}': group {id} cannot take {n} more member(s): it is complete (group_size {}) or \
                     already admitted; each group id names one group of group_size items",
                    self.name(),
                    g.config.size
                ));
            }
        }
        while keys.len() < items.len() {
            // A late rollout is normal: an item already too old is dropped here,
            // before the limiter, which never counts it.
            if st.dropped_stale(record_of(keys.len()), &sh.store) {
                keys.push(DROPPED);
                continue;
            }
            let want = (items.len() - keys.len()) as u64;
            let permits = if st.frozen { 0 } else { st.limiter.insert_permits(want, st.size) };
            if permits == 0 {
                slow.begin();
                if slow.is_due() {
                    let message = self.slow_message(&st, &slow, true, want, keys.len());
                    MutexGuard::unlocked(&mut st, || slow.say(&message));
                    continue;
                }
                match self.wait(&mut st, &sh.insert_cv, deadline, &wait, true, &slow) {
                    Woke::Again => continue,
                    Woke::Interrupted => return Err(Error::Interrupted { partial: Partial::Inserted(keys) }),
                    Woke::TimedOut => {
                        let message = format!(
                            "table '{}': the rate limiter allowed {} of {} inserts before the {} timeout",
                            self.name(),
                            keys.len(),
                            items.len(),
                            wait.describe()
                        );
                        return Err(Error::Timeout { message, partial: Partial::Inserted(keys) });
                    }
                }
            }
            let mut granted = permits;
            // Nothing below lets go of the lock: block references go per block.
            st.refs.begin();
            while granted > 0 && keys.len() < items.len() {
                let i = keys.len();
                if st.dropped_stale(record_of(i), &sh.store) {
                    keys.push(DROPPED);
                    continue;
                }
                if let Some(g) = &mut st.groups {
                    // Only a race with another writer gets here (checked up front).
                    if g.is_duplicate(g.id_of(record_of(i)), 1) {
                        g.duplicates += 1;
                        keys.push(DROPPED);
                        continue;
                    }
                } else if st.size >= sh.config.max_size {
                    let state = &mut *st;
                    let victim = state.remover.pick(&mut state.rng);
                    let gone = state.remove(victim.slot, &sh.store);
                    state.num_evictions += gone;
                }
                let key = st.insert(&items[i], record_of(i), &sh.store);
                keys.push(key);
                granted -= 1;
            }
            st.refs.end(sh.store.allocator());
            st.ext.flush();
            sh.sample_cv.notify_all();
        }
        Ok(keys)
    }

    /// What a call that has waited past [`crate::wait::slow_wait`] says: the table,
    /// how long, how much is done, and what the rate limiter needs (or that a
    /// cluster step holds the table).
    pub(crate) fn slow_message(&self, st: &State, slow: &SlowWait, inserting: bool, want: u64, done: usize) -> String {
        let total = want as usize + done;
        let items = if total == 1 { "item" } else { "items" };
        let (what, done) = if inserting {
            (format!("an insert of {total} {items}"), format!("{done} inserted"))
        } else {
            (format!("a sample of {total} {items}"), format!("{done} drawn"))
        };
        let why = if inserting && st.frozen {
            "a cluster step is reading the table's shard; inserts resume when it ends".to_string()
        } else {
            st.limiter.explain(inserting, st.size, want)
        };
        format!("table '{}': {what} has waited {:.1} s ({done}): {why}", self.name(), slow.elapsed().as_secs_f64())
    }

    /// Waits on `cv` until notified, `deadline`, the moment `slow` is due, or (with
    /// an interrupt check) the next poll slice, after which the check runs with the
    /// table unlocked.
    fn wait(&self, st: &mut MutexGuard<'_, State>, cv: &Condvar, deadline: Option<Instant>, wait: &Wait<'_>, inserting: bool, slow: &SlowWait) -> Woke {
        let start = Instant::now();
        let slice = wait.interrupt.map(|_| start + Wait::POLL);
        // A group's timeout may admit it (or free room): wake for it.
        let expiry = st.groups.as_ref().and_then(|g| g.next_expiry());
        let until = [deadline, slice, slow.due(), expiry].into_iter().flatten().min();
        let woke = match until {
            _ if deadline.is_some_and(|d| start >= d) => Woke::TimedOut,
            None => {
                cv.wait(st);
                Woke::Again
            }
            Some(u) => {
                cv.wait_until(st, u);
                if deadline.is_some_and(|d| Instant::now() >= d) {
                    Woke::TimedOut
                } else {
                    Woke::Again
                }
            }
        };
        let woke = match (woke, wait.interrupt) {
            (Woke::Again, Some(stop)) if MutexGuard::unlocked(st, stop) => Woke::Interrupted,
            (w, _) => w,
        };
        let blocked = start.elapsed();
        if inserting {
            st.limiter.blocked_insert += blocked;
        } else {
            st.limiter.blocked_sample += blocked;
        }
        woke
    }

    /// Sets new priorities. Keys no longer in the table are skipped; returns how
    /// many were applied. Every priority is checked before any is applied.
    pub fn update_priorities(&self, keys: &[u64], priorities: &[f64]) -> Result<usize> {
        if keys.len() != priorities.len() {
            return Err(invalid!(
                "table '{}': {} keys but {} priorities; expected one priority per key",
                self.name(),
                keys.len(),
                priorities.len()
            ));
        }
        self.check_priorities(priorities, |i| format!("table '{}' key {}", self.name(), keys[i]))?;
        let mut st = self.shared.state.lock();
        let mut slots = Vec::with_capacity(keys.len());
        let mut present = Vec::with_capacity(keys.len());
        let mut leaders = Vec::new();
        let mut applied = 0;
        for (&k, &p) in keys.iter().zip(priorities) {
            if let Some(slot) = st.lookup(k) {
                let item = st.item(slot);
                let old = std::mem::replace(&mut item.priority, p);
                let event = ItemEvent { slot, seq: item.seq, priority: p, times_sampled: item.times_sampled };
                st.ext.updated(event, old);
                applied += 1;
                match &st.groups {
                    None => {
                        slots.push(slot);
                        present.push(p);
                    }
                    // A group is selected by the sum of its members' priorities
                    // (a pending member's counts once its group is admitted).
                    Some(g) => leaders.extend(g.leader_of(slot)),
                }
            }
        }
        leaders.sort_unstable();
        leaders.dedup();
        for leader in leaders {
            let members = st.groups.as_ref().expect("a table with groups").members(leader).to_vec();
            slots.push(leader);
            present.push(members.iter().map(|&m| st.item(m).priority).sum());
        }
        st.sampler.update_batch(&slots, &present);
        st.remover.update_batch(&slots, &present);
        st.ext.flush();
        Ok(applied)
    }

    /// Removes items by key. Keys no longer in the table are skipped; returns how
    /// many were removed.
    pub fn delete(&self, keys: &[u64]) -> usize {
        let sh = &*self.shared;
        let mut st = sh.state.lock();
        let mut removed = 0;
        for &k in keys {
            if let Some(slot) = st.lookup(k) {
                removed += st.remove(slot, &sh.store) as usize;
            }
        }
        st.num_deletes += removed as u64;
        st.ext.flush();
        if removed > 0 {
            sh.insert_cv.notify_all();
        }
        removed
    }

    /// Removes every item and restarts the rate limiter. Old keys stay invalid.
    pub fn reset(&self) {
        let sh = &*self.shared;
        let mut st = sh.state.lock();
        release_all(&mut st, &sh.store);
        st.limiter.reset();
        sh.insert_cv.notify_all();
        sh.sample_cv.notify_all();
    }

    pub fn info(&self) -> TableInfo {
        let c = &self.shared.config;
        let (store_raw_bytes, store_stored_bytes) = self.shared.store.columns().memory_bytes();
        let mut st = self.shared.state.lock();
        st.expire_groups(&self.shared.store);
        TableInfo {
            name: c.name.clone(),
            size: st.size,
            max_size: c.max_size,
            max_times_sampled: c.max_times_sampled,
            sampler: c.sampler.describe(),
            remover: c.remover.describe(),
            num_inserts: st.num_inserts,
            num_samples: st.num_samples,
            num_evictions: st.num_evictions,
            num_deletes: st.num_deletes,
            num_store_evictions: st.num_store_evictions,
            rate_limiter: c.rate_limiter,
            limiter_inserts: st.limiter.inserts,
            limiter_samples: st.limiter.samples,
            blocked_insert_seconds: st.limiter.blocked_insert.as_secs_f64(),
            blocked_sample_seconds: st.limiter.blocked_sample.as_secs_f64(),
            version: st.versions.as_ref().map(|v| v.current),
            stale_removed: st.versions.as_ref().map_or(0, |v| v.stale_removed),
            stale_dropped: st.versions.as_ref().map_or(0, |v| v.stale_dropped),
            groups: st.groups.as_ref().map(|g| g.info()),
            attributes: c.attributes.specs().iter().map(|a| (a.name.clone(), a.dtype.name().to_string())).collect(),
            store_raw_bytes,
            store_stored_bytes,
        }
    }

    /// The table's policy version (None without an int64 attribute `version`).
    pub fn version(&self) -> Option<i64> {
        self.shared.state.lock().versions.as_ref().map(|v| v.current)
    }

    /// Sets the policy version: `version` must not be below the current one.
    /// With `max_staleness = k`, every item whose version is below `version - k`
    /// leaves at once (counted in `stale_removed`); returns how many did.
    pub fn set_version(&self, version: i64) -> Result<u64> {
        let sh = &*self.shared;
        let mut st = sh.state.lock();
        let state = &mut *st;
        let Some(v) = &mut state.versions else {
            return Err(invalid!("table '{}': set_version: {}", self.name(), sh.config.attributes.version("set_version").unwrap_err()));
        };
        if version < v.current {
            return Err(invalid!(
                "table '{}': set_version({version}) is below the current version {}; versions only move forward",
                self.name(),
                v.current
            ));
        }
        v.current = version;
        let stale = v.take_stale();
        let oldest = v.oldest_allowed();
        let mut removed = 0;
        for slot in stale.into_iter().flatten() {
            removed += state.remove(slot, &sh.store);
        }
        // A pending group is as old as its oldest member.
        if let (Some(g), Some(oldest), Some(v)) = (&state.groups, oldest, &state.versions) {
            let too_old: Vec<u32> = g
                .pending_slots()
                .filter(|slots| slots.iter().any(|&s| v.of(state.records.get(s)) < oldest))
                .map(|slots| slots[0])
                .collect();
            for slot in too_old {
                removed += state.remove(slot, &sh.store);
            }
        }
        if let Some(v) = &mut state.versions {
            v.stale_removed += removed;
        }
        state.ext.flush();
        if removed > 0 {
            sh.insert_cv.notify_all();
        }
        Ok(removed)
    }

    /// Sets attribute `name` of the items `keys` to `values` (one record field per
    /// key, `values.len() == keys.len() * itemsize`, little-endian). Keys no longer
    /// in the table are skipped; returns how many were updated. With
    /// `max_staleness` an item's version is fixed and cannot be updated.
    pub fn update_attribute(&self, keys: &[u64], name: &str, values: &[u8]) -> Result<usize> {
        let attrs = &self.shared.config.attributes;
        let Some(i) = attrs.find(name) else {
            return Err(Error::NotFound(format!(
                "table '{}' has no attribute '{name}'; its attributes are {:?}",
                self.name(),
                attrs.names()
            )));
        };
        let size = attrs.specs()[i].dtype.itemsize();
        if values.len() != keys.len() * size {
            return Err(invalid!(
                "table '{}': {} keys but {} bytes of '{name}' ({}); expected one value per key",
                self.name(),
                keys.len(),
                values.len(),
                attrs.specs()[i].dtype.name()
            ));
        }
        if name == crate::attributes::VERSION && self.shared.config.max_staleness.is_some() {
            return Err(invalid!(
                "table '{}' has max_staleness: an item's version is fixed when it is created and cannot be updated",
                self.name()
            ));
        }
        if name == groups::GROUP && self.shared.config.groups.is_some() {
            return Err(invalid!(
                "table '{}' has group_size: an item's group is fixed when it is created and cannot be updated",
                self.name()
            ));
        }
        let at = attrs.offset(i);
        let mut st = self.shared.state.lock();
        let mut updated = 0;
        for (j, &k) in keys.iter().enumerate() {
            if let Some(slot) = st.lookup(k) {
                st.records.get_mut(slot)[at..at + size].copy_from_slice(&values[j * size..(j + 1) * size]);
                updated += 1;
            }
        }
        Ok(updated)
    }

    /// The attribute records of the items `keys` end to end, and which were found
    /// (a missing key's record is zeros).
    pub fn attributes_of(&self, keys: &[u64]) -> (Vec<u8>, Vec<bool>) {
        let record = self.shared.config.attributes.record();
        let st = self.shared.state.lock();
        let mut out = vec![0; keys.len() * record];
        let mut found = vec![false; keys.len()];
        for (j, &k) in keys.iter().enumerate() {
            if let Some(slot) = st.lookup(k) {
                out[j * record..(j + 1) * record].copy_from_slice(st.records.get(slot));
                found[j] = true;
            }
        }
        (out, found)
    }

    /// What the table's extensions report: `{name: statistics}` (see
    /// [`crate::extensions`]); `{}` without extensions.
    pub fn stats(&self) -> serde_json::Value {
        let st = self.shared.state.lock();
        let mut stats = st.ext.stats();
        if let (Some(v), Some(map)) = (&st.versions, stats.as_object_mut()) {
            map.insert("staleness".into(), v.stats());
        }
        stats
    }

    /// Every item in insertion order (for inspection and tests).
    pub fn items(&self) -> Vec<ItemInfo> {
        let st = self.shared.state.lock();
        let mut items: Vec<&Item> = st.slots.iter().filter_map(|s| s.item.as_ref()).collect();
        items.sort_by_key(|i| i.seq);
        items
            .iter()
            .map(|i| ItemInfo { key: i.key, priority: i.priority, times_sampled: i.times_sampled, length: i.length })
            .collect()
    }
}

impl TableOverStore for Shared {
    fn item_refs(&self, block: u32) -> u32 {
        let st = self.state.lock();
        st.block_items.get(block as usize).map_or(0, |v| v.len() as u32)
    }

    fn evicts_when_store_full(&self) -> bool {
        self.config.evict_when_store_full
    }

    /// Evicts every item that references `block` (store pressure).
    fn evict_block(&self, block: u32, store: &Store) {
        let mut st = self.state.lock();
        let Some(slots) = st.block_items.get(block as usize).cloned() else { return };
        let mut evicted = 0;
        for slot in slots {
            if st.slots[slot as usize].item.is_some() {
                evicted += st.remove(slot, store);
            }
        }
        st.num_evictions += evicted;
        st.num_store_evictions += evicted;
        st.ext.flush();
        if evicted > 0 {
            self.insert_cv.notify_all();
        }
    }

    fn into_any(self: Arc<Self>) -> Arc<dyn std::any::Any + Send + Sync> {
        self
    }
}

fn release_all(st: &mut State, store: &Store) {
    let alloc = store.allocator();
    st.block_items.iter_mut().for_each(VecDeque::clear);
    for (slot, s) in st.slots.iter_mut().enumerate() {
        if let Some(item) = s.item.take() {
            for_each_block(item.window.ranges(), store.block_steps(), |b| alloc.release(b));
            st.free_slots.push(slot as u32);
        }
    }
    st.sampler.clear();
    st.remover.clear();
    st.ext.cleared();
    if let Some(v) = &mut st.versions {
        v.clear();
    }
    if let Some(g) = &mut st.groups {
        g.clear();
    }
    if let Some(lengths) = &mut st.lengths {
        lengths.clear();
    }
    st.size = 0;
}

impl Drop for Shared {
    fn drop(&mut self) {
        release_all(self.state.get_mut(), &self.store);
    }
}

mod batch_insert;
mod resident;
mod groups;
mod versions;
pub use groups::{GroupConfig, OnTimeout};
use groups::{Groups, Role};
pub use versions::LAGS;
use versions::Versions;
mod sampling;
mod shard;
pub use resident::{Admitted, ResidentChange};
pub use shard::ShardSummary;
pub mod snapshot;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod async_tests;
