//! Checkpoint tests: round trips that continue exactly, damage named and
//! nothing left behind, the manifest's non-finite floats, the npz files.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::manifest::utc_time;
use super::npz::{self, Array};
use super::*;
use crate::rate_limiter::RateLimiterConfig;
use crate::sample::Collect;
use crate::selectors::SelectorSpec;
use crate::signature::{DType, Field, Signature};
use crate::store::Store;
use crate::table::{Table, TableConfig};

/// A fresh directory under the system temporary directory, removed when dropped.
pub(crate) struct TempDir(pub(crate) PathBuf);

impl TempDir {
    pub(crate) fn new(what: &str) -> TempDir {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let p = std::env::temp_dir().join(format!("reprise-ckpt-test-{}-{what}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub(crate) fn signature() -> Signature {
    Signature::new(vec![
        Field::new("obs", DType::Float32, vec![3]).unwrap(),
        Field::new("act", DType::Int64, vec![]).unwrap(),
    ])
    .unwrap()
}

pub(crate) fn config(name: &str, sampler: SelectorSpec, remover: SelectorSpec, max_size: u64, limiter: RateLimiterConfig) -> TableConfig {
    TableConfig {
        name: name.into(),
        sampler,
        remover,
        max_size,
        max_times_sampled: 0,
        rate_limiter: limiter,
        seed: Some(9),
        evict_when_store_full: true,
        external_selection: false,
        extensions: crate::ExtensionSpec::defaults(),
        attributes: Default::default(),
        max_staleness: None,
        groups: None,
    }
}

/// `n` items of `steps` steps; step i of the batch has act = start + i, obs = act.
pub(crate) fn put(t: &Table, n: usize, steps: usize, start: i64, priorities: &[f64]) -> Vec<u64> {
    let acts: Vec<i64> = (0..(n * steps) as i64).map(|i| start + i).collect();
    let obs: Vec<u8> = acts.iter().flat_map(|&a| [a as f32; 3].into_iter().flat_map(f32::to_ne_bytes)).collect();
    let act: Vec<u8> = acts.iter().flat_map(|a| a.to_ne_bytes()).collect();
    t.insert_batch(&[&obs, &act], n, steps, priorities, &[], None).unwrap()
}

/// Two tables over one store, with items sampled, updated and deleted.
fn tables(capacity: u64) -> (Store, Table, Table) {
    let store = Store::new(signature(), capacity, 4, None).unwrap();
    let limiter = RateLimiterConfig::new(2.0, 3, -100.0, 100.0).unwrap();
    let t = Table::new(
        config("replay", SelectorSpec::Prioritized { priority_exponent: 0.7 }, SelectorSpec::Fifo, 30, limiter),
        &store,
    )
    .unwrap();
    let q = Table::new(config("queue", SelectorSpec::Fifo, SelectorSpec::Fifo, 10, RateLimiterConfig::min_size(1).unwrap()), &store)
        .unwrap();
    let priorities: Vec<f64> = (0..40).map(|i| 0.5 + (i % 7) as f64).collect();
    put(&t, 40, 2, 0, &priorities);
    put(&q, 6, 1, 1000, &[1.0; 6]);
    let b = t.sample(6, Some(Duration::ZERO)).unwrap();
    let keys: Vec<u64> = b.items.iter().map(|i| i.key).collect();
    t.update_priorities(&keys[..2], &[0.25, 8.0]).unwrap();
    t.delete(&keys[2..3]);
    q.sample(2, Some(Duration::ZERO)).unwrap();
    (store, t, q)
}

fn acts(batch: &crate::SampleBatch) -> Vec<i64> {
    let t = batch.max_length();
    let mut out = vec![0u8; 8 * batch.len() * t as usize];
    batch.gather(1, t, &mut out);
    out.chunks(8).map(|c| i64::from_ne_bytes(c.try_into().unwrap())).collect()
}

fn by_name<'a>(loaded: &'a Loaded, name: &str) -> &'a Table {
    loaded.tables.iter().find(|t| t.name() == name).unwrap()
}

fn round_trip(compression: Compression) {
    let dir = TempDir::new("round-trip");
    let (store, t, q) = tables(256);
    let path = save(&dir.0, &[t.clone(), q.clone()], SaveOptions { compression, ..Default::default() }).unwrap();
    assert_eq!(path.parent().unwrap(), dir.0);
    let loaded = load(&path, LoadOptions::default()).unwrap();
    assert_eq!(loaded.stores.len(), 1, "a shared store is restored once");
    assert_eq!(loaded.manifest.compression.as_deref(), compression.name());
    let (t2, q2) = (by_name(&loaded, "replay"), by_name(&loaded, "queue"));
    assert!(t2.store().same(q2.store()));
    assert_eq!(t2.items(), t.items());
    assert_eq!(q2.items(), q.items());
    assert_eq!(t2.info(), t.info());
    for i in 0..5 {
        let (a, b) = (t.sample(7, None).unwrap(), t2.sample(7, None).unwrap());
        assert_eq!(a.items.iter().map(|x| (x.key, x.probability)).collect::<Vec<_>>(),
                   b.items.iter().map(|x| (x.key, x.probability)).collect::<Vec<_>>());
        assert_eq!(acts(&a), acts(&b));
        assert_eq!(put(&t, 1, 1, 5000 + i, &[1.0]), put(t2, 1, 1, 5000 + i, &[1.0]));
    }
    let (a, b) = (q.sample(3, None).unwrap(), q2.sample(3, None).unwrap());
    assert_eq!(acts(&a), acts(&b));
    assert_eq!(q.info(), q2.info());
    for s in &loaded.stores {
        s.unlink();
    }
    store.unlink();
}

#[test]
fn round_trip_continues_exactly() {
    round_trip(Compression::None);
}

#[test]
fn zstd_round_trip_continues_exactly() {
    round_trip(Compression::Zstd);
}

#[test]
fn files_are_private_and_listed_in_the_manifest() {
    let dir = TempDir::new("files");
    let (store, t, q) = tables(256);
    let path = save(&dir.0, &[t, q], SaveOptions::default()).unwrap();
    let mut names: Vec<String> = std::fs::read_dir(&path).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    names.sort();
    assert_eq!(names, ["MANIFEST.json", "store-0.col-0", "store-0.col-1", "store-0.rows", "table-0.npz", "table-1.npz"]);
    for n in &names {
        let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(path.join(n)).unwrap().permissions());
        assert_eq!(mode & 0o777, 0o600, "{n}");
    }
    let m = verify(&path).unwrap();
    assert_eq!(m.files.len(), 5);
    assert_eq!(checkpoints(&dir.0), vec![path.clone()]);
    assert_eq!(latest(&dir.0), Some(path));
    assert!(std::fs::read_dir(&dir.0).unwrap().all(|e| !e.unwrap().file_name().to_string_lossy().starts_with('.')));
    store.unlink();
}

