//! How often the items in a table have been sampled ([`Scale::Count`] buckets:
//! never, once, 2-3, 4-7, ...). A draw moves its item one count up; O(1) per
//! event, rebuilt from the items on restore.

use serde_json::Value;

use super::{Extension, ExtensionSpec, Histogram, ItemEvent, Saved, Scale};

pub struct TimesSampled {
    histogram: Histogram,
}

impl TimesSampled {
    pub fn new() -> TimesSampled {
        TimesSampled { histogram: Histogram::new(Scale::Count) }
    }

    /// A new item: never sampled.
    #[inline]
    pub fn inserted(&mut self) {
        self.histogram.add_to(0, 1);
    }

    /// An item drawn; `times` counts this draw.
    #[inline]
    pub fn drawn(&mut self, times: u32) {
        let t = times as u64;
        let (before, after) = (Scale::Count.bucket_of_count(t - 1), Scale::Count.bucket_of_count(t));
        if before != after {
            self.histogram.remove_from(before, 1);
            self.histogram.add_to(after, 1);
        }
    }

    #[inline]
    pub fn removed(&mut self, times: u32) {
        self.histogram.remove_count(times as u64);
    }
}

impl Extension for TimesSampled {
    fn spec(&self) -> ExtensionSpec {
        ExtensionSpec::TimesSampled
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
        live.iter().for_each(|i| self.histogram.add_count(i.times_sampled as u64));
        Ok(())
    }
}
