"""A TorchRL storage and prioritized sampler over a Reprise table.

``RepriseStorage`` is a ``torchrl.data`` storage: TorchRL's writers address it by
position (0 .. max_size - 1), its samplers draw positions, ``get`` returns TensorDicts.
Each position holds one one-step item of a Reprise table, so the data lives in a
Reprise store in shared memory, and the table can be served (``rp.Server``),
checkpointed (``rp.checkpoint``) and gathered on a GPU. ``ReprisePrioritizedSampler``
is TorchRL's ``PrioritizedSampler`` with the priorities in that table's f64 sum tree.

Layout and invariants:

- The signature comes from the first write: one field per tensor leaf of an element,
  named by its key (nested keys joined by "/"; a "/" or "%" inside a key part is
  written %2F or %25, so ``key_of(field_name(k)) == k``), of the leaf's per-element
  shape (an element's own batch dimensions included) and dtype (bfloat16 kept in an
  int16 field, viewed back on read). Later writes must match it exactly.
- ``_keys[p]`` is the key of the item at position p (0: none; keys are never 0) and
  ``_rows[p]`` its store row (-1: none). A row stays valid while its item lives: the
  item references its block, the store never evicts (``evict_when_store_full=False``),
  and the table never does either, since a write deletes the items at its positions
  before inserting, so the table stays within ``max_size``. Blocks are one step, so an
  overwrite in any order frees exactly the rows it replaces: ``max_size + 3`` rows
  always suffice (``Table``'s sizing rule for one writer).
- Reads gather rows straight from the store's memory (``index_select`` on the host,
  the fused gather kernel on a GPU): no draw is counted and no item is touched. A GPU
  read may still be running when ``get`` returns; the next write waits for it before
  rows can be freed and reused.
- ``_pos_of_slot[s]`` is the position whose item has slot ``s`` (``key & 0xffffffff``),
  so the sampler maps the keys the table draws back to positions in O(1) each.

Costs: ``set`` of n elements is O(n log size) in the table (delete, insert) plus one
copy of the data; ``get`` of n is one gather per field. Besides the store, 16 bytes per
position and 8 per table slot.

Not supported: storages of more than one dimension (``ndim > 1``), non-tensor leaves,
device stores, and pickling (serve ``storage.table`` with ``rp.Server`` instead). Items
inserted into the table by others are not part of the buffer; clients of a served table
should sample and update priorities, not insert, delete or reset.
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import weakref
from pathlib import Path

import numpy as np

try:
    import torch
    from tensordict import TensorDict, TensorDictBase, is_non_tensor, is_tensor_collection, is_tensorclass
    from torchrl.data.replay_buffers.checkpointers import StorageCheckpointerBase
    from torchrl.data.replay_buffers.samplers import PrioritizedSampler
    from torchrl.data.replay_buffers.storages import TensorStorage
    from torchrl.data.replay_buffers.storages.tensor import _flip_list
    from torchrl.data.replay_buffers.utils import _is_int
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError(f"reprise.integrations.torchrl needs TorchRL ({e}): pip install 'reprise[torchrl]'") from e

from .. import checkpoint
from .._convert import as_float, as_int
from ..errors import InvalidArgument
from ..selectors import Fifo, Prioritized, Uniform
from ..signature import Field
from ..store import Store
from ..table import Table

__all__ = ["RepriseStorage", "ReprisePrioritizedSampler", "field_name", "key_of"]

_FORMAT = "reprise-torchrl"
_VERSION = 1
_EMPTY_STORAGE_ERROR = "Cannot sample from an empty storage."
_SLOT_MASK = np.uint64(0xFFFFFFFF)
_TENSOR_KEY = ("_tensor",)  # the one field of a storage of plain tensors

# torch dtype -> the Reprise dtype that holds it (bfloat16: its bits, as int16).
_CARRIERS = {
    torch.bool: "bool", torch.int8: "int8", torch.int16: "int16", torch.int32: "int32", torch.int64: "int64",
    torch.uint8: "uint8", torch.float16: "float16", torch.float32: "float32", torch.float64: "float64",
    torch.bfloat16: "int16",
}
for _name in ("uint16", "uint32", "uint64"):
    if hasattr(torch, _name):
        _CARRIERS[getattr(torch, _name)] = _name


def field_name(key) -> str:
    """The Reprise field name of a TensorDict key: parts joined by "/", each part's
    "%" and "/" written %25 and %2F."""
    key = (key,) if isinstance(key, str) else tuple(key)
    return "/".join(part.replace("%", "%25").replace("/", "%2F") for part in key)


def key_of(name: str) -> tuple:
    """The TensorDict key (a tuple of parts) of a field name: ``field_name``'s inverse."""
    return tuple(part.replace("%2F", "/").replace("%25", "%") for part in name.split("/"))


def _show(key: tuple) -> str:
    return repr(key[0]) if len(key) == 1 else repr(key)