/// Records the stores it makes, so a test can check they were removed.
#[derive(Default)]
struct Recording(Vec<PathBuf>);

impl MakeStore for Recording {
    fn make_store(&mut self, spec: &StoreSpec) -> crate::Result<NewStore> {
        let store = Store::new(spec.signature.clone(), spec.capacity, spec.block_steps, None)?;
        self.0.push(store.path().to_path_buf());
        Ok(NewStore { store, rows: None })
    }
}

#[test]
fn damaged_files_are_named_and_load_nothing() {
    let dir = TempDir::new("damage");
    let (store, t, q) = tables(256);
    for victim in ["store-0.col-0", "store-0.col-1", "store-0.rows", "table-0.npz", "table-1.npz"] {
        for truncate in [false, true] {
            let path = save(&dir.0, &[t.clone(), q.clone()], SaveOptions::default()).unwrap();
            let f = path.join(victim);
            let mut raw = std::fs::read(&f).unwrap();
            if truncate {
                raw.truncate(raw.len() / 2);
            } else {
                let mid = raw.len() / 2;
                raw[mid] ^= 0x40;
            }
            std::fs::write(&f, raw).unwrap();
            let mut made = Recording::default();
            let Err(Error::Corrupt(message)) = load(&path, LoadOptions { stores: Some(&mut made), progress: None }) else {
                panic!("{victim} damaged: loaded");
            };
            assert!(message.contains(victim), "{message}");
            assert!(made.0.iter().all(|p| !p.exists()), "a store was left behind");
            assert!(verify(&path).is_err());
            std::fs::remove_dir_all(&path).unwrap();
        }
    }
    store.unlink();
}

