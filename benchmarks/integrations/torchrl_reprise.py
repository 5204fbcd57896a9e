"""TorchRL's replay buffers over ``reprise.integrations.torchrl``: the core suite's TorchRL
side (``peers/torchrl_core.py``) with ``RepriseStorage`` in place of ``LazyTensorStorage``
and ``ReprisePrioritizedSampler`` in place of ``PrioritizedSampler``; everything else, the
tensors, calls and timing, is the same. Runs in the python that has reprise and torchrl:
``python -m benchmarks.integrations.torchrl_reprise [--quick] [--only KEYS]``.

Paths: ``ReplayBuffer(storage=RepriseStorage(N))`` with ``extend`` of a [256, k] tensor /
``add`` of one [k] tensor, ``sample()`` then ``.numpy()``; ``ReplayBuffer(storage=
RepriseStorage(N), sampler=ReprisePrioritizedSampler(alpha=0.6, beta=0.4))`` with
``sample(return_info=True)`` + ``update_priority``. TORCHRL_THREADS=N sets torch's
intra-op threads, as for the LazyTensorStorage side.
"""

from __future__ import annotations

import os

import torch
from reprise.integrations.torchrl import ReprisePrioritizedSampler, RepriseStorage
from torchrl.data import ReplayBuffer

from benchmarks.common.bench import package_versions
from benchmarks.core.workloads import IMPORTANCE_BETA, core_bench, standard_suite
from benchmarks.peers.torchrl_core import Buffers, workloads


class RepriseBuffers(Buffers):
    storage = "RepriseStorage"
    prioritized_path = "ReplayBuffer(RepriseStorage, ReprisePrioritizedSampler(alpha=0.6))"

    def plain(self, capacity: int, batch: int):
        return ReplayBuffer(storage=RepriseStorage(capacity), batch_size=batch)

    def prioritized(self, capacity: int, batch: int, exponent: float):
        return ReplayBuffer(storage=RepriseStorage(capacity), batch_size=batch,
                            sampler=ReprisePrioritizedSampler(alpha=exponent, beta=IMPORTANCE_BETA))

    def close(self, rb):
        def close() -> None:
            rb.storage.close()  # the store's shared-memory file goes now, not at garbage collection
        return close


def main() -> None:
    bench = core_bench("torchrl-reprise")
    if os.environ.get("TORCHRL_THREADS"):
        torch.set_num_threads(int(os.environ["TORCHRL_THREADS"]))
    bench.versions.update(package_versions("torchrl", "tensordict", "torch", "reprise"))
    bench.notes.append(f"torch intra-op threads: {torch.get_num_threads()}")
    standard_suite(bench, *workloads(RepriseBuffers()))
    bench.finish()


if __name__ == "__main__":
    main()
