//! Table extensions: observers attached to a table that are told of its inserts,
//! draws, priority updates and removals (Reverb's `TableExtension`), and report
//! statistics from what they saw.
//!
//! Extensions run under the table's lock, synchronously, so what they count is
//! exactly what the table did, in the table's order; they must therefore be cheap.
//! They are told in batches: one call per insert or draw call of the table (with
//! one clock reading), never one per item through a virtual call per extension.
//! An [`ExtensionSpec`] names a built-in and its settings; tables are made with a
//! list of them ([`ExtensionSpec::defaults`]: every built-in), and checkpoints keep
//! both the list and each extension's state.
//!
//! Order guarantee: an extension hears of an item's insert before any draw,
//! update or removal of it, and of a draw before the removal the draw caused
//! (`max_times_sampled`): [`Extensions`] flushes pending batches before it reports
//! a removal or an update.

mod histogram;
mod priority_histogram;
mod rates;
mod sampled_age;
mod times_sampled;
mod unique_samples;
#[cfg(test)]
mod tests;

use std::time::Instant;

use serde_json::{json, Map, Value};

pub use histogram::{Histogram, Scale};

/// An item as an extension sees it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ItemEvent {
    /// The item's slot in its table (dense, reused after the item leaves).
    pub slot: u32,
    /// Its insertion sequence number.
    pub seq: u64,
    pub priority: f64,
    /// Times sampled, counting the draw being reported.
    pub times_sampled: u32,
}

/// Why an item left its table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Removal {
    /// The remover chose it to make room (`max_size`).
    Evicted,
    /// Deleted by key.
    Deleted,
    /// Sampled `max_times_sampled` times.
    Exhausted,
    /// Its rows' block was needed by a writer (store pressure).
    StoreFull,
}

/// What an extension writes into a checkpoint: its state as JSON, and optionally
/// one number per table slot (stored as an array of the table's file).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Saved {
    pub state: Value,
    pub per_slot: Option<Vec<f64>>,
}

/// An observer of one table. Every method but `stats`, `save` and `restore` has
/// an empty default, so an extension implements only the events it needs.
/// `now` is seconds on the table's extension clock (monotonic; it starts when
/// the table is made or restored).
pub trait Extension: Send {
    fn spec(&self) -> ExtensionSpec;
    /// New items, in insertion order.
    fn on_insert(&mut self, _items: &[ItemEvent], _now: f64) {}
    /// Items drawn, in draw order; `next_seq` is the table's next insertion number.
    fn on_draw(&mut self, _draws: &[ItemEvent], _next_seq: u64, _now: f64) {}
    /// Asks for the per-slot data a draw of `slot` will read (called a few picks ahead).
    fn prefetch(&self, _slot: u32) {}
    /// `item` now has a new priority; it had `old`.
    fn on_update(&mut self, _item: &ItemEvent, _old: f64) {}
    fn on_remove(&mut self, _item: &ItemEvent, _why: Removal) {}
    /// Every item left at once (`reset`).
    fn on_clear(&mut self) {}
    fn stats(&self, now: f64) -> Value;
    fn save(&self, now: f64) -> Saved;
    /// Continues from `saved` over a table holding `live` (its items, in insertion
    /// order). A state that does not fit is an error naming what is wrong.
    fn restore(&mut self, saved: &Saved, live: &[ItemEvent], now: f64) -> Result<(), String>;
}

/// A built-in extension and its settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExtensionSpec {
    /// The priorities of the items in the table, in power-of-two buckets.
    PriorityHistogram,
    /// How old drawn items are, in inserts and in seconds.
    SampledAge,
    /// How often the items in the table have been sampled.
    TimesSampled,
    /// The fraction of distinct items among each `window` consecutive draws.
    UniqueSamples { window: u32 },
    /// Inserts and draws per second over the last `seconds` seconds.
    Rates { seconds: u32 },
}

impl ExtensionSpec {
    pub const DEFAULT_WINDOW: u32 = 10_000;
    pub const DEFAULT_SECONDS: u32 = 60;
    /// The longest rate history kept.
    pub const MAX_SECONDS: u32 = 86_400;

