"""In-network gradient aggregation (iSwitch): workers sum tensors through a UDP daemon.

    daemon = rp.aggregate.Daemon("127.0.0.1:0")          # or `reprise aggregate --config FILE`
    worker = rp.aggregate.Worker(daemon.address, job=1, rank=rank, world_size=world)
    total = worker.allreduce(gradient)                   # numpy array or torch tensor
    model.register_comm_hook(worker, rp.aggregate.ddp_hook)   # DDP through the daemon

Each call cuts the tensor into segments of ``segment_values`` values, streams them as UDP
packets, and the daemon sums every segment as its packets arrive and sends the finished
segment to every member: two link traversals per value instead of a parameter server's four.
``docs/aggregation.md`` has the protocol, the modes and their rules.

Modes:
- ``mode="sync"``: a segment finishes when every member contributed.
- ``mode="async"`` with ``threshold=H`` and ``staleness=S``: a segment finishes after the
  first H contributions; a late contribution is carried into the worker's next call, and one
  computed on weights more than S rounds old is refused (dropped).

``dtype="int32"`` is fixed point: values are rounded to ``round(x * scale)``, summed exactly
(the same result whatever order packets arrive in) and divided by ``scale`` again.
"""

from __future__ import annotations

import concurrent.futures
import weakref

import numpy as np

from .. import _native
from ..errors import InvalidArgument, RepriseError

__all__ = ["Daemon", "Worker", "ddp_hook", "quantize", "dequantize"]

_INT32_MAX = 2**31 - 1


class Daemon:
    """An aggregation daemon on a native thread of this process.

    ``address`` is ``IP:PORT`` to bind (``"127.0.0.1:0"`` picks a free port; beyond loopback
    a ``token`` or an ``allow`` list of member addresses is required). ``member_timeout`` drops
    a member a segment has waited that long for; ``drop_rate``/``seed`` drop that fraction of
    received packets, reproducibly (loss tests). ``upstream`` (with ``upstream_member`` and
    ``upstream_size``) makes this a rack daemon that forwards its partial sums to a parent.
    ``metrics_address`` serves Prometheus text at ``/metrics``. ``max_job_bytes`` and
    ``max_total_bytes`` bound the memory a job, and all jobs together, may hold (a job's
    most is ``window x (kept results + 1) x segment_values x 4`` bytes and a little per
    member); a Join that would create a job beyond either is refused naming the budget.
    ``offload`` (default on): UDP segmentation and receive offload where the kernel has them
    (one system call and one buffer for a run of packets; the datagrams on the wire are the
    same); off, one datagram a message.
    """

    def __init__(self, address: str = "127.0.0.1:0", *, token: str | None = None, allow: list[str] | None = None,
                 member_timeout: float = 30.0, max_jobs: int = 64, drop_rate: float = 0.0, seed: int = 0,
                 busy_poll: bool = False, transparent: bool = False, tos: int | None = None,
                 upstream: str | None = None, upstream_member: int = 0, upstream_size: int = 0,
                 metrics_address: str | None = None, max_job_bytes: int = 256 << 20, max_total_bytes: int = 1 << 30,
                 offload: bool = True):
        self._native = _native.AggregateDaemon(
            address, token=token, allow=list(allow or []), member_timeout=member_timeout, max_jobs=max_jobs,
            drop_rate=drop_rate, seed=seed, busy_poll=busy_poll, transparent=transparent, tos=tos,
            upstream=upstream, upstream_member=upstream_member, upstream_size=upstream_size,
            metrics_address=metrics_address, max_job_bytes=max_job_bytes, max_total_bytes=max_total_bytes,
            offload=bool(offload))

    @property
    def address(self) -> str:
        """The ``IP:PORT`` the daemon is bound to."""
        return self._native.address

    @property
    def metrics_address(self) -> str | None:
        return self._native.metrics_address

    def stats(self) -> dict:
        """Counters since start: packets, values aggregated, duplicates, late, stale, NAKs, ..."""
        return dict(self._native.stats())

    def metrics_text(self) -> str:
        return self._native.metrics_text()

    def stop(self) -> None:
        self._native.stop()

    def __enter__(self) -> "Daemon":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"Daemon({self.address!r})"


