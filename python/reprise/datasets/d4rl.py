"""D4RL's layout: one HDF5 file of per-step arrays of N rows each; groups nest arrays
(``infos/qpos``), the ``metadata`` group and 0-d datasets are skipped."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ..errors import InvalidArgument
from .source import (EPISODE_ARRAYS, Array, check_writable, episode_lengths, import_h5py, native_order,
                     open_hdf5, ordered)


class D4RLReader:
    """An HDF5 file of per-step arrays (D4RL's layout)."""

    format = "d4rl"

    def __init__(self, path: Path):
        h5py = import_h5py()
        self.path = path
        self._file = open_hdf5(path)
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
        self.arrays = ordered({name: Array(ds.shape[0], tuple(ds.shape[1:]), ds.dtype)
                               for name, ds in self._datasets.items() if name not in EPISODE_ARRAYS})
        if not self.arrays:
            self._file.close()
            raise InvalidArgument(f"{path}: no per-step arrays: expected datasets of one row per step "
                                  "such as 'observations', 'actions', 'rewards', 'terminals'")

    def lengths(self) -> np.ndarray:
        first = next(iter(self.arrays.values()))
        return episode_lengths(self.path, self._datasets, lambda n: self._datasets[n][()], lambda: first.rows)

    def read(self, name: str, a: int, b: int) -> np.ndarray:
        return native_order(np.asarray(self._datasets[name][a:b]))

    def close(self):
        self._file.close()


def write_d4rl(path, arrays: dict, metadata: dict | None = None) -> str:
    """Writes ``{name: array}`` as an HDF5 file in the D4RL layout (a name with
    '/' goes in a group: ``infos/qpos``); ``metadata`` values go under
    ``metadata/``. Returns the path."""
    h5py = import_h5py()
    arrays = check_writable(arrays)
    with h5py.File(path, "w") as f:
        for name, a in arrays.items():
            f.create_dataset(name, data=a)
        for key, value in (metadata or {}).items():
            f.create_dataset(f"metadata/{key}", data=value)
    return os.fspath(path)
