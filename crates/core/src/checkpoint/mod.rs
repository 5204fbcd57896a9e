//! Checkpoints: tables, their state and the step data they reference, in a
//! directory on disk (format version 1, documented in `docs/checkpoints.md`).
//!
//! ```text
//! ckpt-<unix ns, 20 digits>/
//!   MANIFEST.json       format, version, stores, tables, and a size + CRC-32 per file
//!   store-<i>.rows      int64 (start, count) pairs: the row runs written, in file order
//!   store-<i>.col-<j>   field j's rows of those runs, back to back (zstd when asked)
//!   table-<i>.npz       the table's index: numpy arrays in a zip (see `npz`)
//! ```
//!
//! [`save`] writes into `.ckpt-<ns>.tmp-<pid>` next to the final name, fsyncs
//! every file and the directory, and renames it: a crash leaves no partial
//! checkpoint and the previous ones intact. Saving is online: each table's index
//! is copied under its lock (a moment; [`Table::snapshot`]) and the blocks it
//! references are pinned, so inserts and samples go on while the rows are
//! written, oldest items' blocks first, each block's pin released once its rows
//! are on disk. A store shared by several tables is written once.
//!
//! [`load`] checks every file's size and CRC-32 as it reads it, the small files
//! (indexes, row runs) before any store is made. A truncated, corrupt or
//! other-version checkpoint is [`Error::Corrupt`] naming the file; the stores it
//! had made are removed: nothing is loaded.
//!
//! Stores whose step data lives off the host (the Python package's GPU stores,
//! whose host store only indexes blocks) are read through [`ReadRows`] and
//! written back through [`WriteRows`]; everything else stays here.

mod files;
mod load;
mod manifest;
mod npz;
mod save;
mod table_file;
#[cfg(test)]
pub(crate) mod tests;

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

pub use load::{load, LoadOptions, Loaded, MakeStore, NewStore, StoreSpec, WriteRows};
pub use manifest::Manifest;
pub use save::{save, OffHost, ReadRows, SaveOptions};

/// The manifest's `format`.
pub const FORMAT: &str = "reprise-checkpoint";
/// The format version written and read.
/// Version 2 added item attributes, `max_staleness` and the policy version;
/// version 1 checkpoints still load (their tables have none).
pub const VERSION: u32 = 2;
/// The oldest version [`load`] reads.
pub const OLDEST_VERSION: u32 = 1;
/// The manifest's file name.
pub const MANIFEST: &str = "MANIFEST.json";

/// How the step data (the column files) is stored.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Compression {
    #[default]
    None,
    /// One zstd stream per column file, level 3.
    Zstd,
}

impl Compression {
    /// `None` or `"zstd"`, as the manifest and the Python API spell it.
    pub fn from_name(name: Option<&str>) -> Result<Compression> {
        match name {
            None => Ok(Compression::None),
            Some("zstd") => Ok(Compression::Zstd),
            Some(other) => Err(Error::InvalidArgument(format!("compression must be None or 'zstd', got '{other}'"))),
        }
    }

    pub fn name(self) -> Option<&'static str> {
        match self {
            Compression::None => None,
            Compression::Zstd => Some("zstd"),
        }
    }
}

/// Called with (bytes of step data done, total) as a save or load goes on; an
/// error stops it (and is returned by it).
pub type Progress<'a> = &'a mut dyn FnMut(u64, u64) -> Result<()>;

/// The checkpoints under `parent` (`ckpt-*` directories), newest first, valid or not.
pub fn checkpoints(parent: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(parent) else { return Vec::new() };
    let mut out: Vec<PathBuf> = entries
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_str().is_some_and(|n| n.starts_with("ckpt-")) && e.path().is_dir())
        .map(|e| e.path())
        .collect();
    out.sort_by(|a, b| b.file_name().cmp(&a.file_name()));
    out
}

/// Checks the manifest of the checkpoint at `path` and the size and CRC-32 of
/// every file it lists; returns the manifest or `Corrupt` naming the first bad file.
pub fn verify(path: &Path) -> Result<Manifest> {
    let manifest = Manifest::read(path)?;
    for name in manifest.files.keys() {
        files::In::open(path, name, &manifest.files, Compression::None)?.check_all()?;
    }
    Ok(manifest)
}

/// The newest checkpoint under `parent` that verifies.
pub fn latest(parent: &Path) -> Option<PathBuf> {
    checkpoints(parent).into_iter().find(|c| verify(c).is_ok())
}
