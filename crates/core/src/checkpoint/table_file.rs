//! A table's index in a checkpoint: scalars in the manifest, arrays in its
//! `.npz` file (one entry per item in insertion order, ranges concatenated).

use std::collections::BTreeMap;

use super::manifest::{TableScalars, F64};
use super::npz::{self, Array};
use crate::attributes::{AttributeSpec, Attributes};
use crate::item::RowRange;
use crate::signature::DType;
use crate::extensions::{ExtensionSpec, Saved};
use crate::rate_limiter::RateLimiterConfig;
use crate::selectors::SelectorSpec;
use crate::snapshot::{ItemRecord, TableSnapshot};
use crate::table::{GroupConfig, OnTimeout, TableConfig};

/// The manifest scalars and the table file's bytes of a snapshot.
pub(crate) fn encode(s: &TableSnapshot) -> Result<(TableScalars, Vec<u8>), String> {
    let c = &s.config;
    let selector = |spec: &SelectorSpec| {
        let (name, exponent) = spec.to_name();
        (name, F64(exponent))
    };
    let r = &c.rate_limiter;
    let scalars = TableScalars {
        name: c.name.clone(),
        sampler: selector(&c.sampler),
        remover: selector(&c.remover),
        max_size: c.max_size,
        max_times_sampled: c.max_times_sampled,
        rate_limiter: (F64(r.samples_per_insert), r.min_size_to_sample, F64(r.min_diff), F64(r.max_diff)),
        seed: c.seed,
        evict_when_store_full: c.evict_when_store_full,
        external_selection: c.external_selection,
        next_seq: s.next_seq,
        counters: s.counters,
        limiter: (s.limiter_inserts, s.limiter_samples, F64(s.blocked_insert_seconds), F64(s.blocked_sample_seconds)),
        rng: s.rng.clone(),
        sampler_order: s.sampler_order.as_ref().map(|_| ()),
        remover_order: s.remover_order.as_ref().map(|_| ()),
        extensions: Some(
            c.extensions
                .iter()
                .zip(&s.extensions)
                .map(|(spec, saved)| {
                    let mut v = spec.to_json();
                    v["state"] = saved.state.clone();
                    v
                })
                .collect(),
        ),
        attributes: c.attributes.specs().iter().map(|a| (a.name.clone(), a.dtype.name().to_string())).collect(),
        max_staleness: c.max_staleness,
        versions: s.versions.clone(),
        group_size: c.groups.map(|g| g.size),
        group_timeout: c.groups.and_then(|g| g.timeout).map(|t| F64(t.as_secs_f64())),
        on_group_timeout: c.groups.map(|g| g.on_timeout.name().to_string()),
        groups: s.groups.clone(),
    };
    let it = &s.items;
    let mut arrays = vec![
        ("slot", Array::U32(it.iter().map(|i| i.slot).collect())),
        ("key", Array::U64(it.iter().map(|i| i.key).collect())),
        ("seq", Array::U64(it.iter().map(|i| i.seq).collect())),
        ("priority", Array::F64(it.iter().map(|i| i.priority).collect())),
        ("times_sampled", Array::U32(it.iter().map(|i| i.times_sampled).collect())),
        ("num_ranges", Array::U32(it.iter().map(|i| i.ranges.len() as u32).collect())),
        ("range_start", Array::U64(it.iter().flat_map(|i| i.ranges.iter().map(|r| r.start)).collect())),
        ("range_len", Array::U32(it.iter().flat_map(|i| i.ranges.iter().map(|r| r.len)).collect())),
        ("generations", Array::U32(s.generations.clone())),
        ("free_slots", Array::U32(s.free_slots.clone())),
    ];
    if !c.attributes.is_empty() {
        arrays.push(("attributes", Array::U8(it.iter().flat_map(|i| i.attributes.iter().copied()).collect())));
    }
    if c.groups.is_some() {
        arrays.push(("group_role", Array::U8(it.iter().map(|i| i.group_role).collect())));
    }
    if let Some(o) = &s.sampler_order {
        arrays.push(("sampler_order", Array::U32(o.clone())));
    }
    if let Some(o) = &s.remover_order {
        arrays.push(("remover_order", Array::U32(o.clone())));
    }
    let names: Vec<String> = (0..c.extensions.len()).map(|i| format!("extension_{i}")).collect();
    for (i, saved) in s.extensions.iter().enumerate() {
        if let Some(v) = &saved.per_slot {
            arrays.push((&names[i], Array::F64(v.clone())));
        }
    }
    Ok((scalars, npz::write(&arrays)?))
}

fn take_u32(arrays: &mut BTreeMap<String, Array>, key: &str) -> Result<Vec<u32>, String> {
    match arrays.remove(key) {
        Some(Array::U32(v)) => Ok(v),
        Some(_) => Err(format!("array '{key}' has the wrong dtype (expected uint32)")),
        None => Err(format!("no array '{key}'")),
    }
}

fn take_u64(arrays: &mut BTreeMap<String, Array>, key: &str) -> Result<Vec<u64>, String> {
    match arrays.remove(key) {
        Some(Array::U64(v)) => Ok(v),
        Some(_) => Err(format!("array '{key}' has the wrong dtype (expected uint64)")),
        None => Err(format!("no array '{key}'")),
    }
}

