"""Samples: the result of one draw of n items, and their packed (varlen) layout."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from .errors import InvalidArgument


class Packed:
    """Items' steps end to end, the layout varlen attention kernels take.

    ``data[field]`` has shape ``[total_steps, *field.shape]``; item ``i`` is
    ``data[field][cu_seqlens[i]:cu_seqlens[i + 1]]``. ``cu_seqlens`` is int32
    ``[n + 1]`` starting at 0 (flash-attn's convention), ``lengths`` int64 ``[n]``,
    ``position_ids`` int64 ``[total_steps]`` (each item counts from 0; made when
    first read) and ``max_seqlen`` the longest item. With a ``device`` these are
    torch tensors there.
    """

    def __init__(self, data: dict, cu_seqlens, lengths, max_seqlen: int, device=None):
        self.data, self.cu_seqlens, self.lengths, self.max_seqlen = data, cu_seqlens, lengths, max_seqlen
        self._device = device

    @functools.cached_property
    def position_ids(self):
        cu = _host(self.cu_seqlens).astype(np.int64)
        lengths = np.diff(cu)
        ids = np.arange(int(cu[-1]), dtype=np.int64) - np.repeat(cu[:-1], lengths)
        return ids if self._device is None else _move(ids, self._device)

    @property
    def total_steps(self) -> int:
        return int(self.cu_seqlens[-1])

    def __repr__(self):
        fields = ", ".join(f"{k}: {v.dtype}{list(v.shape)}" for k, v in self.data.items())
        return f"Packed(n={len(self.lengths)}, total_steps={self.total_steps}, data={{{fields}}})"


class _Padded(Mapping):
    """``data`` of a sample drawn packed: ``[n, T, ...]`` arrays (zeros past each
    item's length) made from the packed rows on first use of each field."""

    def __init__(self, packed: dict, lengths: np.ndarray):
        self._packed, self._lengths, self._made = packed, lengths, {}

    def __getitem__(self, name):
        if name not in self._made:
            self._made[name] = _pad(self._packed[name], self._lengths)
        return self._made[name]

    def __iter__(self):
        return iter(self._packed)

    def __len__(self):
        return len(self._packed)


def padded_view(packed: dict, lengths) -> Mapping:
    """``data`` for packed rows: each field padded to ``[n, T, ...]`` when first read."""
    return _Padded(packed, np.asarray(lengths))


def _pad(flat, lengths: np.ndarray):
    """``[n, longest, ...]`` of packed rows, zeros past each item's length (numpy,
    or torch on the packed rows' device)."""
    n, t = len(lengths), int(lengths.max()) if len(lengths) else 0
    if isinstance(flat, np.ndarray):
        out = np.zeros((n, t) + flat.shape[1:], dtype=flat.dtype)
        out[np.arange(t) < lengths[:, None]] = flat
        return out
    from .torch._device import torch_module
    torch = torch_module()
    out = torch.zeros((n, t) + tuple(flat.shape[1:]), dtype=flat.dtype, device=flat.device)
    mask = torch.arange(t, device=flat.device)[None, :] < torch.as_tensor(lengths, device=flat.device)[:, None]
    out[mask] = flat
    return out


def _cu_seqlens(lengths: np.ndarray) -> np.ndarray:
    cu = np.zeros(len(lengths) + 1, dtype=np.int32)
    np.cumsum(lengths, out=cu[1:])
    return cu


@dataclass
class Sample:
    """n drawn items.

    ``data[field]`` has shape ``[n, T, *field.shape]`` where T is the longest item;
    rows past ``lengths[i]`` are zeros. ``probabilities[i]`` is the probability that
    this draw picked item i and ``table_size`` the table's size when the draw began,
    so prioritized-replay importance weights are ``(table_size * probabilities) ** -beta``.
    ``attributes[name]`` holds the items' attributes (tables made with ``attributes``).

    A sample drawn by token budget (``table.sample(tokens=...)``) holds its rows
    packed (``packed_data``, no padding anywhere); its ``data`` pads a field only
    when it is read. ``packed()`` gives the varlen layout of any sample and
    ``split(k)`` divides one into k parts of near-equal token counts.
    """

    keys: np.ndarray
    probabilities: np.ndarray
    priorities: np.ndarray
    times_sampled: np.ndarray
    table_size: int
    lengths: np.ndarray
    data: dict = field(default_factory=dict)
    attributes: dict = field(default_factory=dict)
    packed_data: dict | None = None

    @classmethod
    def _packed(cls, packed_data: dict, **fields) -> "Sample":
        """A sample whose rows are packed (``packed_data``); ``data`` pads on demand."""
        return cls(**fields, data=_Padded(packed_data, np.asarray(fields["lengths"])), packed_data=packed_data)

    def __len__(self) -> int:
        return int(self.keys.shape[0])

    @property
    def num_steps(self) -> int:
        """The items' total steps (tokens)."""
        return int(np.asarray(self.lengths).sum())

    def importance_weights(self, beta: float = 1.0) -> np.ndarray:
        """``(N * P(i)) ** -beta`` normalised by its maximum, as in prioritized replay."""
        w = (self.table_size * self.probabilities) ** (-float(beta))
        return w / w.max() if len(w) else w

    def packed(self, fields: list[str] | None = None, device=None) -> Packed:
        """The items' steps end to end (see ``Packed``). A sample drawn by token
        budget is packed already (no copy on the host); any other is unpadded here.
        ``device``: torch tensors there (``"cpu"`` shares the arrays' memory)."""
        lengths = np.asarray(self.lengths, dtype=np.int64)
        names = list(self.packed_data if self.packed_data is not None else self.data) if fields is None else fields
        source = self.packed_data if self.packed_data is not None else None
        data = {}
        for name in names:
            if source is not None and name in source:
                data[name] = source[name]
            elif name in self.data:
                padded = _host(self.data[name])
                data[name] = padded[np.arange(padded.shape[1]) < lengths[:, None]]
            else:
                known = list(source if source is not None else self.data)
                raise InvalidArgument(f"packed: unknown field {name!r}; this sample has {known}")
        cu = _cu_seqlens(lengths)
        max_seqlen = int(lengths.max()) if len(lengths) else 0
        if device is None:
            return Packed(data, cu, lengths, max_seqlen)
        return Packed({k: _move(v, device) for k, v in data.items()}, _move(cu, device), _move(lengths, device),
                      max_seqlen, device)

    def split(self, k: int, balance: str = "tokens", groups: bool = False) -> list["Sample"]:
        """k samples whose token counts are near equal (longest items first, each
        to the part with the fewest tokens so far: LPT). Every item goes to exactly
        one part, in draw order within it; a part may be empty when k > n. Each part
        keeps its items' keys, probabilities and attributes, and packs as a sample
        does (for one data-parallel rank or one gradient-accumulation step).
        ``groups=True`` keeps groups whole: the runs of side-by-side items with the
        same ``attributes["group"]`` (a group-table draw's layout) move as one."""
        if not isinstance(k, (int, np.integer)) or isinstance(k, bool) or k < 1:
            raise InvalidArgument(f"split: k must be an int >= 1, got {k!r}")
        if balance not in ("tokens", "items"):
            raise InvalidArgument(f"split: balance must be 'tokens' or 'items', got {balance!r}")
        lengths = np.asarray(self.lengths, dtype=np.int64)
        weights = lengths if balance == "tokens" else np.ones_like(lengths)
        if not groups:
            parts = balanced_parts(weights, int(k))
            return [self._subset(np.asarray(p, dtype=np.int64)) for p in parts]
        if "group" not in self.attributes:
            raise InvalidArgument(f"split(groups=True) needs the attribute 'group'; this sample has "
                                  f"{sorted(self.attributes)}")
        ids = _host(self.attributes["group"])
        starts = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]]) if len(ids) else np.zeros(0, np.int64)
        ends = np.r_[starts[1:], len(ids)].astype(np.int64)
        units = balanced_parts(np.add.reduceat(weights, starts) if len(ids) else weights, int(k))
        return [self._subset(np.concatenate([np.arange(starts[u], ends[u]) for u in p]).astype(np.int64)
                             if p else np.zeros(0, np.int64)) for p in units]

    def _subset(self, idx: np.ndarray) -> "Sample":
        """The items ``idx`` of this sample, in that order."""
        attributes = {k: v[idx] for k, v in self.attributes.items()}
        base = dict(keys=self.keys[idx], probabilities=self.probabilities[idx], priorities=self.priorities[idx],
                    times_sampled=self.times_sampled[idx], table_size=self.table_size,
                    lengths=np.asarray(self.lengths)[idx], attributes=attributes)
        if self.packed_data is None:
            return Sample(**base, data={k: v[idx] for k, v in self.data.items()})
        cu = _cu_seqlens(np.asarray(self.lengths, dtype=np.int64))
        rows = (np.concatenate([np.arange(cu[i], cu[i + 1]) for i in idx]) if len(idx)
                else np.zeros(0, dtype=np.int64))
        return Sample._packed({k: v[rows] for k, v in self.packed_data.items()}, **base)

    def to(self, device) -> "Sample":
        """This sample with its arrays and attributes as torch tensors on ``device``
        (``"cpu"``: sharing memory). A packed sample's ``packed_data`` moves."""
        self.attributes = {k: _move(v, device) for k, v in self.attributes.items()}
        if self.packed_data is not None:
            self.packed_data = {k: _move(v, device) for k, v in self.packed_data.items()}
            self.data = _Padded(self.packed_data, np.asarray(self.lengths))
        else:
            self.data = {k: _move(v, device) for k, v in self.data.items()}
        return self

    def __repr__(self):
        source = self.packed_data if self.packed_data is not None else self.data
        fields = ", ".join(f"{k}: {v.dtype}{list(v.shape)}" for k, v in source.items())
        layout = "packed " if self.packed_data is not None else ""
        return f"Sample(n={len(self)}, table_size={self.table_size}, {layout}data={{{fields}}})"


