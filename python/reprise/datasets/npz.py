"""numpy ``.npz`` archives of per-step arrays of N rows each (``np.savez``,
``np.savez_compressed``, ``write_npz``)."""

from __future__ import annotations

import os
import zipfile
from pathlib import Path

import numpy as np

from ..errors import InvalidArgument
from .source import EPISODE_ARRAYS, EXPECTED, Array, check_writable, episode_lengths, native_order, ordered


class NpzReader:
    """A numpy ``.npz`` of per-step arrays; shapes and dtypes come from the array
    headers, the data from whole arrays (numpy cannot read part of one)."""

    format = "npz"

    def __init__(self, path: Path):
        self.path = path
        try:
            self._zip = zipfile.ZipFile(path)
        except (zipfile.BadZipFile, OSError) as e:
            raise InvalidArgument(f"{path}: not an npz file ({e}); {EXPECTED}") from None
        try:
            self._headers = {info.filename[:-4]: self._header(info)
                             for info in self._zip.infolist() if info.filename.endswith(".npy")}
        except BaseException:
            self._zip.close()
            raise
        self.arrays = ordered({name: Array(shape[0], tuple(shape[1:]), dtype)
                               for name, (shape, dtype) in self._headers.items()
                               if len(shape) >= 1 and name not in EPISODE_ARRAYS})
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
                self._cache[name] = native_order(np.lib.format.read_array(fh, allow_pickle=False))
        return self._cache[name]

    def lengths(self) -> np.ndarray:
        first = next(iter(self.arrays.values()))
        return episode_lengths(self.path, self._headers, self._whole, lambda: first.rows)

    def read(self, name: str, a: int, b: int) -> np.ndarray:
        return self._whole(name)[a:b]

    def close(self):
        self._cache.clear()
        self._zip.close()


def write_npz(path, arrays: dict) -> str:
    """Writes ``{name: array}`` as an ``.npz`` (numpy adds the suffix when missing).
    Returns the path written."""
    arrays = check_writable(arrays)
    path = os.fspath(path)
    np.savez(path, **arrays)
    return path if path.endswith(".npz") else path + ".npz"
