"""The shared loading code: a reader's arrays into one store sized to the dataset, with the
``episodes`` and ``windows`` tables over it (``load``, ``Dataset``)."""

from __future__ import annotations

import numpy as np

from .._convert import as_int
from .._progress import Progress
from ..errors import InvalidArgument, NotFound
from ..selectors import Fifo, Uniform
from ..signature import Field
from ..store import Store
from ..table import Table
from .detect import open_reader
from .source import supported

_CHUNK_BYTES = 64 << 20


def signature_of(src, fields) -> dict:
    """``{name: Field}`` of the arrays ``fields`` (default all) of reader ``src``, checked."""
    if fields is None:
        names = list(src.arrays)
    else:
        names = [fields] if isinstance(fields, str) else list(fields)
        if not names or not all(isinstance(n, str) for n in names):
            raise InvalidArgument(f"fields must be a non-empty list of array names, got {fields!r}")
        for n in names:
            if n not in src.arrays:
                raise NotFound(f"{src.path}: no per-step array '{n}'; it has {list(src.arrays)}")
    signature = {}
    for n in names:
        a = src.arrays[n]
        if not supported(a.dtype):
            raise InvalidArgument(f"{src.path}: array '{n}' has dtype {a.dtype}; Reprise stores bool, int8..int64, "
                                  "uint8..uint64 and float16/32/64 (leave the array out with fields=)")
        if any(d < 1 for d in a.shape):
            raise InvalidArgument(f"{src.path}: array '{n}' has an empty per-step shape {list(a.shape)}")
        signature[n] = Field(a.shape, a.dtype.name)
    return signature


def infer_signature(path, format: str | None = None, fields=None) -> dict:
    """``{name: Field}`` of the store ``load`` would make, read from the file's
    metadata (no step data is read)."""
    src = open_reader(path, format)
    try:
        return signature_of(src, fields)
    finally:
        src.close()


class Dataset:
    """An imported dataset: a store holding every step once, and tables over it.

    ``episodes`` has one item per episode, in file order; ``windows`` (with
    ``window=T``) one item per T-step window inside an episode at every start
    position, and the whole episode for an episode shorter than T. Both are
    Uniform samplers, full when made (``max_size`` is their item count) and never
    evicted by the store. ``close()`` (or leaving a ``with`` block) removes the
    store's shared memory; the tables stay usable until they are gone."""

    def __init__(self, store: Store, episodes: Table, windows: Table | None, format: str, source: str,
                 episode_lengths: np.ndarray, episode_returns: np.ndarray | None, window: int | None):
        self.store, self.episodes, self.windows = store, episodes, windows
        self.format, self.source, self.window = format, source, window
        self.episode_lengths = episode_lengths
        self.episode_returns = episode_returns  # the sum of 'rewards' per episode, when imported

    @property
    def tables(self) -> list:
        return [self.episodes] + ([self.windows] if self.windows is not None else [])

    @property
    def signature(self) -> dict:
        return self.store.signature

    @property
    def num_steps(self) -> int:
        return int(self.episode_lengths.sum())

    @property
    def num_episodes(self) -> int:
        return int(self.episode_lengths.size)

    def describe(self) -> str:
        """Format, source, steps, episodes (lengths, returns), tables and the
        signature, one field per line."""
        lengths = self.episode_lengths
        lines = [f"{self.format} dataset {self.source}",
                 f"  steps      {self.num_steps:,}",
                 f"  episodes   {self.num_episodes:,} (length min {lengths.min()}, mean {lengths.mean():.1f}, "
                 f"max {lengths.max()})"]
        if self.episode_returns is not None:
            r = self.episode_returns
            lines.append(f"  returns    min {r.min():.4g}, mean {r.mean():.4g}, max {r.max():.4g}")
        tables = f"episodes ({self.episodes.size:,} items)"
        if self.windows is not None:
            tables += f", windows ({self.windows.size:,} items of {self.window} steps; shorter episodes whole)"
        row_bytes = sum(f.nbytes for f in self.signature.values())
        size = self.store.capacity * row_bytes
        size = f"{size / 1e6:,.1f} MB" if size >= 1e6 else f"{size / 1e3:,.1f} kB"
        lines += [f"  tables     {tables}",
                  f"  store      {self.store.capacity:,} steps x {row_bytes:,} B = {size} in {self.store.path}",
                  "signature (per step):"]
        width = max(len(n) for n in self.signature)
        lines += [f"  {n:<{width}}  {f.dtype:<8} {list(f.shape)}" for n, f in self.signature.items()]
        return "\n".join(lines)

    def close(self):
        self.store.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __repr__(self):
        return (f"Dataset({self.format}, {self.source!r}, steps={self.num_steps}, episodes={self.num_episodes}, "
                f"window={self.window})")


