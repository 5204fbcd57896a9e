"""Offline datasets: trajectories from files into a store, with tables over them.

    ds = rp.datasets.load("hopper-medium-v2.hdf5", window=20)
    print(ds.describe())
    batch = ds.windows.sample(256)     # data[field]: [256, 20, *shape], windows inside episodes

Three layouts are read (docs/datasets.md gives each in full):

- ``d4rl``: one HDF5 file of per-step arrays of N rows each (``observations``,
  ``actions``, ``rewards``, ``terminals``, ``timeouts``, ``infos/...``); the
  ``metadata`` group and 0-d datasets are skipped.
- ``minari``: a Minari dataset directory (``data/main_data.hdf5``, one
  ``episode_<i>`` group per episode whose ``observations`` hold T+1 rows), that
  file itself, or a dataset id found under ``$MINARI_DATASETS_PATH`` (default
  ``~/.minari/datasets``). Nothing is ever downloaded.
- ``npz``: a numpy ``.npz`` of per-step arrays of N rows each.

Episodes: Minari's episode groups; otherwise an ``episode_lengths`` or
``episode_starts`` array, or else per-step markers, the first present of
``terminals``/``timeouts``, ``dones``, ``terminations``/``truncations``: a step
whose marker is non-zero ends its episode, and steps after the last marked one
form a last, partial episode.

``load`` checks everything it can from the file's metadata before it makes a
store, then writes each step once, episode by episode, into a new store sized
to the dataset: the whole dataset lives in shared memory. Files are read in
chunks of whole episodes of about 64 MB, so little memory is used besides the
store, except for npz files, whose arrays numpy reads whole. HDF5 needs h5py
(``pip install 'reprise[datasets]'``), imported only when an HDF5 file is read.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import zipfile
from pathlib import Path
from typing import NamedTuple

import numpy as np

from ._convert import as_int
from .checkpoint import _Progress
from .errors import InvalidArgument, NotFound, RepriseError
from .selectors import Fifo, Uniform
from .signature import DTYPES, Field
from .store import Store
from .table import Table

FORMATS = ("d4rl", "minari", "npz")
_HDF5_MAGIC = b"\x89HDF\r\n\x1a\n"
_ZIP_MAGIC = (b"PK\x03\x04", b"PK\x05\x06")
_CHUNK_BYTES = 64 << 20
# Per-step episode markers, looked for in this order.
_MARKERS = (("terminals", "timeouts"), ("dones",), ("terminations", "truncations"))
_EPISODE_ARRAYS = ("episode_lengths", "episode_starts")
# Fields listed first, in this order; the rest follow by name.
_FIRST = ("observations", "actions", "rewards", "next_observations", "returns_to_go", "timesteps",
          "terminals", "timeouts", "terminations", "truncations", "dones")
_EXPECTED = ("expected an HDF5 file in the D4RL layout (.hdf5/.h5), a Minari dataset "
             "(directory, its data/main_data.hdf5, or id) or an .npz file")


class _Array(NamedTuple):
    """One per-step array of a file: its rows, and the shape and dtype of one row."""
    rows: int
    shape: tuple
    dtype: np.dtype


def _ordered(arrays: dict) -> dict:
    rank = {name: i for i, name in enumerate(_FIRST)}
    return dict(sorted(arrays.items(), key=lambda kv: (rank.get(kv[0].split("/")[0], len(rank)), kv[0])))


def _native_order(a: np.ndarray) -> np.ndarray:
    return a if a.dtype.isnative else a.astype(a.dtype.newbyteorder("="))


def _h5py():
    try:
        import h5py
    except ImportError:
        raise InvalidArgument("reading HDF5 datasets needs h5py: pip install 'reprise[datasets]'") from None
    return h5py


def _open_hdf5(path: Path):
    try:
        return _h5py().File(path, "r")
    except OSError as e:
        raise InvalidArgument(f"{path}: not a readable HDF5 file ({e}); {_EXPECTED}") from None


def _episode_lengths(path: Path, names, get, steps) -> np.ndarray:
    """Episode lengths from ``episode_lengths``, ``episode_starts`` or per-step
    markers. ``names``: the arrays the file has; ``get(name)`` reads one whole;
    ``steps()``: the rows of its per-step arrays."""
    if "episode_lengths" in names:
        lengths = np.asarray(get("episode_lengths"))
        if lengths.ndim != 1 or lengths.dtype.kind not in "iu" or (lengths < 1).any():
            raise InvalidArgument(f"{path}: 'episode_lengths' must be a 1-D integer array of lengths >= 1, "
                                  f"got {lengths.dtype}{list(lengths.shape)}")
        return lengths.astype(np.int64)
    if "episode_starts" in names:
        starts, n = np.asarray(get("episode_starts")), steps()
        if (starts.ndim != 1 or starts.dtype.kind not in "iu" or starts.size == 0 or starts[0] != 0
                or (np.diff(starts.astype(np.int64)) < 1).any() or starts[-1] >= n):
            raise InvalidArgument(f"{path}: 'episode_starts' must be a 1-D integer array rising strictly "
                                  f"from 0 and below the {n} steps, got {starts.dtype}{list(starts.shape)}")
        return np.diff(np.append(starts.astype(np.int64), n))
    found = next(([n for n in group if n in names] for group in _MARKERS if any(n in names for n in group)), None)
    if found is None:
        raise InvalidArgument(f"{path}: no way to find episode boundaries: expected per-step 'terminals'/'timeouts', "
                              "'dones' or 'terminations'/'truncations' markers, or an 'episode_lengths' or "
                              "'episode_starts' array")
    ends = None
    for name in found:
        m = np.asarray(get(name))
        if m.ndim == 2 and m.shape[1] == 1:
            m = m[:, 0]
        if m.ndim != 1:
            raise InvalidArgument(f"{path}: episode marker '{name}' must hold one value per step, got shape {list(m.shape)}")
        if ends is not None and m.shape != ends.shape:
            raise InvalidArgument(f"{path}: arrays of different lengths: '{found[0]}' has {ends.size} rows, "
                                  f"'{name}' has {m.size}; every per-step array needs one row per step")
        ends = (m != 0) if ends is None else ends | (m != 0)
    bounds = np.concatenate([[0], np.flatnonzero(ends) + 1])
    if bounds[-1] != ends.size:
        bounds = np.append(bounds, ends.size)  # a last, partial episode
    return np.diff(bounds).astype(np.int64)


class _D4RL:
    """An HDF5 file of per-step arrays (D4RL's layout)."""

    format = "d4rl"

    def __init__(self, path: Path):
        h5py = _h5py()
        self.path = path
        self._file = _open_hdf5(path)
        self._datasets = {}

        def walk(group, prefix):
            for key, obj in group.items():
                name = prefix + key
                if isinstance(obj, h5py.Group) and name != "metadata":
                    walk(obj, name + "/")
                elif isinstance(obj, h5py.Dataset) and obj.ndim >= 1:
                    self._datasets[name] = obj

        try:
            walk(self._file, "")
        except BaseException:
            self._file.close()
            raise
        self.arrays = _ordered({name: _Array(ds.shape[0], tuple(ds.shape[1:]), ds.dtype)
                                for name, ds in self._datasets.items() if name not in _EPISODE_ARRAYS})
        if not self.arrays:
            self._file.close()
            raise InvalidArgument(f"{path}: no per-step arrays: expected datasets of one row per step "
                                  "such as 'observations', 'actions', 'rewards', 'terminals'")

    def lengths(self) -> np.ndarray:
        first = next(iter(self.arrays.values()))
        return _episode_lengths(self.path, self._datasets, lambda n: self._datasets[n][()], lambda: first.rows)

    def read(self, name: str, a: int, b: int) -> np.ndarray:
        return _native_order(np.asarray(self._datasets[name][a:b]))

    def close(self):
        self._file.close()


def _leaves(group, name: str, h5py):
    """``(path, dataset)`` for every dataset at or under ``group[name]``, by name."""
    obj = group[name]
    if isinstance(obj, h5py.Dataset):
        yield name, obj
    elif isinstance(obj, h5py.Group):
        for key in sorted(obj):
            yield from _leaves(group, f"{name}/{key}", h5py)


def _supported(dtype: np.dtype) -> bool:
    return dtype.kind in "biuf" and dtype.name in DTYPES


class _Minari:
    """A Minari ``main_data.hdf5``: one ``episode_<i>`` group per episode."""

    format = "minari"
    _PARTS = ("observations", "actions", "rewards", "terminations", "truncations")

    def __init__(self, path: Path):
        self.path = path
        self._file = _open_hdf5(path)
        try:
            self._index(_h5py())
        except BaseException:
            self._file.close()
            raise

    def _index(self, h5py):
        f = self._file
        ids = sorted(int(k[8:]) for k in f if k.startswith("episode_") and k[8:].isdigit())
        if not ids:
            raise InvalidArgument(f"{self.path}: no episode_<i> groups: not a Minari dataset file")
        self._groups = [f[f"episode_{i}"] for i in ids]
        first = self._groups[0]
        steps = self._steps(first)
        # name -> (path in an episode group, rows: "all" T, "head" first T of T+1, "tail" last T of T+1)
        self._leaves = {}
        for part in self._PARTS + ("infos",):
            if part not in first:
                if part == "infos":
                    continue
                raise InvalidArgument(f"{self.path}: {first.name} has no '{part}'; a Minari episode holds "
                                      f"{', '.join(self._PARTS)}")
            for rel, ds in _leaves(first, part, h5py):
                if part == "infos" and (ds.ndim == 0 or not _supported(ds.dtype)):
                    continue  # Minari keeps some infos as strings; only numbers are imported
                rows = ds.shape[0] if ds.ndim else 0
                if rows == steps + 1 and part == "observations":
                    self._leaves[rel] = (rel, "head")
                    self._leaves["next_" + rel] = (rel, "tail")
                elif rows == steps + 1 and part == "infos":
                    self._leaves[rel] = (rel, "tail")  # the first row is the reset's
                elif rows == steps:
                    self._leaves[rel] = (rel, "all")
                else:
                    raise InvalidArgument(f"{self.path}: {first.name}/{rel} has {rows} rows for an episode of "
                                          f"{steps} steps; expected {steps} (or {steps + 1} for observations)")
        lengths = []
        for g in self._groups:
            t = self._steps(g)
            for rel, rows in set(self._leaves.values()):
                ds, ref = g.get(rel), first[rel]
                want = t + (rows != "all")
                if (not isinstance(ds, h5py.Dataset) or ds.ndim == 0 or ds.shape[0] != want
                        or ds.shape[1:] != ref.shape[1:] or ds.dtype != ref.dtype):
                    got = "nothing" if not isinstance(ds, h5py.Dataset) else f"{ds.dtype}{list(ds.shape)}"
                    raise InvalidArgument(f"{self.path}: {g.name}/{rel}: expected {ref.dtype}{[want, *ref.shape[1:]]} "
                                          f"like {first.name}, got {got}")
            lengths.append(t)
        self._lengths = np.array(lengths, dtype=np.int64)
        self._starts = np.concatenate([[0], np.cumsum(self._lengths)])
        total = int(self._starts[-1])
        self.arrays = _ordered({name: _Array(total, tuple(first[rel].shape[1:]), first[rel].dtype)
                                for name, (rel, _) in self._leaves.items()})

    def _steps(self, group) -> int:
        rewards = group.get("rewards")
        if rewards is None or rewards.ndim < 1:
            raise InvalidArgument(f"{self.path}: {group.name} has no per-step 'rewards'")
        if rewards.shape[0] < 1:
            raise InvalidArgument(f"{self.path}: {group.name} has no steps; every episode needs at least one")
        return int(rewards.shape[0])

    def lengths(self) -> np.ndarray:
        return self._lengths

    def read(self, name: str, a: int, b: int) -> np.ndarray:
        rel, rows = self._leaves[name]
        parts = []
        for e in range(int(np.searchsorted(self._starts, a)), int(np.searchsorted(self._starts, b))):
            ds, t = self._groups[e][rel], int(self._lengths[e])
            parts.append(ds[:t] if rows != "tail" else ds[1:t + 1])
        return _native_order(np.concatenate(parts))

    def close(self):
        self._file.close()


class _Npz:
    """A numpy ``.npz`` of per-step arrays; shapes and dtypes come from the array
    headers, the data from whole arrays (numpy cannot read part of one)."""

    format = "npz"

    def __init__(self, path: Path):
        self.path = path
        try:
            self._zip = zipfile.ZipFile(path)
        except (zipfile.BadZipFile, OSError) as e:
            raise InvalidArgument(f"{path}: not an npz file ({e}); {_EXPECTED}") from None
        try:
            self._headers = {info.filename[:-4]: self._header(info)
                             for info in self._zip.infolist() if info.filename.endswith(".npy")}
        except BaseException:
            self._zip.close()
            raise
        self.arrays = _ordered({name: _Array(shape[0], tuple(shape[1:]), dtype)
                                for name, (shape, dtype) in self._headers.items()
                                if len(shape) >= 1 and name not in _EPISODE_ARRAYS})
        if not self.arrays:
            self._zip.close()
            raise InvalidArgument(f"{path}: no per-step arrays: expected arrays of one row per step "
                                  "such as 'observations', 'actions', 'rewards', 'terminals'")
        self._cache: dict = {}

    def _header(self, info):
        fmt = np.lib.format
        with self._zip.open(info) as fh:
            try:
                version = fmt.read_magic(fh)
                if version == (1, 0):
                    shape, _, dtype = fmt.read_array_header_1_0(fh)
                elif version == (2, 0):
                    shape, _, dtype = fmt.read_array_header_2_0(fh)
                else:
                    a = fmt.read_array(fh, allow_pickle=False)
                    shape, dtype = a.shape, a.dtype
            except ValueError as e:
                raise InvalidArgument(f"{self.path}: member '{info.filename}' is not a readable numpy array ({e})") from None
        return tuple(shape), np.dtype(dtype)

    def _whole(self, name: str) -> np.ndarray:
        if name not in self._cache:
            with self._zip.open(name + ".npy") as fh:
                self._cache[name] = _native_order(np.lib.format.read_array(fh, allow_pickle=False))
        return self._cache[name]

    def lengths(self) -> np.ndarray:
        first = next(iter(self.arrays.values()))
        return _episode_lengths(self.path, self._headers, self._whole, lambda: first.rows)

    def read(self, name: str, a: int, b: int) -> np.ndarray:
        return self._whole(name)[a:b]

    def close(self):
        self._cache.clear()
        self._zip.close()


def _minari_root() -> Path:
    return Path(os.environ.get("MINARI_DATASETS_PATH") or Path.home() / ".minari" / "datasets")


def _minari_main(directory: Path) -> Path:
    """The ``main_data.hdf5`` of a Minari dataset directory."""
    meta = directory / "data" / "metadata.json"
    try:
        data_format = json.loads(meta.read_text()).get("data_format") if meta.is_file() else None
    except (OSError, ValueError, AttributeError):
        data_format = None
    if data_format not in (None, "hdf5"):
        raise InvalidArgument(f"{directory}: a Minari dataset stored as '{data_format}'; only Minari's 'hdf5' "
                              "data format is read")
    main = directory / "data" / "main_data.hdf5"
    if not main.is_file():
        raise InvalidArgument(f"{directory}: a directory without data/main_data.hdf5; {_EXPECTED}")
    return main


def _sniff(path: Path) -> str:
    try:
        with open(path, "rb") as f:
            head = f.read(8)
    except OSError as e:
        raise InvalidArgument(f"{path}: cannot be read ({e})") from None
    if head[:4] in _ZIP_MAGIC:
        return "npz"
    hdf5 = head == _HDF5_MAGIC
    if not hdf5 and path.suffix.lower() in (".hdf5", ".h5"):
        hdf5 = _h5py().is_hdf5(path)  # an HDF5 file may start after a user block
    if not hdf5:
        raise InvalidArgument(f"{path}: neither an HDF5 nor an npz file (it begins {head!r}); {_EXPECTED}")
    with _open_hdf5(path) as f:
        keys = list(f)
        episodic = bool(keys) and all(k.startswith("episode_") and k[8:].isdigit() for k in keys)
    return "minari" if episodic else "d4rl"


def _resolve(path) -> tuple[str, Path]:
    """``(format, file)``: what ``path`` holds and the file to read."""
    try:
        p = Path(os.fspath(path)).expanduser()
    except TypeError:
        raise InvalidArgument(f"path must be a str or os.PathLike, got {path!r}") from None
    if p.is_dir():
        return "minari", _minari_main(p)
    if p.is_file():
        return _sniff(p), p
    if p.exists():
        raise InvalidArgument(f"{p}: not a regular file or directory; {_EXPECTED}")
    if p.is_absolute():
        raise NotFound(f"{p}: no such file or directory")
    by_id = _minari_root() / os.fspath(path)
    if by_id.is_dir():
        return "minari", _minari_main(by_id)
    raise NotFound(f"{p}: no such file or directory, and no Minari dataset of that id under {_minari_root()}")


def _open(path, format: str | None):
    if format is not None and format not in FORMATS:
        raise InvalidArgument(f"format must be one of {', '.join(FORMATS)} or None, got {format!r}")
    kind, file = _resolve(path)
    if format is not None and format != kind:
        raise InvalidArgument(f"{file}: asked to read it as {format}, but its content is {kind}")
    return {"d4rl": _D4RL, "minari": _Minari, "npz": _Npz}[kind](file)


def _signature(src, fields) -> dict:
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
        if not _supported(a.dtype):
            raise InvalidArgument(f"{src.path}: array '{n}' has dtype {a.dtype}; Reprise stores bool, int8..int64, "
                                  "uint8..uint64 and float16/32/64 (leave the array out with fields=)")
        if any(d < 1 for d in a.shape):
            raise InvalidArgument(f"{src.path}: array '{n}' has an empty per-step shape {list(a.shape)}")
        signature[n] = Field(a.shape, a.dtype.name)
    return signature


def detect_format(path) -> str:
    """``"d4rl"``, ``"minari"`` or ``"npz"``: what ``path`` holds, from its content
    (a Minari dataset id is looked up on disk, never downloaded)."""
    return _resolve(path)[0]


def infer_signature(path, format: str | None = None, fields=None) -> dict:
    """``{name: Field}`` of the store ``load`` would make, read from the file's
    metadata (no step data is read)."""
    src = _open(path, format)
    try:
        return _signature(src, fields)
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
         progress: bool | None = None, seed: int | None = None) -> Dataset:
    """Reads a dataset into a new store and makes its tables (see ``Dataset``).

    ``format``: None detects it (``detect_format``); a named format must match.
    ``window``: T >= 1 makes the ``windows`` table. ``fields``: the arrays to keep
    (default all). ``progress``: a bar over steps on stderr (default: when it is a
    terminal and the import takes over a second). ``seed``: the tables' seed.

    Raises ``NotFound`` for a missing path or an unknown name in ``fields``, and
    ``InvalidArgument`` for a file that cannot be imported, naming the file and
    what was expected; then no store is left behind."""
    window = None if window is None else as_int("window", window, minimum=1)
    block_steps = as_int("block_steps", block_steps, minimum=1)
    src = _open(path, format)
    try:
        signature = _signature(src, fields)
        lengths = src.lengths()
        steps = int(lengths.sum())
        if steps == 0:
            raise InvalidArgument(f"{src.path}: zero steps; a dataset needs at least one")
        for name in signature:
            if src.arrays[name].rows != steps:
                raise InvalidArgument(f"{src.path}: arrays of different lengths: '{name}' has {src.arrays[name].rows} "
                                      f"rows, the episodes cover {steps} steps; every per-step array needs one row "
                                      "per step (leave it out with fields=)")
        return _build(src, signature, lengths, window, block_steps, progress, seed)
    finally:
        src.close()


