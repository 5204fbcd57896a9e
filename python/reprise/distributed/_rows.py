"""The packed rows of cluster mode's exchange: a 48-byte header, the item's
attribute record (tables with attributes), then each field's steps, every part
8-byte aligned, the same fixed size for every row of a step
(so split sizes follow from the plan and no counts are exchanged). Each source's
part starts with ``STATUS`` bytes: its status word (0: rows follow) and how many of
its rows are filled, which the receiver checks against the rows marked filled. A
row's CRC-32 covers its header and data (all but the CRC word)."""

from __future__ import annotations

import math

import numpy as np

from .. import _native
from .._pool import POOL
from ..errors import Corrupt
from ..signature import Field

HEADER = 48
HEADER_DTYPE = np.dtype([
    ("key", "<u8"), ("probability", "<f8"), ("priority", "<f8"), ("times_sampled", "<u4"),
    ("length", "<u4"), ("shard", "<u4"), ("slot", "<u4"), ("crc", "<u4"), ("flags", "<u4"),
])
assert HEADER_DTYPE.itemsize == HEADER
# Each source's part of an exchange starts with this many bytes of status.
STATUS = 16
# A locator row (a same-host reader's): the header, the record, then each step's store
# row number where a row's data would be (int64, -1 past the item's end).
LOCATOR = {"row": Field((), "int64")}


def _align(n: int) -> int:
    return (n + 7) // 8 * 8


def step_bytes(field) -> int:
    """Bytes of one step of ``field`` as sampled (its stack of frames when stacked)."""
    return math.prod(field.sample_shape) * np.dtype(field.dtype).itemsize


def layout(signature: dict, steps: int, record: int = 0) -> tuple[list[int], int]:
    """``(offsets, stride)``: where each field starts in a row of ``steps`` steps
    whose attribute record takes ``record`` bytes after the header."""
    offsets, at = [], HEADER + _align(record)
    for f in signature.values():
        offsets.append(at)
        at += _align(steps * step_bytes(f))
    return offsets, at


class Layout:
    """The rows of a step of ``steps`` steps, worked out once: data rows of
    ``signature`` (``offsets``, ``stride``) and locator rows (``loc_offsets``,
    ``loc_stride``), both with an attribute record of ``record`` bytes; each field's
    bytes per step (``items``) and how its steps read back (``fields``: name,
    dtype, sampled shape)."""

    def __init__(self, signature: dict, steps: int, record: int = 0):
        self.signature, self.steps, self.record = signature, steps, record
        self.offsets, self.stride = layout(signature, steps, record)
        self.loc_offsets, self.loc_stride = layout(LOCATOR, steps, record)
        self.items = [step_bytes(f) for f in signature.values()]
        self.fields = [(name, np.dtype(f.dtype), tuple(f.sample_shape)) for name, f in signature.items()]


