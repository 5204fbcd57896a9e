//! Table snapshots for `reprise.checkpoint`: the index as numpy arrays plus the
//! pins that keep its blocks from being reused while the rows are written.

use numpy::{PyArray1, PyArrayMethods};
use parking_lot::Mutex;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use reprise_core::item::RowRange;
use reprise_core::snapshot::{ItemRecord, Pins, TableSnapshot};
use reprise_core::{RateLimiterConfig, SelectorSpec, Table, TableConfig};

use crate::errors::new_error;
use crate::raise::py_err;
use crate::store::PyStore;
use crate::table::PyTable;

/// Blocks held for a checkpoint; `release()` (or garbage collection) lets them go.
#[pyclass(name = "Pins", module = "reprise._native", frozen)]
pub struct PyPins {
    pub pins: Mutex<Option<Pins>>,
}

#[pymethods]
impl PyPins {
    fn blocks<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<u32>> {
        let g = self.pins.lock();
        PyArray1::from_slice(py, g.as_ref().map_or(&[][..], |p| p.blocks()))
    }

    fn release(&self) {
        self.pins.lock().take();
    }

    /// Releases these blocks now (their rows are written); the rest stay pinned.
    fn release_blocks(&self, py: Python<'_>, blocks: &Bound<'_, PyAny>) -> PyResult<()> {
        let blocks = crate::arrays::Vector::<u32>::new(py, "blocks", blocks, None)?;
        let mut done = blocks.as_slice().to_vec();
        done.sort_unstable();
        if let Some(p) = self.pins.lock().as_mut() {
            p.release_blocks(&done);
        }
        Ok(())
    }
}

fn corrupt(py: Python<'_>, what: String) -> PyErr {
    new_error(py, "Corrupt", what)
}

/// `(snapshot dict, pins)` of a table.
pub fn snapshot<'py>(py: Python<'py>, table: &Table) -> PyResult<(Bound<'py, PyDict>, PyPins)> {
    let (s, pins) = py.detach(|| table.snapshot());
    let d = PyDict::new(py);
    let c = &s.config;
    d.set_item("name", &c.name)?;
    d.set_item("sampler", c.sampler.to_name())?;
    d.set_item("remover", c.remover.to_name())?;
    d.set_item("max_size", c.max_size)?;
    d.set_item("max_times_sampled", c.max_times_sampled)?;
    let r = &c.rate_limiter;
    d.set_item("rate_limiter", (r.samples_per_insert, r.min_size_to_sample, r.min_diff, r.max_diff))?;
    d.set_item("seed", c.seed)?;
    d.set_item("evict_when_store_full", c.evict_when_store_full)?;
    d.set_item("external_selection", c.external_selection)?;
    let it = &s.items;
    d.set_item("slot", PyArray1::from_iter(py, it.iter().map(|i| i.slot)))?;
    d.set_item("key", PyArray1::from_iter(py, it.iter().map(|i| i.key)))?;
    d.set_item("seq", PyArray1::from_iter(py, it.iter().map(|i| i.seq)))?;
    d.set_item("priority", PyArray1::from_iter(py, it.iter().map(|i| i.priority)))?;
    d.set_item("times_sampled", PyArray1::from_iter(py, it.iter().map(|i| i.times_sampled)))?;
    d.set_item("num_ranges", PyArray1::from_iter(py, it.iter().map(|i| i.ranges.len() as u32)))?;
    d.set_item("range_start", PyArray1::from_iter(py, it.iter().flat_map(|i| i.ranges.iter().map(|r| r.start))))?;
    d.set_item("range_len", PyArray1::from_iter(py, it.iter().flat_map(|i| i.ranges.iter().map(|r| r.len))))?;
    d.set_item("generations", PyArray1::from_slice(py, &s.generations))?;
    d.set_item("free_slots", PyArray1::from_slice(py, &s.free_slots))?;
    d.set_item("next_seq", s.next_seq)?;
    d.set_item("counters", s.counters.to_vec())?;
    d.set_item("limiter", (s.limiter_inserts, s.limiter_samples, s.blocked_insert_seconds, s.blocked_sample_seconds))?;
    d.set_item("rng", &s.rng)?;
    d.set_item("sampler_order", s.sampler_order.as_ref().map(|o| PyArray1::from_slice(py, o)))?;
    d.set_item("remover_order", s.remover_order.as_ref().map(|o| PyArray1::from_slice(py, o)))?;
    Ok((d, PyPins { pins: Mutex::new(Some(pins)) }))
}