/// The snapshot of a table file and its manifest scalars. `external_selection`
/// is turned off: restored tables select on the host.
pub(crate) fn decode(scalars: &TableScalars, file: &[u8]) -> Result<TableSnapshot, String> {
    let mut a = npz::read(file)?;
    let i = scalars;
    let selector = |role: &str, (name, exponent): &(String, F64)| {
        SelectorSpec::from_name(name, exponent.0).ok_or_else(|| format!("unknown {role} '{name}'"))
    };
    let (spi, min_size, min_diff, max_diff) = i.rate_limiter;
    let config = TableConfig {
        name: i.name.clone(),
        sampler: selector("sampler", &i.sampler)?,
        remover: selector("remover", &i.remover)?,
        max_size: i.max_size,
        max_times_sampled: i.max_times_sampled,
        rate_limiter: RateLimiterConfig::new(spi.0, min_size, min_diff.0, max_diff.0).map_err(|e| format!("rate limiter: {e}"))?,
        seed: i.seed,
        evict_when_store_full: i.evict_when_store_full,
        external_selection: false,
        extensions: match &i.extensions {
            None => ExtensionSpec::defaults(),
            Some(list) => list.iter().map(ExtensionSpec::from_json).collect::<Result<Vec<_>, _>>()?,
        },
        attributes: Attributes::new(
            i.attributes
                .iter()
                .map(|(name, dtype)| Ok(AttributeSpec { name: name.clone(), dtype: DType::from_name(dtype).map_err(|e| format!("attribute '{name}': {e}"))? }))
                .collect::<Result<Vec<_>, String>>()?,
        )
        .map_err(|e| e.to_string())?,
        max_staleness: i.max_staleness,
        groups: match i.group_size {
            None => None,
            Some(size) => Some(GroupConfig {
                size,
                timeout: match i.group_timeout {
                    None => None,
                    Some(t) => Some(std::time::Duration::try_from_secs_f64(t.0).map_err(|_| format!("group_timeout {}", t.0))?),
                },
                on_timeout: OnTimeout::from_name(i.on_group_timeout.as_deref().unwrap_or("drop"))
                    .ok_or_else(|| format!("on_group_timeout {:?}", i.on_group_timeout))?,
            }),
        },
    };
    ExtensionSpec::validate_list(&config.extensions)?;
    // A checkpoint from before extensions: every built-in, each started empty.
    let mut extensions = vec![Saved::default(); config.extensions.len()];
    for (k, v) in i.extensions.iter().flatten().enumerate() {
        let per_slot = match a.remove(&format!("extension_{k}")) {
            None => None,
            Some(Array::F64(v)) => Some(v),
            Some(_) => return Err(format!("array 'extension_{k}' has the wrong dtype (expected float64)")),
        };
        extensions[k] = Saved { state: v.get("state").cloned().unwrap_or(serde_json::Value::Null), per_slot };
    }
    let slot = take_u32(&mut a, "slot")?;
    let key = take_u64(&mut a, "key")?;
    let seq = take_u64(&mut a, "seq")?;
    let priority = match a.remove("priority") {
        Some(Array::F64(v)) => v,
        Some(_) => return Err("array 'priority' has the wrong dtype (expected float64)".into()),
        None => return Err("no array 'priority'".into()),
    };
    let times = take_u32(&mut a, "times_sampled")?;
    let num_ranges = take_u32(&mut a, "num_ranges")?;
    let starts = take_u64(&mut a, "range_start")?;
    let lens = take_u32(&mut a, "range_len")?;
    let n = slot.len();
    let record = config.attributes.record();
    let records = match a.remove("attributes") {
        None if record == 0 => Vec::new(),
        Some(Array::U8(v)) if v.len() == n * record => v,
        Some(Array::U8(v)) => return Err(format!("array 'attributes' has {} bytes; {n} items of {record} bytes need {}", v.len(), n * record)),
        Some(_) => return Err("array 'attributes' has the wrong dtype (expected uint8)".into()),
        None => return Err("no array 'attributes' though the table has attributes".into()),
    };
    let roles = match a.remove("group_role") {
        None if config.groups.is_none() => vec![0; n],
        Some(Array::U8(v)) if v.len() == n => v,
        Some(_) => return Err("array 'group_role' has the wrong dtype or length (expected uint8, one per item)".into()),
        None => return Err("no array 'group_role' though the table has groups".into()),
    };
    if [key.len(), seq.len(), priority.len(), times.len(), num_ranges.len()].iter().any(|&l| l != n)
        || starts.len() != lens.len()
        || num_ranges.iter().map(|&k| k as usize).sum::<usize>() != starts.len()
    {
        return Err("arrays have inconsistent lengths".into());
    }
    let mut items = Vec::with_capacity(n);
    let mut at = 0usize;
    for j in 0..n {
        let k = num_ranges[j] as usize;
        let ranges = (at..at + k).map(|r| RowRange { start: starts[r], len: lens[r] }).collect();
        at += k;
        let attributes = records[j * record..(j + 1) * record].to_vec();
        items.push(ItemRecord {
            slot: slot[j],
            key: key[j],
            seq: seq[j],
            ranges,
            priority: priority[j],
            times_sampled: times[j],
            attributes,
            group_role: roles[j],
        });
    }
    let order = |a: &mut BTreeMap<String, Array>, key: &str| -> Result<Option<Vec<u32>>, String> {
        if a.contains_key(key) {
            take_u32(a, key).map(Some)
        } else {
            Ok(None)
        }
    };
    Ok(TableSnapshot {
        config,
        items,
        generations: take_u32(&mut a, "generations")?,
        free_slots: take_u32(&mut a, "free_slots")?,
        next_seq: i.next_seq,
        counters: i.counters,
        limiter_inserts: i.limiter.0,
        limiter_samples: i.limiter.1,
        blocked_insert_seconds: i.limiter.2 .0,
        blocked_sample_seconds: i.limiter.3 .0,
        rng: i.rng.clone(),
        sampler_order: order(&mut a, "sampler_order")?,
        remover_order: order(&mut a, "remover_order")?,
        extensions,
        versions: i.versions.clone(),
        groups: i.groups.clone(),
    })
}
