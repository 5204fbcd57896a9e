"""The GPU path: zero-copy collection from shared memory into CUDA tensors,
device stores, GPU selection and prefetching iteration.

Needs the ``gpu`` extra (torch; triton for the fastest selection kernels). Users
reach it through ``Table.sample(n, device="cuda")``, ``Client.sample(...,
device="cuda")``, ``Table.iterate(...)``, ``Store(..., device="cuda")`` and
``Table(..., selection_device="cuda")`` and ``Table.static_sample(...)`` (a
``StaticSample``, for CUDA graphs); nothing here needs importing directly.

Without CUDA every entry point raises ``InvalidArgument`` naming what is missing.
``emulate_cuda(True)`` runs the same code with "cuda" mapped to the CPU (no
streams, no registration): the test suite uses it so that CI, which has no GPU,
covers the logic of this package.
"""

from ._device import emulate_cuda, emulated, resolve
from .collect import collect_rows
from .iterate import iterate
from .static import StaticSample

__all__ = ["StaticSample", "collect_rows", "emulate_cuda", "emulated", "iterate", "resolve"]
