//! Table extensions: observers attached to a table that are told of its inserts,
//! draws, priority updates and removals (Reverb's `TableExtension`), and report
//! statistics from what they saw.
//!
//! Extensions run under the table's lock, synchronously, so what they count is
//! exactly what the table did, in the table's order. They sit on the hot path of
//! every insert and draw, so the built-ins are called directly (no virtual call,
//! no event queue): each event costs a few arithmetic operations and at most one
//! write per extension, and a table call reads a coarse clock at most once.
//! An [`ExtensionSpec`] names a built-in and its settings; tables are made with a
//! list of them ([`ExtensionSpec::defaults`]: every built-in), and checkpoints keep
//! both the list and each extension's state ([`Extension`]).

mod histogram;
mod priority_histogram;
mod rates;
mod sampled_age;
mod times_sampled;
mod unique_samples;
#[cfg(test)]
mod tests;

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

/// What an extension writes into a checkpoint: its state as JSON, and optionally
/// one number per table slot (stored as an array of the table's file).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Saved {
    pub state: Value,
    pub per_slot: Option<Vec<f64>>,
}

/// What every built-in shares besides its events (which [`Extensions`] calls
/// directly): its spec, its statistics, and its state for checkpoints. Times are
/// seconds on the table's extension clock (monotonic, millisecond-coarse; it
/// starts when the table is made or restored).
pub trait Extension: Send {
    fn spec(&self) -> ExtensionSpec;
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
}

/// A table's extensions, each built-in at most once. Every event method is a
/// few inlined branches when none is attached.
pub(crate) struct Extensions {
    /// Attachment order: the order of `stats()`, checkpoints and `extensions`.
    order: Vec<ExtensionSpec>,
    priorities: Option<priority_histogram::PriorityHistogram>,
    age: Option<sampled_age::SampledAge>,
    times: Option<times_sampled::TimesSampled>,
    unique: Option<unique_samples::UniqueSamples>,
    rates: Option<rates::Rates>,
    clock: Clock,
    /// The clock at this table call's first timed event (valid while `timed`).
    now: f64,
    timed: bool,
    /// Inserts and draws of this table call, for `rates` (added at `flush`).
    inserts: u64,
    draws: u64,
}

impl Extensions {
    pub(crate) fn new(specs: &[ExtensionSpec]) -> Extensions {
        let mut e = Extensions {
            order: specs.to_vec(),
            priorities: None,
            age: None,
            times: None,
            unique: None,
            rates: None,
            clock: Clock::start(),
            now: 0.0,
            timed: false,
            inserts: 0,
            draws: 0,
        };
        for spec in specs {
            match *spec {
                ExtensionSpec::PriorityHistogram => e.priorities = Some(priority_histogram::PriorityHistogram::new()),
                ExtensionSpec::SampledAge => e.age = Some(sampled_age::SampledAge::new()),
                ExtensionSpec::TimesSampled => e.times = Some(times_sampled::TimesSampled::new()),
                ExtensionSpec::UniqueSamples { window } => e.unique = Some(unique_samples::UniqueSamples::new(window)),
                ExtensionSpec::Rates { seconds } => e.rates = Some(rates::Rates::new(seconds)),
            }
        }
        e
    }

    /// The attached built-in `spec` names (it is one of `order`).
    fn get(&self, spec: ExtensionSpec) -> &dyn Extension {
        match spec {
            ExtensionSpec::PriorityHistogram => self.priorities.as_ref().expect("attached"),
            ExtensionSpec::SampledAge => self.age.as_ref().expect("attached"),
            ExtensionSpec::TimesSampled => self.times.as_ref().expect("attached"),
            ExtensionSpec::UniqueSamples { .. } => self.unique.as_ref().expect("attached"),
            ExtensionSpec::Rates { .. } => self.rates.as_ref().expect("attached"),
        }
    }

    fn get_mut(&mut self, spec: ExtensionSpec) -> &mut dyn Extension {
        match spec {
            ExtensionSpec::PriorityHistogram => self.priorities.as_mut().expect("attached"),
            ExtensionSpec::SampledAge => self.age.as_mut().expect("attached"),
            ExtensionSpec::TimesSampled => self.times.as_mut().expect("attached"),
            ExtensionSpec::UniqueSamples { .. } => self.unique.as_mut().expect("attached"),
            ExtensionSpec::Rates { .. } => self.rates.as_mut().expect("attached"),
        }
    }

    /// The attached extensions, in attachment order.
    fn each(&self) -> impl Iterator<Item = &dyn Extension> {
        self.order.iter().map(|&spec| self.get(spec))
    }

    /// The time of this table call (read once per call, and only when needed).
    #[inline]
    fn now(&mut self) -> f64 {
        if !self.timed {
            self.now = self.clock.now();
            self.timed = true;
        }
        self.now
    }

