"""TorchRL side of the core comparison; run with benchmarks/.venvs/torchrl/bin/python:
``benchmarks/.venvs/torchrl/bin/python -m benchmarks.peers.torchrl_core [--quick]`` (from
the repository root).

Paths: ``ReplayBuffer(storage=LazyTensorStorage(N))`` with ``extend`` of a [256, k]
tensor / ``add`` of one [k] tensor, ``sample()`` then ``.numpy()`` (zero-copy view of
the gathered batch), and ``PrioritizedReplayBuffer(alpha=0.6, beta=0.4)`` with
``sample(return_info=True)`` + ``update_priority``. Payload tensors wrap the same
numpy arrays as the other systems (``torch.from_numpy``, no copy). CPU storage; torch
keeps its default intra-op thread count (recorded in the output; TORCHRL_THREADS=N
overrides it). With 2 threads torch is very slow when the second core is busy.
"""

from __future__ import annotations

import os

import numpy as np
import torch
from torchrl.data import LazyTensorStorage, PrioritizedReplayBuffer, ReplayBuffer

from benchmarks.common.bench import package_versions
from benchmarks.common.payload import (PriorityStream, check_batch, fill_batches, fill_rows,
                                       payload, random_priorities)
from benchmarks.core.workloads import IMPORTANCE_BETA, Workload, core_bench, standard_suite

FILL_CHUNK = 4096


def tensor_payload(n: int, floats: int) -> torch.Tensor:
    return torch.from_numpy(payload(n, floats))


class Buffers:
    """How one side builds its buffers: the workloads below are the same for TorchRL's own
    storage (``LAZY``) and for any other storage behind the same ``ReplayBuffer`` API
    (``benchmarks/integrations/torchrl_reprise.py``)."""

    storage = "LazyTensorStorage"
    prioritized_path = "PrioritizedReplayBuffer(alpha=0.6, LazyTensorStorage)"

    def plain(self, capacity: int, batch: int):
        return ReplayBuffer(storage=LazyTensorStorage(capacity), batch_size=batch)

    def prioritized(self, capacity: int, batch: int, exponent: float):
        return PrioritizedReplayBuffer(alpha=exponent, beta=IMPORTANCE_BETA,
                                       storage=LazyTensorStorage(capacity), batch_size=batch)

    def close(self, rb):
        return rb.empty


def workloads(side: Buffers):
    """The core suite's four TorchRL workloads over ``side``'s buffers."""

    def insert_batched(floats: int, capacity: int, batch: int) -> Workload:
        rb = side.plain(capacity, batch)
        src = tensor_payload(batch, floats)
        for _ in range(-(-capacity // batch)):  # wrap the ring once: pages touched
            rb.extend(src)
        return Workload(call=lambda: rb.extend(src), units_per_call=batch,
                        path=f"ReplayBuffer({side.storage}).extend(float32[256,k])", close=side.close(rb))

    def insert_step(floats: int, capacity: int) -> Workload:
        rb = side.plain(capacity, 256)
        steps = 256
        rows = list(tensor_payload(steps, floats))

        def call() -> None:
            add = rb.add
            for a in rows:
                add(a)

        for _ in range(-(-capacity // steps)):
            call()
        return Workload(call=call, units_per_call=steps,
                        path=f"ReplayBuffer({side.storage}).add(float32[k])", close=side.close(rb))

    def sample_uniform(floats: int, n_items: int, batch: int) -> Workload:
        rb = side.plain(n_items, batch)
        src = tensor_payload(fill_rows(n_items, floats, FILL_CHUNK), floats)
        for start, stop in fill_batches(n_items, len(src)):
            rb.extend(src[: stop - start])
        assert len(rb) == n_items
        check_batch(rb.sample().numpy(), batch, floats)
        return Workload(call=lambda: rb.sample().numpy(), units_per_call=batch,
                        path=f"ReplayBuffer({side.storage}, RandomSampler).sample(256).numpy()",
                        close=side.close(rb))

    def prioritized(floats: int, n_items: int, batch: int, exponent: float) -> Workload:
        rb = side.prioritized(n_items, batch, exponent)
        src = tensor_payload(FILL_CHUNK, floats)
        prios = torch.from_numpy(random_priorities(n_items)).float()  # TorchRL's sum tree is float32
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
                        path=f"{side.prioritized_path}.sample(return_info=True) + update_priority",
                        close=side.close(rb))

    return insert_batched, insert_step, sample_uniform, prioritized


def main() -> None:
    bench = core_bench("torchrl")
    if os.environ.get("TORCHRL_THREADS"):
        torch.set_num_threads(int(os.environ["TORCHRL_THREADS"]))
    bench.versions.update(package_versions("torchrl", "tensordict", "torch"))
    bench.notes.append(f"torch intra-op threads: {torch.get_num_threads()}")
    standard_suite(bench, *workloads(Buffers()))
    bench.finish()


if __name__ == "__main__":
    main()
