"""Cluster mode (issue 13): ``rp.distributed.ShardedTable.sample`` on N gloo ranks of this
machine against bare ``torch.distributed`` collectives on the same ranks and group
(``compare.py``; the ranks' side in ``measure.py``, spawning them with ``reprise.distributed.local_ranks``, the
multi-host step model in ``model.py``)."""
