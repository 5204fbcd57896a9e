//! The wire types and gRPC stubs of `proto/reprise/v1/replay.proto`.
#![allow(clippy::all, missing_docs)]

tonic::include_proto!("reprise.v1");

pub use crate::sample::{Column, Rows, SampleResponse};

/// The protocol version this build speaks (`Layout.protocol_version`).
pub const PROTOCOL_VERSION: u32 = 1;

impl From<reprise_core::TableInfo> for TableInfo {
    fn from(i: reprise_core::TableInfo) -> Self {
        TableInfo {
            name: i.name,
            size: i.size,
            max_size: i.max_size,
            max_times_sampled: i.max_times_sampled,
            sampler: i.sampler,
            remover: i.remover,
            num_inserts: i.num_inserts,
            num_samples: i.num_samples,
            num_evictions: i.num_evictions,
            num_deletes: i.num_deletes,
            num_store_evictions: i.num_store_evictions,
            samples_per_insert: i.rate_limiter.samples_per_insert,
            min_size_to_sample: i.rate_limiter.min_size_to_sample,
            min_diff: i.rate_limiter.min_diff,
            max_diff: i.rate_limiter.max_diff,
            limiter_inserts: i.limiter_inserts,
            limiter_samples: i.limiter_samples,
            blocked_insert_seconds: i.blocked_insert_seconds,
            blocked_sample_seconds: i.blocked_sample_seconds,
            version: i.version,
            stale_removed: i.stale_removed,
            stale_dropped: i.stale_dropped,
            groups_json: i.groups.map(|g| g.to_string()).unwrap_or_default(),
            attribute_names: i.attributes.iter().map(|a| a.0.clone()).collect(),
            attribute_dtypes: i.attributes.into_iter().map(|a| a.1).collect(),
            store_raw_bytes: i.store_raw_bytes,
            store_stored_bytes: i.store_stored_bytes,
        }
    }
}

impl From<TableInfo> for reprise_core::TableInfo {
    fn from(i: TableInfo) -> Self {
        let rate_limiter = reprise_core::RateLimiterConfig {
            samples_per_insert: i.samples_per_insert,
            min_size_to_sample: i.min_size_to_sample,
            min_diff: i.min_diff,
            max_diff: i.max_diff,
        };
        reprise_core::TableInfo {
            name: i.name,
            size: i.size,
            max_size: i.max_size,
            max_times_sampled: i.max_times_sampled,
            sampler: i.sampler,
            remover: i.remover,
            num_inserts: i.num_inserts,
            num_samples: i.num_samples,
            num_evictions: i.num_evictions,
            num_deletes: i.num_deletes,
            num_store_evictions: i.num_store_evictions,
            rate_limiter,
            limiter_inserts: i.limiter_inserts,
            limiter_samples: i.limiter_samples,
            blocked_insert_seconds: i.blocked_insert_seconds,
            blocked_sample_seconds: i.blocked_sample_seconds,
            version: i.version,
            stale_removed: i.stale_removed,
            stale_dropped: i.stale_dropped,
            groups: serde_json::from_str(&i.groups_json).ok(),
            attributes: i.attribute_names.into_iter().zip(i.attribute_dtypes).collect(),
            store_raw_bytes: i.store_raw_bytes,
            store_stored_bytes: i.store_stored_bytes,
        }
    }
}
