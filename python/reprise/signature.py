"""Fields: the per-step shape and dtype of one named part of a step."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .errors import InvalidArgument

DTYPES = (
    "bool", "int8", "int16", "int32", "int64",
    "uint8", "uint16", "uint32", "uint64",
    "float16", "float32", "float64",
)


@dataclass(frozen=True)
class Field:
    """``Field((4, 84, 84), "uint8")``: shape of one step and its dtype."""

    shape: tuple
    dtype: str

    def __init__(self, shape=(), dtype="float32"):
        if isinstance(shape, (int, np.integer)):
            shape = (int(shape),)
        try:
            shape = tuple(shape)
        except TypeError:
            raise InvalidArgument(f"Field shape must be a tuple of ints, got {shape!r}") from None
        for d in shape:
            if isinstance(d, bool) or not isinstance(d, (int, np.integer)) or d < 1:
                raise InvalidArgument(f"Field shape {shape!r}: every dimension must be an int >= 1")
        try:
            name = np.dtype(dtype).name
        except TypeError:
            name = str(dtype)
        if name not in DTYPES:
            raise InvalidArgument(f"unknown dtype {dtype!r}: expected one of {', '.join(DTYPES)}")
        object.__setattr__(self, "shape", tuple(int(d) for d in shape))
        object.__setattr__(self, "dtype", name)

    @property
    def nbytes(self) -> int:
        """Bytes per step."""
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize

    def __repr__(self):
        return f"Field({self.shape}, {self.dtype!r})"
