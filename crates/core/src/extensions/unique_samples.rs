//! The fraction of distinct items among consecutive windows of `window` draws
//! (tumbling windows): 1.0 when no item was drawn twice in a window. Each table
//! slot keeps the number of the last window that drew its item (in the slot
//! record a draw touches anyway, reset when the slot gets a new item), so a draw
//! is O(1), with no hashing and no memory of its own per item.

use serde_json::{json, Value};

use super::{Extension, ExtensionSpec, ItemEvent, Saved};

pub struct UniqueSamples {
    window: u32,
    /// The window being filled (numbered from 1; 0 means "never drawn").
    current: u32,
    distinct: u32,
    draws: u32,
    windows: u64,
    fraction: Option<f64>,
}

impl UniqueSamples {
    pub fn new(window: u32) -> UniqueSamples {
        UniqueSamples { window, current: 1, distinct: 0, draws: 0, windows: 0, fraction: None }
    }

    /// A draw of the item whose slot's window number is `last`.
    #[inline]
    pub fn drawn(&mut self, last: &mut u32) {
        // Branch-free: whether a random item was seen in this window is a coin toss the
        // branch predictor loses about half the time.
        self.distinct += (*last != self.current) as u32;
        *last = self.current;
        self.draws += 1;
        if self.draws == self.window {
            self.fraction = Some(self.distinct as f64 / self.window as f64);
            self.windows += 1;
            self.draws = 0;
            self.distinct = 0;
            // After 2^32 - 1 windows (4e13 draws of 10,000) the numbers wrap, skipping 0;
            // an item last drawn exactly 2^32 - 1 windows earlier would then count as seen.
            self.current = self.current.checked_add(1).unwrap_or(1);
        }
    }
}

impl Extension for UniqueSamples {
    fn spec(&self) -> ExtensionSpec {
        ExtensionSpec::UniqueSamples { window: self.window }
    }

    fn stats(&self, _now: f64) -> Value {
        json!({
            "window": self.window,
            "fraction": self.fraction,
            "windows": self.windows,
            "current": self.distinct,
            "current_draws": self.draws,
        })
    }

    fn save(&self, _now: f64) -> Saved {
        Saved {
            state: json!({
                "current": self.current,
                "distinct": self.distinct,
                "draws": self.draws,
                "windows": self.windows,
                "fraction": self.fraction,
            }),
            // The per-slot window numbers live in the table's slots: the table adds them.
            per_slot: None,
        }
    }

    /// Checks the saved per-slot window numbers of the live items (the table
    /// writes them back into its slots).
    fn restore(&mut self, saved: &Saved, live: &[ItemEvent], _now: f64) -> Result<(), String> {
        *self = UniqueSamples::new(self.window);
        let s = &saved.state;
        if s.is_null() {
            return Ok(());
        }
        let int = |key: &str| s.get(key).and_then(Value::as_u64).ok_or_else(|| format!("no valid {key}"));
        let small = |key: &str| int(key).and_then(|v| u32::try_from(v).map_err(|_| format!("{key} {v} is too large")));
        self.current = small("current")?.max(1);
        self.distinct = small("distinct")?;
        self.draws = small("draws")?;
        self.windows = int("windows")?;
        self.fraction = s.get("fraction").and_then(Value::as_f64);
        if self.draws >= self.window || self.distinct > self.draws {
            return Err(format!("{} distinct in {} draws of a window of {}", self.distinct, self.draws, self.window));
        }
        for i in live {
            let w = saved.per_slot.as_ref().and_then(|a| a.get(i.slot as usize)).copied().unwrap_or(0.0);
            if !((0.0..=u32::MAX as f64).contains(&w) && w.fract() == 0.0) {
                return Err(format!("slot {} has window number {w}", i.slot));
            }
        }
        Ok(())
    }
}
