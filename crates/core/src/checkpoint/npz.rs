//! The `.npz` table files: a zip of `.npy` arrays, as numpy's `savez` writes them
//! (entries stored, not compressed), so that numpy reads what is written here and
//! the checkpoints of the Python writer load.
//!
//! Only what table indexes need: one-dimensional little-endian `uint32`, `uint64`
//! and `float64` arrays. Zip64 records are read (numpy writes them for large
//! arrays) but not written: an index file is at most 4 GiB.

use std::collections::BTreeMap;

/// One array of a table file.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Array {
    /// Raw bytes (an item's attribute record is several dtypes side by side).
    U8(Vec<u8>),
    U32(Vec<u32>),
    U64(Vec<u64>),
    F64(Vec<f64>),
}

impl Array {
    fn descr(&self) -> &'static str {
        match self {
            Array::U8(_) => "|u1",
            Array::U32(_) => "<u4",
            Array::U64(_) => "<u8",
            Array::F64(_) => "<f8",
        }
    }

    fn len(&self) -> usize {
        match self {
            Array::U8(v) => v.len(),
            Array::U32(v) => v.len(),
            Array::U64(v) => v.len(),
            Array::F64(v) => v.len(),
        }
    }

    fn bytes(&self, out: &mut Vec<u8>) {
        match self {
            Array::U8(v) => out.extend_from_slice(v),
            Array::U32(v) => v.iter().for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
            Array::U64(v) => v.iter().for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
            Array::F64(v) => v.iter().for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
        }
    }
}

/// `.npy` version 1.0: magic, version, header length, a Python dict literal
/// padded with spaces to a multiple of 64 bytes, then the data.
fn npy(array: &Array) -> Vec<u8> {
    let dict = format!("{{'descr': '{}', 'fortran_order': False, 'shape': ({},), }}", array.descr(), array.len());
    let unpadded = 10 + dict.len() + 1;
    let header_len = unpadded.next_multiple_of(64) - 10;
    let mut out = Vec::with_capacity(10 + header_len + array.len() * 8);
    out.extend_from_slice(b"\x93NUMPY\x01\x00");
    out.extend_from_slice(&(header_len as u16).to_le_bytes());
    out.extend_from_slice(dict.as_bytes());
    out.resize(10 + header_len - 1, b' ');
    out.push(b'\n');
    array.bytes(&mut out);
    out
}

const LOCAL: u32 = 0x0403_4b50;
const CENTRAL: u32 = 0x0201_4b50;
const END: u32 = 0x0605_4b50;
const END64: u32 = 0x0606_4b50;
const END64_LOCATOR: u32 = 0x0706_4b50;
/// 1980-01-01, the earliest zip date (the entries carry no meaningful time).
const DOS_DATE: u16 = 0x21;