def write_statuses(send: np.ndarray, starts: np.ndarray, status: int, counts: np.ndarray) -> None:
    """Writes each part's ``STATUS`` bytes into ``send`` (uint8): the status word
    (0: rows follow) and the part's count of filled rows (``counts``, one per part
    starting at ``starts``; every part starts 8-byte aligned)."""
    words = send[: send.size // 8 * 8].view(np.int64)
    words[starts // 8] = status
    words[starts // 8 + 1] = counts


def statuses(recv, splits: list) -> tuple:
    """``(starts, statuses, declared)`` of a step's received parts (``splits[s]``
    bytes from source s, end to end, in ``recv``, a uint8 tensor on the host or a
    GPU): each part's first byte (int64), its status word (a list) and its count of
    filled rows (int64; ``write_statuses``). On the host one native call; on a GPU
    one small copy to the host."""
    if recv.device.type == "cpu":
        return _native.cluster.statuses(recv.numpy(), splits)
    import torch
    starts = np.cumsum(splits) - np.array(splits, dtype=np.int64)
    at = torch.from_numpy((starts[:, None] + np.arange(STATUS)).reshape(-1)).to(recv.device)
    words = recv.index_select(0, at).cpu().numpy().view(np.int64).reshape(-1, 2)
    return starts, words[:, 0].tolist(), words[:, 1]


def crc_failure(what: str, header) -> Corrupt:
    """The error for a row (its ``HEADER_DTYPE`` header) whose CRC-32 does not match."""
    return Corrupt(f"{what}: the row of key {int(header['key'])} from shard {int(header['shard'])} "
                   f"(slot {int(header['slot'])}) failed its CRC-32 check")


def check_counts(filled_by_source: np.ndarray, declared: np.ndarray, what: str, ranks=None) -> None:
    """Raises ``Corrupt`` naming the first source whose rows marked filled are not as
    many as it said it sent (a damaged flag word would otherwise drop a row). Source
    s is rank ``ranks[s]`` (default: rank s)."""
    bad = np.nonzero(filled_by_source != declared)[0]
    if bad.size:
        s = int(bad[0])
        rank = s if ranks is None else int(ranks[s])
        raise Corrupt(f"{what}: rank {rank} sent {int(declared[s])} filled rows but {int(filled_by_source[s])} "
                      f"arrived marked filled (a damaged row header)")


def unpack_received(recv: np.ndarray, starts: np.ndarray, counts: np.ndarray, sources: np.ndarray, lay: Layout,
                    verify: bool, what: str, declared: np.ndarray, device=None, packed: bool = False, located=None,
                    columns=(), strides=None):
    """``(header, records, data)`` straight from the received bytes on the host
    (``recv``, uint8): source s sent ``counts[s]`` rows (``lay``'s) from byte
    ``starts[s] + STATUS``, in position order, and ``sources[p]`` is the source of
    position p; unpacked in position order in one native pass
    (``_native.cluster.unpack_rows``: header, attribute record, each field's steps,
    the CRC checked as each row is read with ``verify``). Unfilled rows are dropped
    after checking each source's count against ``declared``. ``data`` as
    ``unpack``'s, or with ``packed`` each field's steps end to end,
    ``[total_steps, *shape]``; large fields in pooled memory (``reprise._pool``).
    ``records``: ``n * lay.record`` bytes.

    ``located[s]``: source s sent locators (``LOCATOR`` rows) of rows this process
    reads from that source's store, whose columns are ``columns`` (one flat uint8
    array per field, mapped here): those rows' steps are copied from there.
    ``strides``: each source's row size (int64), when the caller has them."""
    located = np.zeros(len(counts), bool) if located is None else np.ascontiguousarray(located, bool)
    if strides is None:
        strides = np.where(located, lay.loc_stride, lay.stride).astype(np.int64)
    at, row_located, filled_by_source, longest, total = _native.cluster.arrivals(
        recv, np.asarray(starts, np.int64), np.asarray(counts, np.int64), strides, located,
        np.asarray(sources, np.int64), lay.steps, packed)
    if (filled_by_source != declared).any():
        check_counts(filled_by_source, declared, what)
    n = at.size
    outputs = [POOL.empty(total * item) for item in lay.items]
    header = np.empty(n * HEADER, np.uint8)
    records = np.empty(n * lay.record, np.uint8)
    bad = _native.cluster.unpack_rows(recv, at, lay.stride, lay.offsets, lay.items, longest, header, outputs, verify,
                                      lay.record, records, packed, row_located if row_located.any() else None,
                                      (lay.loc_stride, lay.loc_offsets[0]), list(columns))
    if bad >= 0:
        failure = crc_failure(what, recv[at[bad]:at[bad] + HEADER].copy().view(HEADER_DTYPE)[0])
        if row_located[bad]:
            failure = Corrupt(f"{failure} or names a row outside its owner's store (a damaged locator)")
        raise failure
    data = {}
    for (name, dtype, shape), out in zip(lay.fields, outputs):
        arr = out.view(dtype).reshape((total, *shape) if packed else (n, longest, *shape))
        if device is not None:
            import torch
            arr = torch.from_numpy(arr).to(device)
        data[name] = arr
    return header.view(HEADER_DTYPE), records, data


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


def unpack(rows, signature: dict, steps: int, verify: bool, what: str, device=None, declared=None, sources=None,
           record: int = 0):
    """``(header, records, data)`` of ``rows`` (``[n, stride]`` uint8 tensor, on the
    host or a GPU) with unfilled rows dropped; ``data[field]`` is ``[n, T, *shape]``
    with T the longest item: numpy arrays when ``device`` is None, else tensors there
    (rows on a GPU stay there: only headers, attribute records and, with ``verify``,
    the rows cross to the host). Raises ``Corrupt`` when a row's CRC-32 does not
    match, or (given each row's source rank ``sources`` and each source's
    ``declared`` count of filled rows) when a source's rows marked filled are not as
    many as it sent."""
    import torch
    offsets, stride = layout(signature, steps, record)
    on_host = rows.device.type == "cpu"
    if verify:
        host = rows.numpy() if on_host else rows.cpu().numpy()
        header = np.ascontiguousarray(host[:, :HEADER]).view(HEADER_DTYPE).reshape(-1)
        bad = _native.cluster.check_rows(host.reshape(-1), stride)
        if bad >= 0:
            raise crc_failure(what, header[bad])
    else:
        header = rows[:, :HEADER].cpu().numpy().copy().view(HEADER_DTYPE).reshape(-1)
    keep = header["flags"] == 1
    if declared is not None:
        check_counts(np.bincount(sources[keep], minlength=len(declared)), declared, what)
    if not keep.all():
        header = header[keep]
        rows = rows.index_select(0, torch.from_numpy(np.nonzero(keep)[0]).to(rows.device))
    records = rows[:, HEADER:HEADER + record].cpu().numpy().reshape(-1).copy()
    longest = min(int(header["length"].max()), steps) if len(header) else 0
    data = {}
    for (name, f), at in zip(signature.items(), offsets):
        part = rows[:, at:at + longest * step_bytes(f)].contiguous()
        shape = (rows.shape[0], longest, *f.shape)
        if on_host:  # numpy views (every dtype of the signature), then the device asked for
            arr = part.numpy().view(np.dtype(f.dtype)).reshape(shape)
            data[name] = arr if device is None else torch.from_numpy(arr).to(device)
        else:
            from ..torch.columns import torch_dtype
            t = part.view(torch_dtype(f.dtype)).reshape(shape)
            data[name] = t.cpu().numpy() if device is None else t.to(device)
    return header, records, data
