//! `MANIFEST.json`: what a checkpoint holds and a size + CRC-32 per file.
//!
//! Version 1 was first written by Python's `json`, which spells the infinite
//! limiter bounds of `MinSize` as bare `Infinity` and `-Infinity` (not JSON).
//! They are read and written the same way here, so manifests of either writer
//! load with either reader.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::{FORMAT, MANIFEST, OLDEST_VERSION, VERSION};
use crate::error::{Error, Result};

/// The manifest of one checkpoint.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Manifest {
    pub format: String,
    pub version: u32,
    /// UTC time of the save, `2026-11-22T16:39:44Z`.
    #[serde(default)]
    pub created: String,
    /// `None` or `"zstd"` (the column files).
    #[serde(default)]
    pub compression: Option<String>,
    pub stores: Vec<StoreEntry>,
    pub tables: Vec<TableEntry>,
    /// Every file but the manifest, by name.
    pub files: BTreeMap<String, FileEntry>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct StoreEntry {
    /// `[name, shape, dtype]` per field, in signature order.
    pub signature: Vec<(String, Vec<usize>, String)>,
    pub capacity: u64,
    pub block_steps: u32,
    /// `"cpu"` for host stores; the device of a store kept off the host.
    #[serde(default = "cpu")]
    pub device: String,
    /// The `.rows` file.
    pub rows: String,
    /// Field name -> its column file.
    pub columns: BTreeMap<String, String>,
    /// Field name -> the zstd level of a field stored compressed in the store (its
    /// column file holds raw rows all the same); absent for raw fields.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub compress: BTreeMap<String, i32>,
    /// Field name -> the frames a stacked field samples as (absent: 1). Its column
    /// file holds one frame per row, with the rows a writer put before each saved
    /// run (see `save::pieces`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub stack: BTreeMap<String, u32>,
    /// Field name -> the padding of a stacked field padded other than with its
    /// episode's first frame (`"zero"`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub padding: BTreeMap<String, String>,
    /// A file store saved in place: the path of its columns file, whose rows the
    /// checkpoint references instead of copying (`columns` is then empty).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
}

fn cpu() -> String {
    "cpu".into()
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TableEntry {
    /// The `.npz` file with the table's arrays.
    pub file: String,
    /// Index into `stores`.
    pub store: usize,
    /// The table's scalars.
    pub index: TableScalars,
}

/// The scalar part of a table's index (its arrays are in the table file).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TableScalars {
    pub name: String,
    /// `[kind, priority_exponent]`.
    pub sampler: (String, F64),
    pub remover: (String, F64),
    pub max_size: u64,
    pub max_times_sampled: u32,
    /// `[samples_per_insert, min_size_to_sample, min_diff, max_diff]`.
    pub rate_limiter: (F64, u64, F64, F64),
    pub seed: Option<u64>,
    pub evict_when_store_full: bool,
    pub external_selection: bool,
    pub next_seq: u64,
    /// `[num_inserts, num_samples, num_evictions, num_deletes, num_store_evictions]`.
    pub counters: [u64; 5],
    /// `[inserts, samples, blocked_insert_seconds, blocked_sample_seconds]`.
    pub limiter: (u64, u64, F64, F64),
    /// The random generator's state, as JSON.
    pub rng: String,
    /// `null` when the selector keeps no order; absent when it does (the order
    /// is then an array of the table file).
    #[serde(default, skip_serializing_if = "Option::is_some")]
    pub sampler_order: Option<()>,
    #[serde(default, skip_serializing_if = "Option::is_some")]
    pub remover_order: Option<()>,
    /// The table's extensions in order, each `{"kind", settings, "state"}`; an
    /// extension's per-slot numbers are the table file's array `extension_<i>`.
    /// Absent in checkpoints from before extensions: every built-in then starts
    /// empty over the restored items.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extensions: Option<Vec<serde_json::Value>>,
    /// `[[name, dtype]]` of the item attributes (version 2; absent: none). Each
    /// item's record is in the table file's byte array `attributes`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attributes: Vec<(String, String)>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_staleness: Option<u64>,
    /// The policy version and its counters (version 2; tables with a `version` attribute).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub versions: Option<serde_json::Value>,
    /// Group settings and counters (version 2; tables with `group_size`): each
    /// item's role is the table file's byte array `group_role`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group_size: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group_timeout: Option<F64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_group_timeout: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub groups: Option<serde_json::Value>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileEntry {
    /// Size as stored (compressed, for zstd).
    pub bytes: u64,
    pub crc32: u32,
}