/// The file: one stored `<name>.npy` entry per array, in the given order.
pub(crate) fn write(arrays: &[(&str, Array)]) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    let mut central = Vec::new();
    for (name, array) in arrays {
        let data = npy(array);
        let name = format!("{name}.npy");
        let offset = out.len();
        if data.len() >= u32::MAX as usize || offset >= u32::MAX as usize {
            return Err(format!("array '{name}' makes the table file larger than 4 GiB"));
        }
        let crc = crc32fast::hash(&data);
        let common = |v: &mut Vec<u8>| {
            v.extend_from_slice(&20u16.to_le_bytes()); // version needed: 2.0
            v.extend_from_slice(&0u16.to_le_bytes()); // flags
            v.extend_from_slice(&0u16.to_le_bytes()); // method: stored
            v.extend_from_slice(&0u16.to_le_bytes()); // time
            v.extend_from_slice(&DOS_DATE.to_le_bytes());
            v.extend_from_slice(&crc.to_le_bytes());
            v.extend_from_slice(&(data.len() as u32).to_le_bytes()); // compressed
            v.extend_from_slice(&(data.len() as u32).to_le_bytes()); // uncompressed
            v.extend_from_slice(&(name.len() as u16).to_le_bytes());
            v.extend_from_slice(&0u16.to_le_bytes()); // extra length
        };
        out.extend_from_slice(&LOCAL.to_le_bytes());
        common(&mut out);
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(&data);
        central.extend_from_slice(&CENTRAL.to_le_bytes());
        central.extend_from_slice(&20u16.to_le_bytes()); // made by: 2.0
        common(&mut central);
        central.extend_from_slice(&0u16.to_le_bytes()); // comment length
        central.extend_from_slice(&0u16.to_le_bytes()); // disk
        central.extend_from_slice(&0u16.to_le_bytes()); // internal attributes
        central.extend_from_slice(&(0o600u32 << 16).to_le_bytes()); // external: mode
        central.extend_from_slice(&(offset as u32).to_le_bytes());
        central.extend_from_slice(name.as_bytes());
    }
    let at = out.len();
    if at >= u32::MAX as usize || arrays.len() >= u16::MAX as usize {
        return Err("the table file would be larger than 4 GiB".into());
    }
    out.extend_from_slice(&central);
    out.extend_from_slice(&END.to_le_bytes());
    out.extend_from_slice(&[0; 4]); // disk numbers
    out.extend_from_slice(&(arrays.len() as u16).to_le_bytes());
    out.extend_from_slice(&(arrays.len() as u16).to_le_bytes());
    out.extend_from_slice(&(central.len() as u32).to_le_bytes());
    out.extend_from_slice(&(at as u32).to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes()); // comment length
    Ok(out)
}

/// Little-endian fields at an offset, with bounds checks.
struct At<'a>(&'a [u8]);

impl At<'_> {
    fn bytes(&self, at: usize, n: usize) -> Result<&[u8], String> {
        at.checked_add(n).and_then(|end| self.0.get(at..end)).ok_or_else(|| format!("ends early at byte {at}"))
    }
    fn u16(&self, at: usize) -> Result<u16, String> {
        Ok(u16::from_le_bytes(self.bytes(at, 2)?.try_into().expect("2 bytes")))
    }
    fn u32(&self, at: usize) -> Result<u32, String> {
        Ok(u32::from_le_bytes(self.bytes(at, 4)?.try_into().expect("4 bytes")))
    }
    fn u64(&self, at: usize) -> Result<u64, String> {
        Ok(u64::from_le_bytes(self.bytes(at, 8)?.try_into().expect("8 bytes")))
    }
}

/// Every array of the file, by entry name less `.npy`.
pub(crate) fn read(file: &[u8]) -> Result<BTreeMap<String, Array>, String> {
    let z = At(file);
    let end = (0..=file.len().saturating_sub(22))
        .rev()
        .take(1 << 16)
        .find(|&at| z.u32(at) == Ok(END))
        .ok_or("not a zip file (no end of central directory)")?;
    let (mut entries, mut cd_offset) = (z.u16(end + 10)? as u64, z.u32(end + 16)? as u64);
    if entries == 0xFFFF || cd_offset == 0xFFFF_FFFF {
        if end < 20 || z.u32(end - 20)? != END64_LOCATOR {
            return Err("zip64 end record missing".into());
        }
        let at = z.u64(end - 20 + 8)? as usize;
        if z.u32(at)? != END64 {
            return Err("bad zip64 end record".into());
        }
        entries = z.u64(at + 32)?;
        cd_offset = z.u64(at + 48)?;
    }
    let mut out = BTreeMap::new();
    let mut at = cd_offset as usize;
    for _ in 0..entries {
        if z.u32(at)? != CENTRAL {
            return Err(format!("bad central directory entry at byte {at}"));
        }
        let method = z.u16(at + 10)?;
        let crc = z.u32(at + 16)?;
        let mut size = z.u32(at + 20)? as u64;
        let (name_len, extra_len, comment_len) = (z.u16(at + 28)? as usize, z.u16(at + 30)? as usize, z.u16(at + 32)? as usize);
        let mut local = z.u32(at + 42)? as u64;
        let name = String::from_utf8_lossy(z.bytes(at + 46, name_len)?).into_owned();
        let uncompressed = z.u32(at + 24)?;
        if size == 0xFFFF_FFFF || uncompressed == 0xFFFF_FFFF || local == 0xFFFF_FFFF {
            // Zip64 extra field: the 8-byte values present are those saturated above.
            let extra = At(z.bytes(at + 46 + name_len, extra_len)?);
            let mut e = 0;
            while e + 4 <= extra_len {
                let (id, len) = (extra.u16(e)?, extra.u16(e + 2)? as usize);
                if id == 1 {
                    let mut f = e + 4;
                    if uncompressed == 0xFFFF_FFFF {
                        f += 8;
                    }
                    if size == 0xFFFF_FFFF {
                        size = extra.u64(f)?;
                        f += 8;
                    }
                    if local == 0xFFFF_FFFF {
                        local = extra.u64(f)?;
                    }
                }
                e += 4 + len;
            }
        }
        if method != 0 {
            return Err(format!("entry '{name}' is compressed (method {method}); table files store their arrays"));
        }
        let l = local as usize;
        if z.u32(l)? != LOCAL {
            return Err(format!("entry '{name}': bad local header"));
        }
        let data_at = l + 30 + z.u16(l + 26)? as usize + z.u16(l + 28)? as usize;
        let data = z.bytes(data_at, size as usize)?;
        if crc32fast::hash(data) != crc {
            return Err(format!("entry '{name}': checksum mismatch"));
        }
        let key = name.strip_suffix(".npy").unwrap_or(&name).to_string();
        out.insert(key, parse_npy(data).map_err(|e| format!("entry '{name}': {e}"))?);
        at += 46 + name_len + extra_len + comment_len;
    }
    Ok(out)
}

