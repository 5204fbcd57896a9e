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

import numpy as np
import torch
from reprise.integrations.torchrl import ReprisePrioritizedSampler, RepriseStorage
from torchrl.data import ReplayBuffer

from benchmarks.common.bench import package_versions
from benchmarks.common.payload import PriorityStream, check_batch, fill_batches, fill_rows, random_priorities
from benchmarks.core.workloads import IMPORTANCE_BETA, Workload, core_bench, standard_suite
from benchmarks.peers.torchrl_core import FILL_CHUNK, tensor_payload


def closer(rb: ReplayBuffer):
    def close() -> None:
        rb.storage.close()  # the store's shared-memory file goes now, not at garbage collection
    return close


def insert_batched(floats: int, capacity: int, batch: int) -> Workload:
    rb = ReplayBuffer(storage=RepriseStorage(capacity), batch_size=batch)
    src = tensor_payload(batch, floats)
    for _ in range(-(-capacity // batch)):  # full, and the ring wrapped once
        rb.extend(src)
    return Workload(call=lambda: rb.extend(src), units_per_call=batch,
                    path="ReplayBuffer(RepriseStorage).extend(float32[256,k])", close=closer(rb))


def insert_step(floats: int, capacity: int) -> Workload:
    rb = ReplayBuffer(storage=RepriseStorage(capacity), batch_size=256)
    rows = list(tensor_payload(256, floats))

    def call() -> None:
        add = rb.add
        for a in rows:
            add(a)

    for _ in range(-(-capacity // 256)):
        call()
    return Workload(call=call, units_per_call=256, path="ReplayBuffer(RepriseStorage).add(float32[k])",
                    close=closer(rb))


def sample_uniform(floats: int, n_items: int, batch: int) -> Workload:
    rb = ReplayBuffer(storage=RepriseStorage(n_items), batch_size=batch)
    src = tensor_payload(fill_rows(n_items, floats, FILL_CHUNK), floats)
    for start, stop in fill_batches(n_items, len(src)):
        rb.extend(src[: stop - start])
    assert len(rb) == n_items
    check_batch(rb.sample().numpy(), batch, floats)
    return Workload(call=lambda: rb.sample().numpy(), units_per_call=batch,
                    path="ReplayBuffer(RepriseStorage, RandomSampler).sample(256).numpy()", close=closer(rb))


def prioritized(floats: int, n_items: int, batch: int, exponent: float) -> Workload:
    rb = ReplayBuffer(storage=RepriseStorage(n_items),
                      sampler=ReprisePrioritizedSampler(alpha=exponent, beta=IMPORTANCE_BETA), batch_size=batch)
    src = tensor_payload(FILL_CHUNK, floats)
    prios = torch.from_numpy(random_priorities(n_items)).float()  # the same values as the other side
    for start, stop in fill_batches(n_items, FILL_CHUNK):
        idx = rb.extend(src[: stop - start])
        rb.update_priority(idx, prios[start:stop])
    assert len(rb) == n_items
    new = PriorityStream(batch, dtype=np.float32)
    check_batch(rb.sample().numpy(), batch, floats)

    def call() -> None:
        data, info = rb.sample(return_info=True)
        _ = data.numpy()
        rb.update_priority(info["index"], torch.from_numpy(new.next()))

    return Workload(call=call, units_per_call=1,
                    path="ReplayBuffer(RepriseStorage, ReprisePrioritizedSampler(alpha=0.6))"
                         ".sample(return_info=True) + update_priority",
                    close=closer(rb))


def main() -> None:
    bench = core_bench("torchrl-reprise")
    if os.environ.get("TORCHRL_THREADS"):
        torch.set_num_threads(int(os.environ["TORCHRL_THREADS"]))
    bench.versions.update(package_versions("torchrl", "tensordict", "torch", "reprise"))
    bench.notes.append(f"torch intra-op threads: {torch.get_num_threads()}")
    standard_suite(bench, insert_batched, insert_step, sample_uniform, prioritized)
    bench.finish()


if __name__ == "__main__":
    main()
