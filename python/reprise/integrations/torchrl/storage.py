"""``RepriseStorage``: a TorchRL storage whose elements are one-step items of a Reprise table.

TorchRL's writers address it by position (0 .. max_size - 1), its samplers draw
positions, ``get`` returns TensorDicts. The data lives in a Reprise store in shared
memory, so the table can be served (``rp.Server``), checkpointed (``rp.checkpoint``)
and gathered on a GPU.

Invariants:

- ``_keys[p]`` is the key of the item at position p (0: none; keys are never 0) and
  ``_rows[p]`` its store row (-1: none). A row stays valid while its item lives: the
  item references its block, the store never evicts (``evict_when_store_full=False``),
  and the table never does either, since a write deletes the items at its positions
  before inserting, so the table stays within ``max_size``. Blocks are one step, so an
  overwrite in any order frees exactly the rows it replaces before ``Table.insert``
  claims as many: ``max_size`` rows suffice (the store has 3 more).
- ``_pos_of_slot[s]`` is the position whose item has slot ``s`` (``key & 0xffffffff``),
  so the sampler maps the keys the table draws back to positions in O(1) each.
- A GPU read may still be running when ``get`` returns (``reading``); every write
  waits for it before rows can be freed and reused.

Costs: ``set`` of n elements is O(n log size) in the table (delete, insert) plus one
copy of the data; ``get`` of n is one gather per field. Besides the store, 16 bytes per
position and 8 per table slot.

Pickling (``pickle``, ``copy.deepcopy``, so a TorchRL buffer over it) makes a copy: the
table and its store go through Reprise's checkpoint format (``reprise.pickling``: a new
shared-memory file in the default directory), the positions as arrays; nothing is
shared with the original. Sending it to a process being spawned is refused, since
TorchRL expects that to share the storage: serve ``storage.table`` with ``rp.Server``.
"""

from __future__ import annotations

import weakref
from multiprocessing.context import get_spawning_popen

import numpy as np
import torch
from torchrl.data.replay_buffers.storages import TensorStorage
from torchrl.data.replay_buffers.storages.tensor import _flip_list
from torchrl.data.replay_buffers.utils import _is_int

from ..._convert import as_int
from ...errors import InvalidArgument
from ...selectors import Fifo, Prioritized, Uniform
from ...signature import Field
from ...store import Store
from ...table import Table
from . import persistence
from .indexing import positions
from .reading import Reader
from .signature import Spec

_SLOT_MASK = np.uint64(0xFFFFFFFF)
def _distinct(flat: np.ndarray) -> bool:
    """Whether the positions ``flat`` are known distinct at the cost of one comparison:
    they rise throughout, or rise in two runs with the second below the first (a
    writer's cursor that wrapped). False says nothing: the caller then checks."""
    falls = np.count_nonzero(flat[1:] <= flat[:-1])
    return falls == 0 or (falls == 1 and flat[-1] < flat[0])


def _device(device):
    if device is None or (isinstance(device, str) and device == "cpu") or getattr(device, "type", None) == "cpu":
        return torch.device("cpu")
    from ...torch import resolve
    return resolve(device)  # InvalidArgument where CUDA is missing