def _build(src, signature, lengths, window, block_steps, progress, seed) -> Dataset:
    steps = int(lengths.sum())
    # Every step once; a writer's last block may be partly used, so one block spare.
    store = Store(signature, capacity=steps + block_steps, block_steps=block_steps)
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
        bar = _Progress(steps, f"import {src.path.name}", progress, unit="step")
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


def _check_writable(arrays) -> dict:
    if not isinstance(arrays, dict) or not arrays:
        raise InvalidArgument(f"arrays must be a non-empty dict of name -> array, got {type(arrays).__name__}")
    out = {}
    for name, a in arrays.items():
        a = np.asarray(a)
        if not isinstance(name, str) or not name or a.ndim < 1:
            raise InvalidArgument(f"array {name!r}: expected a non-empty name and an array of one row per step")
        out[name] = a
    return out


def write_d4rl(path, arrays: dict, metadata: dict | None = None) -> str:
    """Writes ``{name: array}`` as an HDF5 file in the D4RL layout (a name with
    '/' goes in a group: ``infos/qpos``); ``metadata`` values go under
    ``metadata/``. Returns the path."""
    h5py = _h5py()
    arrays = _check_writable(arrays)
    with h5py.File(path, "w") as f:
        for name, a in arrays.items():
            f.create_dataset(name, data=a)
        for key, value in (metadata or {}).items():
            f.create_dataset(f"metadata/{key}", data=value)
    return os.fspath(path)


