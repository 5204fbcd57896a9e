//! Policy versions: a table's current version, bounded staleness and the figures
//! of how far behind drawn items were.
//!
//! With `max_staleness = k`, an item whose `version` attribute is below
//! `current - k` is never drawn: `set_version` removes every such item at once and
//! an insert that is already stale is dropped at commit. Items are indexed by
//! version (a bucket of slots per version, each slot knowing its place in its
//! bucket), so removing the stale ones costs what is removed, not a scan.

use std::collections::BTreeMap;

use serde_json::{json, Value};

use crate::attributes::Attributes;

/// Lags tallied one by one; a draw `LAGS` or more versions behind counts in the last bucket.
pub const LAGS: usize = 16;

pub(crate) struct Versions {
    /// Where `version` sits in an item's attribute record.
    offset: usize,
    pub(crate) current: i64,
    pub(crate) max_staleness: Option<u64>,
    /// With `max_staleness`: the slots of each version, and each slot's version
    /// and place in its bucket (checked against the bucket: a stale entry is ignored).
    buckets: BTreeMap<i64, Vec<u32>>,
    place: Vec<(i64, u32)>,
    pub(crate) stale_removed: u64,
    pub(crate) stale_dropped: u64,
    /// Draws by how many versions behind `current` the item was (`LAGS` and more in the last).
    pub(crate) drawn_behind: [u64; LAGS + 1],
    /// Draws of items newer than `current` (a writer ahead of `set_version`).
    pub(crate) drawn_ahead: u64,
}

impl Versions {
    /// Versions for a table with `attributes`, or None when they have no int64
    /// `version` (then `max_staleness` must be None, checked by the table).
    pub(crate) fn new(attributes: &Attributes, max_staleness: Option<u64>) -> Option<Versions> {
        let i = attributes.version("").ok()?;
        Some(Versions {
            offset: attributes.offset(i),
            current: 0,
            max_staleness,
            buckets: BTreeMap::new(),
            place: Vec::new(),
            stale_removed: 0,
            stale_dropped: 0,
            drawn_behind: [0; LAGS + 1],
            drawn_ahead: 0,
        })
    }

    pub(crate) fn of(&self, record: &[u8]) -> i64 {
        Attributes::read_i64(record, self.offset)
    }

    /// The lowest version that may still be drawn (None: any).
    pub(crate) fn oldest_allowed(&self) -> Option<i64> {
        self.max_staleness.map(|k| self.current.saturating_sub(k.min(i64::MAX as u64) as i64))
    }

    /// True when an item with this record may not enter (or stay in) the table.
    pub(crate) fn is_stale(&self, record: &[u8]) -> bool {
        self.oldest_allowed().is_some_and(|oldest| self.of(record) < oldest)
    }

    /// Indexes a new sampleable unit (an item, or a group's leader with the
    /// group's oldest version) under `version` (with `max_staleness`).
    pub(crate) fn added(&mut self, slot: u32, version: i64) {
        if self.max_staleness.is_none() {
            return;
        }
        let bucket = self.buckets.entry(version).or_default();
        if self.place.len() <= slot as usize {
            self.place.resize(slot as usize + 1, (0, 0));
        }
        self.place[slot as usize] = (version, bucket.len() as u32);
        bucket.push(slot);
    }

    /// Forgets a unit that left, if it was indexed. A bucket already taken out by
    /// [`Versions::take_stale`] is not there to update.
    pub(crate) fn removed(&mut self, slot: u32) {
        if self.max_staleness.is_none() {
            return;
        }
        let Some(&(version, at)) = self.place.get(slot as usize) else { return };
        let Some(bucket) = self.buckets.get_mut(&version) else { return };
        let at = at as usize;
        if bucket.get(at) != Some(&slot) {
            return; // not indexed (a group member, or pending)
        }
        bucket.swap_remove(at);
        if let Some(&moved) = bucket.get(at) {
            self.place[moved as usize].1 = at as u32;
        }
        if bucket.is_empty() {
            self.buckets.remove(&version);
        }
    }

    /// Takes out the buckets of every version now too old: the slots to remove.
    pub(crate) fn take_stale(&mut self) -> Vec<Vec<u32>> {
        let Some(oldest) = self.oldest_allowed() else { return Vec::new() };
        let keep = self.buckets.split_off(&oldest);
        std::mem::replace(&mut self.buckets, keep).into_values().collect()
    }

    /// Counts a draw of an item with this record.
    pub(crate) fn drawn(&mut self, record: &[u8]) {
        let version = self.of(record);
        if version > self.current {
            self.drawn_ahead += 1;
        } else {
            let behind = (self.current as i128 - version as i128).min(LAGS as i128) as usize;
            self.drawn_behind[behind] += 1;
        }
    }

    pub(crate) fn clear(&mut self) {
        self.buckets.clear();
    }

    /// The figures `stats()["Staleness"]` reports.
    pub(crate) fn stats(&self) -> Value {
        let draws: u64 = self.drawn_behind.iter().sum::<u64>() + self.drawn_ahead;
        let total_lag: u64 = self.drawn_behind.iter().enumerate().map(|(lag, &n)| lag as u64 * n).sum();
        json!({
            "version": self.current,
            "max_staleness": self.max_staleness,
            "draws": draws,
            "behind": self.drawn_behind.to_vec(),
            "ahead": self.drawn_ahead,
            "mean_behind": if draws == 0 { 0.0 } else { total_lag as f64 / draws as f64 },
            "stale_removed": self.stale_removed,
            "stale_dropped": self.stale_dropped,
        })
    }

    /// The counters a checkpoint keeps (the index is rebuilt from the items).
    pub(crate) fn save(&self) -> Value {
        json!({
            "version": self.current,
            "stale_removed": self.stale_removed,
            "stale_dropped": self.stale_dropped,
            "behind": self.drawn_behind.to_vec(),
            "ahead": self.drawn_ahead,
        })
    }

    /// Takes the counters of [`Versions::save`] back.
    pub(crate) fn restore(&mut self, saved: &Value) -> Result<(), String> {
        let int = |name: &str| saved.get(name).and_then(Value::as_i64).ok_or_else(|| format!("versions: '{name}' missing or not an integer"));
        let count = |name: &str| saved.get(name).and_then(Value::as_u64).ok_or_else(|| format!("versions: '{name}' missing or not a count"));
        self.current = int("version")?;
        self.stale_removed = count("stale_removed")?;
        self.stale_dropped = count("stale_dropped")?;
        self.drawn_ahead = count("ahead")?;
        let behind = saved.get("behind").and_then(Value::as_array).ok_or("versions: 'behind' missing")?;
        if behind.len() != LAGS + 1 {
            return Err(format!("versions: 'behind' has {} buckets, expected {}", behind.len(), LAGS + 1));
        }
        for (b, v) in self.drawn_behind.iter_mut().zip(behind) {
            *b = v.as_u64().ok_or("versions: 'behind' holds a non-count")?;
        }
        Ok(())
    }
}
