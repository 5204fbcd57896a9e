"""Conversions at the API boundary, called by the native extension.

numpy arrays must already have a field's exact dtype (an accidental float64
observation is an error, not a silent cast). Python scalars, lists and numpy
scalars are converted when no value changes."""

from __future__ import annotations

import numbers

import numpy as np

from .errors import InvalidArgument

_FLOAT_SOURCES = "biuf"
_INT_SOURCES = "biu"


def to_field_array(value, dtype: str, name: str, describe: str) -> np.ndarray:
    """Converts a non-array value for field ``name`` (expects ``describe``)."""
    try:
        src = np.asarray(value)
    except Exception as e:  # ragged lists and the like
        raise InvalidArgument(f"field '{name}' expects {describe}, got {type(value).__name__} ({e})") from None
    target = np.dtype(dtype)
    if src.dtype == target:
        return np.asarray(src, order="C")
    allowed = {"f": _FLOAT_SOURCES, "i": _INT_SOURCES, "u": _INT_SOURCES, "b": "b"}[target.kind]
    if src.dtype.kind not in allowed:
        raise InvalidArgument(
            f"field '{name}' expects {describe}, got {type(value).__name__} of {src.dtype} "
            f"{_shape(src.shape)}; pass a value convertible to {dtype} without loss"
        )
    with np.errstate(over="ignore", invalid="ignore"):
        out = src.astype(target)
    if target.kind in "iu" and not np.array_equal(out.astype(src.dtype), src):
        raise InvalidArgument(f"field '{name}' expects {describe}: value {value!r} does not fit in {dtype}")
    return np.asarray(out, order="C")


def _shape(shape) -> str:
    return "[" + ",".join(str(d) for d in shape) + "]"


def priorities(value, n: int | None = None) -> np.ndarray:
    """``n`` float64 priorities from an array, a list or one number (broadcast).
    With ``n`` None, any number of them (and no broadcasting)."""
    if isinstance(value, numbers.Real) and not isinstance(value, bool) and n is not None:
        return np.full(n, float(value), dtype=np.float64)
    try:
        arr = np.ascontiguousarray(np.asarray(value, dtype=np.float64).reshape(-1))
    except (TypeError, ValueError) as e:
        raise InvalidArgument(f"priorities must be numbers, got {type(value).__name__} ({e})") from None
    if n is None:
        if np.ndim(value) != 1:
            raise InvalidArgument(f"priorities must be a 1-D sequence of numbers, got shape {np.shape(value)}")
        return arr
    if np.ndim(value) not in (0, 1) or arr.shape[0] != n:
        raise InvalidArgument(f"expected {n} priorities (one per item or key), got shape {np.shape(value)}")
    return arr


def keys(value) -> np.ndarray:
    """Item keys as a contiguous uint64 array."""
    arr = np.asarray(value)
    if arr.ndim > 1:
        raise InvalidArgument(f"keys must be one-dimensional, got shape {arr.shape}")
    arr = arr.reshape(-1)
    if arr.dtype == np.uint64:
        return np.ascontiguousarray(arr)
    if arr.size == 0:
        return np.zeros(0, dtype=np.uint64)
    if arr.dtype.kind not in "iu" or (arr.dtype.kind == "i" and (arr < 0).any()):
        raise InvalidArgument(f"keys must be non-negative integers (uint64), got {arr.dtype} values")
    return np.ascontiguousarray(arr.astype(np.uint64))


def as_int(name: str, value, minimum: int | None = None) -> int:
    """An integer argument, with a clear error for floats, bools and strings."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise InvalidArgument(f"{name} must be an integer, got {type(value).__name__} {value!r}")
    value = int(value)
    if minimum is not None and value < minimum:
        raise InvalidArgument(f"{name} must be >= {minimum}, got {value}")
    return value


def as_float(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise InvalidArgument(f"{name} must be a number, got {type(value).__name__} {value!r}")
    return float(value)