    #[inline]
    pub(crate) fn inserted(&mut self, item: ItemEvent) {
        if let Some(p) = &mut self.priorities {
            p.inserted(item.priority);
        }
        if self.age.is_some() {
            let now = self.now();
            if let Some(a) = &mut self.age {
                a.inserted(item.seq, now);
            }
        }
        if let Some(t) = &mut self.times {
            t.inserted();
        }
        self.inserts += 1;
    }

    /// `next_seq`: the table's next insertion number (the draw's age follows from
    /// it); `window`: the item's slot's `UniqueSamples` window number.
    #[inline]
    pub(crate) fn drawn(&mut self, item: ItemEvent, next_seq: u64, window: &mut u32) {
        if self.age.is_some() {
            let now = self.now();
            if let Some(a) = &mut self.age {
                a.drawn(item.seq, next_seq.saturating_sub(item.seq + 1), now);
            }
        }
        if let Some(t) = &mut self.times {
            t.drawn(item.times_sampled);
        }
        if let Some(u) = &mut self.unique {
            u.drawn(window);
        }
        self.draws += 1;
    }

    /// True when an attached extension looks at each draw's item (its age, its
    /// times sampled, its slot); false when draws may be reported by count alone.
    pub(crate) fn observes_each_draw(&self) -> bool {
        self.age.is_some() || self.times.is_some() || self.unique.is_some()
    }

    /// `count` draws reported by count alone (a device-resident draw); only for
    /// tables whose extensions do not [`Extensions::observes_each_draw`].
    #[inline]
    pub(crate) fn drawn_in_bulk(&mut self, count: u64) {
        debug_assert!(!self.observes_each_draw());
        self.draws += count;
    }

    #[inline]
    pub(crate) fn updated(&mut self, item: ItemEvent, old: f64) {
        if let Some(p) = &mut self.priorities {
            p.updated(old, item.priority);
        }
    }

    #[inline]
    pub(crate) fn removed(&mut self, item: ItemEvent) {
        if let Some(p) = &mut self.priorities {
            p.removed(item.priority);
        }
        if let Some(t) = &mut self.times {
            t.removed(item.times_sampled);
        }
    }

    /// Ends a table call: the call's counts go to `rates`, and the next call reads
    /// the clock again. The table calls it before it lets go of its lock.
    #[inline]
    pub(crate) fn flush(&mut self) {
        if self.inserts + self.draws > 0 {
            if self.rates.is_some() {
                let now = self.now();
                if let Some(r) = &mut self.rates {
                    r.add(now, self.inserts, self.draws);
                }
            }
            self.inserts = 0;
            self.draws = 0;
        }
        self.timed = false;
    }

    pub(crate) fn cleared(&mut self) {
        self.flush();
        for spec in self.order.clone() {
            self.get_mut(spec).on_clear();
        }
    }

    /// `{name: statistics}` of every extension.
    pub(crate) fn stats(&self) -> Value {
        let now = self.clock.now();
        Value::Object(self.each().map(|e| (e.spec().name().to_string(), e.stats(now))).collect::<Map<_, _>>())
    }

    /// Each extension's saved state, in the table's order; `windows`: every
    /// slot's `UniqueSamples` window number (kept in the table's slots).
    pub(crate) fn save(&self, windows: &[u32]) -> Vec<Saved> {
        let now = self.clock.now();
        self.each()
            .map(|e| {
                let mut saved = e.save(now);
                if matches!(e.spec(), ExtensionSpec::UniqueSamples { .. }) {
                    saved.per_slot = Some(windows.iter().map(|&w| w as f64).collect());
                }
                saved
            })
            .collect()
    }

    /// The per-slot window numbers `UniqueSamples` saved, if it is attached and saved them.
    pub(crate) fn saved_windows<'s>(&self, saved: &'s [Saved]) -> Option<&'s [f64]> {
        let at = self.order.iter().position(|s| matches!(s, ExtensionSpec::UniqueSamples { .. }))?;
        saved.get(at)?.per_slot.as_deref()
    }

    /// Restores each extension from `saved` (same order; a default `Saved` starts
    /// that extension empty over `live`).
    pub(crate) fn restore(&mut self, saved: &[Saved], live: &[ItemEvent]) -> Result<(), String> {
        let now = self.clock.now();
        if saved.len() != self.order.len() {
            return Err(format!("{} extension states for {} extensions", saved.len(), self.order.len()));
        }
        for (spec, state) in self.order.clone().into_iter().zip(saved) {
            self.get_mut(spec).restore(state, live, now).map_err(|m| format!("extension {}: {m}", spec.name()))?;
        }
        Ok(())
    }
}

/// The extension clock: `CLOCK_MONOTONIC_COARSE` (a few nanoseconds to read,
/// millisecond resolution: what ages and per-second rates need), seconds since
/// the table was made or restored.
struct Clock {
    start: f64,
}

impl Clock {
    fn start() -> Clock {
        Clock { start: Self::read() }
    }

    fn read() -> f64 {
        let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: `ts` is a valid timespec to write; the clock id is a constant Linux knows.
        let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
        if rc != 0 {
            return 0.0;
        }
        ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
    }

    fn now(&self) -> f64 {
        (Self::read() - self.start).max(0.0)
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
