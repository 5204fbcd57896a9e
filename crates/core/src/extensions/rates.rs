//! Inserts and draws per second: one counter per second over the last `seconds`
//! seconds (at least the 10 the rates are averaged over), in a ring indexed by the
//! second on the extension clock. O(1) per batch.

use serde_json::{json, Value};

use super::{Extension, ExtensionSpec, ItemEvent, Saved};

/// The seconds `insert_rate` and `sample_rate` average over.
const RATE_SECONDS: i64 = 10;

pub struct Rates {
    seconds: u32,
    inserts: Vec<u64>,
    samples: Vec<u64>,
    /// The second of the newest counter.
    head: i64,
    /// The first second counted (earlier ones were before the table existed).
    start: i64,
}

impl Rates {
    pub fn new(seconds: u32) -> Rates {
        let len = (seconds as usize).max(RATE_SECONDS as usize + 1);
        Rates { seconds, inserts: vec![0; len], samples: vec![0; len], head: 0, start: 0 }
    }

    /// Counts `inserts` and `draws` at time `now`.
    pub fn add(&mut self, now: f64, inserts: u64, draws: u64) {
        self.advance(now.floor() as i64);
        let i = self.at(self.head);
        self.inserts[i] += inserts;
        self.samples[i] += draws;
    }

    fn len(&self) -> i64 {
        self.inserts.len() as i64
    }

    fn at(&self, second: i64) -> usize {
        second.rem_euclid(self.len()) as usize
    }

    /// Moves the ring's head to `second`, zeroing the counters it passes.
    fn advance(&mut self, second: i64) {
        if second <= self.head {
            return;
        }
        let from = (self.head + 1).max(second - self.len() + 1);
        for s in from..=second {
            let i = self.at(s);
            self.inserts[i] = 0;
            self.samples[i] = 0;
        }
        self.head = second;
    }

    /// The counter of `second` (0 outside what the ring holds).
    fn count(&self, ring: &[u64], second: i64) -> u64 {
        if second > self.head || self.head - second >= self.len() || second < self.start {
            0
        } else {
            ring[self.at(second)]
        }
    }

    fn rate(&self, ring: &[u64], now: f64) -> f64 {
        let second = now.floor() as i64;
        let first = (second - RATE_SECONDS).max(self.start);
        if first < second {
            (first..second).map(|s| self.count(ring, s)).sum::<u64>() as f64 / (second - first) as f64
        } else {
            // Within the first second: what there is, over the time there was.
            let elapsed = now - self.start as f64;
            if elapsed > 0.0 { self.count(ring, second) as f64 / elapsed.max(0.1) } else { 0.0 }
        }
    }

    fn series(&self, ring: &[u64], now: f64) -> Vec<u64> {
        let second = now.floor() as i64;
        (second - self.seconds as i64 + 1..=second).map(|s| self.count(ring, s)).collect()
    }
}

impl Extension for Rates {
    fn spec(&self) -> ExtensionSpec {
        ExtensionSpec::Rates { seconds: self.seconds }
    }


    fn stats(&self, now: f64) -> Value {
        json!({
            "seconds": self.seconds,
            "inserts": self.series(&self.inserts, now),
            "samples": self.series(&self.samples, now),
            "insert_rate": self.rate(&self.inserts, now),
            "sample_rate": self.rate(&self.samples, now),
        })
    }

    fn save(&self, now: f64) -> Saved {
        let second = now.floor() as i64;
        let range = second - self.len() + 1..=second;
        Saved {
            state: json!({
                "inserts": range.clone().map(|s| self.count(&self.inserts, s)).collect::<Vec<_>>(),
                "samples": range.map(|s| self.count(&self.samples, s)).collect::<Vec<_>>(),
                "counted_seconds": second - self.start + 1,
            }),
            per_slot: None,
        }
    }

    /// The saved counters become the seconds before the restored table's first.
    fn restore(&mut self, saved: &Saved, _live: &[ItemEvent], now: f64) -> Result<(), String> {
        *self = Rates::new(self.seconds);
        let s = &saved.state;
        if s.is_null() {
            return Ok(());
        }
        let list = |key: &str| -> Result<Vec<u64>, String> { serde_json::from_value(s.get(key).cloned().unwrap_or(Value::Null)).map_err(|e| format!("{key}: {e}")) };
        let (inserts, samples) = (list("inserts")?, list("samples")?);
        if inserts.len() != samples.len() || inserts.len() > self.inserts.len() {
            return Err(format!("{} and {} counters for a ring of {}", inserts.len(), samples.len(), self.inserts.len()));
        }
        let counted = s.get("counted_seconds").and_then(Value::as_i64).unwrap_or(0).clamp(0, inserts.len() as i64);
        let second = now.floor() as i64;
        // Saved second k (of n, the last being the save's own) lands at second - n + k.
        let n = inserts.len() as i64;
        self.head = second - 1;
        for (k, (&a, &b)) in inserts.iter().zip(&samples).enumerate() {
            let i = self.at(second - n + k as i64);
            self.inserts[i] = a;
            self.samples[i] = b;
        }
        self.start = second - counted;
        Ok(())
    }
}
