//! Signatures: the ordered named fields every step of a store carries.

use crate::invalid;
use crate::Result;

/// Element types a field can hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    Bool,
    Int8,
    Int16,
    Int32,
    Int64,
    UInt8,
    UInt16,
    UInt32,
    UInt64,
    Float16,
    Float32,
    Float64,
}

impl DType {
    pub const ALL: [DType; 12] = [
        DType::Bool,
        DType::Int8,
        DType::Int16,
        DType::Int32,
        DType::Int64,
        DType::UInt8,
        DType::UInt16,
        DType::UInt32,
        DType::UInt64,
        DType::Float16,
        DType::Float32,
        DType::Float64,
    ];

    /// The numpy name of the type (`"float32"`).
    pub fn name(self) -> &'static str {
        match self {
            DType::Bool => "bool",
            DType::Int8 => "int8",
            DType::Int16 => "int16",
            DType::Int32 => "int32",
            DType::Int64 => "int64",
            DType::UInt8 => "uint8",
            DType::UInt16 => "uint16",
            DType::UInt32 => "uint32",
            DType::UInt64 => "uint64",
            DType::Float16 => "float16",
            DType::Float32 => "float32",
            DType::Float64 => "float64",
        }
    }

    pub fn itemsize(self) -> usize {
        match self {
            DType::Bool | DType::Int8 | DType::UInt8 => 1,
            DType::Int16 | DType::UInt16 | DType::Float16 => 2,
            DType::Int32 | DType::UInt32 | DType::Float32 => 4,
            DType::Int64 | DType::UInt64 | DType::Float64 => 8,
        }
    }

    pub fn from_name(name: &str) -> Result<DType> {
        DType::ALL.iter().copied().find(|d| d.name() == name).ok_or_else(|| {
            let names: Vec<&str> = DType::ALL.iter().map(|d| d.name()).collect();
            invalid!("unknown dtype '{name}': expected one of {}", names.join(", "))
        })
    }
}

/// zstd levels a compressed column accepts (zstd's negative "fast" levels are not
/// offered: at Atari frame sizes they save little over level 1 and cost ratio).
pub const COMPRESS_LEVELS: std::ops::RangeInclusive<i32> = 1..=19;

/// The most frames a stacked field may stack.
pub const MAX_STACK: u32 = 64;

/// What fills a stack before an episode's first frame (gymnasium's
/// `FrameStackObservation` `padding_type`): copies of that first frame (`Reset`,
/// gymnasium's default) or zeros.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum StackPadding {
    #[default]
    Reset,
    Zero,
}

impl StackPadding {
    pub fn name(self) -> &'static str {
        match self {
            StackPadding::Reset => "reset",
            StackPadding::Zero => "zero",
        }
    }

    pub fn from_name(name: &str) -> Result<StackPadding> {
        match name {
            "reset" => Ok(StackPadding::Reset),
            "zero" => Ok(StackPadding::Zero),
            _ => Err(invalid!("unknown stack padding '{name}': expected 'reset' (the episode's first frame) or 'zero'")),
        }
    }
}

/// One named field: a dtype and a fixed per-step shape, stored raw or, with
/// `compress`, as zstd frames at that level (see `columns`' module doc).
///
/// With `stack` k > 1 each step stores one frame of `shape` and samples as the
/// last k frames of its episode, `[k, ...shape]`, oldest first (see `writer`'s
/// module doc, "Stacked fields").
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Field {
    pub name: String,
    pub dtype: DType,
    pub shape: Vec<usize>,
    pub compress: Option<i32>,
    pub stack: u32,
    pub padding: StackPadding,
}

impl Field {
    pub fn new(name: &str, dtype: DType, shape: Vec<usize>) -> Result<Field> {
        if name.is_empty() {
            return Err(invalid!("field names must be non-empty"));
        }
        if let Some(d) = shape.iter().find(|&&d| d == 0) {
            return Err(invalid!(
                "field '{name}' has shape {shape:?} with a dimension of {d}: every dimension must be >= 1"
            ));
        }
        Ok(Field { name: name.to_string(), dtype, shape, compress: None, stack: 1, padding: StackPadding::Reset })
    }

