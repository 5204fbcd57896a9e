//! `Table` for Python: batch insert, sample, priority updates, deletes, info.

use std::sync::Arc;

use numpy::{PyArray1, PyReadonlyArray1};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};
use reprise_core::attributes::{AttributeSpec, Attributes};
use reprise_core::table::{GroupConfig, OnTimeout};
use reprise_core::DType;
use reprise_core::{ExtensionSpec, RateLimiterConfig, SelectorSpec, Table, TableConfig, TableInfo, Wait};

use reprise_core::selectors::external::Candidate;

use crate::arrays::{views, FieldInfo, Vector};
use crate::rows::{rows_error, HeldRows, PySampleRows};
use crate::errors::invalid;
use crate::raise::{py_err, to_py};
use crate::sample::{attribute_arrays, sample_object, sample_with};
use crate::store::PyStore;
use crate::timeout::{self, Alone, Signals};

#[pyclass(name = "Table", module = "reprise._native", frozen)]
pub struct PyTable {
    pub table: Table,
    fields: Arc<Vec<FieldInfo>>,
}

fn selector(py: Python<'_>, role: &str, (name, exponent): (String, f64)) -> PyResult<SelectorSpec> {
    SelectorSpec::from_name(&name, exponent)
        .ok_or_else(|| invalid(py, format!("unknown {role} '{name}': expected {}", SelectorSpec::NAMES)))
}

fn non_negative(py: Python<'_>, what: &str, v: i64, min: i64) -> PyResult<u64> {
    if v < min {
        return Err(invalid(py, format!("{what} must be >= {min}, got {v}")));
    }
    Ok(v as u64)
}

impl PyTable {
    pub fn from_table(table: Table, fields: Arc<Vec<FieldInfo>>) -> PyTable {
        PyTable { table, fields }
    }
}

/// `(slots, seqs, priorities)` of the slots that changed (external selection).
type Changes<'py> = (Bound<'py, PyArray1<i64>>, Bound<'py, PyArray1<i64>>, Bound<'py, PyArray1<f64>>);

/// The changes of an admission: slots, seqs, keys, priorities, times_sampled,
/// lengths, ranges per change, and the flat range starts and lengths.
type ResidentChanges<'py> = (
    Bound<'py, PyArray1<i64>>,
    Bound<'py, PyArray1<i64>>,
    Bound<'py, PyArray1<i64>>,
    Bound<'py, PyArray1<f64>>,
    Bound<'py, PyArray1<i64>>,
    Bound<'py, PyArray1<i64>>,
    Bound<'py, PyArray1<i64>>,
    Bound<'py, PyArray1<i64>>,
    Bound<'py, PyArray1<i64>>,
);

/// What `admit` returns (see there).
type Admission<'py> = (usize, u64, u64, u64, bool, u32, u32, PySampleRows, Option<Bound<'py, PyAny>>, ResidentChanges<'py>);

impl PyTable {
    /// A draw as `sample` and `sample_tokens` make it: Ctrl-C and a lone table
    /// (no writer can ever fill it) end the wait, an error says how many items
    /// (`want`) were asked for, and the batch becomes a `reprise.Sample` of the
    /// chosen fields with its attributes (`packed`: rows end to end).
    fn draw<'py>(
        &self,
        py: Python<'py>,
        timeout: Option<f64>,
        fields: Option<Vec<String>>,
        want: u64,
        packed: bool,
        draw: impl for<'w> FnOnce(&Table, Wait<'w>) -> reprise_core::Result<reprise_core::SampleBatch> + Send,
    ) -> PyResult<Bound<'py, PyAny>> {
        let timeout = timeout::parse(py, timeout)?;
        let select = crate::arrays::select_fields(py, self.table.store().signature(), fields)?;
        let signals = Signals::default();
        let alone = Alone::new(&self.table, false, timeout);
        let check = || signals.check() || alone.check();
        let wait = Wait { timeout, interrupt: Some(&check) };
        let mut batch = py
            .detach(|| draw(&self.table, wait))
            .map_err(|e| to_py(py, alone.explain(e, want), select.as_deref(), signals.take()))?;
        if self.table.config().attributes.is_empty() && !packed {
            return sample_object(py, batch, select.as_deref());
        }
        let records = std::mem::take(&mut batch.attributes);
        sample_with(py, batch, select.as_deref(), &self.table.config().attributes, &records, packed)
    }
}

