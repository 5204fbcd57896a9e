"""What every format's reader shares: the reader interface, episode boundaries, field order,
and the lazy h5py import.

A reader (``D4RLReader``, ``MinariReader``, ``NpzReader``) is opened on one file and has
``format``, ``path``, ``arrays`` (``{name: Array}``, per-step arrays in ``ordered`` order, from
the file's metadata alone), ``lengths()`` (episode lengths, summing to the rows of each array),
``read(name, a, b)`` (rows ``a:b`` of one array, in native byte order) and ``close()``. A reader
that raises while opening has closed its file.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import numpy as np

from ..errors import InvalidArgument
from ..signature import DTYPES

# Per-step episode markers, looked for in this order.
MARKERS = (("terminals", "timeouts"), ("dones",), ("terminations", "truncations"))
EPISODE_ARRAYS = ("episode_lengths", "episode_starts")
# Fields listed first, in this order; the rest follow by name.
FIRST = ("observations", "actions", "rewards", "next_observations", "returns_to_go", "timesteps",
         "terminals", "timeouts", "terminations", "truncations", "dones")
EXPECTED = ("expected an HDF5 file in the D4RL layout (.hdf5/.h5), a Minari dataset "
            "(directory, its data/main_data.hdf5, or id) or an .npz file")


class Array(NamedTuple):
    """One per-step array of a file: its rows, and the shape and dtype of one row."""
    rows: int
    shape: tuple
    dtype: np.dtype


def ordered(arrays: dict) -> dict:
    rank = {name: i for i, name in enumerate(FIRST)}
    return dict(sorted(arrays.items(), key=lambda kv: (rank.get(kv[0].split("/")[0], len(rank)), kv[0])))


def native_order(a: np.ndarray) -> np.ndarray:
    return a if a.dtype.isnative else a.astype(a.dtype.newbyteorder("="))


def supported(dtype: np.dtype) -> bool:
    return dtype.kind in "biuf" and dtype.name in DTYPES


def import_h5py():
    try:
        import h5py
    except ImportError:
        raise InvalidArgument("reading HDF5 datasets needs h5py: pip install 'reprise[datasets]'") from None
    return h5py


def open_hdf5(path: Path):
    try:
        return import_h5py().File(path, "r")
    except OSError as e:
        raise InvalidArgument(f"{path}: not a readable HDF5 file ({e}); {EXPECTED}") from None


def episode_lengths(path: Path, names, get, steps) -> np.ndarray:
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
    found = next(([n for n in group if n in names] for group in MARKERS if any(n in names for n in group)), None)
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


def check_writable(arrays) -> dict:
    """``{name: ndarray}`` of the arrays a ``write_*`` function was given, checked."""
    if not isinstance(arrays, dict) or not arrays:
        raise InvalidArgument(f"arrays must be a non-empty dict of name -> array, got {type(arrays).__name__}")
    out = {}
    for name, a in arrays.items():
        a = np.asarray(a)
        if not isinstance(name, str) or not name or a.ndim < 1:
            raise InvalidArgument(f"array {name!r}: expected a non-empty name and an array of one row per step")
        out[name] = a
    return out
