"""A TorchRL storage and prioritized sampler over a Reprise table.

``RepriseStorage`` is a ``torchrl.data`` storage: TorchRL's writers address it by
position (0 .. max_size - 1), its samplers draw positions, ``get`` returns TensorDicts.
Each position holds one one-step item of a Reprise table, so the data lives in a
Reprise store in shared memory, and the table can be served (``rp.Server``),
checkpointed (``rp.checkpoint``) and gathered on a GPU. ``ReprisePrioritizedSampler``
is TorchRL's ``PrioritizedSampler`` with the priorities in that table's f64 sum tree.

Modules, in import order (each imports only those before it):

- ``signature``: the fields an element is stored as, fixed by the first write
  (``field_name``/``key_of``), checking writes and rebuilding elements;
- ``indexing``: TorchRL indices as positions;
- ``reading``: gathering rows out of the store (host or GPU);
- ``persistence``: ``state_dict``, ``dumps``/``loads``;
- ``storage``: ``RepriseStorage`` (positions to items, writes, reads, pickling);
- ``sampler``: ``ReprisePrioritizedSampler``.

Not supported: storages of more than one dimension (``ndim > 1``), non-tensor leaves,
device stores, and sharing a storage with spawned processes (a pickle is a copy: serve
``storage.table`` with ``rp.Server`` instead). Items inserted into the table by others
are not part of the buffer; clients of a served table should sample and update
priorities, not insert, delete or reset.
"""

from __future__ import annotations

try:
    import tensordict  # noqa: F401
    import torch  # noqa: F401
    import torchrl.data  # noqa: F401

    from .sampler import ReprisePrioritizedSampler
    from .signature import field_name, key_of
    from .storage import RepriseStorage
except ImportError as e:  # pragma: no cover - depends on the environment (a TorchRL without what is used here)
    raise ImportError(f"reprise.integrations.torchrl needs TorchRL ({e}): pip install 'reprise[torchrl]'") from e

__all__ = ["RepriseStorage", "ReprisePrioritizedSampler", "field_name", "key_of"]