def _chunks(lengths: np.ndarray, row_bytes: int):
    """``(first, end)`` runs of whole episodes of about ``_CHUNK_BYTES`` each."""
    first, rows = 0, 0
    for e, n in enumerate(lengths.tolist()):
        if e > first and (rows + n) * row_bytes > _CHUNK_BYTES:
            yield first, e
            first, rows = e, 0
        rows += n
    if first < lengths.size:
        yield first, lengths.size


def load(path, format: str | None = None, window: int | None = None, fields=None, block_steps: int = 64,
         progress: bool | None = None, seed: int | None = None, directory=None, backing: str = "memory") -> Dataset:
    """Reads a dataset into a new store and makes its tables (see ``Dataset``).

    ``format``: None detects it (``detect_format``); a named format must match.
    ``window``: T >= 1 makes the ``windows`` table. ``fields``: the arrays to keep
    (default all). ``progress``: a bar over steps on stderr (default: when it is a
    terminal and the import takes over a second). ``seed``: the tables' seed.
    ``directory``, ``backing``: where the store goes, as ``Store`` takes them;
    ``backing="file"`` builds a file store there, which ``close()`` keeps and
    ``rp.Store.open(directory)`` maps again with its tables, copying nothing (a
    dataset larger than memory is imported once).

    Raises ``NotFound`` for a missing path or an unknown name in ``fields``, and
    ``InvalidArgument`` for a file that cannot be imported, naming the file and
    what was expected; then no store is left behind."""
    window = None if window is None else as_int("window", window, minimum=1)
    block_steps = as_int("block_steps", block_steps, minimum=1)
    src = open_reader(path, format)
    try:
        signature = signature_of(src, fields)
        lengths = src.lengths()
        steps = int(lengths.sum())
        if steps == 0:
            raise InvalidArgument(f"{src.path}: zero steps; a dataset needs at least one")
        for name in signature:
            if src.arrays[name].rows != steps:
                raise InvalidArgument(f"{src.path}: arrays of different lengths: '{name}' has {src.arrays[name].rows} "
                                      f"rows, the episodes cover {steps} steps; every per-step array needs one row "
                                      "per step (leave it out with fields=)")
        return _build(src, signature, lengths, window, block_steps, progress, seed, directory, backing)
    finally:
        src.close()


def _build(src, signature, lengths, window, block_steps, progress, seed, directory=None, backing="memory") -> Dataset:
    steps = int(lengths.sum())
    # Every step once; a writer's last block may be partly used, so one block spare.
    store = Store(signature, capacity=steps + block_steps, block_steps=block_steps, directory=directory,
                  backing=backing)
    try:
        episodes = Table("episodes", store, sampler=Uniform(), remover=Fifo(), max_size=lengths.size,
                         seed=seed, evict_when_store_full=False)
        windows = None
        if window is not None:
            count = int(np.maximum(lengths - window + 1, 1).sum())
            windows = Table("windows", store, sampler=Uniform(), remover=Fifo(), max_size=count,
                            seed=seed, evict_when_store_full=False)
        returns = np.zeros(lengths.size) if "rewards" in signature else None
        starts = np.concatenate([[0], np.cumsum(lengths)])
        bar = Progress(steps, f"import {src.path.name}", progress, unit="step")
        try:
            with store.writer() as w:
                for first, end in _chunks(lengths, sum(f.nbytes for f in signature.values())):
                    data = {name: src.read(name, int(starts[first]), int(starts[end])) for name in signature}
                    at = 0
                    for e in range(first, end):
                        n = int(lengths[e])
                        w.extend({name: a[at:at + n] for name, a in data.items()})
                        w.create_item(episodes, n, 1.0)
                        if windows is not None and n >= window:
                            w.create_items(windows, window, np.ones(n - window + 1))
                        elif windows is not None:
                            w.create_item(windows, n, 1.0)
                        w.end_episode()
                        if returns is not None:
                            returns[e] = data["rewards"][at:at + n].sum(dtype=np.float64)
                        at += n
                        bar.update(n)
        finally:
            bar.close()
    except BaseException:
        store.close()
        raise
    return Dataset(store, episodes, windows, src.format, str(src.path), lengths, returns, window)