    /// This field stored compressed with zstd at `level` (`None`: raw).
    pub fn compressed(mut self, level: Option<i32>) -> Result<Field> {
        if let Some(l) = level {
            if !COMPRESS_LEVELS.contains(&l) {
                return Err(invalid!(
                    "field '{}': compression level {l} is out of range: expected a zstd level from {} to {}",
                    self.name,
                    COMPRESS_LEVELS.start(),
                    COMPRESS_LEVELS.end()
                ));
            }
        }
        self.compress = level;
        Ok(self)
    }

    /// This field sampled as stacks of the last `stack` frames of an episode
    /// (1: not stacked), padded at an episode's start with `padding`.
    pub fn stacked(mut self, stack: u32, padding: StackPadding) -> Result<Field> {
        if !(1..=MAX_STACK).contains(&stack) {
            return Err(invalid!("field '{}': stack={stack} is out of range: expected 1 (no stack) to {MAX_STACK} frames", self.name));
        }
        self.stack = stack;
        self.padding = padding;
        Ok(self)
    }

    /// Elements per step.
    pub fn elements(&self) -> usize {
        self.shape.iter().product()
    }

    /// Bytes per step stored and written (one row of this field's column: one
    /// frame of a stacked field).
    pub fn row_bytes(&self) -> usize {
        self.elements() * self.dtype.itemsize()
    }

    /// Bytes per step of a sample: `stack` rows.
    pub fn sample_bytes(&self) -> usize {
        self.row_bytes() * self.stack as usize
    }

    /// The shape of one step of a sample: `[stack, ...shape]` when stacked.
    pub fn sample_shape(&self) -> Vec<usize> {
        if self.stack > 1 {
            std::iter::once(self.stack as usize).chain(self.shape.iter().copied()).collect()
        } else {
            self.shape.clone()
        }
    }

    /// `uint8[4,84,84]`, the form every error message uses.
    pub fn describe(&self) -> String {
        describe(self.dtype.name(), &self.shape)
    }
}

/// Formats a dtype and shape as `uint8[4,84,84]`.
pub fn describe(dtype: &str, shape: &[usize]) -> String {
    let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    format!("{dtype}[{}]", dims.join(","))
}

/// Ordered named fields, fixed at store creation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Signature {
    fields: Vec<Field>,
}

impl Signature {
    pub fn new(fields: Vec<Field>) -> Result<Signature> {
        if fields.is_empty() {
            return Err(invalid!("a signature needs at least one field"));
        }
        for (i, f) in fields.iter().enumerate() {
            if fields[..i].iter().any(|g| g.name == f.name) {
                return Err(invalid!("field '{}' appears twice in the signature", f.name));
            }
        }
        Ok(Signature { fields })
    }

    pub fn fields(&self) -> &[Field] {
        &self.fields
    }

    pub fn len(&self) -> usize {
        self.fields.len()
    }

    pub fn is_empty(&self) -> bool {
        self.fields.is_empty()
    }

    pub fn index_of(&self, name: &str) -> Option<usize> {
        self.fields.iter().position(|f| f.name == name)
    }

    /// The indices of the fields named `names`, in that order (empty: every field);
    /// `NotFound` naming the first unknown one and the fields there are.
    pub fn select(&self, names: &[String]) -> crate::Result<Vec<usize>> {
        if names.is_empty() {
            return Ok((0..self.fields.len()).collect());
        }
        names
            .iter()
            .map(|name| {
                self.index_of(name).ok_or_else(|| {
                    let known: Vec<&str> = self.fields.iter().map(|f| f.name.as_str()).collect();
                    crate::Error::NotFound(format!("unknown field '{name}'; expected one of {known:?}"))
                })
            })
            .collect()
    }

    /// Bytes of one step across all fields.
    pub fn step_bytes(&self) -> usize {
        self.fields.iter().map(Field::row_bytes).sum()
    }

