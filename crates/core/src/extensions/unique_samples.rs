//! The fraction of distinct items among consecutive windows of `window` draws
//! (tumbling windows): 1.0 when no item was drawn twice in a window. Keeps, per
//! table slot, the number of the last window that drew it (4 bytes), so a draw is
//! O(1) with no hashing; a slot's new item starts unseen.

use serde_json::{json, Value};

use super::{reach, Extension, ExtensionSpec, ItemEvent, Saved};

pub struct UniqueSamples {
    window: u32,
    /// The window number that last drew each slot's item; 0 = none.
    last: Vec<u32>,
    /// The window being filled (numbered from 1).
    current: u32,
    distinct: u32,
    draws: u32,
    windows: u64,
    fraction: Option<f64>,
}

impl UniqueSamples {
    pub fn new(window: u32) -> UniqueSamples {
        UniqueSamples { window, last: Vec::new(), current: 1, distinct: 0, draws: 0, windows: 0, fraction: None }
    }
}

impl Extension for UniqueSamples {
    fn spec(&self) -> ExtensionSpec {
        ExtensionSpec::UniqueSamples { window: self.window }
    }

    fn on_insert(&mut self, items: &[ItemEvent], _now: f64) {
        for i in items {
            *reach(&mut self.last, i.slot, 0) = 0;
        }
    }

    fn prefetch(&self, slot: u32) {
        if let Some(w) = self.last.get(slot as usize) {
            crate::memory::prefetch(w);
        }
    }

    fn on_draw(&mut self, draws: &[ItemEvent], _next_seq: u64, _now: f64) {
        for d in draws {
            let last = reach(&mut self.last, d.slot, 0);
            if *last != self.current {
                *last = self.current;
                self.distinct += 1;
            }
            self.draws += 1;
            if self.draws == self.window {
                self.fraction = Some(self.distinct as f64 / self.window as f64);
                self.windows += 1;
                self.draws = 0;
                self.distinct = 0;
                if self.current == u32::MAX {
                    // Window numbers wrapped: forget every slot's (all are old now).
                    self.last.iter_mut().for_each(|w| *w = 0);
                    self.current = 0;
                }
                self.current += 1;
            }
        }
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
            per_slot: Some(self.last.iter().map(|&w| w as f64).collect()),
        }
    }

    fn restore(&mut self, saved: &Saved, live: &[ItemEvent], _now: f64) -> Result<(), String> {
        *self = UniqueSamples::new(self.window);
        let s = &saved.state;
        if s.is_null() {
            for i in live {
                *reach(&mut self.last, i.slot, 0) = 0;
            }
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
            if !(w >= 0.0 && w <= u32::MAX as f64 && w.fract() == 0.0) {
                return Err(format!("slot {} has window number {w}", i.slot));
            }
            *reach(&mut self.last, i.slot, 0) = w as u32;
        }
        Ok(())
    }
}