def _dtype_name(dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _described(dtype, shape) -> str:
    return f"{_dtype_name(dtype)}{list(shape)}"


class _Leaf:
    """One tensor leaf of an element: its key, field name, torch dtype and shape."""

    def __init__(self, key: tuple, dtype, shape: tuple):
        self.key, self.dtype, self.shape = key, dtype, tuple(int(d) for d in shape)
        self.name = field_name(key)
        self.carrier = _CARRIERS[dtype]

    def to_numpy(self, t) -> np.ndarray:
        t = t.detach().to("cpu")
        if t.dtype == torch.bfloat16:
            t = t.view(torch.int16)
        return t.contiguous().numpy()

    def from_field(self, t):
        return t.view(torch.bfloat16) if self.dtype == torch.bfloat16 else t


class _Spec:
    """What the first write fixed: the kind of element, its batch dimensions and leaves."""

    def __init__(self, kind: str, cls, batch: tuple, leaves: list):
        self.kind, self.cls, self.batch, self.leaves = kind, cls, tuple(batch), leaves
        self.by_key = {leaf.key: leaf for leaf in leaves}
        # The sampler's draws copy only this field (the smallest) before positions are read.
        self.cheapest = min(leaves, key=lambda f: Field(f.shape, f.carrier).nbytes).name

    @classmethod
    def infer(cls, data, lead: int) -> "_Spec":
        kind, klass, body = _unwrap(data)
        if kind == "tensor":
            leaves, batch = [(_TENSOR_KEY, body)], ()
        else:
            leaves, batch = _tensor_leaves(body), tuple(body.batch_size[lead:])
            if not leaves:
                raise InvalidArgument("RepriseStorage: the first TensorDict written holds no tensor: nothing to store")
        out = []
        for key, t in leaves:
            shape = tuple(t.shape[lead:])
            if t.dtype not in _CARRIERS:
                raise InvalidArgument(
                    f"RepriseStorage: key {_show(key)} is {_dtype_name(t.dtype)}, which Reprise cannot store; expected "
                    f"one of {', '.join(sorted({_dtype_name(d) for d in _CARRIERS}))}")
            if 0 in shape:
                raise InvalidArgument(f"RepriseStorage: key {_show(key)} has an empty dimension per element "
                                      f"({_described(t.dtype, shape)}); every dimension must be >= 1")
            out.append(_Leaf(key, t.dtype, shape))
        return cls(kind, klass, batch, out)

    def arrays(self, data, lead: int, n: int) -> dict:
        """``{field: array[n, *shape]}`` of ``data`` (``lead`` = 1 when it holds n
        elements, 0 when one), after checking it against the signature."""
        kind, _, body = _unwrap(data)
        if kind != self.kind:
            raise InvalidArgument(f"RepriseStorage holds {self.kind} elements (from its first write), got a {kind}")
        if kind == "tensor":
            got = {_TENSOR_KEY: body}
        else:
            want = (n, *self.batch) if lead else self.batch
            if tuple(body.batch_size) != want:
                raise InvalidArgument(f"RepriseStorage: expected a TensorDict of batch size {list(want)} for {n} "
                                      f"element(s) of batch size {list(self.batch)}, got {list(body.batch_size)}")
            got = dict(_tensor_leaves(body))
        for key, t in got.items():
            leaf = self.by_key.get(key)
            if leaf is None:
                raise InvalidArgument(f"RepriseStorage: unexpected key {_show(key)} ({_described(t.dtype, t.shape[lead:])} "
                                      f"per element); the storage holds the keys of its first write: {self._keys()}")
        out = {}
        for leaf in self.leaves:
            t = got.get(leaf.key)
            if t is None:
                raise InvalidArgument(f"RepriseStorage: key {_show(leaf.key)} ({_described(leaf.dtype, leaf.shape)}) is "
                                      f"missing; every write needs the keys of the first one: {self._keys()}")
            if t.dtype != leaf.dtype or tuple(t.shape) != ((n, *leaf.shape) if lead else leaf.shape):
                raise InvalidArgument(f"RepriseStorage: key {_show(leaf.key)} expects {_described(leaf.dtype, leaf.shape)} "
                                      f"per element, got {_described(t.dtype, t.shape[lead:])}")
        for leaf in self.leaves:
            a = leaf.to_numpy(got[leaf.key])
            out[leaf.name] = a if lead else a[None]
        return out

    def build(self, tensors: dict, lead: tuple, device):
        """The element(s) of ``tensors`` (``{key: tensor[*lead, *shape]}``)."""
        if self.kind == "tensor":
            return tensors[_TENSOR_KEY]
        td = TensorDict(tensors, batch_size=(*lead, *self.batch), device=device)
        return self.cls.from_tensordict(td) if self.kind == "tensorclass" else td

    def _keys(self) -> list:
        return [leaf.key[0] if len(leaf.key) == 1 else leaf.key for leaf in self.leaves]

    def state(self) -> dict:
        cls = None if self.cls is None else f"{self.cls.__module__}:{self.cls.__qualname__}"
        return {"kind": self.kind, "class": cls, "batch": list(self.batch),
                "leaves": [[list(f.key), _dtype_name(f.dtype), list(f.shape)] for f in self.leaves]}

    @classmethod
    def from_state(cls, state: dict, current: "_Spec | None") -> "_Spec":
        klass = None
        if state["kind"] == "tensorclass":
            if current is not None and current.state()["class"] == state["class"]:
                klass = current.cls
            else:
                module, _, qualname = state["class"].partition(":")
                try:
                    klass = importlib.import_module(module)
                    for part in qualname.split("."):
                        klass = getattr(klass, part)
                except (ImportError, AttributeError) as e:
                    raise InvalidArgument(f"RepriseStorage: cannot find the tensorclass {state['class']} of the saved "
                                          f"elements ({e}); load into a storage that already holds them") from None
        leaves = [_Leaf(tuple(k), getattr(torch, d), tuple(s)) for k, d, s in state["leaves"]]
        return cls(state["kind"], klass, tuple(state["batch"]), leaves)

    def same(self, other: "_Spec") -> bool:
        return self.state() == other.state()


def _unwrap(data):
    """``(kind, tensorclass or None, TensorDict or tensor)``."""
    if isinstance(data, torch.Tensor) and not is_tensor_collection(data):
        return "tensor", None, data
    if is_tensorclass(data):
        return "tensorclass", type(data), data.to_tensordict()
    if isinstance(data, TensorDictBase):
        return "tensordict", None, data
    raise InvalidArgument(f"RepriseStorage stores TensorDicts, tensorclasses and tensors, got {type(data).__name__}")


def _tensor_leaves(td) -> list:
    """``[(key tuple, tensor)]`` of ``td``'s tensor leaves; non-tensor data is refused."""
    out = []
    for key, value in td.items(include_nested=True, leaves_only=False):
        key = (key,) if isinstance(key, str) else tuple(key)
        if isinstance(value, torch.Tensor) and not is_tensor_collection(value):
            out.append((key, value))
        elif is_non_tensor(value):
            raise InvalidArgument(f"RepriseStorage: key {_show(key)} holds non-tensor data ({type(value).__name__}); "
                                  f"only tensors can be stored")
    return out


def _positions(index, length: int, what: str) -> np.ndarray:
    """``index`` as int64 positions in ``[0, length)`` (a 0-d array for one int),
    with torch's rules: negatives count from the end, a bool mask selects."""
    if isinstance(index, tuple):
        if len(index) != 1:
            raise IndexError(f"RepriseStorage is one-dimensional: {what} {index!r} has {len(index)} dimensions")
        index = index[0]
    if index is Ellipsis:
        index = slice(None)
    if isinstance(index, slice):
        return np.arange(*index.indices(length), dtype=np.int64)
    if isinstance(index, torch.Tensor):
        index = index.detach().cpu().numpy()
    arr = np.asarray(index)
    if arr.dtype == np.bool_:
        if arr.shape != (length,):
            raise IndexError(f"RepriseStorage: a boolean {what} needs shape [{length}], got {list(arr.shape)}")
        return np.flatnonzero(arr)
    if arr.size == 0:
        return arr.astype(np.int64)
    if not np.issubdtype(arr.dtype, np.integer):
        raise IndexError(f"RepriseStorage: {what} must hold integers, got {arr.dtype}")
    pos = arr.astype(np.int64, copy=False)
    if pos.min() < 0:
        pos = np.where(pos < 0, pos + length, pos)
    if pos.min() < 0 or pos.max() >= length:
        bad = np.flatnonzero(((pos < 0) | (pos >= length)).reshape(-1))
        raise IndexError(f"RepriseStorage: {what} {int(arr.reshape(-1)[bad[0]])} is out of range for {length} positions")
    return pos


def _device(device):
    if device is None or (isinstance(device, str) and device == "cpu") or getattr(device, "type", None) == "cpu":
        return torch.device("cpu")
    from ..torch import resolve
    return resolve(device)  # InvalidArgument where CUDA is missing


class _Checkpointer(StorageCheckpointerBase):
    """``storage.dumps(path)``/``loads(path)``: a Reprise checkpoint of the table plus the
    positions (see ``RepriseStorage.dumps``)."""

    def dumps(self, storage, path):
        storage._dumps(path)

    def loads(self, storage, path):
        storage._loads(path)


class RepriseStorage(TensorStorage):
    """A TorchRL storage of ``max_size`` elements, each a one-step item of a Reprise table.

    ``device``: where ``get`` returns data, ``"cpu"`` or a CUDA device (gathered by the
    GPU straight from the store's shared memory). ``name``: the table's name;
    ``directory``: where the store's file goes (default ``/dev/shm``); ``seed``: the
    table's random generator (default: the buffer's generator's seed, if it has one,
    else from the OS). The store and table are made at the first write, which fixes
    the signature; ``table`` and ``store`` are then Reprise's own objects.
    """

    supports_conditional_update = False
    _default_checkpointer = _Checkpointer

    def __init__(self, max_size: int, *, device="cpu", name: str = "replay", directory: str | None = None,
                 seed: int | None = None):
        max_size = as_int("RepriseStorage: max_size", max_size, 1)
        if max_size >= 1 << 32:
            raise InvalidArgument(f"RepriseStorage: max_size must be < 2^32, got {max_size}")
        if not isinstance(name, str) or not name:
            raise InvalidArgument(f"RepriseStorage: name must be a non-empty string, got {name!r}")
        if seed is not None:
            seed = as_int("RepriseStorage: seed", seed, 0)
        dev = _device(device)
        super().__init__(storage=None, max_size=max_size, device=dev)
        self.device = dev
        self._name, self._directory, self._seed = name, directory, seed
        self._store = self._table = self._writer = None
        self._spec = None
        self._keys = np.zeros(max_size, np.uint64)
        self._rows = np.full(max_size, -1, np.int64)
        self._pos_of_slot = np.full(max_size, -1, np.int64)
        self._prioritized = None  # the ReprisePrioritizedSampler whose alpha the table samples with
        self._read_event = None
        self._closed = False

    # --- Reprise's side -------------------------------------------------------------------

    @property
    def table(self) -> Table:
        """The Reprise table (exists from the first write on)."""
        self._check_ready()
        return self._table

    @property
    def store(self) -> Store:
        """The Reprise store holding the data (exists from the first write on)."""
        self._check_ready()
        return self._store

    @property
    def field_names(self) -> dict:
        """``{TensorDict key (a tuple): Reprise field name}`` (empty before the first write)."""
        return {} if self._spec is None else {leaf.key: leaf.name for leaf in self._spec.leaves}

    def close(self):
        """Closes the store (its shared-memory file is removed). Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._wait_for_reads()
        if self._writer is not None:
            self._writer.close()
        if self._store is not None:
            self._store.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def _check_open(self):
        if self._closed:
            raise InvalidArgument(f"RepriseStorage '{self._name}' is closed")

    def _check_ready(self):
        self._check_open()
        if self._table is None:
            raise InvalidArgument(f"RepriseStorage '{self._name}' has no table yet: the first write makes it, with "
                                  f"the signature of the data written")

    def _table_sampler(self):
        """The table's sampler: Prioritized(alpha) for a ReprisePrioritizedSampler of a
        buffer over this storage, else Uniform (what Reprise clients then draw)."""
        found = [self._prioritized] + [getattr(e, "_sampler", None) for e in self._attached_entities]
        found = [s for s in found if isinstance(s, ReprisePrioritizedSampler)]
        alphas = sorted({float(s.alpha) for s in found})
        if len(alphas) > 1:
            raise InvalidArgument(f"RepriseStorage '{self._name}': its buffers' ReprisePrioritizedSamplers have different "
                                  f"alphas {alphas}; they share one table, which has one priority exponent")
        if not found:
            return Uniform()
        self._prioritized = found[0]
        return Prioritized(alphas[0])

    def _create(self, spec: _Spec, sampler=None):
        sampler = self._table_sampler() if sampler is None else sampler
        seed = self._seed
        if seed is None and self._rng is not None:
            seed = int(self._rng.initial_seed())
        signature = {leaf.name: Field(leaf.shape, leaf.carrier) for leaf in spec.leaves}
        store = Store(signature, capacity=self.max_size + 3, block_steps=1, directory=self._directory)
        try:
            table = Table(self._name, store, sampler=sampler, remover=Fifo(), max_size=self.max_size, seed=seed,
                          evict_when_store_full=False)
            writer = store.writer()
        except BaseException:
            store.close()
            raise
        self._store, self._table, self._writer = store, table, writer

    def _bind_sampler(self, sampler: "ReprisePrioritizedSampler"):
        if self._prioritized is not None and self._prioritized is not sampler and self._prioritized.alpha != sampler.alpha:
            raise InvalidArgument(f"RepriseStorage '{self._name}' is sampled with alpha={self._prioritized.alpha} by "
                                  f"another ReprisePrioritizedSampler; this one has alpha={sampler.alpha}")
        cap = sampler._max_capacity
        if cap is not None and cap < self.max_size:
            raise InvalidArgument(f"ReprisePrioritizedSampler: max_capacity={cap} is less than the storage's "
                                  f"max_size={self.max_size}")
        if self._table is not None:
            want = ("Prioritized", float(sampler.alpha))
            if self._table._sampler._spec() != want:
                raise InvalidArgument(
                    f"RepriseStorage: table '{self._table.name}' samples with {self._table._sampler!r}, fixed when the "
                    f"first write made it, but this ReprisePrioritizedSampler needs Prioritized(priority_exponent="
                    f"{sampler.alpha}); make the replay buffer with this sampler before writing to the storage")
        self._prioritized = sampler

    def _insert_priority(self) -> float:
        s = self._prioritized
        return 1.0 if s is None else float(s.default_priority) + s._eps

    # --- writing --------------------------------------------------------------------------

    def set(self, cursor, data, *, set_cursor: bool = True):
        """Writes ``data`` (n elements, or one for an int ``cursor``) at the positions of
        ``cursor``; the first write fixes the signature. A bad write changes nothing."""
        self._check_open()
        if isinstance(data, list):
            data = _flip_list(data)
        pos = _positions(cursor, self.max_size, "cursor")
        if pos.ndim > 1:
            raise IndexError(f"RepriseStorage is one-dimensional: the cursor has shape {list(pos.shape)}")
        lead = 0 if pos.ndim == 0 else 1
        flat = pos.reshape(-1)
        spec = self._spec if self._spec is not None else _Spec.infer(data, lead)
        arrays = spec.arrays(data, lead, flat.size)
        if flat.size:
            # A position written twice in one call keeps its last element, as tensor indexing does.
            last = flat.size - 1 - np.unique(flat[::-1], return_index=True)[1]
            if last.size < flat.size:
                last.sort()
                flat, arrays = flat[last], {k: a[last] for k, a in arrays.items()}
            if self._table is None:
                self._create(spec)
            self._spec = spec
            self.initialized = True
            self._write(flat, arrays)
        if set_cursor:
            self._set_last_cursor(cursor)
            self._get_new_len(data, cursor)
        self._bump_mutation_revision()

    def _write(self, flat: np.ndarray, arrays: dict, priorities=None):
        """Replaces the items at positions ``flat`` (distinct) by new ones over ``arrays``."""
        self._wait_for_reads()
        old = self._keys[flat]
        old = old[old != 0]
        if old.size:
            self._table.delete(old)
        self._keys[flat], self._rows[flat] = 0, -1
        n = flat.size
        if priorities is None:
            priorities = np.full(n, self._insert_priority())
        w = self._writer
        try:
            w.extend(arrays)
            rows = w.recent_rows(n)
            keys = w.create_items(self._table, 1, priorities)
        finally:
            w.end_episode()
        self._keys[flat], self._rows[flat] = keys, rows
        slots = (keys & _SLOT_MASK).astype(np.int64)
        top = int(slots.max()) + 1
        if top > self._pos_of_slot.size:
            grown = np.full(max(top, 2 * self._pos_of_slot.size), -1, np.int64)
            grown[: self._pos_of_slot.size] = self._pos_of_slot
            self._pos_of_slot = grown
        self._pos_of_slot[slots] = flat

    def _empty(self):
        self._check_open()
        if self._table is not None:
            self._wait_for_reads()
            self._table.reset()
        self._keys[:], self._rows[:], self._pos_of_slot[:] = 0, -1, -1
        self._len = 0
        self._bump_mutation_revision()

    # --- reading --------------------------------------------------------------------------

    def get(self, index):
        """The elements at ``index`` (int, slice, list, array, tensor or bool mask) of the
        first ``len(self)`` positions, on ``device``."""
        self._check_open()
        if self._spec is None:
            raise RuntimeError("Cannot get elements out of a non-initialized storage.")
        pos = _positions(index, len(self), "index")
        fields = self._gather(pos.reshape(-1), self.device)
        tensors = {leaf.key: leaf.from_field(fields[leaf.name]).reshape((*pos.shape, *leaf.shape))
                   for leaf in self._spec.leaves}
        return self._spec.build(tensors, pos.shape, self.device)

    def _gather(self, flat: np.ndarray, dev) -> dict:
        """``{field: tensor[n, *shape]}`` (the field's dtype) of the items at ``flat``."""
        rows = self._rows[flat]
        empty = np.flatnonzero(rows < 0)
        if empty.size:
            raise IndexError(f"RepriseStorage: position {int(flat[empty[0]])} holds no element (never written)")
        n = rows.size
        columns = self._store._columns_for(dev)
        idx = torch.from_numpy(rows)
        if dev.type == "cpu":
            out = {leaf.name: columns.as_field(leaf.name, torch.index_select(columns.views[leaf.name], 0, idx), (n,))
                   for leaf in self._spec.leaves}
        else:
            from ..torch._device import new_event
            from ..torch.collect import gather
            data = gather(columns, [leaf.name for leaf in self._spec.leaves], idx.to(dev), n, 1, False)
            out = {name: t.reshape(n, *t.shape[2:]) for name, t in data.items()}
            event = new_event(dev)
            event.record()
            self._read_event = event
        return out

    def _wait_for_reads(self):
        """Waits for the GPU gathers of past reads: rows must not be freed under them."""
        event, self._read_event = self._read_event, None
        if event is not None:
            event.synchronize()

    def __len__(self):
        return self._len

    @property
    def shape(self):
        return None if self._spec is None else torch.Size([len(self)])

    def contains(self, item):
        if _is_int(item):
            i = int(item)
            return -len(self) <= i < len(self)
        if isinstance(item, torch.Tensor):
            return (item >= -len(self)) & (item < len(self))
        raise NotImplementedError(f"type {type(item)} is not supported yet.")

    # --- priorities (for ReprisePrioritizedSampler) ----------------------------------------

    def _draw(self, n: int, beta: float):
        """n positions drawn by the table's sampler, and their importance weights."""
        s = self._table.sample(n, timeout=0, fields=[self._spec.cheapest])
        return torch.from_numpy(self._positions_of(s.keys)), torch.from_numpy(s.importance_weights(beta).astype(np.float32))

    def _positions_of(self, keys: np.ndarray) -> np.ndarray:
        slots = (keys & _SLOT_MASK).astype(np.int64)
        known = slots < self._pos_of_slot.size
        pos = np.where(known, self._pos_of_slot[np.where(known, slots, 0)], -1)
        ok = (pos >= 0) & (self._keys[np.maximum(pos, 0)] == keys)
        if not ok.all():
            key = int(keys[np.flatnonzero(~ok)[0]])
            raise RuntimeError(f"RepriseStorage: table '{self._table.name}' drew item {key:#x}, which is at no position "
                               f"of this storage: items inserted into the table by others are not part of the buffer")
        return pos

    def _update_priorities(self, positions: np.ndarray, priorities: np.ndarray):
        bad = np.flatnonzero(positions >= self.max_size)
        if bad.size:
            raise IndexError(f"update_priority: index {int(positions[bad[0]])} is out of range for {self.max_size} positions")
        keys = self._keys[positions]
        empty = np.flatnonzero(keys == 0)
        if empty.size:
            raise InvalidArgument(f"update_priority: index {int(positions[empty[0]])} holds no element")
        self._table.update_priorities(keys, priorities)

    # --- state ----------------------------------------------------------------------------

    def _head(self) -> dict:
        cursor = self._last_cursor_index
        return {"_format": _FORMAT, "_version": _VERSION, "max_size": self.max_size, "_len": self._len,
                "last_cursor": cursor, "initialized": self._spec is not None}

    def state_dict(self) -> dict:
        """The elements as arrays: ``positions`` (int64), ``data`` (``{field: tensor[k, *shape]}``,
        the elements' dtypes), ``priorities`` (float64, as the table holds them), plus the
        signature, length and the table's sampler. Keys, times sampled and the table's
        random state are not kept (``dumps`` keeps them)."""
        self._check_open()
        sd = self._head()
        if self._spec is None:
            return sd
        filled = np.flatnonzero(self._rows >= 0)
        fields = self._gather(filled, torch.device("cpu")) if filled.size else {}
        priority = dict((k, p) for k, p, _, _ in self._table.items())
        sd.update(
            spec=self._spec.state(),
            sampler=list(self._table._sampler._spec()),
            positions=torch.from_numpy(filled),
            data={leaf.name: leaf.from_field(fields[leaf.name]) if filled.size
                  else torch.empty((0, *leaf.shape), dtype=leaf.dtype) for leaf in self._spec.leaves},
            priorities=torch.tensor([priority[int(k)] for k in self._keys[filled]], dtype=torch.float64),
        )
        return sd

    def _check_head(self, head: dict, what: str):
        if not isinstance(head, dict) or head.get("_format", head.get("format")) != _FORMAT:
            raise InvalidArgument(f"RepriseStorage: {what} is not a RepriseStorage's")
        if head["max_size"] != self.max_size:
            raise InvalidArgument(f"RepriseStorage: {what} holds max_size={head['max_size']}, this storage "
                                  f"has max_size={self.max_size}")

    def _check_spec(self, spec: _Spec, what: str):
        if self._spec is not None and not self._spec.same(spec):
            raise InvalidArgument(f"RepriseStorage: {what} holds elements {spec.state()}, this storage holds "
                                  f"{self._spec.state()}")

    def _restore_head(self, head: dict):
        self._len = int(head["_len"])
        if head.get("last_cursor") is not None:
            self._set_last_cursor(int(head["last_cursor"]))

    def load_state_dict(self, state_dict: dict):
        """Replaces the contents with a ``state_dict()``'s (validated first: a bad one changes nothing)."""
        self._check_open()
        self._check_head(state_dict, "the state_dict")
        if not state_dict["initialized"]:
            self._empty()
            self._restore_head(state_dict)
            return
        spec = _Spec.from_state(state_dict["spec"], self._spec)
        self._check_spec(spec, "the state_dict")
        sampler = tuple(state_dict["sampler"])
        if self._table is not None and self._table._sampler._spec() != sampler:
            raise InvalidArgument(f"RepriseStorage: the state_dict was saved from a table sampling with {sampler}, "
                                  f"this storage's samples with {self._table._sampler._spec()}")
        positions = _positions(state_dict["positions"], self.max_size, "saved position")
        k = positions.size
        data = {}
        for leaf in spec.leaves:
            t = state_dict["data"][leaf.name]
            if t.dtype != leaf.dtype or tuple(t.shape) != (k, *leaf.shape):
                raise InvalidArgument(f"RepriseStorage: the state_dict's field '{leaf.name}' is "
                                      f"{_described(t.dtype, t.shape)}, expected {_described(leaf.dtype, (k, *leaf.shape))}")
            data[leaf.name] = leaf.to_numpy(t)
        priorities = np.asarray(state_dict["priorities"], dtype=np.float64).reshape(-1)
        if priorities.size != k or not (np.isfinite(priorities) & (priorities >= 0)).all():
            raise InvalidArgument(f"RepriseStorage: the state_dict needs {k} finite priorities >= 0, got {priorities!r}")
        if np.unique(positions).size != k:
            raise InvalidArgument("RepriseStorage: the state_dict names a position twice")
        if self._table is None:
            kind, exponent = sampler
            self._create(spec, Prioritized(exponent) if kind == "Prioritized" else Uniform())
        else:
            self._empty()
        self._spec = spec
        self.initialized = True
        if k:
            self._write(positions, data, priorities)
        self._restore_head(state_dict)
        self._bump_mutation_revision()

    def _dumps(self, path):
        """Writes ``reprise_storage.json`` (length, signature, checkpoint name),
        ``positions.npz`` (key and row of every position) and a Reprise checkpoint of the
        table (``ckpt-*``, which ``rp.checkpoint.load`` and ``rp.Server(checkpoint_dir=)``
        read too) into ``path``; replaces what an earlier dump put there."""
        self._check_open()
        path = Path(path).absolute()
        path.mkdir(parents=True, exist_ok=True)
        meta_path = path / "reprise_storage.json"
        previous = None
        if meta_path.exists():
            with open(meta_path) as f:
                previous = json.load(f).get("checkpoint")
        meta = self._head()
        meta["checkpoint"] = None
        if self._spec is not None:
            self._wait_for_reads()
            meta["checkpoint"] = Path(checkpoint.save(path, self._table, progress=False)).name
            meta["spec"] = self._spec.state()
            np.savez(path / "positions.npz", keys=self._keys, rows=self._rows)
        tmp = path / "reprise_storage.json.tmp"
        with open(tmp, "w") as f:
            json.dump(meta, f)
        os.replace(tmp, meta_path)
        if previous and previous != meta["checkpoint"] and (path / previous).is_dir():
            shutil.rmtree(path / previous)

    def _loads(self, path):
        """Replaces the table and store by those of a ``dumps``: the same keys, priorities,
        times sampled, draws to come and rows (a checkpoint restores rows in place)."""
        self._check_open()
        path = Path(path).absolute()
        with open(path / "reprise_storage.json") as f:
            meta = json.load(f)
        self._check_head(meta, f"{path}")
        if not meta["initialized"]:
            self._empty()
            self._restore_head(meta)
            return
        spec = _Spec.from_state(meta["spec"], self._spec)
        self._check_spec(spec, f"{path}")
        with np.load(path / "positions.npz") as z:
            keys, rows = z["keys"].astype(np.uint64), z["rows"].astype(np.int64)
        if keys.shape != (self.max_size,) or rows.shape != (self.max_size,):
            raise InvalidArgument(f"RepriseStorage: {path}/positions.npz does not hold {self.max_size} positions")
        tables = checkpoint.load(path / meta["checkpoint"], progress=False, directory=self._directory)
        table = next(iter(tables.values()))
        try:
            live = {k for k, _, _, _ in table.items()}
            missing = [int(k) for k in keys[keys != 0] if int(k) not in live]
            if missing:
                raise InvalidArgument(f"RepriseStorage: {path}: the checkpoint lacks item {missing[0]:#x} of the "
                                      f"saved positions")
            if self._prioritized is not None and table._sampler._spec() != ("Prioritized", float(self._prioritized.alpha)):
                raise InvalidArgument(f"RepriseStorage: {path} holds a table sampling with {table._sampler!r}; this "
                                      f"storage's ReprisePrioritizedSampler needs alpha={self._prioritized.alpha}")
            writer = table.store.writer()
        except BaseException:
            table.store.close()
            raise
        self._wait_for_reads()
        if self._writer is not None:
            self._writer.close()
            self._store.close()
        self._store, self._table, self._writer = table.store, table, writer
        self._keys, self._rows = keys, rows
        filled = np.flatnonzero(keys != 0)
        slots = (keys[filled] & _SLOT_MASK).astype(np.int64)
        self._pos_of_slot = np.full(max(self.max_size, int(slots.max(initial=0)) + 1), -1, np.int64)
        self._pos_of_slot[slots] = filled
        self._spec = spec
        self.initialized = True
        self._restore_head(meta)

    def __getstate__(self):
        raise TypeError("a RepriseStorage cannot be pickled or sent to another process: its data lives in a Reprise "
                        "store; serve storage.table with rp.Server, or save it with dumps()")

    def __repr__(self):
        keys = [] if self._spec is None else self._spec._keys()
        return (f"RepriseStorage(max_size={self.max_size}, len={len(self)}, device={self.device}, "
                f"table={self._name!r}, keys={keys})")


class ReprisePrioritizedSampler(PrioritizedSampler):
    """TorchRL's ``PrioritizedSampler`` over a ``RepriseStorage``: the priorities are the
    items' priorities in the storage's table, drawn from its exact f64 sum tree.

    The table holds ``priority + eps`` and samples with exponent ``alpha`` (fixed when the
    first write makes the table, so ``alpha`` cannot change afterwards). New elements get
    the largest priority given so far (1 at first). ``priority_weight`` is
    ``(N * P(i)) ** -beta`` normalised by the batch's largest (TorchRL's divides by the
    buffer's smallest-priority weight instead). ``max_capacity`` is optional: when given
    it must be at least the storage's ``max_size``.
    """

    def __init__(self, max_capacity: int | None = None, *, alpha: float, beta: float, eps: float = 1e-8,
                 reduction: str = "max"):
        self._max_capacity = None if max_capacity is None else as_int("max_capacity", max_capacity, 1)
        self._alpha = self._checked("alpha", alpha)
        self._beta = self._checked("beta", beta)
        self._eps = self._checked("eps", eps)
        self.reduction = reduction
        self.dtype = torch.float64
        self._max_priority_within_buffer = False
        self._device = None
        self._max_seen = None
        self._storage_ref = None

    @staticmethod
    def _checked(name: str, value) -> float:
        value = as_float(f"ReprisePrioritizedSampler: {name}", value)
        if not np.isfinite(value) or value < 0:
            raise InvalidArgument(f"ReprisePrioritizedSampler: {name} must be finite and >= 0, got {value}")
        return value

    def _init(self):
        """No trees of its own: the table keeps the priorities."""

    @property
    def device(self):
        return torch.device("cpu")

    @property
    def alpha(self) -> float:
        return self._alpha

    @alpha.setter
    def alpha(self, value):
        value = self._checked("alpha", value)
        storage = self._storage()
        if storage is not None and storage._table is not None and value != self._alpha:
            raise InvalidArgument(f"ReprisePrioritizedSampler: alpha is the priority exponent of table "
                                  f"'{storage._table.name}', fixed when it was made; it cannot change to {value}")
        self._alpha = value

    @property
    def default_priority(self) -> float:
        return 1.0 if self._max_seen is None else self._max_seen

    def _storage(self):
        return None if self._storage_ref is None else self._storage_ref()

    def _bind(self, storage) -> RepriseStorage:
        storage = self._storage() if storage is None else storage
        if not isinstance(storage, RepriseStorage):
            raise InvalidArgument(f"ReprisePrioritizedSampler needs a RepriseStorage (the priorities live in its "
                                  f"Reprise table), got {type(storage).__name__}; use torchrl's PrioritizedSampler "
                                  f"with other storages")
        storage._bind_sampler(self)
        self._storage_ref = weakref.ref(storage)
        return storage

    def sample(self, storage, batch_size: int):
        storage = self._bind(storage)
        if len(storage) == 0 or storage._table is None or storage._table.size == 0:
            raise RuntimeError(_EMPTY_STORAGE_ERROR)
        index, weight = storage._draw(batch_size, self._beta)
        return index, {"priority_weight": weight}

    @torch.no_grad()
    def update_priority(self, index, priority, *, storage=None):
        """Sets the priorities of the elements at ``index`` (one priority, or one per
        index; indices < 0 are skipped, as TorchRL's writers mark them). Every priority
        is checked first: a bad one changes nothing."""
        storage = self._bind(storage)
        if isinstance(index, tuple):
            raise IndexError("ReprisePrioritizedSampler: RepriseStorage is one-dimensional; got a tuple index")
        idx = torch.as_tensor(index).detach().to("cpu", torch.int64).reshape(-1).numpy()
        p = torch.as_tensor(priority).detach().to("cpu", torch.float64).reshape(-1).numpy()
        if p.size == 1:
            p = np.full(idx.size, p[0])
        elif p.size != idx.size:
            raise InvalidArgument(f"update_priority: {p.size} priorities for {idx.size} indices; expected one per "
                                  f"index or one for all")
        keep = idx >= 0
        idx, p = idx[keep], p[keep]
        if idx.size == 0:
            return
        bad = np.flatnonzero(~np.isfinite(p) | (p < 0))
        if bad.size:
            i = bad[0]
            raise InvalidArgument(f"update_priority: index {int(idx[i])}: priority must be finite and >= 0, got {p[i]}")
        storage._update_priorities(idx, p + self._eps)
        top = float(p.max())
        self._max_seen = top if self._max_seen is None else max(self._max_seen, top)

    def mark_update(self, index, *, storage=None):
        """New elements were inserted at ``default_priority`` by the storage: only binds."""
        self._bind(storage)

    def _empty(self):
        self._max_seen = None

    def state_dict(self) -> dict:
        return {"_alpha": self._alpha, "_beta": self._beta, "_eps": self._eps, "_max_priority": self._max_seen}

    def load_state_dict(self, state_dict: dict):
        self.alpha = state_dict["_alpha"]
        self._beta = self._checked("beta", state_dict["_beta"])
        self._eps = self._checked("eps", state_dict["_eps"])
        m = state_dict["_max_priority"]
        self._max_seen = None if m is None else float(m)

    def dumps(self, path):
        path = Path(path).absolute()
        path.mkdir(parents=True, exist_ok=True)
        with open(path / "sampler_metadata.json", "w") as f:
            json.dump(self.state_dict(), f)

    def loads(self, path):
        with open(Path(path).absolute() / "sampler_metadata.json") as f:
            self.load_state_dict(json.load(f))

    def __getstate__(self):
        state = super().__getstate__()
        state["_storage_ref"] = None
        return state

    def __repr__(self):
        return f"{type(self).__name__}(alpha={self._alpha}, beta={self._beta}, eps={self._eps})"