class TablePriorities:
    """A sampler whose priorities live in a ``RepriseStorage``'s table
    (``ReprisePrioritizedSampler``): what the storage reads of it.

    ``alpha`` is the table's priority exponent; new items go in at
    ``default_priority + _eps``; ``_max_capacity`` (or None) bounds ``max_size``;
    ``_storage()`` is the storage it is bound to (or None)."""

    alpha: float
    default_priority: float
    _eps: float
    _max_capacity: int | None


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
    _default_checkpointer = persistence.Checkpointer

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
        self._store = self._table = self._reader = None
        self._spec = None
        self._keys = np.zeros(max_size, np.uint64)
        self._rows = np.full(max_size, -1, np.int64)
        self._pos_of_slot = np.full(max_size, -1, np.int64)
        self._prioritized = None  # the TablePriorities sampler whose alpha the table samples with
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
        found = [s for s in found if isinstance(s, TablePriorities)]
        alphas = sorted({float(s.alpha) for s in found})
        if len(alphas) > 1:
            raise InvalidArgument(f"RepriseStorage '{self._name}': its buffers' ReprisePrioritizedSamplers have different "
                                  f"alphas {alphas}; they share one table, which has one priority exponent")
        if not found:
            return Uniform()
        self._prioritized = found[0]
        return Prioritized(alphas[0])

    def _create(self, spec: Spec, sampler=None):
        sampler = self._table_sampler() if sampler is None else sampler
        seed = self._seed
        if seed is None and self._rng is not None:
            seed = int(self._rng.initial_seed())
        signature = {leaf.name: Field(leaf.shape, leaf.carrier) for leaf in spec.leaves}
        store = Store(signature, capacity=self.max_size + 3, block_steps=1, directory=self._directory)
        try:
            table = Table(self._name, store, sampler=sampler, remover=Fifo(), max_size=self.max_size, seed=seed,
                          evict_when_store_full=False)
        except BaseException:
            store.close()
            raise
        self._store, self._table = store, table
        self._reader = Reader(store, spec)

    def _take(self, table: Table, keys: np.ndarray, rows: np.ndarray, spec: Spec):
        """Replaces the table, store and positions by those of a ``loads`` (the old store is closed)."""
        self._wait_for_reads()
        if self._store is not None:
            self._store.close()
        self._store, self._table = table.store, table
        self._reader = Reader(table.store, spec)
        self._keys, self._rows = keys, rows
        filled = np.flatnonzero(keys != 0)
        slots = (keys[filled] & _SLOT_MASK).astype(np.int64)
        self._pos_of_slot = np.full(max(self.max_size, int(slots.max(initial=0)) + 1), -1, np.int64)
        self._pos_of_slot[slots] = filled
        self._spec = spec
        self.initialized = True

    def _bind_sampler(self, sampler: TablePriorities):
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
        pos = positions(cursor, self.max_size, "cursor")
        if pos.ndim > 1:
            raise IndexError(f"RepriseStorage is one-dimensional: the cursor has shape {list(pos.shape)}")
        lead = 0 if pos.ndim == 0 else 1
        flat = pos.reshape(-1)
        spec = self._spec if self._spec is not None else Spec.infer(data, lead)
        arrays = spec.arrays(data, lead, flat.size)
        if flat.size:
            if not _distinct(flat):
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
        """Replaces the items at positions ``flat`` (distinct) by new ones over ``arrays``:
        the old items are deleted, then one ``Table.insert`` of one-step items copies
        each column once and returns the new keys with their store rows. Where the
        insert fails, the positions are left empty (their old items are deleted)."""
        self._wait_for_reads()
        old = self._keys[flat]
        old = old[old != 0]
        if old.size:
            self._table.delete(old)
        n = flat.size
        if priorities is None:
            priorities = np.full(n, self._insert_priority())
        steps = {k: a.reshape(n, 1, *a.shape[1:]) for k, a in arrays.items()}
        try:
            keys, rows = self._table._native.insert(steps, priorities, None, True)
        except BaseException:
            self._keys[flat], self._rows[flat] = 0, -1
            raise
        self._record(flat, keys, rows)

    def _record(self, flat: np.ndarray, keys: np.ndarray, rows: np.ndarray):
        """Puts the new items ``keys`` (at store ``rows``) at positions ``flat``."""
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
        spec = self._spec
        if spec is None:
            raise RuntimeError("Cannot get elements out of a non-initialized storage.")
        pos = positions(index, self._len, "index")
        return spec.build(self._read(pos.reshape(-1), pos.shape, self.device), pos.shape, self.device)

    def _read(self, flat: np.ndarray, lead: tuple, device) -> list:
        """``[tensor[*lead, *shape] per leaf]`` of the items at positions ``flat``."""
        rows = self._rows[flat]
        if rows.size and rows.min() < 0:
            raise IndexError(f"RepriseStorage: position {int(flat[np.flatnonzero(rows < 0)[0]])} holds no element "
                             f"(never written)")
        tensors, event = self._reader.read(rows, lead, device)
        if event is not None:
            self._read_event = event
        return tensors

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

    def _update_priorities(self, at: np.ndarray, priorities: np.ndarray):
        bad = np.flatnonzero(at >= self.max_size)
        if bad.size:
            raise IndexError(f"update_priority: index {int(at[bad[0]])} is out of range for {self.max_size} positions")
        keys = self._keys[at]
        empty = np.flatnonzero(keys == 0)
        if empty.size:
            raise InvalidArgument(f"update_priority: index {int(at[empty[0]])} holds no element")
        self._table.update_priorities(keys, priorities)

    # --- state (persistence) and pickling ---------------------------------------------------

    def state_dict(self) -> dict:
        """The elements as tensors: ``positions`` (int64), ``data`` (``{field: tensor[k, *shape]}``,
        the elements' dtypes), ``priorities`` (float64, as the table holds them), plus the
        signature, length and the table's sampler. Keys, times sampled and the table's
        random state are not kept (``dumps`` keeps them)."""
        return persistence.state_dict(self)

    def load_state_dict(self, state_dict: dict):
        """Replaces the contents with a ``state_dict()``'s (validated first: a bad one changes nothing)."""
        persistence.load_state_dict(self, state_dict)

    def __getstate__(self):
        self._check_open()
        if get_spawning_popen() is not None:
            raise RuntimeError(f"RepriseStorage '{self._name}' cannot be shared with a process being spawned: its "
                               f"pickle is a copy, which the buffer there would fill and sample on its own; serve "
                               f"storage.table with rp.Server and write or sample through clients")
        self._wait_for_reads()
        state = super().__getstate__()  # the table and store pickle themselves, as a checkpoint (a copy)
        state["_reader"] = state["_read_event"] = None
        sampler = self._prioritized
        state["_bound_to_sampler"] = sampler is not None and sampler._storage() is self
        return state

    def __setstate__(self, state):
        bound = state.pop("_bound_to_sampler", False)
        super().__setstate__(state)
        if self._store is not None:
            self._reader = Reader(self._store, self._spec)
        if bound:
            self._prioritized._storage_ref = weakref.ref(self)

    def __copy__(self):
        raise TypeError("a RepriseStorage cannot be copied shallowly (the copy would share its table but not its "
                        "positions); use copy.deepcopy or pickle, which copy the table too")

    def __repr__(self):
        keys = [] if self._spec is None else self._spec.keys()
        return (f"RepriseStorage(max_size={self.max_size}, len={len(self)}, device={self.device}, "
                f"table={self._name!r}, keys={keys})")