#[test]
fn other_versions_and_garbage_are_corrupt() {
    let dir = TempDir::new("version");
    let (store, t, _q) = tables(256);
    let size = t.info().size;
    let path = save(&dir.0, &[t], SaveOptions::default()).unwrap();
    let m = path.join(MANIFEST);
    let text = std::fs::read_to_string(&m).unwrap();
    // Version 1 (before attributes) still loads: its tables have none.
    std::fs::write(&m, text.replace("\"version\": 2", "\"version\": 1")).unwrap();
    let loaded = load(&path, LoadOptions::default()).unwrap();
    assert_eq!(loaded.tables[0].info().size, size);
    for s in &loaded.stores {
        s.unlink();
    }
    drop(loaded);
    std::fs::write(&m, text.replace("\"version\": 2", "\"version\": 3")).unwrap();
    let Err(Error::Corrupt(e)) = load(&path, LoadOptions::default()) else { panic!("loaded version 3") };
    assert!(e.ends_with("MANIFEST.json: format version 3; this Reprise reads versions 1 to 2"), "{e}");
    std::fs::write(&m, "{not json").unwrap();
    let Err(Error::Corrupt(e)) = load(&path, LoadOptions::default()) else { panic!("loaded garbage") };
    assert!(e.contains("MANIFEST.json: unreadable"), "{e}");
    std::fs::remove_file(&m).unwrap();
    let Err(Error::Corrupt(e)) = load(&dir.0, LoadOptions::default()) else { panic!("loaded nothing") };
    assert!(e.ends_with("no valid checkpoint here"), "{e}");
    store.unlink();
}

#[test]
fn infinite_limiter_bounds_are_bare_tokens_as_python_writes_them() {
    let dir = TempDir::new("infinity");
    let (store, _t, q) = tables(256);
    let path = save(&dir.0, std::slice::from_ref(&q), SaveOptions::default()).unwrap();
    let text = std::fs::read_to_string(path.join(MANIFEST)).unwrap();
    assert!(text.contains("-Infinity") && !text.contains("\\u0000"), "{text}");
    let loaded = load(&path, LoadOptions::default()).unwrap();
    assert_eq!(loaded.tables[0].config().rate_limiter, q.config().rate_limiter);
    loaded.stores[0].unlink();
    store.unlink();
}

#[test]
fn saves_clean_up_after_killed_ones_and_list_newest_first() {
    let dir = TempDir::new("stale");
    let (store, t, _q) = tables(256);
    let first = save(&dir.0, std::slice::from_ref(&t), SaveOptions::default()).unwrap();
    // A pid that is not running (pid_max is at most 2^22).
    let stale = dir.0.join(".ckpt-00000000000000000001.tmp-999999999");
    std::fs::create_dir(&stale).unwrap();
    std::fs::write(stale.join("store-0.rows"), b"partial").unwrap();
    let second = save(&dir.0, &[t], SaveOptions::default()).unwrap();
    assert!(!stale.exists());
    assert_eq!(checkpoints(&dir.0), vec![second.clone(), first.clone()]);
    std::fs::write(second.join("store-0.col-1"), b"x").unwrap();
    assert_eq!(latest(&dir.0), Some(first));
    store.unlink();
}

#[test]
fn progress_counts_every_byte_and_can_stop_a_save() {
    let dir = TempDir::new("progress");
    let (store, t, q) = tables(256);
    let mut calls = Vec::new();
    let mut record = |done: u64, total: u64| {
        calls.push((done, total));
        Ok(())
    };
    save(&dir.0, &[t.clone(), q.clone()], SaveOptions { progress: Some(&mut record), ..Default::default() }).unwrap();
    let total = calls[0].1;
    assert_eq!(calls.first(), Some(&(0, total)));
    assert_eq!(calls.last(), Some(&(total, total)));
    assert!(total > 0 && total % signature().step_bytes() as u64 == 0);
    let mut stop = |_: u64, _: u64| Err(Error::InvalidArgument("stopped".into()));
    let e = save(&dir.0, &[t], SaveOptions { progress: Some(&mut stop), ..Default::default() }).unwrap_err();
    assert_eq!(e.to_string(), "stopped");
    assert_eq!(std::fs::read_dir(&dir.0).unwrap().count(), 1, "the stopped save left something behind");
    store.unlink();
}

