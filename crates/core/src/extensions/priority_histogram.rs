//! The priorities of the items in a table, in power-of-two buckets
//! ([`Scale::Real`]). O(1) per insert, update and removal; rebuilt from the
//! items on restore, so it always describes exactly the table's items.

use serde_json::Value;

use super::{Extension, ExtensionSpec, Histogram, ItemEvent, Removal, Saved, Scale};

pub struct PriorityHistogram {
    histogram: Histogram,
}

impl PriorityHistogram {
    pub fn new() -> PriorityHistogram {
        PriorityHistogram { histogram: Histogram::new(Scale::Real) }
    }
}

impl Extension for PriorityHistogram {
    fn spec(&self) -> ExtensionSpec {
        ExtensionSpec::PriorityHistogram
    }

    fn on_insert(&mut self, items: &[ItemEvent], _now: f64) {
        for i in items {
            self.histogram.add_real(i.priority);
        }
    }

    fn on_update(&mut self, item: &ItemEvent, old: f64) {
        self.histogram.remove_real(old);
        self.histogram.add_real(item.priority);
    }

    fn on_remove(&mut self, item: &ItemEvent, _why: Removal) {
        self.histogram.remove_real(item.priority);
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

    fn restore(&mut self, _saved: &Saved, live: &[ItemEvent], now: f64) -> Result<(), String> {
        self.histogram.clear();
        self.on_insert(live, now);
        Ok(())
    }
}
