//! How old drawn items are: in inserts (items inserted after the drawn one; 0 is
//! the newest) and in seconds since its insert, as cumulative histograms over
//! every draw with their means. Keeps one insertion time per table slot (8 bytes),
//! read by each draw; the table prefetches it with the slot.

use serde_json::{json, Value};

use super::{reach, saved_histogram, Extension, ExtensionSpec, Histogram, ItemEvent, Saved, Scale};

pub struct SampledAge {
    /// Insertion time of the item in each slot, on the extension clock.
    inserted: Vec<f64>,
    inserts: Histogram,
    seconds: Histogram,
    count: u64,
    sum_inserts: f64,
    sum_seconds: f64,
}

impl SampledAge {
    pub fn new() -> SampledAge {
        SampledAge {
            inserted: Vec::new(),
            inserts: Histogram::new(Scale::Count),
            seconds: Histogram::new(Scale::Seconds),
            count: 0,
            sum_inserts: 0.0,
            sum_seconds: 0.0,
        }
    }
}

impl Extension for SampledAge {
    fn spec(&self) -> ExtensionSpec {
        ExtensionSpec::SampledAge
    }

    fn on_insert(&mut self, items: &[ItemEvent], now: f64) {
        for i in items {
            *reach(&mut self.inserted, i.slot, now) = now;
        }
    }

    fn prefetch(&self, slot: u32) {
        if let Some(t) = self.inserted.get(slot as usize) {
            crate::memory::prefetch(t);
        }
    }

    fn on_draw(&mut self, draws: &[ItemEvent], next_seq: u64, now: f64) {
        for d in draws {
            let age = next_seq.saturating_sub(d.seq + 1);
            let seconds = (now - self.inserted.get(d.slot as usize).copied().unwrap_or(now)).max(0.0);
            self.inserts.add_count(age);
            self.seconds.add_real(seconds);
            self.sum_inserts += age as f64;
            self.sum_seconds += seconds;
        }
        self.count += draws.len() as u64;
    }

    fn stats(&self, _now: f64) -> Value {
        let mean = |sum: f64| (self.count > 0).then(|| sum / self.count as f64);
        json!({
            "count": self.count,
            "inserts": self.inserts.to_json(),
            "seconds": self.seconds.to_json(),
            "mean_inserts": mean(self.sum_inserts),
            "mean_seconds": mean(self.sum_seconds),
        })
    }

    fn save(&self, now: f64) -> Saved {
        Saved {
            state: json!({
                "count": self.count,
                "sum_inserts": self.sum_inserts,
                "sum_seconds": self.sum_seconds,
                "inserts": self.inserts.counts(),
                "seconds": self.seconds.counts(),
            }),
            // Ages, not times: the clock restarts with the restored table.
            per_slot: Some(self.inserted.iter().map(|t| (now - t).max(0.0)).collect()),
        }
    }

    fn restore(&mut self, saved: &Saved, live: &[ItemEvent], now: f64) -> Result<(), String> {
        *self = SampledAge::new();
        let s = &saved.state;
        if let Some(h) = saved_histogram(s, "inserts", Scale::Count)? {
            self.inserts = h;
        }
        if let Some(h) = saved_histogram(s, "seconds", Scale::Seconds)? {
            self.seconds = h;
        }
        self.count = s.get("count").and_then(Value::as_u64).unwrap_or(0);
        self.sum_inserts = s.get("sum_inserts").and_then(Value::as_f64).unwrap_or(0.0);
        self.sum_seconds = s.get("sum_seconds").and_then(Value::as_f64).unwrap_or(0.0);
        if self.inserts.total() != self.count || self.seconds.total() != self.count {
            return Err(format!("count {} does not match its histograms ({}, {})", self.count, self.inserts.total(), self.seconds.total()));
        }
        // Items without a saved age (an older checkpoint) count from now.
        for i in live {
            let age = saved.per_slot.as_ref().and_then(|a| a.get(i.slot as usize)).copied().unwrap_or(0.0);
            if !(age.is_finite() && age >= 0.0) {
                return Err(format!("slot {} has age {age}", i.slot));
            }
            *reach(&mut self.inserted, i.slot, now) = now - age;
        }
        Ok(())
    }
}
