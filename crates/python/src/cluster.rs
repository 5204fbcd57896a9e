//! Cluster mode's arithmetic for `reprise.distributed` (the plan, the merge, the
//! assignment and global keys of `reprise_core::cluster`). Internal: the Python
//! package passes arrays of the exact dtypes.

use numpy::{PyArray1, PyArrayMethods, PyReadonlyArray1};
use pyo3::prelude::*;
use reprise_core::cluster::{self, assign::Assignment, merge::Candidate, plan::ShardFigures, plan::Target};
use reprise_core::SelectorSpec;

use crate::errors::invalid;
use crate::raise::py_err;
use crate::rows::{row_crc, CRC_AT, FLAGS_AT, HEADER, LENGTH_AT, STATUS};

type Array<'py, T> = Bound<'py, PyArray1<T>>;
type Planned<'py> = (Bound<'py, PyArray1<u32>>, Bound<'py, PyArray1<u64>>, Bound<'py, PyArray1<f64>>, bool, f64, u64);

fn slice<'a, T: numpy::Element>(py: Python<'_>, what: &str, a: &'a PyReadonlyArray1<'_, T>) -> PyResult<&'a [T]> {
    a.as_slice().map_err(|_| invalid(py, format!("{what} must be a contiguous array")))
}

/// `(shard, index, mass, by_mass, divisor, table_size)` of a draw of `batch`: per
/// position its shard and its target (`mass[j]` when `by_mass`, else `index[j]`).
#[pyfunction]
#[pyo3(signature = (weighted, sizes, masses, batch, seed, table, step))]
#[allow(clippy::too_many_arguments)]
fn plan<'py>(
    py: Python<'py>,
    weighted: bool,
    sizes: PyReadonlyArray1<'py, u64>,
    masses: PyReadonlyArray1<'py, f64>,
    batch: usize,
    seed: u64,
    table: u64,
    step: u64,
) -> PyResult<Planned<'py>> {
    let (sizes, masses) = (slice(py, "sizes", &sizes)?, slice(py, "masses", &masses)?);
    if sizes.len() != masses.len() {
        return Err(invalid(py, format!("{} sizes but {} masses", sizes.len(), masses.len())));
    }
    let figures: Vec<ShardFigures> = sizes.iter().zip(masses).map(|(&size, &mass)| ShardFigures { size, mass }).collect();
    let p = py.detach(|| cluster::plan::plan(weighted, &figures, batch, seed, table, step)).map_err(py_err(py))?;
    let by_mass = matches!(p.target.first(), Some(Target::Mass(_)));
    let index = p.target.iter().map(|t| if let Target::Index(i) = t { *i } else { 0 });
    let mass = p.target.iter().map(|t| if let Target::Mass(m) = t { *m } else { 0.0 });
    Ok((PyArray1::from_vec(py, p.shard), PyArray1::from_iter(py, index), PyArray1::from_iter(py, mass), by_mass, p.divisor, p.table_size))
}

