//! The rate limiter: one mechanism, four numbers, as in Reverb (paper section 3.4).
//!
//! With `size` items in the table, `inserts` and `samples` counted since the last
//! reset and `spi = samples_per_insert`:
//!
//! * inserting k items is allowed when `size + k <= min_size_to_sample` (filling up
//!   is never blocked) or when `(inserts + k) * spi - samples <= max_diff`;
//! * sampling k times is allowed when `size >= min_size_to_sample` and
//!   `inserts * spi - samples - k >= min_diff`.
//!
//! The presets `MinSize`, `SampleToInsertRatio`, `Queue` and `Stack` only fill in
//! the numbers. The table calls these checks under its lock and blocks callers on
//! its condition variables; the time they spend blocked is counted here.

use std::time::Duration;

use crate::invalid;
use crate::Result;

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RateLimiterConfig {
    pub samples_per_insert: f64,
    pub min_size_to_sample: u64,
    pub min_diff: f64,
    pub max_diff: f64,
}

impl RateLimiterConfig {
    pub fn new(samples_per_insert: f64, min_size_to_sample: u64, min_diff: f64, max_diff: f64) -> Result<Self> {
        if !(samples_per_insert.is_finite() && samples_per_insert > 0.0) {
            return Err(invalid!("samples_per_insert must be finite and > 0, got {samples_per_insert}"));
        }
        if min_size_to_sample == 0 {
            return Err(invalid!("min_size_to_sample must be >= 1, got 0 (nothing can be sampled from an empty table)"));
        }
        if min_diff.is_nan() || max_diff.is_nan() || min_diff > max_diff {
            return Err(invalid!("min_diff must be <= max_diff, got min_diff={min_diff}, max_diff={max_diff}"));
        }
        Ok(RateLimiterConfig { samples_per_insert, min_size_to_sample, min_diff, max_diff })
    }

    /// Sampling waits until the table holds `min_size_to_sample` items; nothing else.
    pub fn min_size(min_size_to_sample: u64) -> Result<Self> {
        Self::new(1.0, min_size_to_sample, f64::NEG_INFINITY, f64::INFINITY)
    }

    /// Keeps samples per insert near `samples_per_insert`, within `error_buffer`.
    pub fn sample_to_insert_ratio(samples_per_insert: f64, min_size_to_sample: u64, error_buffer: f64) -> Result<Self> {
        if !(error_buffer.is_finite() && error_buffer >= samples_per_insert.max(1.0)) {
            return Err(invalid!(
                "error_buffer must be >= max(1, samples_per_insert) = {}, got {error_buffer}: a smaller \
                 buffer can block samples or inserts for good",
                samples_per_insert.max(1.0)
            ));
        }
        let offset = samples_per_insert * min_size_to_sample as f64;
        Self::new(samples_per_insert, min_size_to_sample, offset - error_buffer, offset + error_buffer)
    }

    /// Every item sampled exactly once, at most `size` waiting: a queue or stack.
    pub fn queue(size: u64) -> Result<Self> {
        if size == 0 {
            return Err(invalid!("queue size must be >= 1, got 0"));
        }
        Self::new(1.0, 1, 0.0, size as f64)
    }
}

#[derive(Clone, Debug)]
pub struct RateLimiter {
    pub config: RateLimiterConfig,
    pub inserts: u64,
    pub samples: u64,
    pub blocked_insert: Duration,
    pub blocked_sample: Duration,
}

impl RateLimiter {
    pub fn new(config: RateLimiterConfig) -> RateLimiter {
        RateLimiter { config, inserts: 0, samples: 0, blocked_insert: Duration::ZERO, blocked_sample: Duration::ZERO }
    }

    fn diff(&self) -> f64 {
        self.inserts as f64 * self.config.samples_per_insert - self.samples as f64
    }

    pub fn can_insert(&self, k: u64, size: u64) -> bool {
        size + k <= self.config.min_size_to_sample
            || (self.inserts + k) as f64 * self.config.samples_per_insert - self.samples as f64 <= self.config.max_diff
    }

    pub fn can_sample(&self, k: u64, size: u64) -> bool {
        size >= self.config.min_size_to_sample && self.diff() - k as f64 >= self.config.min_diff
    }

