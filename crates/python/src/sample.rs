//! Turns a core `SampleBatch` into a `reprise.Sample` with numpy arrays.

use numpy::{PyArray1, PyArrayDescr};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyDict;
use reprise_core::attributes::Attributes;
use reprise_core::Collect;

use crate::arrays::new_array;

static SAMPLE_CLASS: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

/// Builds a `reprise.Sample`: metadata arrays plus `data[field]` of shape
/// `[n, T, ...]` (T = longest item, zero-padded past each item's length) for the
/// fields in `select` (all when `None`). Rows are copied with the GIL released.
pub fn sample_object<'py, S: Collect + Send + Sync>(py: Python<'py>, batch: S, select: Option<&[usize]>) -> PyResult<Bound<'py, PyAny>> {
    sample_with(py, batch, select, &Attributes::default(), &[], false)
}

/// Builds a `reprise.Sample` of `batch` with its items' attributes (`records`,
/// laid out by `schema`) as `attributes[name]`. `packed`: the rows go end to end
/// into `packed[field]` of shape `[total_steps, ...]` (no padding anywhere;
/// `data` then pads on demand); otherwise into `data` as `sample_object` does.
pub fn sample_with<'py, S: Collect + Send + Sync>(
    py: Python<'py>,
    batch: S,
    select: Option<&[usize]>,
    schema: &Attributes,
    records: &[u8],
    packed: bool,
) -> PyResult<Bound<'py, PyAny>> {
    let n = batch.items().len();
    let t = batch.max_length() as usize;
    let total: usize = if packed { batch.items().iter().map(|i| i.length as usize).sum() } else { 0 };
    let sig = batch.columns().signature().clone();
    let all: Vec<usize> = (0..sig.len()).collect();
    let select = select.unwrap_or(&all);
    let data = PyDict::new(py);
    let mut outs = Vec::with_capacity(select.len());
    for &col in select {
        let f = &sig.fields()[col];
        let mut shape = if packed { vec![total] } else { vec![n, t] };
        shape.extend(f.sample_shape());
        let dtype: Py<PyArrayDescr> = PyArrayDescr::new(py, f.dtype.name())?.unbind();
        // Uninitialized: the gather zeroes what lies past each item's steps.
        let (array, out) = new_array(py, &shape, &dtype, false)?;
        data.set_item(&f.name, array)?;
        outs.push((col, out));
    }
    let items = batch.items();
    let keys = PyArray1::from_iter(py, items.iter().map(|i| i.key));
    let probabilities = PyArray1::from_iter(py, items.iter().map(|i| i.probability));
    let priorities = PyArray1::from_iter(py, items.iter().map(|i| i.priority));
    let times_sampled = PyArray1::from_iter(py, items.iter().map(|i| i.times_sampled as i64));
    let lengths = PyArray1::from_iter(py, items.iter().map(|i| i.length as i64));
    let table_size = batch.table_size();
    let attributes = if schema.is_empty() { None } else { Some(attribute_arrays(py, schema, records, n)?) };
    py.detach(|| {
        for (col, out) in outs.iter_mut() {
            if packed {
                batch.gather_packed(*col, out.bytes());
            } else {
                batch.gather(*col, t as u32, out.bytes());
            }
        }
        drop(batch);
    });
    let class = sample_class(py)?;
    let kwargs = PyDict::new(py);
    kwargs.set_item("keys", keys)?;
    kwargs.set_item("probabilities", probabilities)?;
    kwargs.set_item("priorities", priorities)?;
    kwargs.set_item("times_sampled", times_sampled)?;
    kwargs.set_item("table_size", table_size)?;
    kwargs.set_item("lengths", lengths)?;
    if let Some(attributes) = attributes {
        kwargs.set_item("attributes", attributes)?;
    }
    if packed {
        return class.getattr("_packed")?.call((data,), Some(&kwargs));
    }
    kwargs.set_item("data", data)?;
    class.call((), Some(&kwargs))
}

/// `{name: array[n]}` of `n` items' attribute records laid out by `schema`.
pub fn attribute_arrays<'py>(py: Python<'py>, schema: &Attributes, records: &[u8], n: usize) -> PyResult<Bound<'py, PyDict>> {
    let out = PyDict::new(py);
    let record = schema.record();
    if record == 0 || records.len() != n * record {
        return Ok(out);
    }
    for (i, spec) in schema.specs().iter().enumerate() {
        let dtype: Py<PyArrayDescr> = PyArrayDescr::new(py, spec.dtype.name())?.unbind();
        let (array, mut column) = new_array(py, &[n], &dtype, false)?;
        schema.column_into(i, records, column.bytes());
        out.set_item(&spec.name, array)?;
    }
    Ok(out)
}

/// `reprise.Sample`, looked up once.
pub fn sample_class(py: Python<'_>) -> PyResult<&Bound<'_, PyAny>> {
    SAMPLE_CLASS.get_or_try_init(py, || Ok::<_, PyErr>(py.import("reprise.sample")?.getattr("Sample")?.unbind())).map(|c| c.bind(py))
}