#[pymethods]
impl PyTable {
    #[new]
    #[pyo3(signature = (name, store, sampler, remover, max_size, rate_limiter, max_times_sampled=0, seed=None, evict_when_store_full=true, external_selection=false, extensions=None, attributes=Vec::new(), max_staleness=None, group=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        name: String,
        store: PyRef<'_, PyStore>,
        sampler: (String, f64),
        remover: (String, f64),
        max_size: i64,
        rate_limiter: (f64, i64, f64, f64),
        max_times_sampled: i64,
        seed: Option<u64>,
        evict_when_store_full: bool,
        external_selection: bool,
        extensions: Option<String>,
        attributes: Vec<(String, String)>,
        max_staleness: Option<i64>,
        group: Option<(i64, Option<f64>, String)>,
    ) -> PyResult<Self> {
        let groups = match group {
            None => None,
            Some((size, timeout, on_timeout)) => Some(GroupConfig {
                size: u32::try_from(size).map_err(|_| invalid(py, format!("table '{name}': group_size must be 1 to 2^32-1, got {size}")))?,
                timeout: match timeout {
                    None => None,
                    Some(t) => Some(std::time::Duration::try_from_secs_f64(t).map_err(|_| {
                        invalid(py, format!("table '{name}': group_timeout must be a finite number of seconds >= 0, got {t}"))
                    })?),
                },
                on_timeout: OnTimeout::from_name(&on_timeout).ok_or_else(|| {
                    invalid(py, format!("table '{name}': on_group_timeout must be 'drop' or 'partial', got {on_timeout:?}"))
                })?,
            }),
        };
        let specs = attributes
            .into_iter()
            .map(|(name, dtype)| {
                let dtype = DType::from_name(&dtype).map_err(|e| invalid(py, format!("attribute '{name}': {e}")))?;
                Ok(AttributeSpec { name, dtype })
            })
            .collect::<PyResult<Vec<_>>>()?;
        let attributes = Attributes::new(specs).map_err(|e| invalid(py, format!("table '{name}': {e}")))?;
        let max_staleness = match max_staleness {
            None => None,
            Some(k) => Some(non_negative(py, &format!("table '{name}': max_staleness"), k, 0)?),
        };
        let (spi, min_size, min_diff, max_diff) = rate_limiter;
        let min_size = non_negative(py, "min_size_to_sample", min_size, 1)?;
        let extensions = match extensions {
            None => ExtensionSpec::defaults(),
            Some(text) => {
                let list: Vec<serde_json::Value> =
                    serde_json::from_str(&text).map_err(|e| invalid(py, format!("table '{name}': extensions: {e}")))?;
                list.iter()
                    .map(ExtensionSpec::from_json)
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| invalid(py, format!("table '{name}': {e}")))?
            }
        };
        let config = TableConfig {
            extensions,
            sampler: selector(py, "sampler", sampler)?,
            remover: selector(py, "remover", remover)?,
            max_size: non_negative(py, &format!("table '{name}': max_size"), max_size, 1)?,
            max_times_sampled: u32::try_from(non_negative(py, &format!("table '{name}': max_times_sampled"), max_times_sampled, 0)?)
                .map_err(|_| invalid(py, format!("table '{name}': max_times_sampled must be < 2^32")))?,
            rate_limiter: RateLimiterConfig::new(spi, min_size, min_diff, max_diff).map_err(py_err(py))?,
            seed,
            evict_when_store_full,
            external_selection,
            attributes,
            max_staleness,
            groups,
            name,
        };
        let table = Table::new(config, &store.store).map_err(py_err(py))?;
        Ok(PyTable { table, fields: store.fields.clone() })
    }

    /// What the table's extensions report, as JSON text (`{name: statistics}`).
    fn stats_json(&self, py: Python<'_>) -> String {
        py.detach(|| self.table.stats().to_string())
    }

    /// The table's extensions as JSON text (`[{"kind": ..., settings}]`).
    fn extensions_json(&self) -> String {
        serde_json::Value::Array(self.table.config().extensions.iter().map(|e| e.to_json()).collect()).to_string()
    }

    #[getter]
    fn name(&self) -> String {
        self.table.name().to_string()
    }

    #[getter]
    fn size(&self, py: Python<'_>) -> u64 {
        py.detach(|| self.table.size())
    }

    /// Inserts n items of T steps from `{field: array[n, T, ...]}`; returns keys, and
    /// with `rows` also each item's first store row: `(keys, rows)`.
    /// `records`: the items' attribute records end to end (tables with attributes).
    #[pyo3(signature = (data, priorities, timeout=None, rows=false, records=None))]
    fn insert<'py>(&self, py: Python<'py>, data: &Bound<'py, PyAny>, priorities: &Bound<'py, PyAny>, timeout: Option<f64>, rows: bool, records: Option<Bound<'py, PyBytes>>) -> PyResult<Bound<'py, PyAny>> {
        let timeout = timeout::parse(py, timeout)?;
        let vs = views(py, data, &self.fields, 2, "insert: ")?;
        let lead = vs[0].leading(2).to_vec();
        for (v, f) in vs.iter().zip(self.fields.iter()).skip(1) {
            if v.leading(2) != lead.as_slice() {
                return Err(invalid(py, format!(
                    "insert: field '{}' has [n, T] = {:?} but field '{}' has {:?}; every field needs the same n and T",
                    f.name, v.leading(2), self.fields[0].name, lead
                )));
            }
        }
        let (n, steps) = (lead[0], lead[1]);
        let priorities = Vector::<f64>::new(py, "priorities", priorities, Some(n))?;
        let p = priorities.as_slice();
        let records = records.as_ref().map_or(&[][..], |r| r.as_bytes());
        let slices: Vec<&[u8]> = vs.iter().map(|v| v.bytes()).collect();
        let signals = Signals::default();
        let alone = Alone::new(&self.table, true, timeout);
        let check = || signals.check() || alone.check();
        let wait = Wait { timeout, interrupt: Some(&check) };
        let (keys, first_rows) = py
            .detach(|| self.table.insert_batch_rows(&slices, n, steps, p, records, wait))
            .map_err(|e| to_py(py, alone.explain(e, n as u64), None, signals.take()))?;
        let keys = PyArray1::from_vec(py, keys).into_any();
        if !rows {
            return Ok(keys);
        }
        let first_rows: Vec<i64> = first_rows.into_iter().map(|r| r as i64).collect();
        Ok((keys, PyArray1::from_vec(py, first_rows)).into_pyobject(py)?.into_any())
    }

    /// Draws n items; returns a `reprise.Sample`.
    /// `packed`: the rows end to end (`packed_data`), as a token sample has them.
    #[pyo3(signature = (n, timeout=None, fields=None, packed=false))]
    fn sample<'py>(&self, py: Python<'py>, n: i64, timeout: Option<f64>, fields: Option<Vec<String>>, packed: bool) -> PyResult<Bound<'py, PyAny>> {
        let n = non_negative(py, &format!("table '{}': sample size", self.table.name()), n, 1)? as usize;
        self.draw(py, timeout, fields, n as u64, packed, |table, wait| table.sample(n, wait))
    }

    /// Draws whole items until the next would pass `budget` steps; returns a
    /// `reprise.Sample` whose rows are packed end to end (`packed_data`).
    #[pyo3(signature = (budget, timeout=None, fields=None))]
    fn sample_tokens<'py>(&self, py: Python<'py>, budget: i64, timeout: Option<f64>, fields: Option<Vec<String>>) -> PyResult<Bound<'py, PyAny>> {
        let budget = non_negative(py, &format!("table '{}': tokens", self.table.name()), budget, 1)?;
        self.draw(py, timeout, fields, 1, true, |table, wait| table.sample_tokens(budget, wait))
    }

    /// `[(name, dtype)]` of the item attributes.
    #[getter]
    fn attributes(&self) -> Vec<(String, &'static str)> {
        self.table.config().attributes.specs().iter().map(|a| (a.name.clone(), a.dtype.name())).collect()
    }

    #[getter]
    fn max_staleness(&self) -> Option<u64> {
        self.table.config().max_staleness
    }

    /// The policy version (None without an int64 attribute `version`).
    #[getter]
    fn version(&self, py: Python<'_>) -> Option<i64> {
        py.detach(|| self.table.version())
    }

    /// Sets the policy version; returns how many items left as stale.
    fn set_version(&self, py: Python<'_>, version: i64) -> PyResult<u64> {
        py.detach(|| self.table.set_version(version)).map_err(py_err(py))
    }

    /// Sets attribute `name` of `keys` from `values` (the attribute's dtype,
    /// one per key, as bytes); keys no longer present are skipped. Returns how many.
    fn update_attribute(&self, py: Python<'_>, keys: &Bound<'_, PyAny>, name: &str, values: Bound<'_, PyBytes>) -> PyResult<usize> {
        let keys = Vector::<u64>::new(py, "keys", keys, None)?;
        let (k, v) = (keys.as_slice(), values.as_bytes());
        py.detach(|| self.table.update_attribute(k, name, v)).map_err(py_err(py))
    }

    /// `({name: array[n]}, found[n])`: the attributes of items by key (zeros where
    /// a key is no longer present).
    fn attributes_of<'py>(&self, py: Python<'py>, keys: &Bound<'py, PyAny>) -> PyResult<(Bound<'py, PyDict>, Bound<'py, PyArray1<bool>>)> {
        let keys = Vector::<u64>::new(py, "keys", keys, None)?;
        let k = keys.as_slice();
        let (records, found) = py.detach(|| self.table.attributes_of(k));
        Ok((attribute_arrays(py, &self.table.config().attributes, &records, k.len())?, PyArray1::from_vec(py, found)))
    }

    /// Draws n items and keeps their rows held: a `SampleRows` for a collector.
    /// `pinned`: held by one epoch instead of a reference per block (for a device's
    /// gather; release it as soon as the gather has ended: until then no block of
    /// the store freed meanwhile is reused).
    #[pyo3(signature = (n, timeout=None, pinned=false))]
    fn sample_rows(&self, py: Python<'_>, n: i64, timeout: Option<f64>, pinned: bool) -> PyResult<PySampleRows> {
        let timeout = timeout::parse(py, timeout)?;
        let n = non_negative(py, &format!("table '{}': sample size", self.table.name()), n, 1)? as usize;
        let signals = Signals::default();
        let alone = Alone::new(&self.table, false, timeout);
        let check = || signals.check() || alone.check();
        let wait = Wait { timeout, interrupt: Some(&check) };
        let draw = || if pinned { self.table.sample_pinned(n, wait) } else { self.table.sample(n, wait) };
        let batch = py.detach(draw).map_err(|e| rows_error(py, alone.explain(e, n as u64), signals.take()))?;
        Ok(PySampleRows::new(HeldRows::InProcess(batch)))
    }

    /// Draws whole items until the next would pass `budget` steps (as
    /// `sample_tokens`) and keeps their rows held: a `SampleRows` for a collector
    /// that gathers them packed.
    fn sample_tokens_rows(&self, py: Python<'_>, budget: i64, timeout: Option<f64>) -> PyResult<PySampleRows> {
        let timeout = timeout::parse(py, timeout)?;
        let budget = non_negative(py, &format!("table '{}': tokens", self.table.name()), budget, 1)?;
        let signals = Signals::default();
        let alone = Alone::new(&self.table, false, timeout);
        let check = || signals.check() || alone.check();
        let wait = Wait { timeout, interrupt: Some(&check) };
        let batch = py
            .detach(|| self.table.sample_tokens(budget, wait))
            .map_err(|e| rows_error(py, alone.explain(e, 1), signals.take()))?;
        Ok(PySampleRows::new(HeldRows::InProcess(batch)))
    }

    /// External selection: draws up to n items in total into `rows` (a fresh
    /// batch when None) from candidates `(slots, seqs, probabilities)`. Returns
    /// `(rows, starved)`; `starved` means the candidates ran out first.
    #[pyo3(signature = (rows, n, timeout, slots, seqs, probabilities))]
    #[allow(clippy::too_many_arguments)]
    fn sample_candidates(
        &self,
        py: Python<'_>,
        rows: Option<PyRef<'_, PySampleRows>>,
        n: i64,
        timeout: Option<f64>,
        slots: &Bound<'_, PyAny>,
        seqs: &Bound<'_, PyAny>,
        probabilities: &Bound<'_, PyAny>,
    ) -> PyResult<(PySampleRows, bool)> {
        let timeout = timeout::parse(py, timeout)?;
        let n = non_negative(py, &format!("table '{}': sample size", self.table.name()), n, 1)? as usize;
        let slots = Vector::<i64>::new(py, "slots", slots, None)?;
        let seqs = Vector::<i64>::new(py, "seqs", seqs, Some(slots.len()))?;
        let probabilities = Vector::<f64>::new(py, "probabilities", probabilities, Some(slots.len()))?;
        let candidates: Vec<Candidate> = slots
            .as_slice()
            .iter()
            .zip(seqs.as_slice())
            .zip(probabilities.as_slice())
            .filter(|((&slot, &seq), _)| (0..=u32::MAX as i64).contains(&slot) && seq >= 0)
            .map(|((&slot, &seq), &probability)| Candidate { slot: slot as u32, seq: seq as u64, probability })
            .collect();
        let batch = match rows {
            Some(r) => Some(r.take_local(py)?),
            None => None,
        };
        let signals = Signals::default();
        let check = || signals.check();
        let wait = Wait { timeout, interrupt: Some(&check) };
        let (batch, starved) = py
            .detach(|| self.table.sample_candidates(batch, n, wait, &candidates))
            .map_err(|e| rows_error(py, e, signals.take()))?;
        Ok((PySampleRows::new(HeldRows::InProcess(batch)), starved))
    }

    /// Why this table cannot draw on a device from its mirror (None: it can).
    fn resident_refusal(&self) -> Option<String> {
        self.table.resident_refusal()
    }

    /// Device-resident draws: admits up to n draws under the rate limiter and
    /// returns `(count, table_size, size, positive, dense, shortest, longest,
    /// rows, stopped, changes)`; `dense`: the items fill slots `0..size`. `rows`
    /// is a `SampleRows` of no items holding the epoch; `stopped` is the (unraised) error that cut the admission short after
    /// `count` draws, or None. `changes` is `(slots, seqs, keys, priorities,
    /// times_sampled, lengths, ranges, starts, range_lengths)`: seq -1 for an
    /// empty slot; `ranges[i]` row ranges of change i follow in the flat
    /// `starts` / `range_lengths`.
    #[pyo3(signature = (n, timeout, longest_allowed=None))]
    fn admit<'py>(&self, py: Python<'py>, n: i64, timeout: Option<f64>, longest_allowed: Option<u32>) -> PyResult<Admission<'py>> {
        let timeout = timeout::parse(py, timeout)?;
        let n = non_negative(py, &format!("table '{}': sample size", self.table.name()), n, 1)? as usize;
        let signals = Signals::default();
        let check = || signals.check();
        let wait = Wait { timeout, interrupt: Some(&check) };
        let a = py.detach(|| self.table.admit(n, wait, longest_allowed)).map_err(|e| to_py(py, e, None, signals.take()))?;
        let stopped = a.stopped.map(|e| to_py(py, e, None, signals.take()).into_value(py).into_bound(py).into_any());
        let c = &a.changes;
        let item = |i: usize| c[i].item.as_ref();
        let ranges = |i: usize| item(i).map_or(&[][..], |it| it.window.ranges());
        let changes = (
            PyArray1::from_iter(py, c.iter().map(|c| c.slot as i64)),
            PyArray1::from_iter(py, (0..c.len()).map(|i| item(i).map_or(-1, |it| it.seq as i64))),
            PyArray1::from_iter(py, (0..c.len()).map(|i| item(i).map_or(0, |it| it.key as i64))),
            PyArray1::from_iter(py, (0..c.len()).map(|i| item(i).map_or(0.0, |it| it.priority))),
            PyArray1::from_iter(py, (0..c.len()).map(|i| item(i).map_or(0, |it| it.times_sampled as i64))),
            PyArray1::from_iter(py, (0..c.len()).map(|i| item(i).map_or(0, |it| it.length as i64))),
            PyArray1::from_iter(py, (0..c.len()).map(|i| ranges(i).len() as i64)),
            PyArray1::from_iter(py, (0..c.len()).flat_map(|i| ranges(i).iter().map(|r| r.start as i64))),
            PyArray1::from_iter(py, (0..c.len()).flat_map(|i| ranges(i).iter().map(|r| r.len as i64))),
        );
        let rows = PySampleRows::new(HeldRows::InProcess(a.rows));
        Ok((a.count, a.table_size, a.size, a.positive, a.dense, a.shortest, a.longest, rows, stopped, changes))
    }

    /// Adds device draws to items' times_sampled (items that left are skipped);
    /// returns how many items were credited.
    fn credit_draws(&self, py: Python<'_>, slots: PyReadonlyArray1<'_, i64>, seqs: PyReadonlyArray1<'_, i64>, counts: PyReadonlyArray1<'_, i64>) -> PyResult<usize> {
        fn each<T: TryFrom<i64>>(py: Python<'_>, what: &str, values: &PyReadonlyArray1<'_, i64>, clamp: i64) -> PyResult<Vec<T>> {
            let values = values.as_array();
            values
                .iter()
                .map(|&v| T::try_from(v.min(clamp)).map_err(|_| invalid(py, format!("credit_draws: {what} must be >= 0, got {v}"))))
                .collect()
        }
        let s: Vec<u32> = each(py, "a slot", &slots, i64::MAX)?;
        let q: Vec<u64> = each(py, "a seq", &seqs, i64::MAX)?;
        let k: Vec<u32> = each(py, "a count", &counts, u32::MAX as i64)?;
        py.detach(|| self.table.credit_draws(&s, &q, &k)).map_err(py_err(py))
    }

    /// External selection: `(slots, seqs, priorities)` of every slot that changed
    /// since the last call; seq is -1 where the slot is now empty.
    fn drain_changes<'py>(&self, py: Python<'py>) -> PyResult<Changes<'py>> {
        let changes = py.detach(|| self.table.drain_changes()).map_err(py_err(py))?;
        Ok((
            PyArray1::from_iter(py, changes.iter().map(|c| c.slot as i64)),
            PyArray1::from_iter(py, changes.iter().map(|c| c.item.map_or(-1, |(seq, _)| seq as i64))),
            PyArray1::from_iter(py, changes.iter().map(|c| c.item.map_or(0.0, |(_, p)| p))),
        ))
    }

    /// Sets priorities; keys no longer present are skipped. Returns how many applied.
    fn update_priorities(&self, py: Python<'_>, keys: &Bound<'_, PyAny>, priorities: &Bound<'_, PyAny>) -> PyResult<usize> {
        let keys = Vector::<u64>::new(py, "keys", keys, None)?;
        let priorities = Vector::<f64>::new(py, "priorities", priorities, Some(keys.len()))?;
        let (k, p) = (keys.as_slice(), priorities.as_slice());
        py.detach(|| self.table.update_priorities(k, p)).map_err(py_err(py))
    }

    /// Removes items; keys no longer present are skipped. Returns how many removed.
    fn delete(&self, py: Python<'_>, keys: &Bound<'_, PyAny>) -> PyResult<usize> {
        let keys = Vector::<u64>::new(py, "keys", keys, None)?;
        let k = keys.as_slice();
        Ok(py.detach(|| self.table.delete(k)))
    }

    fn reset(&self, py: Python<'_>) {
        py.detach(|| self.table.reset())
    }

    fn info<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let info = py.detach(|| self.table.info());
        info_dict(py, &info)
    }

    /// `[(key, priority, times_sampled, length)]` in insertion order.
    fn items(&self, py: Python<'_>) -> Vec<(u64, f64, u32, u32)> {
        py.detach(|| self.table.items()).into_iter().map(|i| (i.key, i.priority, i.times_sampled, i.length)).collect()
    }

    // Cluster mode (`reprise.distributed`): this table as one shard.

    /// Makes inserts wait until `thaw()`.
    fn freeze(&self, py: Python<'_>) {
        py.detach(|| self.table.freeze())
    }

    fn thaw(&self, py: Python<'_>) {
        py.detach(|| self.table.thaw())
    }

    /// `(size, mass, next_seq, num_inserts, num_samples, max_length)`.
    fn shard_summary(&self, py: Python<'_>) -> (u64, f64, u64, u64, u64, u32) {
        let s = py.detach(|| self.table.shard_summary());
        (s.size, s.mass, s.next_seq, s.num_inserts, s.num_samples, s.max_length)
    }

    /// `(slots, seqs, priorities, times_sampled, lengths)` of the first k items in
    /// the sampler's order (empty for random samplers).
    fn ranked<'py>(&self, py: Python<'py>, k: usize) -> Ranked<'py> {
        let c = py.detach(|| self.table.ranked(k));
        (
            PyArray1::from_iter(py, c.iter().map(|c| c.slot)),
            PyArray1::from_iter(py, c.iter().map(|c| c.seq)),
            PyArray1::from_iter(py, c.iter().map(|c| c.priority)),
            PyArray1::from_iter(py, c.iter().map(|c| c.times_sampled)),
            PyArray1::from_iter(py, c.iter().map(|c| c.length)),
        )
    }

    /// The length of the item each planned target (as `draw_planned` takes them)
    /// would draw now, 0 where none would; draws nothing.
    #[pyo3(signature = (by_mass, index, mass, summary_size, summary_mass))]
    fn planned_lengths<'py>(
        &self,
        py: Python<'py>,
        by_mass: bool,
        index: PyReadonlyArray1<'py, u64>,
        mass: PyReadonlyArray1<'py, f64>,
        summary_size: u64,
        summary_mass: f64,
    ) -> PyResult<Bound<'py, PyArray1<u32>>> {
        let (targets, summary) = planned(py, by_mass, &index, &mass, summary_size, summary_mass)?;
        Ok(PyArray1::from_vec(py, py.detach(|| self.table.planned_lengths(&targets, &summary))))
    }

    /// Draws planned targets (`mass` when `by_mass`, else `index`): `(rows, filled)`.
    #[pyo3(signature = (by_mass, index, mass, divisor, table_size, summary_size, summary_mass))]
    #[allow(clippy::too_many_arguments)]
    fn draw_planned<'py>(
        &self,
        py: Python<'py>,
        by_mass: bool,
        index: PyReadonlyArray1<'py, u64>,
        mass: PyReadonlyArray1<'py, f64>,
        divisor: f64,
        table_size: u64,
        summary_size: u64,
        summary_mass: f64,
    ) -> PyResult<(PySampleRows, Bound<'py, PyArray1<bool>>)> {
        let (targets, summary) = planned(py, by_mass, &index, &mass, summary_size, summary_mass)?;
        let (batch, filled) = py.detach(|| self.table.draw_planned(&targets, divisor, table_size, &summary));
        Ok((PySampleRows::new(HeldRows::InProcess(batch)), PyArray1::from_vec(py, filled)))
    }

    /// Draws merged candidates `(slots, seqs)` in order: `(rows, filled)`.
    fn draw_ranked<'py>(
        &self,
        py: Python<'py>,
        slots: PyReadonlyArray1<'py, u32>,
        seqs: PyReadonlyArray1<'py, u64>,
        table_size: u64,
    ) -> PyResult<(PySampleRows, Bound<'py, PyArray1<bool>>)> {
        let slots = slots.as_slice().map_err(|_| invalid(py, "slots must be contiguous".into()))?;
        let seqs = seqs.as_slice().map_err(|_| invalid(py, "seqs must be contiguous".into()))?;
        let picks: Vec<(u32, u64)> = slots.iter().copied().zip(seqs.iter().copied()).collect();
        let (batch, filled) = py.detach(|| self.table.draw_ranked(&picks, table_size));
        Ok((PySampleRows::new(HeldRows::InProcess(batch)), PyArray1::from_vec(py, filled)))
    }

    /// Local keys of global keys' `(generation, slot)` parts: `(keys, found)`.
    fn local_keys<'py>(
        &self,
        py: Python<'py>,
        generations: PyReadonlyArray1<'py, u32>,
        slots: PyReadonlyArray1<'py, u32>,
    ) -> PyResult<LocalKeys<'py>> {
        let g = generations.as_slice().map_err(|_| invalid(py, "generations must be contiguous".into()))?;
        let s = slots.as_slice().map_err(|_| invalid(py, "slots must be contiguous".into()))?;
        let found: Vec<Option<u64>> = py.detach(|| g.iter().zip(s).map(|(&g, &s)| self.table.local_key(s, g)).collect());
        Ok((PyArray1::from_iter(py, found.iter().map(|k| k.unwrap_or(0))), PyArray1::from_iter(py, found.iter().map(|k| k.is_some()))))
    }
}