/// `(shard, candidate)` per position of an ordered selector's merged draw.
/// `counts[s]` candidates of shard s lie consecutively in the other arrays.
#[pyfunction]
#[pyo3(signature = (sampler, max_times_sampled, counts, slots, seqs, priorities, times_sampled, visible_steps, batch, table_size))]
#[allow(clippy::too_many_arguments)]
fn merge<'py>(
    py: Python<'py>,
    sampler: (String, f64),
    max_times_sampled: u32,
    counts: PyReadonlyArray1<'py, u64>,
    slots: PyReadonlyArray1<'py, u32>,
    seqs: PyReadonlyArray1<'py, u64>,
    priorities: PyReadonlyArray1<'py, f64>,
    times_sampled: PyReadonlyArray1<'py, u32>,
    visible_steps: PyReadonlyArray1<'py, u64>,
    batch: usize,
    table_size: u64,
) -> PyResult<(Array<'py, u32>, Array<'py, u32>)> {
    let spec = SelectorSpec::from_name(&sampler.0, sampler.1).ok_or_else(|| invalid(py, format!("unknown sampler '{}'", sampler.0)))?;
    let counts = slice(py, "counts", &counts)?;
    let (slots, seqs, prios) = (slice(py, "slots", &slots)?, slice(py, "seqs", &seqs)?, slice(py, "priorities", &priorities)?);
    let (times, steps) = (slice(py, "times_sampled", &times_sampled)?, slice(py, "visible_steps", &visible_steps)?);
    let n = slots.len();
    if [seqs.len(), prios.len(), times.len(), steps.len()].iter().any(|&l| l != n) || counts.iter().sum::<u64>() != n as u64 {
        return Err(invalid(py, "merge: candidate arrays of different lengths".into()));
    }
    let mut shards = Vec::with_capacity(counts.len());
    let mut at = 0usize;
    for &c in counts {
        shards.push(
            (at..at + c as usize)
                .map(|i| Candidate {
                    slot: slots[i],
                    seq: seqs[i],
                    priority: prios[i],
                    times_sampled: times[i],
                    visible_step: steps[i],
                    length: 0,
                })
                .collect::<Vec<_>>(),
        );
        at += c as usize;
    }
    let merged = py.detach(|| cluster::merge::merge(spec, max_times_sampled, &shards, batch, table_size)).map_err(py_err(py))?;
    Ok((PyArray1::from_iter(py, merged.iter().map(|m| m.0)), PyArray1::from_iter(py, merged.iter().map(|m| m.1))))
}

/// Candidates each shard sends for a merged draw of `batch`.
#[pyfunction]
fn candidates_needed(py: Python<'_>, sampler: (String, f64), max_times_sampled: u32, batch: usize) -> PyResult<usize> {
    let spec = SelectorSpec::from_name(&sampler.0, sampler.1).ok_or_else(|| invalid(py, format!("unknown sampler '{}'", sampler.0)))?;
    Ok(cluster::merge::candidates_needed(spec, max_times_sampled, batch))
}

/// The consumer index of every position (`how`: "iid" or "local").
#[pyfunction]
fn assign<'py>(
    py: Python<'py>,
    how: &str,
    shard: PyReadonlyArray1<'py, u32>,
    shard_host: PyReadonlyArray1<'py, u32>,
    consumer_host: PyReadonlyArray1<'py, u32>,
) -> PyResult<Bound<'py, PyArray1<u32>>> {
    let how = Assignment::from_name(how).ok_or_else(|| invalid(py, format!("assignment must be 'local' or 'iid', got {how:?}")))?;
    let (shard, shard_host, consumer_host) = (slice(py, "shard", &shard)?, slice(py, "shard_host", &shard_host)?, slice(py, "consumer_host", &consumer_host)?);
    let out = cluster::assign::assign(how, shard, shard_host, consumer_host).map_err(py_err(py))?;
    Ok(PyArray1::from_vec(py, out))
}

/// The consumer index of each pick of a token-budget step that fits (a prefix of
/// `lengths`, the picks' item lengths in draw order; `cluster::tokens::cut`).
#[pyfunction]
fn token_cut<'py>(py: Python<'py>, lengths: PyReadonlyArray1<'py, u32>, consumers: usize, budget: u64) -> PyResult<Array<'py, u32>> {
    let lengths = slice(py, "lengths", &lengths)?;
    let out = cluster::tokens::cut(lengths, consumers, budget).map_err(py_err(py))?;
    Ok(PyArray1::from_vec(py, out))
}

#[pyfunction]
fn table_id(name: &str) -> u64 {
    cluster::table_id(name)
}

/// Global keys of `keys` (local keys of shard `shard`).
#[pyfunction]
fn global_keys<'py>(py: Python<'py>, shard: u32, keys: PyReadonlyArray1<'py, u64>) -> PyResult<Bound<'py, PyArray1<u64>>> {
    let keys = slice(py, "keys", &keys)?;
    Ok(PyArray1::from_iter(py, keys.iter().map(|&k| cluster::global_key(shard, k))))
}