/// A float that may be infinite or NaN (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct F64(pub f64);

/// How a non-finite float travels through serde_json, which has no such numbers:
/// as a string no name can clash with in practice, swapped for the bare token
/// when the text is written and back when it is read.
const NON_FINITE: [(&str, &str); 3] = [("Infinity", "\u{0}Infinity"), ("-Infinity", "\u{0}-Infinity"), ("NaN", "\u{0}NaN")];

impl Serialize for F64 {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        let v = self.0;
        if v.is_finite() {
            s.serialize_f64(v)
        } else {
            s.serialize_str(if v.is_nan() { NON_FINITE[2].1 } else if v > 0.0 { NON_FINITE[0].1 } else { NON_FINITE[1].1 })
        }
    }
}

impl<'de> Deserialize<'de> for F64 {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<F64, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Number(f64),
            Text(String),
        }
        match Raw::deserialize(d)? {
            Raw::Number(v) => Ok(F64(v)),
            Raw::Text(t) => match NON_FINITE.iter().position(|(_, s)| *s == t) {
                Some(0) => Ok(F64(f64::INFINITY)),
                Some(1) => Ok(F64(f64::NEG_INFINITY)),
                Some(_) => Ok(F64(f64::NAN)),
                None => Err(serde::de::Error::custom(format!("expected a number, got {t:?}"))),
            },
        }
    }
}

/// Replaces the bare tokens `Infinity`, `-Infinity` and `NaN` outside strings by
/// their stand-in strings (`to_standin`), or stand-in strings by the bare tokens.
fn swap_non_finite(text: &str, to_standin: bool) -> String {
    let quoted: Vec<String> = NON_FINITE.iter().map(|(_, s)| serde_json::to_string(s).expect("a string serialises")).collect();
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(c) = rest.chars().next() {
        if c == '"' {
            // A whole string token: up to the first unescaped quote.
            let bytes = rest.as_bytes();
            let mut end = 1;
            while end < bytes.len() && bytes[end] != b'"' {
                end += if bytes[end] == b'\\' { 2 } else { 1 };
            }
            let end = (end + 1).min(rest.len());
            let token = &rest[..end];
            match quoted.iter().position(|q| q == token) {
                Some(i) if !to_standin => out.push_str(NON_FINITE[i].0),
                _ => out.push_str(token),
            }
            rest = &rest[end..];
            continue;
        }
        if to_standin {
            if let Some(i) = NON_FINITE.iter().position(|(bare, _)| rest.starts_with(bare)) {
                out.push_str(&quoted[i]);
                rest = &rest[NON_FINITE[i].0.len()..];
                continue;
            }
        }
        out.push(c);
        rest = &rest[c.len_utf8()..];
    }
    out
}

impl Manifest {
    /// Reads and checks `<checkpoint>/MANIFEST.json`: present, parseable, this
    /// format and version.
    pub fn read(checkpoint: &Path) -> Result<Manifest> {
        let path = checkpoint.join(MANIFEST);
        let bad = |what: String| Error::Corrupt(format!("{}: {what}", path.display()));
        let text = match std::fs::read(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(bad("missing: not a complete checkpoint".into())),
            Err(e) => return Err(bad(format!("unreadable ({e})"))),
        };
        let text = String::from_utf8(text).map_err(|e| bad(format!("unreadable ({e})")))?;
        let value: serde_json::Value =
            serde_json::from_str(&swap_non_finite(&text, true)).map_err(|e| bad(format!("unreadable ({e})")))?;
        if value.get("format").and_then(|f| f.as_str()) != Some(FORMAT) {
            return Err(bad("not a Reprise checkpoint manifest".into()));
        }
        let version = value.get("version").cloned().unwrap_or(serde_json::Value::Null);
        if !version.as_u64().is_some_and(|v| (OLDEST_VERSION as u64..=VERSION as u64).contains(&v)) {
            return Err(bad(format!("format version {version}; this Reprise reads versions {OLDEST_VERSION} to {VERSION}")));
        }
        serde_json::from_value(value).map_err(|e| bad(format!("malformed ({e})")))
    }

    /// The manifest as written: JSON, non-finite floats as bare tokens.
    pub fn to_text(&self) -> String {
        let text = serde_json::to_string_pretty(self).expect("a manifest serialises");
        swap_non_finite(&text, false)
    }
}

/// `2026-11-22T16:39:44Z` for `secs` seconds after the Unix epoch.
pub(crate) fn utc_time(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z", rem / 3600, rem / 60 % 60, rem % 60)
}