/// A plan's targets for this shard (`mass` when `by_mass`, else `index`) and the
/// figures the shard reported for the step.
fn planned(
    py: Python<'_>,
    by_mass: bool,
    index: &PyReadonlyArray1<'_, u64>,
    mass: &PyReadonlyArray1<'_, f64>,
    summary_size: u64,
    summary_mass: f64,
) -> PyResult<(Vec<reprise_core::cluster::plan::Target>, reprise_core::cluster::plan::ShardFigures)> {
    use reprise_core::cluster::plan::{ShardFigures, Target};
    let targets = if by_mass {
        mass.as_slice().map_err(|_| invalid(py, "mass must be contiguous".into()))?.iter().map(|&m| Target::Mass(m)).collect()
    } else {
        index.as_slice().map_err(|_| invalid(py, "index must be contiguous".into()))?.iter().map(|&i| Target::Index(i)).collect()
    };
    Ok((targets, ShardFigures { size: summary_size, mass: summary_mass }))
}

/// `(keys, found)`.
type LocalKeys<'py> = (Bound<'py, PyArray1<u64>>, Bound<'py, PyArray1<bool>>);

/// `(slots, seqs, priorities, times_sampled)`.
type Ranked<'py> = (
    Bound<'py, PyArray1<u32>>,
    Bound<'py, PyArray1<u64>>,
    Bound<'py, PyArray1<f64>>,
    Bound<'py, PyArray1<u32>>,
    Bound<'py, PyArray1<u32>>,
);

