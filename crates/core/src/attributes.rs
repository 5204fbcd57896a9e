//! Item attributes: named per-item scalars beside the per-step signature (a
//! rollout's policy version, its reward, its prompt group), given when an item is
//! created, returned with every draw, updated later by key.
//!
//! A table keeps them as one fixed-size record per slot: attribute `i` of a slot
//! sits at `offsets[i]` of its record, in its dtype's native little-endian bytes.
//! Callers hand a batch of items' attributes as one flat buffer of records, so an
//! insert of `n` items copies `n * record` bytes and allocates nothing per item.

use crate::invalid;
use crate::signature::DType;
use crate::Result;

/// The attribute every policy-version feature reads (`max_staleness`,
/// `set_version`, the staleness figures).
pub const VERSION: &str = "version";

/// One named attribute and its element type.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AttributeSpec {
    pub name: String,
    pub dtype: DType,
}

/// A table's attributes: names, types and the layout of a slot's record.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Attributes {
    specs: Vec<AttributeSpec>,
    offsets: Vec<usize>,
    record: usize,
}

impl Attributes {
    /// Attributes `specs`, in order: names non-empty and distinct.
    pub fn new(specs: Vec<AttributeSpec>) -> Result<Attributes> {
        let mut offsets = Vec::with_capacity(specs.len());
        let mut record = 0;
        for (i, s) in specs.iter().enumerate() {
            if s.name.is_empty() {
                return Err(invalid!("attribute names must be non-empty"));
            }
            if specs[..i].iter().any(|t| t.name == s.name) {
                return Err(invalid!("attribute '{}' is named twice", s.name));
            }
            offsets.push(record);
            record += s.dtype.itemsize();
        }
        Ok(Attributes { specs, offsets, record })
    }

    pub fn specs(&self) -> &[AttributeSpec] {
        &self.specs
    }

    pub fn is_empty(&self) -> bool {
        self.specs.is_empty()
    }

    pub fn len(&self) -> usize {
        self.specs.len()
    }

    /// Bytes of one item's record.
    pub fn record(&self) -> usize {
        self.record
    }

    /// Where attribute `i` starts in a record.
    pub fn offset(&self, i: usize) -> usize {
        self.offsets[i]
    }

    /// Writes attribute `i` of every record of `records` (records end to end) into
    /// `out`, one value after another: the column the wire and numpy take. `out`
    /// holds `records.len() / record()` values of the attribute's size.
    pub fn column_into(&self, i: usize, records: &[u8], out: &mut [u8]) {
        let (at, size) = (self.offsets[i], self.specs[i].dtype.itemsize());
        for (dst, rec) in out.chunks_exact_mut(size).zip(records.chunks_exact(self.record)) {
            dst.copy_from_slice(&rec[at..at + size]);
        }
    }

    /// Every attribute's column of `records` (`n` records end to end); empty
    /// without attributes or when `records` does not hold `n` of them.
    pub fn columns(&self, records: &[u8], n: usize) -> Vec<Vec<u8>> {
        if self.record == 0 || records.len() != n * self.record {
            return Vec::new();
        }
        (0..self.specs.len())
            .map(|i| {
                let mut column = vec![0u8; n * self.specs[i].dtype.itemsize()];
                self.column_into(i, records, &mut column);
                column
            })
            .collect()
    }

    pub fn find(&self, name: &str) -> Option<usize> {
        self.specs.iter().position(|s| s.name == name)
    }

    /// The position of the `int64` attribute `version`, or an error saying why
    /// `what` needs it.
    pub fn version(&self, what: &str) -> Result<usize> {
        match self.find(VERSION) {
            Some(i) if self.specs[i].dtype == DType::Int64 => Ok(i),
            Some(i) => Err(invalid!(
                "{what} needs the attribute 'version' to be int64, got {}",
                self.specs[i].dtype.name()
            )),
            None => Err(invalid!(
                "{what} needs an int64 attribute 'version' (attributes={{\"version\": \"int64\", ...}}); \
                 the table's attributes are {:?}",
                self.names()
            )),
        }
    }

    pub fn names(&self) -> Vec<&str> {
        self.specs.iter().map(|s| s.name.as_str()).collect()
    }

    /// Reads the `int64` at `offset` of `record`.
    pub fn read_i64(record: &[u8], offset: usize) -> i64 {
        i64::from_le_bytes(record[offset..offset + 8].try_into().expect("an int64 attribute has 8 bytes"))
    }

