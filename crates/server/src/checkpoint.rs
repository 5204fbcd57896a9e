//! Checkpoints of the served tables, asked for by clients (a CHECKPOINT request
//! on the local socket, the Checkpoint call of the remote service).
//!
//! A server runs whatever [`Checkpointer`] its owner gave it. [`to_directory`] is
//! the built-in one: it writes the served tables into a directory in the core
//! format (`reprise_core::checkpoint`), so a server with no Python in it can
//! checkpoint; the Python package passes its own, which also saves GPU stores.

use std::path::PathBuf;
use std::sync::Arc;

use reprise_core::checkpoint::{self, Compression, SaveOptions};
use reprise_core::error::Result;
use reprise_core::Table;

/// Writes a checkpoint of the served tables and returns its path. Runs on the
/// asking connection's thread; saves are online, so other clients keep working.
pub type Checkpointer = Arc<dyn Fn() -> Result<String> + Send + Sync>;

/// A checkpointer that saves `tables` into a new `ckpt-<ns>` directory under
/// `directory` (created if missing) on each call.
pub fn to_directory(directory: impl Into<PathBuf>, tables: Vec<Table>, compression: Compression) -> Checkpointer {
    let directory = directory.into();
    Arc::new(move || {
        let path = checkpoint::save(&directory, &tables, SaveOptions { compression, ..Default::default() })?;
        Ok(path.to_string_lossy().into_owned())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use reprise_core::checkpoint::LoadOptions;
    use reprise_core::signature::{DType, Field, Signature};
    use reprise_core::{RateLimiterConfig, SelectorSpec, Store, TableConfig};

    #[test]
    fn the_built_in_checkpointer_writes_what_load_reads_back() {
        let sig = Signature::new(vec![Field::new("x", DType::Int64, vec![]).unwrap()]).unwrap();
        let store = Store::new(sig, 64, 4, None).unwrap();
        let config = TableConfig {
            name: "replay".into(),
            sampler: SelectorSpec::Uniform,
            remover: SelectorSpec::Fifo,
            max_size: 32,
            max_times_sampled: 0,
            rate_limiter: RateLimiterConfig::min_size(1).unwrap(),
            seed: Some(1),
            evict_when_store_full: true,
            external_selection: false,
            extensions: reprise_core::ExtensionSpec::defaults(),
            attributes: Default::default(),
            max_staleness: None,
            groups: None,
        };
        let table = Table::new(config, &store).unwrap();
        let values: Vec<u8> = (0..10i64).flat_map(|v| v.to_ne_bytes()).collect();
        table.insert_batch(&[&values], 10, 1, &[1.0; 10], &[], None).unwrap();
        let dir = std::env::temp_dir().join(format!("reprise-server-checkpoint-{}", std::process::id()));
        let save = to_directory(&dir, vec![table.clone()], Compression::Zstd);
        let first = save().unwrap();
        let second = save().unwrap();
        assert_ne!(first, second);
        assert_eq!(checkpoint::latest(&dir).unwrap().to_string_lossy(), second);
        let loaded = checkpoint::load(&dir, LoadOptions::default()).unwrap();
        assert_eq!(loaded.tables[0].items(), table.items());
        loaded.stores[0].unlink();
        store.unlink();
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