/// The four numbers of a rate-limiter preset, validated by the core.
#[pyfunction]
#[pyo3(signature = (kind, a, b=0.0, c=0.0, d=0.0))]
pub fn rate_limiter_preset(py: Python<'_>, kind: &str, a: f64, b: f64, c: f64, d: f64) -> PyResult<(f64, u64, f64, f64)> {
    let count = |name: &str, v: f64| -> PyResult<u64> {
        if v.fract() != 0.0 || v < 0.0 || !v.is_finite() {
            return Err(invalid(py, format!("{name} must be a whole number >= 0, got {v}")));
        }
        Ok(v as u64)
    };
    let config = match kind {
        "MinSize" => RateLimiterConfig::min_size(count("min_size_to_sample", a)?),
        "SampleToInsertRatio" => RateLimiterConfig::sample_to_insert_ratio(a, count("min_size_to_sample", b)?, c),
        "Queue" | "Stack" => RateLimiterConfig::queue(count("size", a)?),
        "RateLimiter" => RateLimiterConfig::new(a, count("min_size_to_sample", b)?, c, d),
        other => return Err(invalid(py, format!("unknown rate limiter preset '{other}'"))),
    }
    .map_err(py_err(py))?;
    Ok((config.samples_per_insert, config.min_size_to_sample, config.min_diff, config.max_diff))
}

