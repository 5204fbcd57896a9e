//! Batch insert: n items of T steps each from `[n, T, ...]` column buffers, with
//! one copy per column per contiguous run of rows (usually exactly one), for
//! dataset loading and bulk writers. Each item is its own episode.

use crate::error::Result;
use crate::invalid;
use crate::item::{NewItem, RowRange, Window};
use super::Table;
use crate::wait::Wait;

/// The window covering virtual rows `[offset, offset + len)` of `runs` laid end to end.
fn slice_runs(runs: &[RowRange], mut offset: u64, mut len: u64) -> Window {
    let mut out = Vec::new();
    for r in runs {
        if len == 0 {
            break;
        }
        if offset >= r.len as u64 {
            offset -= r.len as u64;
            continue;
        }
        let take = len.min(r.len as u64 - offset);
        let range = RowRange { start: r.start + offset, len: take as u32 };
        if take == len && out.is_empty() {
            return Window::One(range);
        }
        out.push(range);
        len -= take;
        offset = 0;
    }
    Window::from_ranges(out)
}

impl Table {
    /// Inserts `n` items of `steps` steps each. `columns[c]` holds `n * steps` rows
    /// of field `c`, item-major; `records` the items' attribute records end to
    /// end (empty for a table without attributes). Every priority and record is
    /// checked before anything is written. Returns the keys in item order.
    pub fn insert_batch<'w>(&self, columns: &[&[u8]], n: usize, steps: usize, priorities: &[f64], records: &[u8], wait: impl Into<Wait<'w>>) -> Result<Vec<u64>> {
        self.insert_batch_rows(columns, n, steps, priorities, records, wait).map(|(keys, _)| keys)
    }

    /// `insert_batch`, also returning each item's first row in the store (what a
    /// caller that reads items back by row, such as a position-addressed storage,
    /// keeps beside the keys).
    pub fn insert_batch_rows<'w>(&self, columns: &[&[u8]], n: usize, steps: usize, priorities: &[f64], records: &[u8], wait: impl Into<Wait<'w>>) -> Result<(Vec<u64>, Vec<u64>)> {
        let wait = wait.into();
        let store = self.store();
        let fields = store.signature().fields();
        if n == 0 {
            return Ok((Vec::new(), Vec::new()));
        }
        if steps == 0 {
            return Err(invalid!("table '{}': items must have >= 1 step, got 0", self.name()));
        }
        if priorities.len() != n {
            return Err(invalid!("table '{}': {n} items but {} priorities; expected one per item", self.name(), priorities.len()));
        }
        if columns.len() != fields.len() {
            return Err(invalid!("expected {} columns, got {}", fields.len(), columns.len()));
        }
        for (f, c) in fields.iter().zip(columns) {
            if c.len() != f.row_bytes() * n * steps {
                return Err(invalid!("field '{}': expected {} bytes for [{n}, {steps}] of {}, got {}", f.name, f.row_bytes() * n * steps, f.describe(), c.len()));
            }
        }
        self.check_priorities(priorities, |i| format!("table '{}' item {i}", self.name()))?;
        self.check_records(n, records)?;
        if store.signature().lead() > 0 {
            return self.insert_stacked(columns, n, steps, priorities, records, wait);
        }
        let claim = store.claim_rows((n * steps) as u64)?;
        for (col, src) in columns.iter().enumerate() {
            let row_bytes = store.row_bytes(col);
            let mut at = 0;
            for run in &claim.runs {
                let bytes = run.len as usize * row_bytes;
                // SAFETY: the claim's runs are fresh rows of blocks the claim holds,
                // not yet referenced by any item.
                unsafe { store.columns().write_rows(col, run.start, &src[at..at + bytes]) };
                at += bytes;
            }
        }
        let items: Vec<NewItem> = match claim.runs.as_slice() {
            // The usual claim: one run of fresh rows, item i at its i-th `steps` rows.
            [run] => priorities
                .iter()
                .enumerate()
                .map(|(i, &priority)| NewItem {
                    window: Window::One(RowRange { start: run.start + (i * steps) as u64, len: steps as u32 }),
                    priority,
                })
                .collect(),
            runs => priorities
                .iter()
                .enumerate()
                .map(|(i, &priority)| NewItem { window: slice_runs(runs, (i * steps) as u64, steps as u64), priority })
                .collect(),
        };
        let first_rows = items.iter().map(|i| i.window.ranges()[0].start).collect();
        // Windows lie inside the claim and priorities were checked above. The items
        // now hold their own references; the claim's go when it drops.
        let result = self.insert_checked(&items, records, wait);
        drop(claim);
        result.map(|keys| (keys, first_rows))
    }
}

impl Table {
    /// `insert_batch_rows` over a store with stacked fields: each item is written
    /// as its own episode by a writer (padding first, copies at block starts; see
    /// `writer`'s module doc), so its steps stack over its own frames. A store that
    /// fills part way inserts nothing.
    fn insert_stacked(&self, columns: &[&[u8]], n: usize, steps: usize, priorities: &[f64], records: &[u8], wait: Wait<'_>) -> Result<(Vec<u64>, Vec<u64>)> {
        let store = self.store();
        let alloc = store.allocator();
        let mut writer = crate::writer::Writer::new(store.clone(), None)?;
        let mut items: Vec<NewItem> = Vec::with_capacity(n);
        let release = |items: &[NewItem]| {
            for i in items {
                crate::item::for_each_block(i.window.ranges(), store.block_steps(), |b| alloc.release(b));
            }
        };
        for (i, &priority) in priorities.iter().enumerate() {
            let item: Vec<&[u8]> =
                columns.iter().enumerate().map(|(c, col)| &col[i * steps * store.row_bytes(c)..(i + 1) * steps * store.row_bytes(c)]).collect();
            let window = writer.extend(&item, steps, wait).and_then(|_| writer.recent_rows(steps as u64));
            let window = match window {
                Ok(w) => w,
                Err(e) => {
                    release(&items);
                    return Err(e);
                }
            };
            // Held until the insert: the writer lets go of its episode next.
            crate::item::for_each_block(window.ranges(), store.block_steps(), |b| alloc.retain(b));
            writer.end_episode();
            items.push(NewItem { window, priority });
        }
        writer.close();
        let first_rows = items.iter().map(|i| i.window.ranges()[0].start).collect();
        let result = self.insert_checked(&items, records, wait);
        release(&items);
        result.map(|keys| (keys, first_rows))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slicing_runs_splits_at_run_boundaries() {
        let runs = [RowRange { start: 10, len: 3 }, RowRange { start: 40, len: 5 }];
        assert_eq!(slice_runs(&runs, 0, 2).ranges(), [RowRange { start: 10, len: 2 }]);
        assert_eq!(slice_runs(&runs, 2, 3).ranges(), [RowRange { start: 12, len: 1 }, RowRange { start: 40, len: 2 }]);
        assert_eq!(slice_runs(&runs, 5, 3), Window::One(RowRange { start: 42, len: 3 }));
    }
}