    /// How many of `want` inserts are allowed now, one after another.
    pub fn insert_permits(&self, want: u64, size: u64) -> u64 {
        let c = &self.config;
        let filling = c.min_size_to_sample.saturating_sub(size);
        let by_diff = ((c.max_diff + self.samples as f64) / c.samples_per_insert - self.inserts as f64).floor();
        let mut k = want.min(filling.max(clamp_count(by_diff)));
        // The closed form can be off by one in floating point; the check is the truth.
        while k > 0 && !self.can_insert(k, size) {
            k -= 1;
        }
        k
    }

    /// How many of `want` samples are allowed now.
    pub fn sample_permits(&self, want: u64, size: u64) -> u64 {
        if size < self.config.min_size_to_sample {
            return 0;
        }
        let mut k = want.min(clamp_count((self.diff() - self.config.min_diff).floor()));
        while k > 0 && !self.can_sample(k, size) {
            k -= 1;
        }
        k
    }

    pub fn reset(&mut self) {
        self.inserts = 0;
        self.samples = 0;
    }

    /// Why inserting one item (`inserting`) or sampling `want` items cannot proceed
    /// with `size` items in the table, in words a user can act on: what the limiter
    /// needs (items before the first sample, or how many more samples or inserts)
    /// and the counts it has, with a question about who should be doing that. Said
    /// once by a call that waits long (see `wait.rs`).
    pub fn explain(&self, inserting: bool, size: u64, want: u64) -> String {
        match self.reason(inserting, size, want) {
            (why, Some(ask)) => format!("{why}; {ask}"),
            (why, None) => why,
        }
    }

    /// [`RateLimiter::explain`] in two parts: the reason, and the question it asks
    /// of whoever should end the wait (None when nothing blocks).
    pub fn reason(&self, inserting: bool, size: u64, want: u64) -> (String, Option<&'static str>) {
        let c = &self.config;
        let (inserts, samples, spi) = (self.inserts, self.samples, c.samples_per_insert);
        let counts = format!("{inserts} inserts and {samples} samples so far, {size} items in the table");
        if inserting {
            if self.can_insert(1, size) {
                return (format!("the rate limiter allows an insert now ({counts})"), None);
            }
            // (inserts + 1) * spi - samples' <= max_diff
            let more = clamp_count(((inserts + 1) as f64 * spi - c.max_diff - samples as f64).ceil()).max(1);
            return (
                format!(
                    "inserts wait for samples: with samples_per_insert = {spi} the next insert needs {more} more \
                     sample{} ({counts})",
                    if more == 1 { "" } else { "s" }
                ),
                Some("is a learner sampling this table?"),
            );
        }
        if size < c.min_size_to_sample {
            return (
                format!(
                    "sampling waits until the table holds min_size_to_sample = {} items; it holds {size} \
                     ({inserts} inserted so far)",
                    c.min_size_to_sample
                ),
                Some("are the writers flushing items into this table?"),
            );
        }
        if self.can_sample(want.max(1), size) {
            return (format!("the rate limiter allows {want} samples now ({counts})"), None);
        }
        // inserts' * spi - samples - want >= min_diff
        let more = clamp_count(((c.min_diff + samples as f64 + want as f64) / spi - inserts as f64).ceil()).max(1);
        (
            format!(
                "sampling waits for inserts: with samples_per_insert = {spi}, {want} more sample{} need {more} more \
                 insert{} ({counts})",
                if want == 1 { "" } else { "s" },
                if more == 1 { "" } else { "s" }
            ),
            Some("are the writers running?"),
        )
    }
}

