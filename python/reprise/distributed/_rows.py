"""The packed rows of cluster mode's exchange: a 48-byte header then each field's
steps, every part 8-byte aligned, the same fixed size for every row of a step
(so split sizes follow from the plan and no counts are exchanged)."""

from __future__ import annotations

import numpy as np

from .. import _native
from ..errors import Corrupt

HEADER = 48
HEADER_DTYPE = np.dtype([
    ("key", "<u8"), ("probability", "<f8"), ("priority", "<f8"), ("times_sampled", "<u4"),
    ("length", "<u4"), ("shard", "<u4"), ("slot", "<u4"), ("crc", "<u4"), ("flags", "<u4"),
])
assert HEADER_DTYPE.itemsize == HEADER
# Each source's part of an exchange starts with this many bytes of status.
STATUS = 16


def _align(n: int) -> int:
    return (n + 7) // 8 * 8


def layout(signature: dict, steps: int) -> tuple[list[int], int]:
    """``(offsets, stride)``: where each field starts in a row of ``steps`` steps."""
    offsets, at = [], HEADER
    for f in signature.values():
        offsets.append(at)
        at += _align(steps * int(np.prod(f.shape, dtype=np.int64)) * np.dtype(f.dtype).itemsize)
    return offsets, at


def unpack(rows: np.ndarray, signature: dict, steps: int, verify: bool, what: str):
    """``(header, data)`` of ``rows`` (``[n, stride]`` uint8) with unfilled rows
    dropped; ``data[field]`` is ``[n, T, *shape]`` with T the longest item. Raises
    ``Corrupt`` when a row's CRC-32 does not match."""
    offsets, stride = layout(signature, steps)
    header = np.ascontiguousarray(rows[:, :HEADER]).view(HEADER_DTYPE).reshape(-1)
    if verify:
        bad = _native.cluster.check_rows(np.ascontiguousarray(rows).reshape(-1), stride)
        if bad >= 0:
            raise Corrupt(
                f"{what}: the row of key {int(header['key'][bad])} from shard {int(header['shard'][bad])} "
                f"(slot {int(header['slot'][bad])}) failed its CRC-32 check"
            )
    keep = header["flags"] == 1
    if not keep.all():
        rows, header = rows[keep], header[keep]
    longest = int(header["length"].max()) if len(header) else 0
    data = {}
    for (name, f), at in zip(signature.items(), offsets):
        item = int(np.prod(f.shape, dtype=np.int64)) * np.dtype(f.dtype).itemsize
        part = np.ascontiguousarray(rows[:, at:at + longest * item])
        data[name] = part.view(np.dtype(f.dtype)).reshape((rows.shape[0], longest, *f.shape))
    return header, data
