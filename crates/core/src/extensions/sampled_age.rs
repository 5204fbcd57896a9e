//! How old drawn items are: in inserts (items inserted after the drawn one; 0 is
//! the newest) and in seconds since its insert, as cumulative histograms over
//! every draw with their means.
//!
//! No per-item data: an item's insertion time follows from its insertion number
//! through `marks`, the (first insertion number, time) of each clock tick in which
//! items were inserted. A draw looks its item's tick up by binary search over at
//! most [`MARKS`] marks (64 KB, cache-resident). When the list is full its older
//! half is thinned (every other mark dropped), so recent ticks stay exact and old
//! items' ages are overestimated by at most the gap between their marks: a small
//! fraction of their age (the clock ticks in milliseconds).

use serde_json::{json, Value};

use super::{saved_histogram, Extension, ExtensionSpec, Histogram, ItemEvent, Saved, Scale};

/// The most (insertion number, time) marks kept.
const MARKS: usize = 4096;

pub struct SampledAge {
    /// `(first insertion number, time)` of each tick with inserts, ascending.
    marks: Vec<(u64, f64)>,
    inserts: Histogram,
    seconds: Histogram,
    count: u64,
    sum_inserts: f64,
    sum_seconds: f64,
}

impl SampledAge {
    pub fn new() -> SampledAge {
        SampledAge {
            marks: Vec::with_capacity(MARKS),
            inserts: Histogram::new(Scale::Count),
            seconds: Histogram::new(Scale::Seconds),
            count: 0,
            sum_inserts: 0.0,
            sum_seconds: 0.0,
        }
    }

    /// Item `seq` was inserted at `now`.
    #[inline]
    pub fn inserted(&mut self, seq: u64, now: f64) {
        if self.marks.last().is_some_and(|&(_, t)| t == now) {
            return;
        }
        if self.marks.len() == MARKS {
            // Thin the older half: keep its even marks (the oldest stays).
            let half = MARKS / 2;
            let mut w = 0;
            for r in 0..MARKS {
                if r >= half || r % 2 == 0 {
                    self.marks[w] = self.marks[r];
                    w += 1;
                }
            }
            self.marks.truncate(w);
        }
        self.marks.push((seq, now));
    }

    /// When item `seq` was inserted, as far as the marks tell (never later than it
    /// was). A branch-free binary search: the draws' items are random, so a
    /// branching one would mispredict at nearly every step.
    #[inline]
    fn inserted_at(&self, seq: u64, now: f64) -> f64 {
        let m = &self.marks;
        if m.is_empty() {
            return now;
        }
        // The last mark whose insertion number is <= seq (or the first mark).
        let (mut base, mut size) = (0usize, m.len());
        while size > 1 {
            let half = size / 2;
            let mid = base + half;
            base = if m[mid].0 <= seq { mid } else { base };
            size -= half;
        }
        m[base].1
    }

    /// A draw of item `seq`, `age` items after it were inserted.
    #[inline]
    pub fn drawn(&mut self, seq: u64, age: u64, now: f64) {
        let seconds = (now - self.inserted_at(seq, now)).max(0.0);
        self.inserts.add_count(age);
        self.seconds.add_real(seconds);
        self.sum_inserts += age as f64;
        self.sum_seconds += seconds;
        self.count += 1;
    }
}

impl Extension for SampledAge {
    fn spec(&self) -> ExtensionSpec {
        ExtensionSpec::SampledAge
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
                // Ages, not times: the clock restarts with the restored table.
                "marks": self.marks.iter().map(|&(s, t)| (s, (now - t).max(0.0))).collect::<Vec<_>>(),
            }),
            per_slot: None,
        }
    }

    fn restore(&mut self, saved: &Saved, _live: &[ItemEvent], now: f64) -> Result<(), String> {
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
        // Items without saved marks (an older checkpoint) count from now.
        let marks: Vec<(u64, f64)> = match s.get("marks") {
            None | Some(Value::Null) => Vec::new(),
            Some(v) => serde_json::from_value(v.clone()).map_err(|e| format!("marks: {e}"))?,
        };
        if marks.len() > MARKS || marks.windows(2).any(|w| w[1].0 <= w[0].0) || marks.iter().any(|m| !(m.1.is_finite() && m.1 >= 0.0)) {
            return Err(format!("{} marks, not ascending or with a bad age", marks.len()));
        }
        self.marks = marks.into_iter().map(|(seq, age)| (seq, now - age)).collect();
        Ok(())
    }
}