/// `Table.info()` as a dict (also what clients get per table).
pub fn info_dict<'py>(py: Python<'py>, i: &TableInfo) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("name", &i.name)?;
    d.set_item("size", i.size)?;
    d.set_item("max_size", i.max_size)?;
    d.set_item("max_times_sampled", i.max_times_sampled)?;
    d.set_item("sampler", &i.sampler)?;
    d.set_item("remover", &i.remover)?;
    d.set_item("num_inserts", i.num_inserts)?;
    d.set_item("num_samples", i.num_samples)?;
    d.set_item("num_evictions", i.num_evictions)?;
    d.set_item("num_deletes", i.num_deletes)?;
    d.set_item("num_store_evictions", i.num_store_evictions)?;
    let r = PyDict::new(py);
    r.set_item("samples_per_insert", i.rate_limiter.samples_per_insert)?;
    r.set_item("min_size_to_sample", i.rate_limiter.min_size_to_sample)?;
    r.set_item("min_diff", i.rate_limiter.min_diff)?;
    r.set_item("max_diff", i.rate_limiter.max_diff)?;
    r.set_item("inserts", i.limiter_inserts)?;
    r.set_item("samples", i.limiter_samples)?;
    r.set_item("blocked_insert_seconds", i.blocked_insert_seconds)?;
    r.set_item("blocked_sample_seconds", i.blocked_sample_seconds)?;
    d.set_item("rate_limiter", r)?;
    d.set_item("version", i.version)?;
    d.set_item("stale_removed", i.stale_removed)?;
    d.set_item("stale_dropped", i.stale_dropped)?;
    match &i.groups {
        Some(g) => d.set_item("groups", py.import("json")?.getattr("loads")?.call1((g.to_string(),))?)?,
        None => d.set_item("groups", py.None())?,
    }
    let attributes = PyDict::new(py);
    for (name, dtype) in &i.attributes {
        attributes.set_item(name, dtype)?;
    }
    d.set_item("attributes", attributes)?;
    let store = PyDict::new(py);
    store.set_item("raw_bytes", i.store_raw_bytes)?;
    store.set_item("stored_bytes", i.store_stored_bytes)?;
    d.set_item("store", store)?;
    Ok(d)
}

