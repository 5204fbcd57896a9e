"""Minari datasets on disk: a dataset directory (``data/main_data.hdf5``, one ``episode_<i>``
group per episode whose ``observations`` hold T+1 rows), that file itself, or a dataset id
found under ``$MINARI_DATASETS_PATH`` (default ``~/.minari/datasets``). Nothing is ever
downloaded."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from ..errors import InvalidArgument
from .source import EXPECTED, Array, import_h5py, native_order, open_hdf5, ordered, supported


def _leaves(group, name: str, h5py):
    """``(path, dataset)`` for every dataset at or under ``group[name]``, by name."""
    obj = group[name]
    if isinstance(obj, h5py.Dataset):
        yield name, obj
    elif isinstance(obj, h5py.Group):
        for key in sorted(obj):
            yield from _leaves(group, f"{name}/{key}", h5py)


class MinariReader:
    """A Minari ``main_data.hdf5``: one ``episode_<i>`` group per episode."""

    format = "minari"
    _PARTS = ("observations", "actions", "rewards", "terminations", "truncations")

    def __init__(self, path: Path):
        self.path = path
        self._file = open_hdf5(path)
        try:
            self._index(import_h5py())
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
                if part == "infos" and (ds.ndim == 0 or not supported(ds.dtype)):
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
        self.arrays = ordered({name: Array(total, tuple(first[rel].shape[1:]), first[rel].dtype)
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
        return native_order(np.concatenate(parts))

    def close(self):
        self._file.close()


def minari_root() -> Path:
    """Where Minari dataset ids are looked up: ``$MINARI_DATASETS_PATH``, default ``~/.minari/datasets``."""
    return Path(os.environ.get("MINARI_DATASETS_PATH") or Path.home() / ".minari" / "datasets")


def minari_main(directory: Path) -> Path:
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
        raise InvalidArgument(f"{directory}: a directory without data/main_data.hdf5; {EXPECTED}")
    return main
