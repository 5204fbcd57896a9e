//! `reprise.v1.SampleResponse`, written by hand instead of generated, so that a
//! server can send sampled rows with one copy: a column may be [`Column::Rows`], a
//! range of items of a drawn [`SampleBatch`] that is gathered from the store straight
//! into the outgoing message when tonic encodes it (no column buffer in between).
//! Decoding (the client) reads every column as [`Column::Bytes`], a slice of the
//! received message. The wire format is exactly the one `replay.proto` declares.

use std::fmt;
use std::ops::Range;
use std::sync::Arc;

use prost::bytes::{Buf, BufMut, Bytes};
use prost::encoding::{self, DecodeContext, WireType};
use prost::DecodeError;
use reprise_core::{Collect, SampleBatch};

/// One column of a response: bytes already at hand, or rows still in the store.
#[derive(Clone)]
pub enum Column {
    Bytes(Bytes),
    Rows(Rows),
}

/// Items `items` of column `column` of a drawn batch, laid out `[len, t_max, row]`
/// (zero past each item's length). Holding it keeps the batch, and so its rows, alive.
#[derive(Clone)]
pub struct Rows {
    pub batch: Arc<SampleBatch>,
    pub column: usize,
    pub t_max: u32,
    pub items: Range<usize>,
}

impl Rows {
    /// Bytes these rows take on the wire.
    pub fn len(&self) -> usize {
        self.items.len() * self.t_max as usize * self.batch.columns().sample_bytes(self.column)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Column {
    pub fn len(&self) -> usize {
        match self {
            Column::Bytes(b) => b.len(),
            Column::Rows(r) => r.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The bytes of a received column (rows still in a store have none yet).
    pub fn bytes(&self) -> Option<&Bytes> {
        match self {
            Column::Bytes(b) => Some(b),
            Column::Rows(_) => None,
        }
    }
}

impl From<Bytes> for Column {
    fn from(b: Bytes) -> Self {
        Column::Bytes(b)
    }
}

impl From<Vec<u8>> for Column {
    fn from(v: Vec<u8>) -> Self {
        Column::Bytes(v.into())
    }
}

impl fmt::Debug for Column {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Column::Bytes(b) => write!(f, "Bytes({} bytes)", b.len()),
            Column::Rows(r) => write!(f, "Rows(column {}, items {:?}, {} bytes)", r.column, r.items, r.len()),
        }
    }
}

/// One answer on a `Sample` stream: a whole batch, or one part of a batch sent in
/// parts (`more`: parts follow; the items are in the first part only).
#[derive(Clone, Debug, Default)]
pub struct SampleResponse {
    pub keys: Vec<u64>,
    pub probabilities: Vec<f64>,
    pub priorities: Vec<f64>,
    pub times_sampled: Vec<u32>,
    pub table_size: u64,
    pub lengths: Vec<u32>,
    pub max_length: u32,
    pub fields: Vec<String>,
    pub columns: Vec<Column>,
    pub partial: bool,
    pub more: bool,
    /// One column per item attribute, in the table's order (first part only).
    pub attributes: Vec<Bytes>,
}

const KEYS: u32 = 1;
const PROBABILITIES: u32 = 2;
const PRIORITIES: u32 = 3;
const TIMES_SAMPLED: u32 = 4;
const TABLE_SIZE: u32 = 5;
const LENGTHS: u32 = 6;
const MAX_LENGTH: u32 = 7;
const FIELDS: u32 = 8;
const COLUMNS: u32 = 9;
const PARTIAL: u32 = 10;
const MORE: u32 = 11;
const ATTRIBUTES: u32 = 12;

impl SampleResponse {
    /// Bytes of column data in this message.
    pub fn column_bytes(&self) -> usize {
        self.columns.iter().map(Column::len).sum()
    }
}

impl prost::Message for SampleResponse {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        encoding::uint64::encode_packed(KEYS, &self.keys, buf);
        encoding::double::encode_packed(PROBABILITIES, &self.probabilities, buf);
        encoding::double::encode_packed(PRIORITIES, &self.priorities, buf);
        encoding::uint32::encode_packed(TIMES_SAMPLED, &self.times_sampled, buf);
        if self.table_size != 0 {
            encoding::uint64::encode(TABLE_SIZE, &self.table_size, buf);
        }
        encoding::uint32::encode_packed(LENGTHS, &self.lengths, buf);
        if self.max_length != 0 {
            encoding::uint32::encode(MAX_LENGTH, &self.max_length, buf);
        }
        encoding::string::encode_repeated(FIELDS, &self.fields, buf);
        for column in &self.columns {
            encoding::encode_key(COLUMNS, WireType::LengthDelimited, buf);
            encoding::encode_varint(column.len() as u64, buf);
            match column {
                Column::Bytes(b) => buf.put_slice(b),
                // The one copy of a sampled row: from the store into the message.
                Column::Rows(r) => r.batch.for_each_slice(r.column, r.t_max, r.items.clone(), |s| buf.put_slice(s)),
            }
        }
        if self.partial {
            encoding::bool::encode(PARTIAL, &self.partial, buf);
        }
        if self.more {
            encoding::bool::encode(MORE, &self.more, buf);
        }
        encoding::bytes::encode_repeated(ATTRIBUTES, &self.attributes, buf);
    }

    fn merge_field(&mut self, tag: u32, wire_type: WireType, buf: &mut impl Buf, ctx: DecodeContext) -> Result<(), DecodeError> {
        match tag {
            KEYS => encoding::uint64::merge_repeated(wire_type, &mut self.keys, buf, ctx),
            PROBABILITIES => encoding::double::merge_repeated(wire_type, &mut self.probabilities, buf, ctx),
            PRIORITIES => encoding::double::merge_repeated(wire_type, &mut self.priorities, buf, ctx),
            TIMES_SAMPLED => encoding::uint32::merge_repeated(wire_type, &mut self.times_sampled, buf, ctx),
            TABLE_SIZE => encoding::uint64::merge(wire_type, &mut self.table_size, buf, ctx),
            LENGTHS => encoding::uint32::merge_repeated(wire_type, &mut self.lengths, buf, ctx),
            MAX_LENGTH => encoding::uint32::merge(wire_type, &mut self.max_length, buf, ctx),
            FIELDS => encoding::string::merge_repeated(wire_type, &mut self.fields, buf, ctx),
            COLUMNS => {
                let mut b = Bytes::new();
                encoding::bytes::merge(wire_type, &mut b, buf, ctx)?;
                self.columns.push(Column::Bytes(b));
                Ok(())
            }
            PARTIAL => encoding::bool::merge(wire_type, &mut self.partial, buf, ctx),
            MORE => encoding::bool::merge(wire_type, &mut self.more, buf, ctx),
            ATTRIBUTES => encoding::bytes::merge_repeated(wire_type, &mut self.attributes, buf, ctx),
            _ => encoding::skip_field(wire_type, tag, buf, ctx),
        }
    }

    fn encoded_len(&self) -> usize {
        let columns: usize = self
            .columns
            .iter()
            .map(|c| encoding::key_len(COLUMNS) + encoding::encoded_len_varint(c.len() as u64) + c.len())
            .sum();
        encoding::uint64::encoded_len_packed(KEYS, &self.keys)
            + encoding::double::encoded_len_packed(PROBABILITIES, &self.probabilities)
            + encoding::double::encoded_len_packed(PRIORITIES, &self.priorities)
            + encoding::uint32::encoded_len_packed(TIMES_SAMPLED, &self.times_sampled)
            + if self.table_size != 0 { encoding::uint64::encoded_len(TABLE_SIZE, &self.table_size) } else { 0 }
            + encoding::uint32::encoded_len_packed(LENGTHS, &self.lengths)
            + if self.max_length != 0 { encoding::uint32::encoded_len(MAX_LENGTH, &self.max_length) } else { 0 }
            + encoding::string::encoded_len_repeated(FIELDS, &self.fields)
            + columns
            + if self.partial { encoding::bool::encoded_len(PARTIAL, &self.partial) } else { 0 }
            + if self.more { encoding::bool::encoded_len(MORE, &self.more) } else { 0 }
            + encoding::bytes::encoded_len_repeated(ATTRIBUTES, &self.attributes)
    }

    fn clear(&mut self) {
        *self = SampleResponse::default();
    }
}