def write_npz(path, arrays: dict) -> str:
    """Writes ``{name: array}`` as an ``.npz`` (numpy adds the suffix when missing).
    Returns the path written."""
    arrays = _check_writable(arrays)
    path = os.fspath(path)
    np.savez(path, **arrays)
    return path if path.endswith(".npz") else path + ".npz"


def main(argv: list[str] | None = None) -> int:
    """``reprise import PATH --out DIR``: loads a dataset, prints what it holds and
    saves its tables as a checkpoint under DIR."""
    p = argparse.ArgumentParser(
        prog="reprise import",
        description="Load a D4RL (HDF5), Minari or npz dataset into a Reprise store and save its tables "
                    "('episodes', and 'windows' with --window) as a checkpoint.")
    p.add_argument("path", help="an .hdf5/.h5 file (D4RL layout), a Minari dataset (directory, "
                                "main_data.hdf5 or id on disk) or an .npz file")
    p.add_argument("--out", required=True, help="directory for the checkpoint (created if missing)")
    p.add_argument("--format", choices=FORMATS, help="default: detected from the content")
    p.add_argument("--window", type=int, help="also make a 'windows' table of T-step windows")
    p.add_argument("--fields", help="comma-separated arrays to keep (default: all)")
    p.add_argument("--block-steps", type=int, default=64, help="store block size in steps (default 64)")
    p.add_argument("--compression", choices=("zstd",), help="compress the checkpoint's step data")
    p.add_argument("--seed", type=int, help="seed of the tables' samplers")
    args = p.parse_args(argv)
    fields = None if args.fields is None else [f.strip() for f in args.fields.split(",") if f.strip()]
    from . import checkpoint
    try:
        with load(args.path, format=args.format, window=args.window, fields=fields,
                  block_steps=args.block_steps, seed=args.seed) as ds:
            print(ds.describe())
            saved = checkpoint.save(args.out, ds.tables, compression=args.compression)
            names = [t.name for t in ds.tables]
    except (RepriseError, OSError) as e:
        print(f"reprise import: {e}", file=sys.stderr)
        return 2
    print(f"\ncheckpoint: {saved}\nload it with:\n"
          f"    import reprise as rp\n"
          f"    tables = rp.checkpoint.load({saved!r})    # {{{', '.join(repr(n) for n in names)}}}\n"
          f"    batch = tables[{names[-1]!r}].sample(256)")
    return 0


__all__ = ["Dataset", "load", "detect_format", "infer_signature", "write_d4rl", "write_npz", "main", "FORMATS"]

if __name__ == "__main__":
    sys.exit(main())
