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


def statuses(recv, starts: np.ndarray) -> np.ndarray:
    """Each source's status word (int64; 0: its rows are there) from the received
    bytes (a uint8 tensor, on the host or a GPU): one small copy to the host."""
    import torch
    at = torch.from_numpy((starts[:, None] + np.arange(8)).reshape(-1)).to(recv.device)
    return recv.index_select(0, at).cpu().numpy().view(np.int64)


def in_position_order(recv, starts: np.ndarray, counts: np.ndarray, stride: int, order: np.ndarray):
    """The received rows (``[n, stride]`` uint8 tensor, where ``recv`` is) in position
    order: row ``order[j]`` is the j-th to arrive (sources in rank order)."""
    import torch
    parts = [recv[s + STATUS:s + STATUS + int(n) * stride].view(int(n), stride)
             for s, n in zip(starts.tolist(), counts.tolist()) if n]
    if not parts:
        return torch.empty((0, stride), dtype=torch.uint8, device=recv.device)
    arrived = parts[0] if len(parts) == 1 else torch.cat(parts)
    if np.array_equal(order, np.arange(len(order))):
        return arrived
    inverse = np.empty_like(order)
    inverse[order] = np.arange(len(order))
    return arrived.index_select(0, torch.from_numpy(inverse).to(recv.device))


def unpack(rows, signature: dict, steps: int, verify: bool, what: str, device=None):
    """``(header, data)`` of ``rows`` (``[n, stride]`` uint8 tensor, on the host or a
    GPU) with unfilled rows dropped; ``data[field]`` is ``[n, T, *shape]`` with T the
    longest item: numpy arrays when ``device`` is None, else tensors there (rows on a
    GPU stay there: only headers, and with ``verify`` the rows, cross to the host).
    Raises ``Corrupt`` when a row's CRC-32 does not match."""
    import torch
    offsets, stride = layout(signature, steps)
    on_host = rows.device.type == "cpu"
    if verify:
        host = rows.numpy() if on_host else rows.cpu().numpy()
        header = np.ascontiguousarray(host[:, :HEADER]).view(HEADER_DTYPE).reshape(-1)
        bad = _native.cluster.check_rows(host.reshape(-1), stride)
        if bad >= 0:
            raise Corrupt(
                f"{what}: the row of key {int(header['key'][bad])} from shard {int(header['shard'][bad])} "
                f"(slot {int(header['slot'][bad])}) failed its CRC-32 check"
            )
    else:
        header = rows[:, :HEADER].cpu().numpy().copy().view(HEADER_DTYPE).reshape(-1)
    keep = header["flags"] == 1
    if not keep.all():
        header = header[keep]
        rows = rows.index_select(0, torch.from_numpy(np.nonzero(keep)[0]).to(rows.device))
    longest = int(header["length"].max()) if len(header) else 0
    data = {}
    for (name, f), at in zip(signature.items(), offsets):
        item = int(np.prod(f.shape, dtype=np.int64)) * np.dtype(f.dtype).itemsize
        part = rows[:, at:at + longest * item].contiguous()
        shape = (rows.shape[0], longest, *f.shape)
        if on_host:  # numpy views (every dtype of the signature), then the device asked for
            arr = part.numpy().view(np.dtype(f.dtype)).reshape(shape)
            data[name] = arr if device is None else torch.from_numpy(arr).to(device)
        else:
            from ..torch.columns import torch_dtype
            t = part.view(torch_dtype(f.dtype)).reshape(shape)
            data[name] = t.cpu().numpy() if device is None else t.to(device)
    return header, data
