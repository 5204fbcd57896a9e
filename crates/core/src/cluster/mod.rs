//! Cluster mode's arithmetic: the replicated plan of one global draw over the
//! shards of a `torch.distributed` job (Python owns the process groups and the
//! transport; this is the part every rank must compute bit for bit alike).
//!
//! * [`plan`]: draws with replacement (Uniform, Prioritized) from the shards'
//!   gathered figures and a counter-based generator keyed by (seed, table, step);
//! * [`merge`]: the ordered selectors (Fifo, Lifo, heaps, TopK) by a merge of
//!   each shard's local best;
//! * [`assign`]: which consumer receives each drawn position;
//! * [`tokens`]: how many positions a token-budget step keeps, and for whom;
//! * global keys, which carry their shard.

pub mod assign;
pub mod merge;
pub mod plan;
pub mod tokens;

/// Bits of a global key that name the shard (the top ones): 4096 shards at most.
pub const SHARD_BITS: u32 = 12;
/// Bits of a local key's generation a global key keeps.
pub const GENERATION_BITS: u32 = 32 - SHARD_BITS;
pub const MAX_SHARDS: usize = 1 << SHARD_BITS;

/// The global key of `local_key` (`generation << 32 | slot`) in `shard`: the
/// shard, the low [`GENERATION_BITS`] of the generation, the slot. A stale key
/// is recognised unless its slot was reused exactly 2^20 times since.
pub fn global_key(shard: u32, local_key: u64) -> u64 {
    let generation = (local_key >> 32) & ((1 << GENERATION_BITS) - 1);
    ((shard as u64) << (64 - SHARD_BITS)) | (generation << 32) | (local_key & 0xFFFF_FFFF)
}

/// `(shard, low generation bits, slot)` of a global key.
pub fn split_key(key: u64) -> (u32, u32, u32) {
    let shard = (key >> (64 - SHARD_BITS)) as u32;
    let generation = ((key >> 32) & ((1 << GENERATION_BITS) - 1)) as u32;
    (shard, generation, key as u32)
}

/// A table's id in the plan's generator key: FNV-1a of its name (stable across
/// processes, Python versions and platforms, unlike Python's `hash`).
pub fn table_id(name: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name.as_bytes() {
        h ^= *b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn global_keys_round_trip() {
        let local = (7u64 << 32) | 123;
        let g = global_key(4095, local);
        assert_eq!(split_key(g), (4095, 7, 123));
        let wrapped = ((1u64 << GENERATION_BITS) + 5) << 32 | 9;
        assert_eq!(split_key(global_key(3, wrapped)), (3, 5, 9));
    }

    #[test]
    fn table_ids_are_fnv1a() {
        assert_eq!(table_id(""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(table_id("a"), 0xaf63_dc4c_8601_ec8c);
        assert_ne!(table_id("replay"), table_id("replay2"));
    }
}