def balanced_parts(weights: np.ndarray, k: int) -> list[list[int]]:
    """Indices of ``weights`` in k parts of near-equal sums: heaviest first, each to
    the lightest part so far (LPT: within 4/3 of the best possible largest part);
    each part lists its indices in ascending order."""
    import heapq
    heap = [(0, j) for j in range(k)]
    parts: list[list[int]] = [[] for _ in range(k)]
    for i in np.argsort(-np.asarray(weights), kind="stable"):
        load, j = heapq.heappop(heap)
        parts[j].append(int(i))
        heapq.heappush(heap, (load + int(weights[i]), j))
    return [sorted(p) for p in parts]


def _host(v):
    """A numpy view of ``v`` (torch CPU tensors and the like)."""
    if isinstance(v, np.ndarray):
        return v
    return v.detach().cpu().numpy() if hasattr(v, "detach") else np.asarray(v)


def _move(v, device):
    """``v`` as a torch tensor on ``device`` (a numpy array on the CPU shares its memory)."""
    from .torch._device import torch_module
    torch = torch_module()
    dev = torch.device(device)
    if isinstance(v, np.ndarray):
        t = torch.from_numpy(np.ascontiguousarray(v))
        return t if dev.type == "cpu" else t.to(dev)
    return v.to(dev)