    /// Rows a writer puts before the rows of a stacked field's steps so that every
    /// step's frames lie in its own block: the largest stack less one (0 without
    /// stacked fields).
    pub fn lead(&self) -> u32 {
        self.fields.iter().map(|f| f.stack).max().unwrap_or(1) - 1
    }

    /// `{obs: uint8[84,84] stack:4 zstd:3, action: int64[]}`.
    pub fn describe(&self) -> String {
        let parts: Vec<String> = self
            .fields
            .iter()
            .map(|f| {
                let mut s = format!("{}: {}", f.name, f.describe());
                if f.stack > 1 {
                    s += &format!(" stack:{}", f.stack);
                    if f.padding == StackPadding::Zero {
                        s += " pad:zero";
                    }
                }
                if let Some(l) = f.compress {
                    s += &format!(" zstd:{l}");
                }
                s
            })
            .collect();
        format!("{{{}}}", parts.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dtype_names_round_trip() {
        for d in DType::ALL {
            assert_eq!(DType::from_name(d.name()).unwrap(), d);
        }
    }

    #[test]
    fn unknown_dtype_lists_the_known_ones() {
        let e = DType::from_name("complex64").unwrap_err().to_string();
        assert!(e.contains("complex64") && e.contains("float32"), "{e}");
    }

    #[test]
    fn row_bytes_follow_shape_and_dtype() {
        let f = Field::new("obs", DType::UInt8, vec![4, 84, 84]).unwrap();
        assert_eq!(f.row_bytes(), 4 * 84 * 84);
        assert_eq!(f.describe(), "uint8[4,84,84]");
        let s = Field::new("r", DType::Float32, vec![]).unwrap();
        assert_eq!(s.row_bytes(), 4);
    }

    #[test]
    fn compression_levels_are_checked_and_described() {
        let f = Field::new("obs", DType::UInt8, vec![84, 84]).unwrap();
        let sig = Signature::new(vec![f.clone().compressed(Some(3)).unwrap()]).unwrap();
        assert_eq!(sig.describe(), "{obs: uint8[84,84] zstd:3}");
        for bad in [0, -1, 20] {
            let e = f.clone().compressed(Some(bad)).unwrap_err().to_string();
            assert!(e.contains("'obs'") && e.contains(&bad.to_string()) && e.contains("1 to 19"), "{e}");
        }
    }

    #[test]
    fn stacks_are_checked_sized_and_described() {
        let f = Field::new("obs", DType::UInt8, vec![84, 84]).unwrap();
        let s = f.clone().stacked(4, StackPadding::Zero).unwrap();
        assert_eq!((s.row_bytes(), s.sample_bytes(), s.sample_shape()), (84 * 84, 4 * 84 * 84, vec![4, 84, 84]));
        let sig = Signature::new(vec![s, Field::new("a", DType::Int64, vec![]).unwrap()]).unwrap();
        assert_eq!(sig.describe(), "{obs: uint8[84,84] stack:4 pad:zero, a: int64[]}");
        assert_eq!(sig.lead(), 3);
        for bad in [0, MAX_STACK + 1] {
            let e = f.clone().stacked(bad, StackPadding::Reset).unwrap_err().to_string();
            assert!(e.contains("'obs'") && e.contains(&format!("stack={bad}")) && e.contains("1 (no stack) to 64"), "{e}");
        }
        assert!(StackPadding::from_name("edge").unwrap_err().to_string().contains("'reset'"));
    }

    #[test]
    fn zero_dimension_is_rejected() {
        let e = Field::new("x", DType::Float32, vec![3, 0]).unwrap_err().to_string();
        assert!(e.contains("'x'") && e.contains(">= 1"), "{e}");
    }

    #[test]
    fn duplicate_and_empty_signatures_are_rejected() {
        let f = Field::new("x", DType::Int8, vec![]).unwrap();
        assert!(Signature::new(vec![f.clone(), f]).unwrap_err().to_string().contains("twice"));
        assert!(Signature::new(vec![]).is_err());
    }
}