/// `(shard, generation, slot)` of global keys.
#[pyfunction]
fn split_keys<'py>(py: Python<'py>, keys: PyReadonlyArray1<'py, u64>) -> PyResult<(Array<'py, u32>, Array<'py, u32>, Array<'py, u32>)> {
    let parts: Vec<(u32, u32, u32)> = slice(py, "keys", &keys)?.iter().map(|&k| cluster::split_key(k)).collect();
    Ok((
        PyArray1::from_iter(py, parts.iter().map(|p| p.0)),
        PyArray1::from_iter(py, parts.iter().map(|p| p.1)),
        PyArray1::from_iter(py, parts.iter().map(|p| p.2)),
    ))
}

fn word(row: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([row[at], row[at + 1], row[at + 2], row[at + 3]])
}

/// The first packed row (`stride` bytes each, as `SampleRows.pack` writes them,
/// filled or not) whose CRC-32 (`rows::row_crc`) does not match, or -1.
#[pyfunction]
fn check_rows(py: Python<'_>, rows: PyReadonlyArray1<'_, u8>, stride: usize) -> PyResult<i64> {
    let bytes = slice(py, "rows", &rows)?;
    if stride < HEADER || bytes.len() % stride != 0 {
        return Err(invalid(py, format!("check_rows: {} bytes are not rows of {stride}", bytes.len())));
    }
    let bad = py.detach(|| bytes.chunks_exact(stride).position(|row| row_crc(row) != word(row, CRC_AT)));
    Ok(bad.map_or(-1, |i| i as i64))
}

/// A step's routes from its plan (`shard[p]`, `dest[p]`: each position's shard and
/// consumer rank; `owner[s]`: shard s's rank), as rank `rank` of `world` sees them:
/// `(mine, recv_rows, sources)`: the consumer of each row this rank sends (the
/// positions of its shard `my_shard`, in order; none without a shard, -1), how
/// many rows each rank sends it, and the rank each of its positions comes from,
/// in position order.
#[pyfunction]
fn route<'py>(
    py: Python<'py>,
    shard: PyReadonlyArray1<'py, u32>,
    dest: PyReadonlyArray1<'py, i64>,
    owner: PyReadonlyArray1<'py, i64>,
    my_shard: i64,
    rank: i64,
    world: usize,
) -> PyResult<(Array<'py, i64>, Vec<i64>, Array<'py, i64>)> {
    let (shard, dest, owner) = (slice(py, "shard", &shard)?, slice(py, "dest", &dest)?, slice(py, "owner", &owner)?);
    if shard.len() != dest.len() {
        return Err(invalid(py, format!("route: {} shards but {} destinations; expected one of each per position", shard.len(), dest.len())));
    }
    let (mut mine, mut sources, mut recv_rows) = (Vec::new(), Vec::new(), vec![0i64; world]);
    for (&s, &d) in shard.iter().zip(dest) {
        let source = owner.get(s as usize).copied().filter(|&o| o >= 0 && (o as usize) < world);
        let Some(source) = source else {
            return Err(invalid(py, format!("route: shard {s} has no owner among {world} ranks")));
        };
        if s as i64 == my_shard {
            mine.push(d);
        }
        if d == rank {
            sources.push(source);
            recv_rows[source as usize] += 1;
        }
    }
    Ok((PyArray1::from_vec(py, mine), recv_rows, PyArray1::from_vec(py, sources)))
}

