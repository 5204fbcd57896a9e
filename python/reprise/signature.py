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
PADDINGS = ("reset", "zero")
MAX_STACK = 64


@dataclass(frozen=True)
class Field:
    """``Field((84, 84), "uint8")``: shape of one step and its dtype.

    ``compress="zstd"`` stores the field compressed, one zstd frame per step, at
    ``level`` (1-19, default 3): a block's rows stay raw while it is being written
    and are compressed once it is full. Samples return exactly what was written.
    For host stores only (a GPU store keeps its columns raw).

    ``stack=k`` (k > 1) stores one frame of ``shape`` per step and samples each step
    as the last k frames of its episode, ``[k, *shape]`` oldest first, as gymnasium's
    ``FrameStackObservation(env, k)`` stacks them: writers append the newest frame
    only, and an episode's first steps are padded with its first frame
    (``padding="reset"``, gymnasium's default) or zeros (``padding="zero"``). An
    n-step item's first and last steps are its observation and next observation,
    from the same stored frames. Host stores only; with ``compress`` each frame is
    compressed once."""

    shape: tuple
    dtype: str
    compress: str | None = None
    level: int | None = None
    stack: int = 1
    padding: str = "reset"

    def __init__(self, shape=(), dtype="float32", compress: str | None = None, level: int | None = None,
                 stack: int = 1, padding: str = "reset"):
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
        if isinstance(stack, bool) or not isinstance(stack, (int, np.integer)) or not 1 <= stack <= MAX_STACK:
            raise InvalidArgument(f"Field stack={stack!r}: expected the number of frames a step samples as, "
                                  f"1 (no stack) to {MAX_STACK}")
        if padding not in PADDINGS:
            raise InvalidArgument(f"Field padding={padding!r}: expected 'reset' (an episode's first frame, as "
                                  f"gymnasium's FrameStackObservation pads) or 'zero'")
        if padding != "reset" and stack == 1:
            raise InvalidArgument(f"Field padding={padding!r} needs stack > 1 (an unstacked field is not padded)")
        object.__setattr__(self, "shape", tuple(int(d) for d in shape))
        object.__setattr__(self, "dtype", name)
        object.__setattr__(self, "compress", compress)
        object.__setattr__(self, "level", None if compress is None else int(DEFAULT_LEVEL if level is None else level))
        object.__setattr__(self, "stack", int(stack))
        object.__setattr__(self, "padding", padding)

    @classmethod
    def _from_native(cls, shape, dtype, level=None, stack=1, padding="reset") -> "Field":
        """A field as the native side lists it (a zstd level or None, the stack and
        its padding)."""
        return cls(tuple(shape), dtype, compress=None if level is None else "zstd", level=level,
                   stack=stack, padding=padding if stack > 1 else "reset")

    @property
    def sample_shape(self) -> tuple:
        """The shape of one step of a sample: ``(stack, *shape)`` when stacked."""
        return (self.stack, *self.shape) if self.stack > 1 else self.shape

    @property
    def nbytes(self) -> int:
        """Bytes per step stored (uncompressed; one frame of a stacked field)."""
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize

    def __repr__(self):
        extra = ""
        if self.compress is not None:
            extra += f", compress={self.compress!r}, level={self.level}"
        if self.stack > 1:
            extra += f", stack={self.stack}" + ("" if self.padding == "reset" else f", padding={self.padding!r}")
        return f"Field({self.shape}, {self.dtype!r}{extra})"