/// A one-dimensional `.npy` array of a supported dtype.
fn parse_npy(data: &[u8]) -> Result<Array, String> {
    let d = At(data);
    if d.bytes(0, 6)? != b"\x93NUMPY" {
        return Err("not an .npy array".into());
    }
    let (header_at, header_len) = match d.bytes(6, 1)?[0] {
        1 => (10, d.u16(8)? as usize),
        2 | 3 => (12, d.u32(8)? as usize),
        v => return Err(format!(".npy version {v}")),
    };
    let header = std::str::from_utf8(d.bytes(header_at, header_len)?).map_err(|_| "header is not text")?;
    let value = |key: &str| -> Result<&str, String> {
        let at = header.find(&format!("'{key}':")).ok_or_else(|| format!("header has no '{key}'"))?;
        Ok(header[at + key.len() + 3..].trim_start())
    };
    let descr = value("descr")?;
    let descr = descr.strip_prefix('\'').and_then(|d| d.split('\'').next()).ok_or("bad descr")?;
    let shape = value("shape")?;
    let shape = shape.strip_prefix('(').and_then(|s| s.split(')').next()).ok_or("bad shape")?;
    let dims: Vec<usize> = shape
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| s.parse::<usize>().map_err(|_| format!("bad shape ({shape})")))
        .collect::<Result<_, _>>()?;
    let [n] = dims[..] else { return Err(format!("shape ({shape}) is not one-dimensional")) };
    let body = &data[header_at + header_len..];
    let take = |size: usize| -> Result<&[u8], String> {
        let bytes = n.checked_mul(size).ok_or("shape too large")?;
        if body.len() != bytes {
            return Err(format!("{} data bytes for {n} elements of {size} bytes", body.len()));
        }
        Ok(body)
    };
    Ok(match descr {
        "|u1" => Array::U8(take(1)?.to_vec()),
        "<u4" => Array::U32(take(4)?.chunks_exact(4).map(|c| u32::from_le_bytes(c.try_into().expect("4"))).collect()),
        "<u8" => Array::U64(take(8)?.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().expect("8"))).collect()),
        "<f8" => Array::F64(take(8)?.chunks_exact(8).map(|c| f64::from_le_bytes(c.try_into().expect("8"))).collect()),
        other => return Err(format!("dtype '{other}'; table files hold |u1, <u4, <u8 and <f8")),
    })
}