    /// Checks that `bytes` holds whole records for `n` items.
    #[inline]
    pub fn check_records(&self, table: &str, n: usize, bytes: &[u8]) -> Result<()> {
        if bytes.len() == n * self.record {
            return Ok(());
        }
        if self.record == 0 {
            return Err(invalid!("table '{table}' has no attributes; got attribute values for its items"));
        }
        if bytes.is_empty() {
            return Err(invalid!(
                "table '{table}': every item needs its attributes {:?}; none were given",
                self.names()
            ));
        }
        Err(invalid!(
            "table '{table}': attribute records for {n} items need {} bytes, got {}",
            n * self.record,
            bytes.len()
        ))
    }
}

/// Every slot's record, in one buffer indexed by slot.
#[derive(Default)]
pub(crate) struct Records {
    record: usize,
    bytes: Vec<u8>,
}

impl Records {
    pub(crate) fn new(record: usize) -> Records {
        Records { record, bytes: Vec::new() }
    }

    #[inline]
    pub(crate) fn get(&self, slot: u32) -> &[u8] {
        if self.record == 0 {
            return &[];
        }
        let at = slot as usize * self.record;
        &self.bytes[at..at + self.record]
    }

    pub(crate) fn get_mut(&mut self, slot: u32) -> &mut [u8] {
        let at = slot as usize * self.record;
        &mut self.bytes[at..at + self.record]
    }

    /// Sets `slot`'s record (growing the buffer to reach it).
    #[inline]
    pub(crate) fn set(&mut self, slot: u32, record: &[u8]) {
        if self.record == 0 {
            return;
        }
        let end = (slot as usize + 1) * self.record;
        if self.bytes.len() < end {
            self.bytes.resize(end, 0);
        }
        self.get_mut(slot).copy_from_slice(record);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(name: &str, dtype: DType) -> AttributeSpec {
        AttributeSpec { name: name.into(), dtype }
    }

    #[test]
    fn records_lay_attributes_end_to_end() {
        let a = Attributes::new(vec![spec("version", DType::Int64), spec("reward", DType::Float32), spec("ok", DType::Bool)]).unwrap();
        assert_eq!(a.record(), 13);
        assert_eq!((a.offset(0), a.offset(1), a.offset(2)), (0, 8, 12));
        assert_eq!(a.version("max_staleness").unwrap(), 0);
        assert_eq!(a.find("ok"), Some(2));
    }

    #[test]
    fn columns_transpose_records() {
        let a = Attributes::new(vec![spec("version", DType::Int64), spec("ok", DType::Bool)]).unwrap();
        let mut records = Vec::new();
        for (v, ok) in [(7i64, 1u8), (-2, 0), (40, 1)] {
            records.extend_from_slice(&v.to_le_bytes());
            records.push(ok);
        }
        let c = a.columns(&records, 3);
        let versions: Vec<i64> = c[0].chunks_exact(8).map(|b| i64::from_le_bytes(b.try_into().unwrap())).collect();
        assert_eq!(versions, [7, -2, 40]);
        assert_eq!(c[1], [1, 0, 1]);
        assert!(a.columns(&records, 2).is_empty()); // not 2 records
        assert!(Attributes::default().columns(&[], 5).is_empty());
    }

    #[test]
    fn bad_schemas_name_what_is_wrong() {
        let e = Attributes::new(vec![spec("a", DType::Int8), spec("a", DType::Int8)]).unwrap_err().to_string();
        assert!(e.contains("'a' is named twice"), "{e}");
        let a = Attributes::new(vec![spec("version", DType::Float32)]).unwrap();
        let e = a.version("max_staleness").unwrap_err().to_string();
        assert!(e.contains("int64") && e.contains("float32"), "{e}");
        let e = Attributes::default().version("set_version").unwrap_err().to_string();
        assert!(e.contains("needs an int64 attribute 'version'"), "{e}");
    }

    #[test]
    fn record_buffers_are_checked_against_the_item_count() {
        let a = Attributes::new(vec![spec("v", DType::Int64)]).unwrap();
        assert!(a.check_records("t", 2, &[0; 16]).is_ok());
        let e = a.check_records("t", 2, &[]).unwrap_err().to_string();
        assert!(e.contains("needs its attributes") && e.contains("\"v\""), "{e}");
        let e = a.check_records("t", 2, &[0; 8]).unwrap_err().to_string();
        assert!(e.contains("need 16 bytes, got 8"), "{e}");
        let e = Attributes::default().check_records("t", 1, &[0; 8]).unwrap_err().to_string();
        assert!(e.contains("has no attributes"), "{e}");
    }
}
