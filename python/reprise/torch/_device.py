"""Devices, streams and events for the GPU path, with a CPU emulation for CI.

A sample's ``device`` is one of three: None (numpy arrays, the host path), "cpu"
or a CPU ``torch.device`` (the host path, its ``data`` as torch CPU tensors that
share the drawn arrays' memory) or a CUDA device (the GPU path, ``resolve``)."""

from __future__ import annotations

import contextlib

from ..errors import InvalidArgument
from ..sample import Sample

_EMULATE = False


def emulate_cuda(on: bool = True) -> None:
    """Map "cuda" devices to the CPU (for testing the GPU path without a GPU)."""
    global _EMULATE
    _EMULATE = bool(on)


def emulated() -> bool:
    return _EMULATE


def torch_module():
    try:
        import torch
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise InvalidArgument(
            "the GPU path and samples as torch tensors (device='cpu' or 'cuda') need PyTorch: "
            "pip install 'reprise[gpu]' (torch, triton)"
        ) from e
    return torch


_CUDA_READY: dict = {}  # index -> torch.device, once that device resolved


def resolve(device):
    """A ``torch.device`` for a GPU-path ``device`` argument ("cuda", "cuda:1",
    a torch.device). Refuses CPU devices (they use the host path) and CUDA devices
    that this process cannot use."""
    if device == "cuda" and _CUDA_READY and not _EMULATE:  # the common case, fast
        hit = _CUDA_READY.get(torch_module().cuda.current_device())
        if hit is not None:
            return hit
    dev = _resolve(device)
    if dev.type == "cuda":
        _CUDA_READY[dev.index] = dev
    return dev


def _resolve(device):
    torch = torch_module()
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise InvalidArgument(f"device {device!r} is not a device: expected 'cuda', 'cuda:N', 'cpu' or None") from e
    if dev.type != "cuda":
        raise InvalidArgument(f"device {device!r}: expected a CUDA device ('cuda' or 'cuda:N'), 'cpu' or None")
    if _EMULATE:
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise InvalidArgument(
            f"device {device!r} was asked for but CUDA is not available to this process "
            f"(torch {torch.__version__}, torch.cuda.is_available() is False); use device='cpu' or None"
        )
    index = dev.index if dev.index is not None else torch.cuda.current_device()
    if index >= torch.cuda.device_count():
        raise InvalidArgument(f"device {device!r}: this process sees {torch.cuda.device_count()} CUDA device(s)")
    return torch.device("cuda", index)


def is_host_device(device) -> bool:
    """True for the host path: None, "cpu" or a CPU torch.device."""
    if device is None:
        return True
    if isinstance(device, str):
        return device == "cpu"
    return getattr(device, "type", None) == "cpu"


def host_tensors(draw):
    """``draw()``'s Sample with its numpy ``data`` as torch CPU tensors, as a sample
    for ``device="cpu"`` returns them (a cut-short draw's ``partial`` too). The
    arrays are the draw's own, so the tensors share their memory: no copy. Torch is
    imported before drawing, so that without it the call changes nothing."""
    return on_device(draw, torch_module().device("cpu"))


def on_device(draw, dev):
    """``draw()``'s Sample with its numpy ``data`` as tensors on ``dev`` (on the CPU
    without a copy), and a cut-short draw's ``partial`` moved the same way."""
    torch = torch_module()

    def move(s):
        s.data = {k: torch.from_numpy(v).to(dev) for k, v in s.data.items()}
        s.attributes = {k: torch.from_numpy(v).to(dev) for k, v in s.attributes.items()}
        return s

    try:
        return move(draw())
    except BaseException as e:
        partial = getattr(e, "partial", None)
        if isinstance(partial, Sample):
            move(partial)
        raise


class _CpuEvent:
    """An event on the emulated device: work is synchronous, so always complete."""

    def record(self, stream=None):
        pass

    def query(self):
        return True

    def synchronize(self):
        pass

    def wait(self, stream=None):
        pass


class _CpuStream:
    def wait_stream(self, other):
        pass

    def wait_event(self, event):
        pass

    def synchronize(self):
        pass


def host_to_device(array, dev):
    """A numpy array as a tensor on ``dev``, copied without waiting for the work
    queued on the current stream: staged in pinned memory (torch's caching host
    allocator keeps the block until the copy has run). On the CPU, no copy."""
    tensor = torch_module().from_numpy(array)
    if dev.type == "cpu":
        return tensor
    return tensor.pin_memory().to(dev, non_blocking=True)


class Mapped:
    """Host memory the device can read in place (page-locked and mapped: registered
    with ``cudaHostRegister``, or allocated pinned, which under unified addressing
    is mapped at the same address), exposed through ``__cuda_array_interface__``;
    ``owner`` is kept alive with it."""

    def __init__(self, address: int, nbytes: int, owner):
        self.__cuda_array_interface__ = {
            "shape": (nbytes,), "typestr": "|u1", "data": (address, False), "version": 3, "strides": None,
        }
        self._owner = owner


def mapped_view(pinned, dev):
    """A tensor on ``dev`` over the memory of the pinned host tensor ``pinned`` (kept
    alive with it): kernels read it in place over the bus, with no copy queued before
    them. On the CPU, ``pinned`` itself."""
    if dev.type == "cpu":
        return pinned
    torch = torch_module()
    raw = torch.as_tensor(Mapped(pinned.data_ptr(), pinned.numel() * pinned.element_size(), pinned), device=dev)
    return raw.view(pinned.dtype)


def new_event(dev):
    if dev.type == "cpu":
        return _CpuEvent()
    return torch_module().cuda.Event()


def new_stream(dev):
    if dev.type == "cpu":
        return _CpuStream()
    return torch_module().cuda.Stream(device=dev)


def current_stream(dev):
    if dev.type == "cpu":
        return _CpuStream()
    return torch_module().cuda.current_stream(dev)


def use_stream(stream):
    """``with use_stream(s):`` runs the block's device work on ``s``."""
    if isinstance(stream, _CpuStream):
        return contextlib.nullcontext()
    return torch_module().cuda.stream(stream)
