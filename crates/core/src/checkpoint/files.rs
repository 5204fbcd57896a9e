//! Checkpoint files: written 0600 with their size and CRC-32 (optionally zstd),
//! read back with both checked; the directory operations of a save.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use super::manifest::FileEntry;
use super::Compression;
use crate::error::{Error, Result};

/// Small writes are gathered into writes of this size; larger ones go straight through.
const BUFFER: usize = 4 << 20;
/// zstd level of the column files.
const ZSTD_LEVEL: i32 = 3;

pub(crate) fn io_error(path: &Path, what: &str, e: std::io::Error) -> Error {
    Error::Io(format!("{}: cannot {what}: {e}", path.display()))
}

/// The bytes as stored, counted and checksummed on their way to the file.
struct Counted {
    file: BufWriter<File>,
    crc: crc32fast::Hasher,
    size: u64,
}

impl Write for Counted {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        let n = self.file.write(data)?;
        self.crc.update(&data[..n]);
        self.size += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.file.flush()
    }
}

enum Sink {
    Plain(Counted),
    Zstd(zstd::stream::write::Encoder<'static, Counted>),
}

/// A new checkpoint file.
pub(crate) struct Out {
    path: PathBuf,
    sink: Sink,
}

impl Out {
    pub fn create(path: PathBuf, compression: Compression) -> Result<Out> {
        let file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .map_err(|e| io_error(&path, "create", e))?;
        let counted = Counted { file: BufWriter::with_capacity(BUFFER, file), crc: crc32fast::Hasher::new(), size: 0 };
        let sink = match compression {
            Compression::None => Sink::Plain(counted),
            Compression::Zstd => Sink::Zstd(
                zstd::stream::write::Encoder::new(counted, ZSTD_LEVEL).map_err(|e| io_error(&path, "start compressing", e))?,
            ),
        };
        Ok(Out { path, sink })
    }

    pub fn name(&self) -> String {
        self.path.file_name().expect("a checkpoint file has a name").to_string_lossy().into_owned()
    }

    pub fn write(&mut self, data: &[u8]) -> Result<()> {
        let r = match &mut self.sink {
            Sink::Plain(c) => c.write_all(data),
            Sink::Zstd(z) => z.write_all(data),
        };
        r.map_err(|e| io_error(&self.path, "write", e))
    }

    /// Flushes, fsyncs and closes the file; its entry for the manifest.
    pub fn close(self) -> Result<(String, FileEntry)> {
        let name = self.name();
        let path = self.path;
        let counted = match self.sink {
            Sink::Plain(c) => c,
            Sink::Zstd(z) => z.finish().map_err(|e| io_error(&path, "finish compressing", e))?,
        };
        let Counted { file, crc, size } = counted;
        let file = file.into_inner().map_err(|e| io_error(&path, "write", e.into_error()))?;
        file.sync_all().map_err(|e| io_error(&path, "fsync", e))?;
        Ok((name, FileEntry { bytes: size, crc32: crc.finalize() }))
    }
}

/// The raw bytes of a file being read, counted and checksummed.
struct Checked {
    file: File,
    crc: crc32fast::Hasher,
    size: u64,
}

impl Read for Checked {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.file.read(buf)?;
        self.crc.update(&buf[..n]);
        self.size += n as u64;
        Ok(n)
    }
}

enum Source {
    Plain(Checked),
    Zstd(zstd::stream::read::Decoder<'static, std::io::BufReader<Checked>>),
}

/// A checkpoint file read front to back, its size and CRC-32 checked against
/// the manifest at the end ([`In::finish`]); zstd-decompressed when asked.
pub(crate) struct In {
    path: PathBuf,
    entry: FileEntry,
    source: Source,
}

impl In {
    pub fn open(checkpoint: &Path, name: &str, files: &BTreeMap<String, FileEntry>, compression: Compression) -> Result<In> {
        let entry = match files.get(name) {
            Some(f) if !name.contains('/') && name != "." && name != ".." => *f,
            _ => {
                return Err(Error::Corrupt(format!(
                    "{}: names a file it has no checksum for: '{name}'",
                    checkpoint.join(super::MANIFEST).display()
                )))
            }
        };
        let path = checkpoint.join(name);
        let file = File::open(&path).map_err(|e| Error::Corrupt(format!("{}: missing or unreadable ({e})", path.display())))?;
        let checked = Checked { file, crc: crc32fast::Hasher::new(), size: 0 };
        let source = match compression {
            Compression::None => Source::Plain(checked),
            Compression::Zstd => Source::Zstd(
                zstd::stream::read::Decoder::new(checked)
                    .map_err(|e| Error::Corrupt(format!("{}: cannot decompress ({e})", path.display())))?,
            ),
        };
        Ok(In { path, entry, source })
    }