fn clamp_count(x: f64) -> u64 {
    if x.is_nan() || x <= 0.0 {
        0
    } else if x >= u64::MAX as f64 {
        u64::MAX
    } else {
        x as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn min_size_blocks_sampling_until_filled() {
        let mut r = RateLimiter::new(RateLimiterConfig::min_size(3).unwrap());
        assert!(!r.can_sample(1, 2));
        r.inserts = 3;
        assert!(r.can_sample(1_000_000, 3));
        assert_eq!(r.sample_permits(256, 3), 256);
        assert_eq!(r.insert_permits(10, 3), 10);
    }

    #[test]
    fn queue_alternates_inserts_and_samples() {
        let mut r = RateLimiter::new(RateLimiterConfig::queue(2).unwrap());
        assert_eq!(r.insert_permits(5, 0), 2);
        r.inserts = 2;
        assert!(!r.can_insert(1, 2));
        assert_eq!(r.sample_permits(5, 2), 2);
        r.samples = 2;
        assert_eq!(r.sample_permits(5, 0), 0);
        assert_eq!(r.insert_permits(5, 0), 2);
    }

    #[test]
    fn ratio_keeps_samples_within_the_buffer() {
        let c = RateLimiterConfig::sample_to_insert_ratio(2.0, 10, 4.0).unwrap();
        assert_eq!((c.min_diff, c.max_diff), (16.0, 24.0));
        let mut r = RateLimiter::new(c);
        assert_eq!(r.insert_permits(100, 0), 12); // 12 * 2 = 24 <= max_diff
        r.inserts = 12;
        assert_eq!(r.sample_permits(100, 12), 8); // 24 - 8 = 16 >= min_diff
        r.samples = 8;
        assert_eq!(r.insert_permits(100, 12), 4);
    }

    #[test]
    fn permits_agree_with_the_checks() {
        let c = RateLimiterConfig::sample_to_insert_ratio(0.3, 5, 2.0).unwrap();
        let mut r = RateLimiter::new(c);
        for step in 0..200u64 {
            let size = r.inserts.min(50);
            let k = r.insert_permits(7, size);
            assert!(k == 0 || r.can_insert(k, size));
            assert!(k == 7 || !r.can_insert(k + 1, size));
            r.inserts += k;
            let size = r.inserts.min(50);
            let s = r.sample_permits(3 + step % 5, size);
            assert!(s == 0 || r.can_sample(s, size));
            r.samples += s;
        }
    }

    #[test]
    fn explain_names_what_the_limiter_waits_for_and_the_numbers_are_exact() {
        // Reverb-style ratio: 8 samples per insert, 1000 items before the first sample.
        let mut r = RateLimiter::new(RateLimiterConfig::sample_to_insert_ratio(8.0, 1000, 100.0).unwrap());
        r.inserts = 12;
        let m = r.explain(false, 12, 256);
        assert!(m.contains("min_size_to_sample = 1000 items; it holds 12 (12 inserted so far)"), "{m}");
        // Full: inserts wait for samples. The message's count is exactly what unblocks.
        r.inserts = 1012;
        assert!(!r.can_insert(1, 1012));
        let m = r.explain(true, 1012, 1);
        let more: u64 = m.split("needs ").nth(1).unwrap().split(' ').next().unwrap().parse().unwrap();
        r.samples = more - 1;
        assert!(!r.can_insert(1, 1012), "{m}");
        r.samples = more;
        assert!(r.can_insert(1, 1012), "{m}");
        // Samples ahead of inserts: the count of inserts that unblocks `want` samples.
        let mut r = RateLimiter::new(RateLimiterConfig::sample_to_insert_ratio(2.0, 10, 4.0).unwrap());
        r.inserts = 12;
        r.samples = 8;
        assert!(!r.can_sample(5, 12));
        let m = r.explain(false, 12, 5);
        let more: u64 = m.split("need ").nth(1).unwrap().split(' ').next().unwrap().parse().unwrap();
        r.inserts += more - 1;
        assert!(!r.can_sample(5, 12), "{m}");
        r.inserts += 1;
        assert!(r.can_sample(5, 12), "{m}");
        // A queue that is full.
        let mut q = RateLimiter::new(RateLimiterConfig::queue(2).unwrap());
        q.inserts = 2;
        assert!(q.explain(true, 2, 1).contains("the next insert needs 1 more sample ("));
    }

    #[test]
    fn bad_configs_name_the_number() {
        assert!(RateLimiterConfig::min_size(0).unwrap_err().to_string().contains("min_size_to_sample"));
        assert!(RateLimiterConfig::new(0.0, 1, 0.0, 1.0).unwrap_err().to_string().contains("samples_per_insert"));
        assert!(RateLimiterConfig::new(1.0, 1, 2.0, 1.0).unwrap_err().to_string().contains("min_diff"));
        assert!(RateLimiterConfig::sample_to_insert_ratio(8.0, 10, 2.0).unwrap_err().to_string().contains("error_buffer"));
        assert!(RateLimiterConfig::queue(0).unwrap_err().to_string().contains("queue size"));
    }
}