#[test]
fn bad_arguments_write_nothing() {
    let dir = TempDir::new("bad");
    let (store, t, _q) = tables(256);
    assert!(matches!(save(&dir.0, &[], SaveOptions::default()), Err(Error::InvalidArgument(_))));
    let Err(Error::InvalidArgument(e)) = save(&dir.0, &[t.clone(), t], SaveOptions::default()) else { panic!() };
    assert!(e.contains("unique"), "{e}");
    assert!(Compression::from_name(Some("lz5")).is_err());
    assert!(checkpoints(&dir.0).is_empty());
    store.unlink();
}

#[test]
fn a_loaded_full_store_evicts_in_the_same_order() {
    let dir = TempDir::new("full");
    let store = Store::new(signature(), 32, 4, None).unwrap();
    let limiter = RateLimiterConfig::min_size(1).unwrap();
    let t = Table::new(config("t", SelectorSpec::Fifo, SelectorSpec::Fifo, 32, limiter), &store).unwrap();
    for i in 0..12 {
        put(&t, 4, 1, 4 * i, &[1.0; 4]); // the store wraps: items are evicted to make room
    }
    let loaded = load(&save(&dir.0, std::slice::from_ref(&t), SaveOptions::default()).unwrap(), LoadOptions::default()).unwrap();
    let t2 = &loaded.tables[0];
    for i in 0..3 {
        assert_eq!(put(&t, 4, 1, 500 + 4 * i, &[1.0; 4]), put(t2, 4, 1, 500 + 4 * i, &[1.0; 4]));
    }
    assert_eq!(t.items(), t2.items());
    loaded.stores[0].unlink();
    store.unlink();
}

#[test]
fn npz_round_trips_and_reads_what_numpy_writes() {
    let arrays = [("a", Array::U32(vec![1, 2, 3])), ("b", Array::U64(vec![])), ("c", Array::F64(vec![0.5, f64::MAX]))];
    let file = npz::write(&arrays).unwrap();
    let back = npz::read(&file).unwrap();
    assert_eq!(back.len(), 3);
    for (name, a) in &arrays {
        assert_eq!(&back[*name], a);
    }
    // numpy.savez(f, x=np.array([7, 8], np.uint32)) with Python 3.11's zipfile
    // (zip64 extra fields in the local header).
    let numpy = include_bytes!("testdata/numpy_savez.npz");
    assert_eq!(npz::read(numpy).unwrap()["x"], Array::U32(vec![7, 8]));
    assert!(npz::read(&file[..file.len() - 5]).is_err());
}

#[test]
fn utc_times() {
    assert_eq!(utc_time(0), "1970-01-01T00:00:00Z");
    assert_eq!(utc_time(951_782_400), "2000-02-29T00:00:00Z");
    assert_eq!(utc_time(1_763_822_384), "2025-11-22T14:39:44Z");
}


/// Rows kept "off the host" in plain vectors: what the Python package does for GPU stores.
struct Offside {
    columns: Vec<Vec<u8>>,
    row_bytes: Vec<usize>,
}

impl ReadRows for Offside {
    fn read_rows(&mut self, col: usize, row: u64, dst: &mut [u8]) -> crate::Result<()> {
        let at = row as usize * self.row_bytes[col];
        dst.copy_from_slice(&self.columns[col][at..at + dst.len()]);
        Ok(())
    }
}

impl WriteRows for std::sync::Arc<std::sync::Mutex<Offside>> {
    fn write_rows(&mut self, col: usize, row: u64, bytes: &[u8]) -> crate::Result<()> {
        let mut o = self.lock().unwrap();
        let at = row as usize * o.row_bytes[col];
        o.columns[col][at..at + bytes.len()].copy_from_slice(bytes);
        Ok(())
    }
}

