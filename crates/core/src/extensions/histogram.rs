//! Counts in power-of-two buckets, the shape every built-in histogram shares.
//!
//! A [`Histogram`] has a fixed number of buckets chosen by its [`Scale`]: bucket 0
//! holds everything below the scale's smallest power of two (zero included), and
//! each next bucket spans one power of two. Adding or removing a value is a few
//! bit operations and one increment: no allocation, no floating-point `log`.

use serde_json::{json, Value};

/// How values map to buckets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scale {
    /// Non-negative reals: `[0, 2^-64)`, then `[2^e, 2^(e+1))` for e in -64..=63
    /// (values of 2^64 and more fall in the last bucket).
    Real,
    /// Counts: `[0, 1)`, then `[2^(k-1), 2^k)` for k in 1..=64.
    Count,
    /// Seconds: `[0, 2^-10)`, then `[2^e, 2^(e+1))` for e in -10..=31 (longer
    /// durations fall in the last bucket).
    Seconds,
}

impl Scale {
    fn buckets(self) -> usize {
        match self {
            Scale::Real => 129,
            Scale::Count => 65,
            Scale::Seconds => 43,
        }
    }

    /// The bucket of a real `v >= 0` whose smallest power of two is `2^low`: from
    /// the exponent bits alone (no float comparison against a computed bound).
    #[inline]
    fn real_bucket(v: f64, low: i32, last: usize) -> usize {
        let bits = v.to_bits();
        if bits >> 63 != 0 || v.is_nan() {
            return 0; // negative zero, and NaN (never passed)
        }
        let exponent = ((bits >> 52) & 0x7ff) as i32 - 1023; // subnormals and 0: -1023
        if exponent < low {
            return 0;
        }
        ((exponent - low + 1) as usize).min(last)
    }

    #[inline]
    pub fn bucket_of_real(self, v: f64) -> usize {
        match self {
            Scale::Real => Self::real_bucket(v, -64, 128),
            Scale::Seconds => Self::real_bucket(v, -10, 42),
            Scale::Count => self.bucket_of_count(v as u64),
        }
    }

    #[inline]
    pub fn bucket_of_count(self, n: u64) -> usize {
        match self {
            Scale::Count => (64 - n.leading_zeros()) as usize,
            _ => self.bucket_of_real(n as f64),
        }
    }

    /// The lower bound of bucket `i` (`i == buckets()` gives the last upper bound).
    fn bound(self, i: usize) -> f64 {
        if i == 0 {
            return 0.0;
        }
        let low = match self {
            Scale::Real => -64,
            Scale::Seconds => -10,
            Scale::Count => 0,
        };
        f64::powi(2.0, low + i as i32 - 1)
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Histogram {
    scale: Scale,
    counts: Vec<u64>,
    total: u64,
}

impl Histogram {
    pub fn new(scale: Scale) -> Histogram {
        Histogram { scale, counts: vec![0; scale.buckets()], total: 0 }
    }

    pub fn add_to(&mut self, bucket: usize, n: u64) {
        self.counts[bucket] += n;
        self.total += n;
    }

    /// Takes `n` out of `bucket`. Callers only remove what they added; a count that
    /// would go negative is a bug in the caller, kept at zero in release builds.
    pub fn remove_from(&mut self, bucket: usize, n: u64) {
        debug_assert!(self.counts[bucket] >= n, "histogram bucket {bucket} would go negative");
        self.counts[bucket] = self.counts[bucket].saturating_sub(n);
        self.total = self.total.saturating_sub(n);
    }

    pub fn add_real(&mut self, v: f64) {
        self.add_to(self.scale.bucket_of_real(v), 1);
    }

    pub fn remove_real(&mut self, v: f64) {
        self.remove_from(self.scale.bucket_of_real(v), 1);
    }

    pub fn add_count(&mut self, v: u64) {
        self.add_to(self.scale.bucket_of_count(v), 1);
    }

    pub fn remove_count(&mut self, v: u64) {
        self.remove_from(self.scale.bucket_of_count(v), 1);
    }

    pub fn total(&self) -> u64 {
        self.total
    }

    pub fn clear(&mut self) {
        self.counts.iter_mut().for_each(|c| *c = 0);
        self.total = 0;
    }

    /// `{"bounds": [...], "counts": [...], "total": n}` over the span from the first
    /// to the last non-empty bucket (`[]`, `[]` when empty).
    pub fn to_json(&self) -> Value {
        let first = self.counts.iter().position(|&c| c > 0);
        let last = self.counts.iter().rposition(|&c| c > 0);
        let (bounds, counts): (Vec<f64>, Vec<u64>) = match (first, last) {
            (Some(a), Some(b)) => ((a..=b + 1).map(|i| self.scale.bound(i)).collect(), self.counts[a..=b].to_vec()),
            _ => (Vec::new(), Vec::new()),
        };
        json!({"bounds": bounds, "counts": counts, "total": self.total})
    }

    /// The counts of every bucket, for checkpoints.
    pub fn counts(&self) -> &[u64] {
        &self.counts
    }

    /// Restores counts saved by [`Histogram::counts`]; `None` when the length is wrong.
    pub fn from_counts(scale: Scale, counts: Vec<u64>) -> Option<Histogram> {
        (counts.len() == scale.buckets()).then(|| Histogram { scale, total: counts.iter().sum(), counts })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn real_buckets_span_powers_of_two() {
        let s = Scale::Real;
        assert_eq!(s.bucket_of_real(0.0), 0);
        assert_eq!(s.bucket_of_real(f64::powi(2.0, -65)), 0);
        assert_eq!(s.bucket_of_real(f64::powi(2.0, -64)), 1);
        assert_eq!(s.bucket_of_real(1.0), 65);
        assert_eq!(s.bucket_of_real(1.999), 65);
        assert_eq!(s.bucket_of_real(2.0), 66);
        assert_eq!(s.bucket_of_real(1e300), 128);
        for v in [0.0, 1e-30, 0.3, 1.0, 7.5, 1e9] {
            let b = s.bucket_of_real(v);
            assert!(s.bound(b) <= v && (v < s.bound(b + 1) || b == 128), "{v} in bucket {b}");
        }
    }

    #[test]
    fn count_buckets_are_zero_then_powers_of_two() {
        let s = Scale::Count;
        let got: Vec<usize> = [0u64, 1, 2, 3, 4, 7, 8, u64::MAX].iter().map(|&n| s.bucket_of_count(n)).collect();
        assert_eq!(got, [0, 1, 2, 2, 3, 3, 4, 64]);
        assert_eq!((s.bound(0), s.bound(1), s.bound(2), s.bound(3)), (0.0, 1.0, 2.0, 4.0));
    }

    #[test]
    fn seconds_buckets_start_below_a_millisecond() {
        let s = Scale::Seconds;
        assert_eq!(s.bucket_of_real(0.0005), 0);
        assert_eq!(s.bucket_of_real(0.001), 1);
        assert_eq!(s.bucket_of_real(1.5), 11);
        assert_eq!(s.bucket_of_real(1e12), 42);
    }

    #[test]
    fn json_lists_the_non_empty_span() {
        let mut h = Histogram::new(Scale::Count);
        assert_eq!(h.to_json(), json!({"bounds": [], "counts": [], "total": 0}));
        h.add_count(1);
        h.add_count(5);
        assert_eq!(h.to_json(), json!({"bounds": [1.0, 2.0, 4.0, 8.0], "counts": [1, 0, 1], "total": 2}));
        h.remove_count(1);
        assert_eq!(h.to_json(), json!({"bounds": [4.0, 8.0], "counts": [1], "total": 1}));
    }
}
