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


COMPRESSORS = ("zstd",)
DEFAULT_LEVEL = 3
LEVELS = range(1, 20)


@dataclass(frozen=True)
class Field:
    """``Field((84, 84), "uint8")``: shape of one step and its dtype.

    ``compress="zstd"`` stores the field compressed, one zstd frame per step, at
    ``level`` (1-19, default 3): a block's rows stay raw while it is being written
    and are compressed once it is full. Samples return exactly what was written.
    For host stores only (a GPU store keeps its columns raw)."""

    shape: tuple
    dtype: str
    compress: str | None = None
    level: int | None = None

    def __init__(self, shape=(), dtype="float32", compress: str | None = None, level: int | None = None):
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
        if compress is not None and compress not in COMPRESSORS:
            raise InvalidArgument(f"Field compress={compress!r}: expected None or one of {', '.join(map(repr, COMPRESSORS))}")
        if level is not None:
            if compress is None:
                raise InvalidArgument(f"Field level={level!r} needs compress='zstd' (a raw field has no level)")
            if isinstance(level, bool) or not isinstance(level, (int, np.integer)) or int(level) not in LEVELS:
                raise InvalidArgument(f"Field level={level!r}: expected a zstd level from {LEVELS.start} to {LEVELS.stop - 1}")
        object.__setattr__(self, "shape", tuple(int(d) for d in shape))
        object.__setattr__(self, "dtype", name)
        object.__setattr__(self, "compress", compress)
        object.__setattr__(self, "level", None if compress is None else int(DEFAULT_LEVEL if level is None else level))

    @property
    def nbytes(self) -> int:
        """Bytes per step (uncompressed)."""
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize

    def __repr__(self):
        if self.compress is None:
            return f"Field({self.shape}, {self.dtype!r})"
        return f"Field({self.shape}, {self.dtype!r}, compress={self.compress!r}, level={self.level})"
