"""Cluster mode: one replay table sharded across the ranks of a torch.distributed
job (GEAR's design), sampled globally and deterministically, rows exchanged with
one ``all_to_all_single`` per step. See ``docs/cluster.md``.

    import reprise as rp
    table = rp.distributed.ShardedTable("replay", {"obs": rp.Field((4,), "float32")},
                                        capacity_per_shard=100_000, shards="rank", seed=0)
    table.insert({"obs": obs[:, None]}, priorities=1.0)   # this rank's shard
    batch = table.sample(256)                            # a collective
"""

from .placement import load_dataset
from .reference import ReferenceTable
from .table import ShardedTable
from .topology import consumers

__all__ = ["ShardedTable", "ReferenceTable", "load_dataset", "consumers"]