def quantize(x: np.ndarray, scale: float, members: int) -> np.ndarray:
    """``round(x * scale)`` as int32, refusing values whose sum over ``members`` could overflow."""
    q = np.rint(np.asarray(x, dtype=np.float64) * scale)
    limit = _INT32_MAX // max(members, 1)
    if q.size and not np.all(np.abs(q) <= limit):
        worst = float(np.max(np.abs(x))) if np.all(np.isfinite(x)) else float("nan")
        raise InvalidArgument(
            f"int32 mode: a value of magnitude {worst:g} times scale {scale:g} does not fit: the sum of {members} "
            f"members must stay within +-{_INT32_MAX}; expected |x| <= {limit / scale:g} (lower scale)")
    return q.astype(np.int32)


def dequantize(total: np.ndarray, scale: float) -> np.ndarray:
    """The float32 value of an int32 fixed-point sum."""
    return total.astype(np.float32) / np.float32(scale)


def _torch():
    try:
        import torch
        return torch
    except ImportError:  # pragma: no cover - torch is optional
        return None


class Worker:
    """A member of aggregation job ``job`` at the daemon ``address``, with id ``rank`` of
    ``world_size`` members (torch.distributed's names; ``size=`` is an alias of ``world_size``).

    Every member of a job must pass the same ``world_size``, ``mode``, ``dtype``, ``segment_values``
    (values per packet: 256 = 1 KiB fits a 1500-byte MTU; up to 8192 on loopback or jumbo
    frames), ``window`` (segments in flight) and ``staleness``. ``threshold`` (async) sets H,
    the contributions that finish a segment. ``timeout`` bounds how long a call may go
    without progress; ``rto`` is the first retransmission timeout. In sync mode a call whose
    result is partial (members dropped after the daemon's ``member_timeout``, or a segment
    force-broadcast) raises ``RepriseError`` unless ``allow_partial=True``. ``offload``: as
    the daemon's.
    """

    def __init__(self, address: str, job: int, rank: int, world_size: int | None = None, *, size: int | None = None,
                 mode: str = "sync", dtype: str = "float32",
                 scale: float = 65536.0, segment_values: int = 256, window: int = 128, staleness: int = 0,
                 threshold: int | None = None, token: str | None = None, timeout: float = 30.0, rto: float = 0.01,
                 drop_rate: float = 0.0, seed: int = 0, on_path: bool = False, allow_partial: bool = False,
                 offload: bool = True):
        size = _world_size(world_size, size)
        for name, value, low, high in (("job", job, 0, 2**32 - 1), ("rank", rank, 0, 65535),
                                       ("world_size", size, 1, 4096),
                                       ("segment_values", segment_values, 1, 8192), ("window", window, 1, 4096),
                                       ("staleness", staleness, 0, 64)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not low <= value <= high:
                raise InvalidArgument(f"{name} must be an integer in [{low}, {high}], got {value!r}")
        if rank >= size:
            raise InvalidArgument(f"rank {rank} must be below world_size {size}")
        if not (np.isfinite(scale) and scale > 0):
            raise InvalidArgument(f"scale must be a positive finite number, got {scale!r}")
        if threshold is not None and mode != "async":
            raise InvalidArgument(f"threshold={threshold} is for mode=\"async\"; sync mode waits for every member")
        self.job, self.rank, self.world_size, self.mode, self.dtype = int(job), int(rank), int(size), mode, dtype
        self.scale = float(scale)
        self.segment_values = int(segment_values)
        self._native = _native.AggregateWorker(address, int(job), int(rank), int(size), mode=mode, dtype=dtype,
                                               segment_values=int(segment_values), window=int(window),
                                               staleness=int(staleness), token=token, timeout=timeout, rto=rto,
                                               drop_rate=drop_rate, seed=seed, on_path=on_path, offload=bool(offload))
        self.address = address
        self.allow_partial = bool(allow_partial) or mode == "async"
        #: What the last ``allreduce`` saw: per-segment ``counts``, ``partial``, ``late``, ``stale``, ``retransmits``.
        self.last_report: dict = {}
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        if threshold is not None:
            self.set_threshold(threshold)

    def allreduce(self, x, *, average: bool = False):
        """The sum over the job's members of ``x`` (a numpy array or torch tensor of any shape).

        Returns a new array or tensor of ``x``'s type, shape, dtype and device. ``average``
        divides each segment by the contributions it summed (all members, unless members were
        dropped or the segment was force-broadcast). Float inputs are summed as float32 (or
        fixed point in int32 mode); int32 inputs in int32 mode are summed exactly.
        """
        torch = _torch()
        tensor = torch is not None and isinstance(x, torch.Tensor)
        array = x.detach().to("cpu").numpy() if tensor else np.asarray(x)
        shape, dtype = array.shape, array.dtype
        flat = np.ascontiguousarray(array).reshape(-1)
        if flat.size == 0:
            raise InvalidArgument("allreduce needs at least one value, got an empty array")
        integer = np.issubdtype(dtype, np.integer)
        if self.dtype == "int32":
            if integer and dtype != np.int32:
                raise InvalidArgument(f"int32 mode sums int32 or float arrays, got {dtype}")
            words = (flat if integer else quantize(flat, self.scale, self.world_size)).view(np.uint32)
        else:
            if integer:
                raise InvalidArgument(f"float32 mode sums float arrays, got {dtype}; use dtype=\"int32\" for integers")
            words = flat.astype(np.float32, copy=False).view(np.uint32)
        out = np.empty_like(words)
        report = self._native.allreduce(np.ascontiguousarray(words), out)
        self.last_report = report
        if report["partial"] and not self.allow_partial:
            counts = report["counts"]
            raise RepriseError(
                f"job {self.job}: {report['partial']} of {len(counts)} segments were summed over fewer than the "
                f"{self.world_size} members (as few as {int(counts.min())}): members were dropped after the daemon's "
                f"member_timeout, or a segment was force-broadcast. Pass allow_partial=True to take partial sums "
                f"(average=True divides each segment by its count); last_report['counts'] has them")
        if self.dtype == "int32":
            result = out.view(np.int32) if integer else dequantize(out.view(np.int32), self.scale)
        else:
            result = out.view(np.float32)
        if average:
            counts = np.repeat(report["counts"].astype(np.float32), self.segment_values)[:flat.size]
            result = result.astype(np.float32) / np.maximum(counts, 1)
        result = result.reshape(shape)
        if not integer:
            result = result.astype(dtype, copy=False)
        if tensor:
            return torch.from_numpy(np.ascontiguousarray(result)).to(device=x.device)
        return result

    @property
    def size(self) -> int:
        """``world_size``, by the name ``Worker(size=...)`` also accepts."""
        return self.world_size

    def allreduce_async(self, x, *, average: bool = False) -> concurrent.futures.Future:
        """``allreduce`` on this worker's background thread (calls run in order, one at a time)."""
        if self._executor is None:
            self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="reprise-aggregate")
            weakref.finalize(self, self._executor.shutdown, wait=False)
        return self._executor.submit(self.allreduce, x, average=average)

    def set_threshold(self, h: int) -> int:
        """SetH: segments that start from now on finish after ``h`` contributions (0: every
        member). Returns the threshold now in force."""
        return self._native.set_h(int(h))

    def reset(self) -> None:
        """Reset: clears the job's slots. Every member must call it (between rounds): each
        member's segment numbers restart at 0."""
        self._native.reset()

    def fbcast(self, seq: int) -> bool:
        """FBcast: asks the daemon to broadcast segment ``seq`` now with what it has summed
        (a partial result). Returns whether the segment was open."""
        return self._native.fbcast(int(seq))

    @property
    def position(self) -> tuple[int, int]:
        """(the next segment number, the next round)."""
        return tuple(self._native.position())

    def close(self) -> None:
        """Leave: open segments stop waiting for this worker."""
        if self._executor is not None:
            self._executor.shutdown(wait=True)
        self._native.leave()

    def __enter__(self) -> "Worker":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Worker({self.address!r}, job={self.job}, rank={self.rank}, world_size={self.world_size}, mode={self.mode!r}, dtype={self.dtype!r})"


def _world_size(world_size, size):
    """The member count from ``world_size=`` or its alias ``size=``: one of them, or both equal."""
    if world_size is None and size is None:
        raise InvalidArgument("Worker needs world_size (the members of the job), got neither world_size nor size")
    if world_size is not None and size is not None and world_size != size:
        raise InvalidArgument(f"world_size={world_size!r} and size={size!r} disagree; size is an alias of "
                              f"world_size: pass one of them")
    return size if world_size is None else world_size


def ddp_hook(worker: Worker, bucket):
    """A ``DistributedDataParallel`` communication hook that averages each gradient bucket
    through the daemon: ``model.register_comm_hook(worker, rp.aggregate.ddp_hook)``.

    Buckets aggregate on the worker's background thread (in order), so backward keeps running
    while they are in flight, as with DDP's own all-reduce.
    """
    torch = _torch()
    tensor = bucket.buffer()
    inner = worker.allreduce_async(tensor, average=True)
    future = torch.futures.Future()

    def done(f):
        try:
            future.set_result(f.result())
        except BaseException as e:  # noqa: BLE001 - the hook's caller receives it
            future.set_exception(e)

    inner.add_done_callback(done)
    return future