struct OffsideMaker(std::sync::Arc<std::sync::Mutex<Offside>>);

impl MakeStore for OffsideMaker {
    fn make_store(&mut self, spec: &StoreSpec) -> crate::Result<NewStore> {
        assert_eq!(spec.device, "gpu:3");
        let index = Signature::new(vec![Field::new("index", DType::UInt8, vec![]).unwrap()]).unwrap();
        let store = Store::new(index, spec.capacity, spec.block_steps, None)?;
        Ok(NewStore { store, rows: Some(Box::new(self.0.clone())) })
    }
}

#[test]
fn stores_kept_off_the_host_are_read_and_written_through_their_callbacks() {
    let dir = TempDir::new("off-host");
    // The host store indexes blocks only; the step data is "on the device".
    let index = Signature::new(vec![Field::new("index", DType::UInt8, vec![]).unwrap()]).unwrap();
    let store = Store::new(index, 64, 4, None).unwrap();
    let limiter = RateLimiterConfig::min_size(1).unwrap();
    let t = Table::new(config("d", SelectorSpec::Uniform, SelectorSpec::Fifo, 16, limiter), &store).unwrap();
    let one = vec![0u8; 20];
    t.insert_batch(&[&one], 10, 2, &[1.0; 10], &[], None).unwrap();
    let row_bytes = vec![12, 8];
    let columns = row_bytes.iter().map(|rb| (0..64 * rb).map(|i| (i % 251) as u8).collect()).collect();
    let mut device = Offside { columns, row_bytes: row_bytes.clone() };
    let off_host = vec![OffHost { store: store.clone(), device: "gpu:3".into(), signature: signature(), rows: &mut device }];
    let path = save(&dir.0, std::slice::from_ref(&t), SaveOptions { off_host, ..Default::default() }).unwrap();
    assert_eq!(verify(&path).unwrap().stores[0].device, "gpu:3");
    let back = std::sync::Arc::new(std::sync::Mutex::new(Offside { columns: vec![vec![0; 64 * 12], vec![0; 64 * 8]], row_bytes }));
    let mut maker = OffsideMaker(back.clone());
    let loaded = load(&path, LoadOptions { stores: Some(&mut maker), progress: None }).unwrap();
    assert_eq!(loaded.tables[0].items(), t.items());
    let back = back.lock().unwrap();
    for (col, rb) in [(0, 12), (1, 8)] {
        // Every referenced row (items cover rows 0..20) came back; the rest stayed zero.
        assert_eq!(back.columns[col][..20 * rb], device.columns[col][..20 * rb]);
        assert!(back.columns[col][20 * rb..].iter().all(|&b| b == 0));
    }
    // Without a maker the same checkpoint loads into host memory.
    let host = load(&path, LoadOptions::default()).unwrap();
    assert_eq!(host.stores[0].signature().describe(), signature().describe());
    for s in loaded.stores.iter().chain(&host.stores) {
        s.unlink();
    }
    store.unlink();
}