/// Where a step's received rows lie, in position order: source s sent `counts[s]`
/// rows of `strides[s]` bytes from byte `starts[s] + STATUS`, in position order, and
/// `sources[p]` is the source of position p. Returns the filled rows' `(at,
/// located, filled_by_source, longest, total)`: each one's byte offset in `recv`
/// and whether its source sent locators (`located[s]`), in position order; how many
/// rows each source marked filled; the longest item (its `length`, at most
/// `steps`); and the steps the outputs need (`packed`: every item's steps end to
/// end, else `longest` per row).
#[pyfunction]
#[pyo3(signature = (recv, starts, counts, strides, located, sources, steps, packed))]
#[allow(clippy::too_many_arguments, clippy::type_complexity)]
fn arrivals<'py>(
    py: Python<'py>,
    recv: PyReadonlyArray1<'py, u8>,
    starts: PyReadonlyArray1<'py, i64>,
    counts: PyReadonlyArray1<'py, i64>,
    strides: PyReadonlyArray1<'py, i64>,
    located: PyReadonlyArray1<'py, bool>,
    sources: PyReadonlyArray1<'py, i64>,
    steps: usize,
    packed: bool,
) -> PyResult<(Array<'py, i64>, Array<'py, bool>, Array<'py, i64>, usize, usize)> {
    let bytes = slice(py, "recv", &recv)?;
    let (starts, counts, strides) = (slice(py, "starts", &starts)?, slice(py, "counts", &counts)?, slice(py, "strides", &strides)?);
    let (located, sources) = (slice(py, "located", &located)?, slice(py, "sources", &sources)?);
    let world = counts.len();
    if starts.len() != world || strides.len() != world || located.len() != world {
        return Err(invalid(py, format!("arrivals: {world} counts but {} starts, {} strides, {} located flags; expected one of each per source", starts.len(), strides.len(), located.len())));
    }
    for s in 0..world {
        let end = starts[s].checked_add(STATUS as i64).and_then(|a| counts[s].checked_mul(strides[s]).and_then(|b| a.checked_add(b)));
        if starts[s] < 0 || counts[s] < 0 || strides[s] < HEADER as i64 || end.is_none_or(|e| e > bytes.len() as i64) {
            return Err(invalid(py, format!("arrivals: source {s}'s {} rows of {} bytes from {} do not fit the {} bytes received", counts[s], strides[s], starts[s], bytes.len())));
        }
    }
    let mut seen = vec![0i64; world];
    let mut by_source = vec![0i64; world];
    let mut filled_at = Vec::with_capacity(sources.len());
    let mut filled_located = Vec::with_capacity(sources.len());
    let (mut longest, mut total) = (0usize, 0usize);
    for &s in sources {
        if s < 0 || s as usize >= world || seen[s as usize] >= counts[s as usize] {
            return Err(invalid(py, format!("arrivals: the positions name source {s} more often than its rows (counts {counts:?})")));
        }
        let s = s as usize;
        let a = starts[s] + STATUS as i64 + seen[s] * strides[s];
        seen[s] += 1;
        let row = &bytes[a as usize..];
        if word(row, FLAGS_AT) != 1 {
            continue;
        }
        let length = (word(row, LENGTH_AT) as usize).min(steps); // (a damaged length fails its CRC)
        filled_at.push(a);
        filled_located.push(located[s]);
        by_source[s] += 1;
        longest = longest.max(length);
        total += length;
    }
    if seen != counts {
        return Err(invalid(py, format!("arrivals: {} positions for counts {counts:?}", sources.len())));
    }
    if !packed {
        total = filled_at.len() * longest;
    }
    Ok((PyArray1::from_vec(py, filled_at), PyArray1::from_vec(py, filled_located), PyArray1::from_vec(py, by_source), longest, total))
}

/// Each part's start in a step's received bytes (`splits[s]` bytes from source s,
/// end to end), and its status word and count of filled rows (its first `STATUS`
/// bytes: two int64): `(starts, statuses, counts)`.
#[pyfunction]
fn statuses<'py>(py: Python<'py>, recv: PyReadonlyArray1<'py, u8>, splits: Vec<i64>) -> PyResult<(Array<'py, i64>, Vec<i64>, Array<'py, i64>)> {
    let bytes = slice(py, "recv", &recv)?;
    let (mut starts, mut status, mut counts) = (Vec::with_capacity(splits.len()), Vec::with_capacity(splits.len()), Vec::with_capacity(splits.len()));
    let mut at = 0usize;
    for &n in &splits {
        if n < STATUS as i64 || at + n as usize > bytes.len() {
            return Err(invalid(py, format!("statuses: parts of {splits:?} bytes do not fit the {} received", bytes.len())));
        }
        let w = |k: usize| i64::from_le_bytes(bytes[at + 8 * k..at + 8 * k + 8].try_into().unwrap_or([0; 8]));
        starts.push(at as i64);
        status.push(w(0));
        counts.push(w(1));
        at += n as usize;
    }
    Ok((PyArray1::from_vec(py, starts), status, PyArray1::from_vec(py, counts)))
}