    fn corrupt(&self, what: impl std::fmt::Display) -> Error {
        Error::Corrupt(format!("{}: {what}", self.path.display()))
    }

    /// Fills `buf` with the next bytes of content; `Corrupt` when the file ends first.
    pub fn read_exact(&mut self, buf: &mut [u8]) -> Result<()> {
        let r = match &mut self.source {
            Source::Plain(c) => c.read_exact(buf),
            Source::Zstd(z) => z.read_exact(buf),
        };
        r.map_err(|e| match e.kind() {
            std::io::ErrorKind::UnexpectedEof => self.corrupt("ends early (truncated?)"),
            _ if matches!(self.source, Source::Zstd(_)) => self.corrupt(format_args!("cannot decompress ({e})")),
            _ => self.corrupt(format_args!("unreadable ({e})")),
        })
    }

    /// The whole (small, uncompressed) file, checked.
    pub fn read_all(mut self) -> Result<Vec<u8>> {
        let mut data = Vec::with_capacity(self.entry.bytes.min(1 << 30) as usize);
        let Source::Plain(c) = &mut self.source else { unreachable!("read_all is for uncompressed files") };
        c.read_to_end(&mut data).map_err(|e| self.corrupt(format_args!("unreadable ({e})")))?;
        self.finish()?;
        Ok(data)
    }

    /// Checks that the content is used up and that the file matches the manifest.
    pub fn finish(self) -> Result<()> {
        let mut extra = false;
        let mut checked = match self.source {
            Source::Plain(c) => c,
            Source::Zstd(mut z) => {
                let mut byte = [0u8; 1];
                match z.read(&mut byte) {
                    Ok(n) => extra = n > 0,
                    Err(e) => return Err(Error::Corrupt(format!("{}: cannot decompress ({e})", self.path.display()))),
                }
                z.finish().into_inner()
            }
        };
        let mut rest = Vec::new();
        checked
            .read_to_end(&mut rest)
            .map_err(|e| Error::Corrupt(format!("{}: unreadable ({e})", self.path.display())))?;
        let corrupt = |what: String| Error::Corrupt(format!("{}: {what}", self.path.display()));
        if checked.size != self.entry.bytes {
            return Err(corrupt(format!("{} bytes, the manifest says {} (truncated?)", checked.size, self.entry.bytes)));
        }
        if checked.crc.finalize() != self.entry.crc32 {
            return Err(corrupt("checksum mismatch (corrupt)".into()));
        }
        if extra || !rest.is_empty() {
            return Err(corrupt("more data than the manifest's rows".into()));
        }
        Ok(())
    }

    /// Reads the (uncompressed-opened) file to its end unparsed and checks its
    /// size and CRC-32 (verify).
    pub fn check_all(mut self) -> Result<()> {
        let Source::Plain(c) = &mut self.source else { unreachable!("check_all is for files opened uncompressed") };
        std::io::copy(c, &mut std::io::sink()).map_err(|e| self.corrupt(format_args!("unreadable ({e})")))?;
        self.finish()
    }
}

/// Creates `path` and its missing parents (mode 0700).
pub(crate) fn make_dirs(path: &Path) -> Result<()> {
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(path).map_err(|e| io_error(path, "create the directory", e))
}

pub(crate) fn fsync_dir(path: &Path) -> Result<()> {
    File::open(path).and_then(|d| d.sync_all()).map_err(|e| io_error(path, "fsync", e))
}

/// Removes a (flat) checkpoint directory, finished or not.
pub(crate) fn remove_dir(path: &Path) {
    let _ = std::fs::remove_dir_all(path);
}

/// Removes what saves killed midway left behind in `parent`: temporaries whose
/// process is gone.
pub(crate) fn remove_stale_temporaries(parent: &Path) {
    let Ok(entries) = std::fs::read_dir(parent) else { return };
    for e in entries.filter_map(|e| e.ok()) {
        let name = e.file_name();
        let Some(name) = name.to_str() else { continue };
        if !name.starts_with(".ckpt-") {
            continue;
        }
        let Some((_, pid)) = name.rsplit_once(".tmp-") else { continue };
        let Ok(pid) = pid.parse::<i32>() else { continue };
        if pid > 0 && !Path::new("/proc").join(pid.to_string()).exists() {
            remove_dir(&e.path());
        }
    }
}
