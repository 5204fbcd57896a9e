"""TorchRL side of the GPU comparison: functions imported by ``benchmarks.gpu.compare``
(run alone: ``python -m benchmarks.peers.torchrl_gpu [cuda|cpu]`` from the repository root).

Written against torchrl 0.12.0 + tensordict 0.12.4, the release pair built for torch 2.11
(carried as wheels in ``.whl/``; install with ``pip install --no-index --no-deps --target``),
and kept working on newer torchrl (0.14.x in ``benchmarks/.venvs/torchrl``) for CPU smoke runs.

- ``collect_host``: ``ReplayBuffer(LazyTensorStorage(n, device="cpu"), RandomSampler,
  pin_memory=True, prefetch=None).sample()`` then ``.to(device, non_blocking=True)``: TorchRL's
  documented host-resident path (gather on the CPU, copy into pinned memory, async H2D copy).
- ``collect_device``: the same buffer with ``LazyTensorStorage(n, device=device)``: indices
  drawn on the device, gather on the device.
- ``prioritized``: ``PrioritizedSampler(max_capacity=n, alpha=0.6, beta=0.4)`` on its own, one
  round = ``sample(storage, batch)`` + ``update_priority(index, new_priorities)``. torchrl 0.12
  has only the CPU C++ segment trees; torchrl >= 0.13 has CUDA trees in source, used here when
  the installed extension was built with them (the PyPI wheels checked, 0.13.1 and 0.14.1, were not).

Every timed call ends with ``torch.cuda.synchronize()`` (on CUDA) inside host
``perf_counter`` timers; warm-up calls first; medians over ``repeats`` calls.
Runs on ``device="cpu"`` too (smoke tests; the pin_memory step is then skipped).
"""

from __future__ import annotations

import gc
import inspect
import statistics
import time

import torch
from torchrl.data import LazyTensorStorage, ReplayBuffer, TensorStorage
from torchrl.data.replay_buffers.samplers import PrioritizedSampler, RandomSampler

from benchmarks.common.timing import call_summary, call_times

FILL_CHUNK_BYTES = 64 << 20  # random source block reused while filling the storage
PRIO_FILL_CHUNK = 1_000_000  # update_priority chunk while filling the sum tree
PRIO_POOL = 64  # distinct pre-generated priority vectors cycled through the timed rounds


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _free() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def _time_calls(call, device: torch.device, repeats: int, warmup: int) -> list[float]:
    """Per-call seconds, each call closed by a device synchronize."""
    return call_times(call, warmup, repeats, sync=lambda: _sync(device))