    /// Every built-in with its default settings.
    pub fn defaults() -> Vec<ExtensionSpec> {
        vec![
            ExtensionSpec::PriorityHistogram,
            ExtensionSpec::SampledAge,
            ExtensionSpec::TimesSampled,
            ExtensionSpec::UniqueSamples { window: Self::DEFAULT_WINDOW },
            ExtensionSpec::Rates { seconds: Self::DEFAULT_SECONDS },
        ]
    }

    /// The key of its statistics in `stats()`.
    pub fn name(&self) -> &'static str {
        match self {
            ExtensionSpec::PriorityHistogram => "priority_histogram",
            ExtensionSpec::SampledAge => "sampled_age",
            ExtensionSpec::TimesSampled => "times_sampled",
            ExtensionSpec::UniqueSamples { .. } => "unique_samples",
            ExtensionSpec::Rates { .. } => "rates",
        }
    }

    pub fn validate(&self) -> Result<(), String> {
        match *self {
            ExtensionSpec::UniqueSamples { window: 0 } => {
                Err("UniqueSamples window must be >= 1 draw, got 0".into())
            }
            ExtensionSpec::Rates { seconds } if seconds == 0 || seconds > Self::MAX_SECONDS => {
                Err(format!("Rates seconds must be 1 to {}, got {seconds}", Self::MAX_SECONDS))
            }
            _ => Ok(()),
        }
    }

    /// Checks a table's list: each valid, no kind twice.
    pub fn validate_list(specs: &[ExtensionSpec]) -> Result<(), String> {
        for (i, s) in specs.iter().enumerate() {
            s.validate()?;
            if specs[..i].iter().any(|t| t.name() == s.name()) {
                return Err(format!("extensions: {} is attached twice; attach each built-in at most once", s.name()));
            }
        }
        Ok(())
    }

    /// `{"kind": name, ...settings}`.
    pub fn to_json(&self) -> Value {
        match *self {
            ExtensionSpec::UniqueSamples { window } => json!({"kind": self.name(), "window": window}),
            ExtensionSpec::Rates { seconds } => json!({"kind": self.name(), "seconds": seconds}),
            _ => json!({"kind": self.name()}),
        }
    }

    pub fn from_json(v: &Value) -> Result<ExtensionSpec, String> {
        let kind = v.get("kind").and_then(Value::as_str).ok_or_else(|| format!("extension {v} has no kind"))?;
        let setting = |key: &str| {
            v.get(key).and_then(Value::as_u64).and_then(|n| u32::try_from(n).ok()).ok_or_else(|| format!("extension {kind} has no valid {key}"))
        };
        let spec = match kind {
            "priority_histogram" => ExtensionSpec::PriorityHistogram,
            "sampled_age" => ExtensionSpec::SampledAge,
            "times_sampled" => ExtensionSpec::TimesSampled,
            "unique_samples" => ExtensionSpec::UniqueSamples { window: setting("window")? },
            "rates" => ExtensionSpec::Rates { seconds: setting("seconds")? },
            other => return Err(format!("unknown extension kind '{other}'")),
        };
        spec.validate()?;
        Ok(spec)
    }

    pub fn build(&self) -> Box<dyn Extension> {
        match *self {
            ExtensionSpec::PriorityHistogram => Box::new(priority_histogram::PriorityHistogram::new()),
            ExtensionSpec::SampledAge => Box::new(sampled_age::SampledAge::new()),
            ExtensionSpec::TimesSampled => Box::new(times_sampled::TimesSampled::new()),
            ExtensionSpec::UniqueSamples { window } => Box::new(unique_samples::UniqueSamples::new(window)),
            ExtensionSpec::Rates { seconds } => Box::new(rates::Rates::new(seconds)),
        }
    }
}

/// A table's extensions, with the batches not yet reported. With none attached
/// every method returns at once.
pub(crate) struct Extensions {
    list: Vec<Box<dyn Extension>>,
    clock: Instant,
    inserted: Vec<ItemEvent>,
    drawn: Vec<ItemEvent>,
}

