//! How often the items in a table have been sampled ([`Scale::Count`] buckets:
//! never, once, 2-3, 4-7, ...). A draw moves its item one count up; O(1) per
//! event, rebuilt from the items on restore.

use serde_json::Value;

use super::{Extension, ExtensionSpec, Histogram, ItemEvent, Removal, Saved, Scale};

pub struct TimesSampled {
    histogram: Histogram,
}

impl TimesSampled {
    pub fn new() -> TimesSampled {
        TimesSampled { histogram: Histogram::new(Scale::Count) }
    }
}

impl Extension for TimesSampled {
    fn spec(&self) -> ExtensionSpec {
        ExtensionSpec::TimesSampled
    }

    fn on_insert(&mut self, items: &[ItemEvent], _now: f64) {
        for i in items {
            self.histogram.add_count(i.times_sampled as u64);
        }
    }

    fn on_draw(&mut self, draws: &[ItemEvent], _next_seq: u64, _now: f64) {
        for d in draws {
            let (before, after) = (Scale::Count.bucket_of_count(d.times_sampled as u64 - 1), Scale::Count.bucket_of_count(d.times_sampled as u64));
            if before != after {
                self.histogram.remove_from(before, 1);
                self.histogram.add_to(after, 1);
            }
        }
    }

    fn on_remove(&mut self, item: &ItemEvent, _why: Removal) {
        self.histogram.remove_count(item.times_sampled as u64);
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
