//! Items: what a table holds and samples — a key, a window of rows, a priority.

/// Rows `[start, start + len)` of a store. A window is a list of these, in step order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RowRange {
    pub start: u64,
    pub len: u32,
}

impl RowRange {
    /// The blocks this range touches.
    #[inline]
    pub fn blocks(&self, block_steps: u32) -> std::ops::RangeInclusive<u32> {
        let end = self.start + self.len as u64 - 1;
        if block_steps.is_power_of_two() {
            // A shift, not two 64-bit divisions: this runs twice per item inserted
            // or removed (block sizes are powers of two unless a user picks otherwise).
            let shift = block_steps.trailing_zeros();
            return (self.start >> shift) as u32..=(end >> shift) as u32;
        }
        let bs = block_steps as u64;
        (self.start / bs) as u32..=(end / bs) as u32
    }
}

/// The rows of an item, in step order. Most items are one contiguous range, kept
/// inline so that inserting and sampling them allocates nothing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Window {
    One(RowRange),
    Many(Box<[RowRange]>),
}

impl Window {
    pub fn from_ranges(ranges: Vec<RowRange>) -> Window {
        if ranges.len() == 1 {
            Window::One(ranges[0])
        } else {
            Window::Many(ranges.into_boxed_slice())
        }
    }

    pub fn ranges(&self) -> &[RowRange] {
        match self {
            Window::One(r) => std::slice::from_ref(r),
            Window::Many(rs) => rs,
        }
    }
}

/// Calls `f` once for every block a window touches (a block shared by two ranges
/// of the window is visited once per range; retain and release use the same walk,
/// so the counts match).
#[inline]
pub fn for_each_block(ranges: &[RowRange], block_steps: u32, mut f: impl FnMut(u32)) {
    for r in ranges {
        for b in r.blocks(block_steps) {
            f(b);
        }
    }
}

/// Total steps of a window.
pub fn window_len(ranges: &[RowRange]) -> u64 {
    ranges.iter().map(|r| r.len as u64).sum()
}

/// An item held by a table.
#[derive(Clone, Debug)]
pub struct Item {
    pub key: u64,
    /// Insertion sequence number within the table (FIFO order, checkpoints).
    pub seq: u64,
    pub window: Window,
    pub length: u32,
    pub priority: f64,
    pub times_sampled: u32,
}

/// An item about to be inserted.
#[derive(Clone, Debug)]
pub struct NewItem {
    pub window: Window,
    pub priority: f64,
}

/// Checks a priority: finite and >= 0.
pub fn check_priority(priority: f64, what: impl FnOnce() -> String) -> crate::Result<()> {
    if priority.is_finite() && priority >= 0.0 {
        Ok(())
    } else {
        Err(crate::invalid!("{}: priority must be finite and >= 0, got {priority}", what()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_report_the_blocks_they_touch() {
        let r = RowRange { start: 6, len: 5 };
        assert_eq!(r.blocks(4).collect::<Vec<_>>(), vec![1, 2]);
        let mut seen = vec![];
        for_each_block(&[RowRange { start: 0, len: 1 }, r], 4, |b| seen.push(b));
        assert_eq!(seen, vec![0, 1, 2]);
        assert_eq!(window_len(&[RowRange { start: 0, len: 1 }, r]), 6);
    }

    #[test]
    fn bad_priorities_name_the_value() {
        for p in [f64::NAN, f64::INFINITY, -1.0] {
            let e = check_priority(p, || "key 7".into()).unwrap_err().to_string();
            assert!(e.contains("key 7") && e.contains(">= 0"), "{e}");
        }
        assert!(check_priority(0.0, String::new).is_ok());
    }
}
