"""Reprise: GPU-centric, distributed experience replay.

    import reprise as rp
    store = rp.Store({"obs": rp.Field((4,), "float32")}, capacity=100_000)
    table = rp.Table("replay", store, sampler=rp.selectors.Prioritized(0.6),
                     remover=rp.selectors.Fifo(), max_size=50_000)
"""

from . import aggregate, checkpoint, datasets, distributed, errors, extensions, rate_limiters, selectors
from ._native import Writer, __version__
from .client import Client
from .pool import ClientPool
from .sample import Sample
from .server import Server
from .signature import Field
from .store import Store
from .table import Table
from .transitions import TransitionBatch, TransitionBuffer

__all__ = [
    "Field",
    "Store",
    "Table",
    "TransitionBuffer", "TransitionBatch",
    "Writer",
    "Server",
    "Client",
    "ClientPool",
    "Sample",
    "selectors",
    "aggregate",
    "checkpoint",
    "distributed",
    "datasets",
    "rate_limiters",
    "errors",
    "__version__",
]


def __getattr__(name):
    # ``rp.ray`` imports Ray only when used: the rest of the package never imports it.
    if name == "ray":
        import importlib
        return importlib.import_module(".ray", __name__)
    raise AttributeError(f"module 'reprise' has no attribute {name!r}")