impl Extensions {
    pub(crate) fn new(specs: &[ExtensionSpec]) -> Extensions {
        Extensions { list: specs.iter().map(ExtensionSpec::build).collect(), clock: Instant::now(), inserted: Vec::new(), drawn: Vec::new() }
    }

    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    fn now(&self) -> f64 {
        self.clock.elapsed().as_secs_f64()
    }

    #[inline]
    pub(crate) fn inserted(&mut self, item: ItemEvent) {
        if !self.is_empty() {
            self.inserted.push(item);
        }
    }

    #[inline]
    pub(crate) fn drawn(&mut self, item: ItemEvent) {
        if !self.is_empty() {
            self.drawn.push(item);
        }
    }

    #[inline]
    pub(crate) fn prefetch(&self, slot: u32) {
        for e in &self.list {
            e.prefetch(slot);
        }
    }

    /// Reports the pending inserts and draws (one clock reading for both).
    pub(crate) fn flush(&mut self, next_seq: u64) {
        if self.inserted.is_empty() && self.drawn.is_empty() {
            return;
        }
        let now = self.now();
        if !self.inserted.is_empty() {
            for e in &mut self.list {
                e.on_insert(&self.inserted, now);
            }
            self.inserted.clear();
        }
        if !self.drawn.is_empty() {
            for e in &mut self.list {
                e.on_draw(&self.drawn, next_seq, now);
            }
            self.drawn.clear();
        }
    }

    pub(crate) fn updated(&mut self, item: &ItemEvent, old: f64, next_seq: u64) {
        if self.is_empty() {
            return;
        }
        self.flush(next_seq);
        for e in &mut self.list {
            e.on_update(item, old);
        }
    }

    pub(crate) fn removed(&mut self, item: &ItemEvent, why: Removal, next_seq: u64) {
        if self.is_empty() {
            return;
        }
        self.flush(next_seq);
        for e in &mut self.list {
            e.on_remove(item, why);
        }
    }

    pub(crate) fn cleared(&mut self) {
        self.inserted.clear();
        self.drawn.clear();
        for e in &mut self.list {
            e.on_clear();
        }
    }

    /// `{name: statistics}` of every extension.
    pub(crate) fn stats(&self) -> Value {
        let now = self.now();
        Value::Object(self.list.iter().map(|e| (e.spec().name().to_string(), e.stats(now))).collect::<Map<_, _>>())
    }

    /// Each extension's saved state, in the table's order.
    pub(crate) fn save(&self) -> Vec<Saved> {
        let now = self.now();
        self.list.iter().map(|e| e.save(now)).collect()
    }

    /// Restores each extension from `saved` (same order; `None`: start empty over `live`).
    pub(crate) fn restore(&mut self, saved: Option<&[Saved]>, live: &[ItemEvent]) -> Result<(), String> {
        let now = self.now();
        let empty = Saved::default();
        if let Some(s) = saved {
            if s.len() != self.list.len() {
                return Err(format!("{} extension states for {} extensions", s.len(), self.list.len()));
            }
        }
        for (i, e) in self.list.iter_mut().enumerate() {
            let state = saved.map_or(&empty, |s| &s[i]);
            e.restore(state, live, now).map_err(|m| format!("extension {}: {m}", e.spec().name()))?;
        }
        Ok(())
    }
}

/// Reads a histogram's counts from saved state (`key` in `state`); `None` if absent.
pub(crate) fn saved_histogram(state: &Value, key: &str, scale: Scale) -> Result<Option<Histogram>, String> {
    match state.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => {
            let counts: Vec<u64> = serde_json::from_value(v.clone()).map_err(|e| format!("{key}: {e}"))?;
            Histogram::from_counts(scale, counts).map(Some).ok_or_else(|| format!("{key}: wrong number of buckets"))
        }
    }
}

/// Grows a per-slot vector so that `slot` is in it.
#[inline]
pub(crate) fn reach<T: Clone>(v: &mut Vec<T>, slot: u32, fill: T) -> &mut T {
    let i = slot as usize;
    if v.len() <= i {
        v.resize(i + 1, fill);
    }
    &mut v[i]
}