def _filled_buffer(row_bytes: int, batch: int, n_items: int, storage_device: torch.device,
                   pin_memory: bool) -> tuple[ReplayBuffer, float]:
    floats = max(1, row_bytes // 4)
    rb = ReplayBuffer(storage=LazyTensorStorage(n_items, device=storage_device),
                      sampler=RandomSampler(), batch_size=batch,
                      pin_memory=pin_memory, prefetch=None)
    chunk = max(1, min(n_items, FILL_CHUNK_BYTES // (floats * 4)))
    gen = torch.Generator(device=storage_device).manual_seed(0)
    src = torch.randn(chunk, floats, generator=gen, device=storage_device)
    t0 = time.perf_counter()
    done = 0
    while done < n_items:
        k = min(chunk, n_items - done)
        rb.extend(src[:k])
        done += k
    _sync(storage_device)
    fill_s = time.perf_counter() - t0
    del src
    assert len(rb) == n_items, (len(rb), n_items)
    return rb, fill_s


def collect_host(row_bytes: int, batch: int, n_items: int, device: str = "cuda",
                 repeats: int = 200) -> dict:
    """Host-resident storage, uniform sample, pinned staging, async copy to ``device``."""
    dev = torch.device(device)
    pin = dev.type == "cuda"  # pin_memory() needs an accelerator
    return _collect(row_bytes, batch, n_items, dev, torch.device("cpu"), pin, repeats,
                    "ReplayBuffer(LazyTensorStorage(n, device='cpu'), RandomSampler(), "
                    f"pin_memory={pin}, prefetch=None).sample() + .to({dev.type!r}, "
                    "non_blocking=True) + synchronize")


def collect_device(row_bytes: int, batch: int, n_items: int, device: str = "cuda",
                   repeats: int = 200) -> dict:
    """Device-resident storage: indices drawn and rows gathered on ``device``."""
    dev = torch.device(device)
    return _collect(row_bytes, batch, n_items, dev, dev, False, repeats,
                    f"ReplayBuffer(LazyTensorStorage(n, device={dev.type!r}), RandomSampler(), "
                    "prefetch=None).sample() (torch.randint + gather on the device) + "
                    "synchronize; gbps = sampled bytes delivered on the device per second")


def _collect(row_bytes: int, batch: int, n_items: int, dev, storage_device, pin: bool,
             repeats: int, path: str) -> dict:
    """``rb.sample().to(dev, non_blocking=True)`` (a no-op where the storage is on ``dev``)
    over a filled buffer on ``storage_device``, timed per call."""
    rb, fill_s = _filled_buffer(row_bytes, batch, n_items, storage_device, pin)
    floats = max(1, row_bytes // 4)

    def call():
        return rb.sample().to(dev, non_blocking=True)

    out = call()
    assert out.shape == (batch, floats) and out.device.type == dev.type, (out.shape, out.device)
    del out
    times = _time_calls(call, dev, repeats, warmup=max(10, repeats // 10))
    res = call_summary(times, nbytes=batch * floats * 4)
    res.update(fill_s=fill_s, n_items=n_items, batch=batch, row_bytes=floats * 4, device=str(dev),
               path=path)
    del rb, call
    _free()
    return res


def cuda_trees_available() -> bool:
    """True when the installed TorchRL can hold PrioritizedSampler trees on a CUDA device."""
    try:
        from torchrl import _torchrl
    except ImportError:
        return False
    return (hasattr(_torchrl, "CudaSumSegmentTreeFp32")
            and "device" in inspect.signature(PrioritizedSampler.__init__).parameters)


def prioritized(n_items: int, batch: int, device: str = "cuda", repeats: int = 200,
                alpha: float = 0.6, beta: float = 0.4) -> dict:
    """PrioritizedSampler alone: fill ``n_items`` priorities, then time sample + update rounds.

    ``us_median``: a learner's round on ``device``: sample ``batch`` indices + importance
    weights, move both to ``device``, then ``update_priority`` with ``batch`` new float32
    priorities that live on ``device`` (TorchRL copies them back to its host tree).
    ``us_median_host``: the same round with everything on the host (no device traffic).
    Memory: the two float32 trees take 2 * 2 * next_pow2(n_items) * 4 B (~2.1 GB at 1e8);
    the storage handed to the sampler is a 1-byte expanded view (no per-item memory).
    """
    dev = torch.device(device)
    on_gpu_tree = dev.type == "cuda" and cuda_trees_available()
    kwargs = {"device": dev} if on_gpu_tree else {}
    tree_dev = dev if on_gpu_tree else torch.device("cpu")
    sampler = PrioritizedSampler(max_capacity=n_items, alpha=alpha, beta=beta,
                                 dtype=torch.float32, **kwargs)
    # The sampler only needs len(storage) and storage.ndim (and the device, for the CUDA
    # trees): a zero-stride uint8 view of length n_items is a real TensorStorage at no cost.
    storage = TensorStorage(torch.zeros(1, dtype=torch.uint8, device=tree_dev).expand(n_items),
                            device=tree_dev)
    assert len(storage) == n_items

    gen = torch.Generator(device="cpu").manual_seed(1)
    t0 = time.perf_counter()
    for start in range(0, n_items, PRIO_FILL_CHUNK):
        stop = min(n_items, start + PRIO_FILL_CHUNK)
        idx = torch.arange(start, stop, dtype=torch.long, device=tree_dev)
        prio = torch.rand(stop - start, generator=gen, dtype=torch.float32).add_(1e-3)
        sampler.update_priority(idx, prio.to(tree_dev))
    _sync(dev)
    fill_s = time.perf_counter() - t0
    del idx, prio

    pool_host = [torch.rand(batch, generator=gen, dtype=torch.float32).add_(1e-3)
                 for _ in range(PRIO_POOL)]
    pool_dev = [p.to(dev) for p in pool_host]
    state = {"k": 0}

    def round_device():
        index, info = sampler.sample(storage, batch)
        index_d = index.to(dev, non_blocking=True)
        weight_d = info["priority_weight"].to(dev, non_blocking=True)
        k = state["k"] = (state["k"] + 1) % PRIO_POOL
        sampler.update_priority(index, pool_dev[k])
        return index_d, weight_d

    def round_host():
        index, info = sampler.sample(storage, batch)
        k = state["k"] = (state["k"] + 1) % PRIO_POOL
        sampler.update_priority(index, pool_host[k])
        return index, info["priority_weight"]

    i, w = round_device()
    assert i.shape == (batch,) and w.shape == (batch,), (i.shape, w.shape)
    assert int(i.max()) < n_items and int(i.min()) >= 0
    del i, w
    warmup = max(10, repeats // 10)
    t_dev = _time_calls(round_device, dev, repeats, warmup)
    t_host = _time_calls(round_host, torch.device("cpu"), repeats, warmup)
    res = call_summary(t_dev)
    res["us_median_host"] = statistics.median(t_host) * 1e6
    tree = "CUDA segment trees" if on_gpu_tree else "CPU C++ SumSegmentTreeFp32/MinSegmentTreeFp32"
    res.update(fill_s=fill_s, fill_chunk=PRIO_FILL_CHUNK, n_items=n_items, batch=batch,
               device=str(dev), tree_device=str(tree_dev), cuda_trees_available=on_gpu_tree,
               path=(f"PrioritizedSampler(max_capacity=n, alpha={alpha}, beta={beta}) on {tree}: "
                     f"sample(storage, {batch}) + index/weights .to({dev.type!r}) + "
                     f"update_priority(index, float32[{batch}] on {dev.type!r}) + synchronize; "
                     f"filled by update_priority over {PRIO_FILL_CHUNK:,}-index chunks"))
    del sampler, storage, pool_host, pool_dev, round_device, round_host
    _free()
    return res


def versions() -> dict:
    from importlib.metadata import version
    out = {p: version(p) for p in ("torchrl", "tensordict")}
    out["torch"] = torch.__version__
    out["cuda_prioritized_trees"] = cuda_trees_available()
    return out


if __name__ == "__main__":
    import json
    import sys

    dev = sys.argv[1] if len(sys.argv) > 1 else ("cuda" if torch.cuda.is_available() else "cpu")
    print(json.dumps(versions()))
    print(json.dumps(collect_host(4096, 256, 10_000, dev, 50)))
    print(json.dumps(collect_device(4096, 256, 10_000, dev, 50)))
    print(json.dumps(prioritized(1_000_000, 256, dev, 100)))