#[test]
fn a_checkpoint_written_by_the_python_format_code_loads() {
    // tests/data/checkpoint_v1*: written before the format moved here (see
    // tests/data/make_checkpoint_v1.py; tests/test_checkpoint.py checks every value).
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/data");
    let expected: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(data.join("checkpoint_v1_expected.json")).unwrap()).unwrap();
    for fixture in ["checkpoint_v1", "checkpoint_v1_zstd"] {
        let loaded = load(&data.join(fixture), LoadOptions::default()).unwrap();
        let (t, q) = (by_name(&loaded, "replay"), by_name(&loaded, "queue"));
        let items = |t: &Table| -> Vec<(u64, f64, u32, u32)> {
            t.items().iter().map(|i| (i.key, i.priority, i.times_sampled, i.length)).collect()
        };
        let want = |key: &str| -> Vec<(u64, f64, u32, u32)> {
            expected[key]
                .as_array()
                .unwrap()
                .iter()
                .map(|i| (i[0].as_u64().unwrap(), i[1].as_f64().unwrap(), i[2].as_u64().unwrap() as u32, i[3].as_u64().unwrap() as u32))
                .collect()
        };
        assert_eq!(items(t), want("replay_items"), "{fixture}");
        assert_eq!(items(q), want("queue_items"), "{fixture}");
        assert_eq!(t.info().num_evictions, expected["replay_info"]["num_evictions"].as_u64().unwrap());
        let draw = t.sample(4, None).unwrap();
        let keys: Vec<u64> = draw.items.iter().map(|i| i.key).collect();
        let want_keys: Vec<u64> = expected["replay_draws"][0]["keys"].as_array().unwrap().iter().map(|k| k.as_u64().unwrap()).collect();
        assert_eq!(keys, want_keys, "{fixture}: the sampler does not continue");
        let want_acts: Vec<i64> =
            expected["replay_draws"][0]["act"].as_array().unwrap().iter().flat_map(|a| a.as_array().unwrap().iter().map(|v| v.as_i64().unwrap())).collect();
        assert_eq!(acts(&draw), want_acts, "{fixture}");
        loaded.stores[0].unlink();
    }
}

/// Every item's whole sample, column by column (stacks included), oldest first.
fn samples_of(t: &Table) -> Vec<Vec<Vec<u8>>> {
    let (snap, _pins) = t.snapshot();
    let cols = t.store().columns();
    snap.items
        .iter()
        .map(|i| {
            let len: u32 = i.ranges.iter().map(|r| r.len).sum();
            (0..cols.signature().len())
                .map(|c| {
                    let mut bytes = vec![0u8; len as usize * cols.sample_bytes(c)];
                    // SAFETY: `_pins` holds every block the items reference.
                    unsafe { cols.read_ranges(c, &i.ranges, &mut bytes) };
                    bytes
                })
                .collect()
        })
        .collect()
}

#[test]
fn stacked_stores_round_trip_with_the_frames_before_each_item() {
    use crate::signature::StackPadding;
    for level in [None, Some(3)] {
        let dir = TempDir::new("stacked");
        let sig = Signature::new(vec![
            Field::new("obs", DType::UInt8, vec![4]).unwrap().stacked(3, StackPadding::Zero).unwrap().compressed(level).unwrap(),
            Field::new("act", DType::Int64, vec![]).unwrap(),
        ])
        .unwrap();
        let store = Store::new(sig, 64, 8, None).unwrap();
        let t = Table::new(config("t", SelectorSpec::Fifo, SelectorSpec::Fifo, 64, RateLimiterConfig::min_size(1).unwrap()), &store).unwrap();
        let mut w = crate::Writer::new(store.clone(), None).unwrap();
        for i in 0..20i64 {
            w.append(&[&[i as u8 + 1; 4], &i.to_ne_bytes()], None).unwrap();
            if i % 3 == 2 {
                w.create_item(&t, 2, 1.0, &[], None).unwrap();
            }
        }
        // Batch inserts are episodes of their own.
        let obs: Vec<u8> = (0..6u8).flat_map(|v| [100 + v; 4]).collect();
        let act: Vec<u8> = (0..6i64).flat_map(|v| v.to_ne_bytes()).collect();
        t.insert_batch(&[&obs, &act], 2, 3, &[1.0, 1.0], &[], None).unwrap();
        w.close();
        let before = samples_of(&t);
        assert_eq!(before.last().unwrap()[0], [0, 0, 0, 0, 0, 0, 0, 0, 103, 103, 103, 103, 0, 0, 0, 0, 103, 103, 103, 103, 104, 104, 104, 104,
                   103, 103, 103, 103, 104, 104, 104, 104, 105, 105, 105, 105]);
        let path = save(&dir.0, std::slice::from_ref(&t), SaveOptions::default()).unwrap();
        let loaded = load(&path, LoadOptions::default()).unwrap();
        assert_eq!(loaded.stores[0].signature(), store.signature());
        assert_eq!(samples_of(by_name(&loaded, "t")), before, "level {level:?}");
        for s in &loaded.stores {
            s.unlink();
        }
        store.unlink();
    }
}
