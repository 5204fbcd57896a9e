//! The priorities of the items in a table, in power-of-two buckets
//! ([`Scale::Real`]). O(1) per insert, update and removal; rebuilt from the
//! items on restore, so it always describes exactly the table's items.

use serde_json::Value;

use super::{Extension, ExtensionSpec, Histogram, ItemEvent, Saved, Scale};

pub struct PriorityHistogram {
    histogram: Histogram,
}

impl PriorityHistogram {
    pub fn new() -> PriorityHistogram {
        PriorityHistogram { histogram: Histogram::new(Scale::Real) }
    }

    #[inline]
    pub fn inserted(&mut self, priority: f64) {
        self.histogram.add_real(priority);
    }

    #[inline]
    pub fn updated(&mut self, old: f64, new: f64) {
        self.histogram.remove_real(old);
        self.histogram.add_real(new);
    }

    #[inline]
    pub fn removed(&mut self, priority: f64) {
        self.histogram.remove_real(priority);
    }
}

impl Extension for PriorityHistogram {
    fn spec(&self) -> ExtensionSpec {
        ExtensionSpec::PriorityHistogram
    }

    fn on_clear(&mut self) {
        self.histogram.clear();
    }

    fn stats(&self, _now: f64) -> Value {
        self.histogram.to_json()
    }

    fn save(&self, _now: f64) -> Saved {
        Saved { state: Value::Null, per_slot: None }
    }

    fn restore(&mut self, _saved: &Saved, live: &[ItemEvent], _now: f64) -> Result<(), String> {
        self.histogram.clear();
        live.iter().for_each(|i| self.histogram.add_real(i.priority));
        Ok(())
    }
}