fn get<'py, T>(py: Python<'py>, d: &Bound<'py, PyDict>, key: &str) -> PyResult<T>
where
    T: for<'a> FromPyObject<'a, 'py>,
    for<'a> <T as FromPyObject<'a, 'py>>::Error: Into<PyErr>,
{
    match d.get_item(key)? {
        Some(v) => v.extract::<T>().map_err(|e| {
            let e: PyErr = e.into();
            corrupt(py, format!("table snapshot field '{key}': {e}"))
        }),
        None => Err(corrupt(py, format!("table snapshot has no '{key}'"))),
    }
}

fn array<'py, T: numpy::Element + Copy>(py: Python<'py>, d: &Bound<'py, PyDict>, key: &str) -> PyResult<Vec<T>> {
    let v = d.get_item(key)?.ok_or_else(|| corrupt(py, format!("table snapshot has no '{key}'")))?;
    let a = v.cast::<PyArray1<T>>().map_err(|_| corrupt(py, format!("table snapshot field '{key}' has the wrong type")))?;
    Ok(a.readonly().as_slice().map_err(|e| corrupt(py, format!("'{key}': {e}")))?.to_vec())
}

fn selector(py: Python<'_>, (name, exponent): (String, f64)) -> PyResult<SelectorSpec> {
    SelectorSpec::from_name(&name, exponent).ok_or_else(|| corrupt(py, format!("unknown selector '{name}' in a table snapshot")))
}

/// Rebuilds a table from a snapshot dict over `store` (rows written back first).
pub fn restore(py: Python<'_>, store: &PyStore, d: &Bound<'_, PyDict>) -> PyResult<PyTable> {
    let (spi, min_size, min_diff, max_diff): (f64, u64, f64, f64) = get(py, d, "rate_limiter")?;
    let config = TableConfig {
        name: get(py, d, "name")?,
        sampler: selector(py, get(py, d, "sampler")?)?,
        remover: selector(py, get(py, d, "remover")?)?,
        max_size: get(py, d, "max_size")?,
        max_times_sampled: get(py, d, "max_times_sampled")?,
        rate_limiter: RateLimiterConfig::new(spi, min_size, min_diff, max_diff).map_err(|e| corrupt(py, format!("rate limiter: {e}")))?,
        seed: get(py, d, "seed")?,
        evict_when_store_full: get(py, d, "evict_when_store_full")?,
        external_selection: get(py, d, "external_selection")?,
    };
    let slot: Vec<u32> = array(py, d, "slot")?;
    let key: Vec<u64> = array(py, d, "key")?;
    let seq: Vec<u64> = array(py, d, "seq")?;
    let priority: Vec<f64> = array(py, d, "priority")?;
    let times: Vec<u32> = array(py, d, "times_sampled")?;
    let nr: Vec<u32> = array(py, d, "num_ranges")?;
    let rs: Vec<u64> = array(py, d, "range_start")?;
    let rl: Vec<u32> = array(py, d, "range_len")?;
    let n = slot.len();
    if [key.len(), seq.len(), priority.len(), times.len(), nr.len()].iter().any(|&l| l != n)
        || rs.len() != rl.len()
        || nr.iter().map(|&k| k as usize).sum::<usize>() != rs.len()
    {
        return Err(corrupt(py, "table snapshot arrays have inconsistent lengths".into()));
    }
    let mut items = Vec::with_capacity(n);
    let mut at = 0usize;
    for i in 0..n {
        let k = nr[i] as usize;
        let ranges = (at..at + k).map(|j| RowRange { start: rs[j], len: rl[j] }).collect();
        at += k;
        items.push(ItemRecord { slot: slot[i], key: key[i], seq: seq[i], ranges, priority: priority[i], times_sampled: times[i] });
    }
    let counters: Vec<u64> = get(py, d, "counters")?;
    let counters: [u64; 5] = counters.try_into().map_err(|_| corrupt(py, "table snapshot counters must be 5 numbers".into()))?;
    let (li, ls, bi, bs): (u64, u64, f64, f64) = get(py, d, "limiter")?;
    let order = |key: &str| -> PyResult<Option<Vec<u32>>> {
        match d.get_item(key)? {
            Some(v) if !v.is_none() => Ok(Some(array(py, d, key)?)),
            _ => Ok(None),
        }
    };
    let snap = TableSnapshot {
        config,
        items,
        generations: array(py, d, "generations")?,
        free_slots: array(py, d, "free_slots")?,
        next_seq: get(py, d, "next_seq")?,
        counters,
        limiter_inserts: li,
        limiter_samples: ls,
        blocked_insert_seconds: bi,
        blocked_sample_seconds: bs,
        rng: get(py, d, "rng")?,
        sampler_order: order("sampler_order")?,
        remover_order: order("remover_order")?,
    };
    let table = py.detach(|| Table::restore(&snap, &store.store)).map_err(py_err(py))?;
    Ok(PyTable::from_table(table, store.fields.clone()))
}