/// Unpacks received rows in one pass over each: row i of the output is the
/// `stride`-byte row at byte `at[i]` of `recv` (positions in order, filled rows
/// only). Its 48-byte header goes to `header[i]`, its attribute record (`record`
/// bytes after the header) to `records[i]`, and field c's steps to `outputs[c]`:
/// padded, `longest * items[c]` bytes per row (the item's `length` steps from
/// `offsets[c]`, zeros after); `packed`, the rows' steps end to end with nothing
/// between. With `verify`, each row's CRC-32 is checked as it is read. Returns the
/// first row whose CRC fails (nothing is promised of the outputs then), or -1.
///
/// `located[i]`: row i is instead a `locator` row (`locator = (stride, offset)`:
/// the header, the record, then at `offset` each step's row number in the store
/// whose columns are `columns`, one flat byte array per field of `items[c]` bytes
/// a row): its steps are copied from those columns. A row number outside them is
/// reported as a failed row too.
#[pyfunction]
#[pyo3(signature = (recv, at, stride, offsets, items, longest, header, outputs, verify, record=0, records=None, packed=false, located=None, locator=(0, 0), columns=Vec::new()))]
#[allow(clippy::too_many_arguments)]
fn unpack_rows(
    py: Python<'_>,
    recv: PyReadonlyArray1<'_, u8>,
    at: PyReadonlyArray1<'_, i64>,
    stride: usize,
    offsets: Vec<usize>,
    items: Vec<usize>,
    longest: usize,
    header: Bound<'_, PyArray1<u8>>,
    outputs: Vec<Bound<'_, PyArray1<u8>>>,
    verify: bool,
    record: usize,
    records: Option<Bound<'_, PyArray1<u8>>>,
    packed: bool,
    located: Option<PyReadonlyArray1<'_, bool>>,
    locator: (usize, usize),
    columns: Vec<PyReadonlyArray1<'_, u8>>,
) -> PyResult<i64> {
    let bytes = slice(py, "recv", &recv)?;
    let at = slice(py, "at", &at)?;
    let n = at.len();
    if stride < HEADER + record || offsets.len() != items.len() || outputs.len() != items.len() {
        return Err(invalid(py, "unpack_rows: one offset, item size and output per field, rows past the header".into()));
    }
    for (c, (&o, &item)) in offsets.iter().zip(&items).enumerate() {
        if o < HEADER + record || o + longest * item > stride {
            return Err(invalid(py, format!("unpack_rows: field {c} of {longest} steps does not fit a row of {stride}")));
        }
    }
    let located: &[bool] = match &located {
        Some(l) => slice(py, "located", l)?,
        None => &[],
    };
    let (loc_stride, loc_at) = locator;
    let cols: Vec<&[u8]> = columns.iter().map(|c| slice(py, "column", c)).collect::<PyResult<_>>()?;
    if !located.is_empty() {
        if located.len() != n || cols.len() != items.len() {
            return Err(invalid(py, "unpack_rows: one located flag per row and one column per field are needed".into()));
        }
        if loc_at < HEADER + record || loc_at % 8 != 0 || loc_at + longest * 8 > loc_stride {
            return Err(invalid(py, format!("unpack_rows: locators of {longest} steps do not fit a row of {loc_stride}")));
        }
    }
    let is_located = |i: usize| located.get(i).copied().unwrap_or(false);
    let row_len = |i: usize| if is_located(i) { loc_stride } else { stride };
    if let Some(bad) = (0..n).find(|&i| at[i] < 0 || at[i] as usize + row_len(i) > bytes.len()) {
        return Err(invalid(py, format!("unpack_rows: a row at {} runs past the {} bytes received", at[bad], bytes.len())));
    }
    let length_of = |a: i64| (word(&bytes[a as usize..], LENGTH_AT) as usize).min(longest);
    // Where each row's steps start in the outputs (in steps).
    let mut starts = Vec::with_capacity(n);
    let mut steps = 0usize;
    for &a in at {
        starts.push(steps);
        steps += if packed { length_of(a) } else { longest };
    }
    let mut header = header.try_readwrite().map_err(|e| invalid(py, format!("unpack_rows: header: {e}")))?;
    let header = header.as_slice_mut().map_err(|e| invalid(py, format!("unpack_rows: header: {e}")))?;
    let mut record_guard = match &records {
        Some(r) => Some(r.try_readwrite().map_err(|e| invalid(py, format!("unpack_rows: records: {e}")))?),
        None => None,
    };
    let records: &mut [u8] = match record_guard.as_mut() {
        Some(g) => g.as_slice_mut().map_err(|e| invalid(py, format!("unpack_rows: records: {e}")))?,
        None => &mut [],
    };
    let mut guards = Vec::with_capacity(outputs.len());
    for o in &outputs {
        guards.push(o.try_readwrite().map_err(|e| invalid(py, format!("unpack_rows: output: {e}")))?);
    }
    let mut outs: Vec<&mut [u8]> = Vec::with_capacity(guards.len());
    for g in guards.iter_mut() {
        outs.push(g.as_slice_mut().map_err(|e| invalid(py, format!("unpack_rows: output: {e}")))?);
    }
    if header.len() != n * HEADER || records.len() != n * record || outs.iter().zip(&items).any(|(o, &item)| o.len() != steps * item) {
        return Err(invalid(py, format!("unpack_rows: outputs of the wrong size for {n} rows of {longest} steps")));
    }
    let bad = py.detach(|| {
        for (i, &a) in at.iter().enumerate() {
            let row = &bytes[a as usize..a as usize + row_len(i)];
            if verify && row_crc(row) != word(row, CRC_AT) {
                return Some(i);
            }
            header[i * HEADER..(i + 1) * HEADER].copy_from_slice(&row[..HEADER]);
            records[i * record..(i + 1) * record].copy_from_slice(&row[HEADER..HEADER + record]);
            let length = length_of(a);
            let width = if packed { length } else { longest };
            for (c, ((out, &o), &item)) in outs.iter_mut().zip(&offsets).zip(&items).enumerate() {
                let dst = &mut out[starts[i] * item..(starts[i] + width) * item];
                if is_located(i) {
                    let col = cols[c];
                    for k in 0..length {
                        let w = &row[loc_at + 8 * k..loc_at + 8 * k + 8];
                        let r = i64::from_le_bytes([w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7]]);
                        if r < 0 || (r as usize + 1) * item > col.len() {
                            return Some(i);
                        }
                        dst[k * item..(k + 1) * item].copy_from_slice(&col[r as usize * item..(r as usize + 1) * item]);
                    }
                } else {
                    dst[..length * item].copy_from_slice(&row[o..o + length * item]);
                }
                dst[length * item..].fill(0);
            }
        }
        None
    });
    Ok(bad.map_or(-1, |i| i as i64))
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let c = PyModule::new(m.py(), "cluster")?;
    c.add_function(wrap_pyfunction!(plan, &c)?)?;
    c.add_function(wrap_pyfunction!(merge, &c)?)?;
    c.add_function(wrap_pyfunction!(candidates_needed, &c)?)?;
    c.add_function(wrap_pyfunction!(assign, &c)?)?;
    c.add_function(wrap_pyfunction!(token_cut, &c)?)?;
    c.add_function(wrap_pyfunction!(table_id, &c)?)?;
    c.add_function(wrap_pyfunction!(global_keys, &c)?)?;
    c.add_function(wrap_pyfunction!(split_keys, &c)?)?;
    c.add_function(wrap_pyfunction!(check_rows, &c)?)?;
    c.add_function(wrap_pyfunction!(unpack_rows, &c)?)?;
    c.add_function(wrap_pyfunction!(arrivals, &c)?)?;
    c.add_function(wrap_pyfunction!(statuses, &c)?)?;
    c.add_function(wrap_pyfunction!(route, &c)?)?;
    c.add("MAX_SHARDS", cluster::MAX_SHARDS)?;
    m.add_submodule(&c)?;
    Ok(())
}
