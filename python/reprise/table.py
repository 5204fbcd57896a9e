"""Tables: items over a store, picked by a sampler, evicted by a remover, paced by
a rate limiter."""

from __future__ import annotations

import functools
import json
import time
import warnings

import numpy as np

from . import _native
from ._attributes import arrays, check_fixed, check_schema, records, values
from ._convert import as_int
from .errors import CapacityWarning, InvalidArgument, NotFound
from .extensions import Extension, _from_spec, _specs_json
from .rate_limiters import MinSize, Queue, RateLimiter, Stack
from .sample import Sample, padded_view
from .selectors import Fifo, Lifo, Selector, Uniform
from .store import Store
from .torch._device import host_tensors, is_host_device, on_device, torch_module


def _collect(rows, columns, fields, to_host=False, stream=None, schema=None) -> Sample:
    """A Sample of ``rows``: copied on the host (``columns`` None) or gathered from
    ``columns`` on their device (then moved to numpy when ``to_host``), with the
    items' attributes by ``schema``."""
    if columns is None:
        s = rows.to_sample(fields)
        s.attributes = arrays(schema, rows.records(), len(s)) if schema else {}
        return s
    from .torch.collect import collect_rows
    s = collect_rows(rows, columns, fields, stream, schema)
    return _to_host(s) if to_host else s


def _to_host(s: Sample) -> Sample:
    """``s`` with its device tensors copied into numpy arrays (a packed sample's
    ``packed_data``, its padded ``data`` made from them when read)."""
    s.attributes = {k: v.cpu().numpy() for k, v in s.attributes.items()}
    if s.packed_data is not None:
        s.packed_data = {k: v.cpu().numpy() for k, v in s.packed_data.items()}
        s.data = padded_view(s.packed_data, s.lengths)
        return s
    s.data = {k: v.cpu().numpy() for k, v in s.data.items()}
    return s


def _resident_kind(sampler, max_times_sampled) -> bool:
    """Whether a table with GPU selection draws on the device from its mirror
    (given no extension that looks at each draw): see ``reprise.torch.resident``."""
    return sampler._spec()[0] in ("Uniform", "Prioritized") and max_times_sampled == 0


def _warn_if_the_store_cannot_hold(name: str, store: Store, max_size: int, evicts: bool) -> None:
    """Warns when even one-step items cannot fill ``max_size``. A new item's steps are
    written before the remover drops the oldest item, a writer holds the block it is
    filling, and a block comes free only when its last item goes: a store holds
    ``max_size`` items of ``k`` steps with ``(max_size + 1) x k + 2 x block_steps``
    steps (exactly, with a Fifo or Lifo remover and one writer; other removers free
    rows out of order and need more, and so does each further writer). With stacked
    fields a block holds ``block_steps - (stack - 1)`` steps of an episode it continues
    (see ``Field``'s ``stack``), and each episode takes ``stack - 1`` rows more."""
    lead = max(f.stack for f in store.signature.values()) - 1
    bs = store.block_steps
    need = -(-(max_size + 1) * bs // (bs - lead)) + 2 * bs
    if store.capacity >= need:
        return
    then = "evict items (ring semantics)" if evicts else "refuse writes (ResourceExhausted)"
    stacked = (f" x {bs}/{bs - lead} (a block holds {bs - lead} steps of a stacked episode it continues)"
               if lead else "")
    warnings.warn(
        f"table '{name}': max_size={max_size} needs a store of at least {need} steps even for one-step items "
        f"((max_size + 1) x 1{stacked} + 2 x block_steps: the next item's step, the block a writer is filling and "
        f"the oldest, partly freed one); "
        f"the store has {store.capacity}, so it will {then} before the table holds max_size. Give the store "
        f"capacity >= (max_size + 1) x steps per item{stacked} + 2 x block_steps.",
        CapacityWarning, stacklevel=3)


def _items_in(data) -> int:
    """n of an insert's ``{field: array[n, T, ...]}`` (0 when it cannot tell: the
    native insert then names what is wrong with ``data``)."""
    if isinstance(data, dict):
        for v in data.values():
            shape = getattr(v, "shape", None)
            if shape:
                return int(shape[0])
            try:
                return len(v)
            except TypeError:
                return 0
    return 0


_ITEM_SETTINGS = ("attributes", "max_staleness", "group_size", "group_timeout", "on_group_timeout")


def _item_settings(name: str, items: dict) -> dict:
    """The item settings a queue or stack passes on (anything else is refused)."""
    for k in items:
        if k not in _ITEM_SETTINGS:
            raise InvalidArgument(f"table '{name}': unexpected setting {k!r}; a queue or stack takes "
                                  f"{list(_ITEM_SETTINGS)} besides its own")
    return items


class Table:
    """A replay table.

    ``max_size`` items at most: inserting into a full table evicts the item the
    ``remover`` picks. ``max_times_sampled`` > 0 removes an item once it has been
    sampled that often (0 = unlimited). ``seed`` makes selection reproducible.

    When a writer needs room and the store has no free block, the store works as a
    ring: the items in the block leased longest ago are evicted (counted in
    ``info()["num_store_evictions"]``), unless a table over it was made with
    ``evict_when_store_full=False`` (queues and stacks: their items are consumed,
    never dropped), in which case the writer gets ``ResourceExhausted``.

    ``extensions``: the built-in observers whose figures ``stats()`` returns
    (``reprise.extensions``); None attaches every built-in (with ``selection_device``
    and a Uniform or Prioritized sampler: the two its device-resident draws keep
    exact, PriorityHistogram and Rates), ``[]`` none.

    ``attributes``: named per-item scalars, ``{name: dtype}`` (any numeric numpy
    dtype), given for every item at insert (``insert(..., attributes=...)``,
    ``Writer.create_item(..., attributes=...)``), returned with every draw as
    ``sample.attributes[name]`` and updated by ``update_attributes``.
    ``max_staleness=k`` (needs an int64 attribute ``version``): an item whose
    version is below ``table.version - k`` is never drawn; ``set_version`` removes
    such items at once and an insert that is already stale is dropped (its key is
    0). ``group_size=G`` (needs an int64 attribute ``group``): items become
    sampleable only in whole groups of G (GRPO's prompt groups); ``sample(n)``
    (n a multiple of G) returns whole groups side by side, picked by the sampler
    with a group's priority the sum of its members'. A group still incomplete
    ``group_timeout`` seconds after its first member arrived is dropped
    (``on_group_timeout="drop"``) or admitted as it is (``"partial"``). See
    docs/async-rl.md.
    """

    def __init__(self, name: str, store: Store, sampler: Selector | None = None, remover: Selector | None = None,
                 max_size: int | None = None, rate_limiter: RateLimiter | None = None,
                 max_times_sampled: int = 0, seed: int | None = None, selection_device: str | None = None,
                 evict_when_store_full: bool = True, extensions=None, attributes: dict | None = None,
                 max_staleness: int | None = None, group_size: int | None = None,
                 group_timeout: float | None = None, on_group_timeout: str = "drop"):
        if not isinstance(name, str) or not name:
            raise InvalidArgument(f"table name must be a non-empty string, got {name!r}")
        if not isinstance(store, Store):
            raise InvalidArgument(f"table '{name}': store must be a reprise.Store, got {type(store).__name__}")
        store._check_open()
        sampler = Uniform() if sampler is None else sampler
        remover = Fifo() if remover is None else remover
        rate_limiter = MinSize(1) if rate_limiter is None else rate_limiter
        for role, sel in (("sampler", sampler), ("remover", remover)):
            if not isinstance(sel, Selector):
                raise InvalidArgument(f"table '{name}': {role} must be a reprise.selectors selector, got {sel!r}")
        if not isinstance(rate_limiter, RateLimiter):
            raise InvalidArgument(f"table '{name}': rate_limiter must be a reprise.rate_limiters limiter, got {rate_limiter!r}")
        selection = None
        if not is_host_device(selection_device):
            if store._staged:
                raise InvalidArgument(f"table '{name}': selection_device needs the rows gathered on the device in "
                                      f"place, and {store._staged}: select on the host (no selection_device)")
            from .torch import resolve
            try:
                selection = resolve(selection_device)
            except InvalidArgument as e:
                raise InvalidArgument(f"table '{name}': selection_device: {e}") from None
        if max_size is None:
            max_size = store.capacity
        else:
            max_size = as_int(f"table '{name}': max_size", max_size)
            _warn_if_the_store_cannot_hold(name, store, max_size, evict_when_store_full)
        max_times_sampled = as_int(f"table '{name}': max_times_sampled", max_times_sampled)
        if seed is not None:
            seed = as_int(f"table '{name}': seed", seed, minimum=0)
        if extensions is None and selection is not None and _resident_kind(sampler, max_times_sampled):
            # Every built-in that a device-resident draw keeps exact (see docs/gpu.md).
            from .extensions import PriorityHistogram, Rates
            extensions = [PriorityHistogram(), Rates()]
        extensions = _specs_json(name, extensions)
        schema = check_schema(name, attributes)
        if max_staleness is not None:
            max_staleness = as_int(f"table '{name}': max_staleness", max_staleness, minimum=0)
        group = None
        if group_size is not None:
            group_size = as_int(f"table '{name}': group_size", group_size, minimum=1)
            if group_timeout is not None:
                if isinstance(group_timeout, bool) or not isinstance(group_timeout, (int, float)) \
                        or not group_timeout >= 0 or group_timeout == float("inf"):
                    raise InvalidArgument(f"table '{name}': group_timeout must be a finite number of seconds >= 0 "
                                          f"or None, got {group_timeout!r}")
                group_timeout = float(group_timeout)
            group = (group_size, group_timeout, on_group_timeout)
        elif group_timeout is not None:
            raise InvalidArgument(f"table '{name}': group_timeout is for tables with group_size")
        if (max_staleness is not None or group is not None) and store._device_columns is not None:
            raise InvalidArgument(f"table '{name}': max_staleness and group_size need a host store in this version; "
                                  f"this store keeps its steps on {store.device}")
        native = _native.Table(
            name, store._native, sampler._spec(), remover._spec(), max_size, rate_limiter._spec(),
            max_times_sampled, seed, bool(evict_when_store_full), selection is not None, extensions, schema,
            max_staleness, group,
        )
        self._store = store
        store._tables[name] = self
        self._sampler, self._remover, self._rate_limiter = sampler, remover, rate_limiter
        self._native = native
        self._selection = None
        if selection is not None:
            kind, exponent = sampler._spec()
            if self._native.resident_refusal() is None:
                from .torch.resident import ResidentSelection
                self._selection = ResidentSelection(self._native, kind, exponent, selection, seed, max_size)
            else:
                from .torch.selection import DeviceSelection
                self._selection = DeviceSelection(self._native, kind, exponent, selection, seed, max_size,
                                                  max_times_sampled)

    @classmethod
    def _restored(cls, native, store: Store, snapshot: dict) -> "Table":
        """Wraps a table rebuilt by ``reprise.checkpoint.load``."""
        from . import selectors as S
        from .rate_limiters import RateLimiter
        t = cls.__new__(cls)
        t._store = store
        store._tables[native.name] = t

        def selector(spec):
            kind, exponent = spec
            return S.Prioritized(exponent) if kind == "Prioritized" else getattr(S, kind)()

        t._sampler, t._remover = selector(snapshot["sampler"]), selector(snapshot["remover"])
        t._rate_limiter = RateLimiter(*snapshot["rate_limiter"])
        t._native = native
        t._selection = None
        return t

    @classmethod
    def queue(cls, name: str, store: Store, max_size: int, seed: int | None = None, **items) -> "Table":
        """Fifo in, Fifo out, each item sampled exactly once; inserts block while
        ``max_size`` items wait, samples block while none does. ``items``: the
        item settings a table takes (``attributes``, ``max_staleness``)."""
        return cls(name, store, sampler=Fifo(), remover=Fifo(), max_size=max_size,
                   rate_limiter=Queue(max_size), max_times_sampled=1, seed=seed, evict_when_store_full=False,
                   **_item_settings(name, items))

    @classmethod
    def stack(cls, name: str, store: Store, max_size: int, seed: int | None = None, **items) -> "Table":
        """Like ``queue`` but the newest item comes out first."""
        return cls(name, store, sampler=Lifo(), remover=Lifo(), max_size=max_size,
                   rate_limiter=Stack(max_size), max_times_sampled=1, seed=seed, evict_when_store_full=False,
                   **_item_settings(name, items))

    def __reduce__(self):
        """Pickles a copy, with its store (``reprise.pickling``): the unpickled table
        is over the unpickled store, with the same items and state."""
        from .pickling import reduce_table
        return reduce_table(self)

    @property
    def name(self) -> str:
        return self._native.name

    @property
    def store(self) -> Store:
        return self._store

    @property
    def size(self) -> int:
        return self._native.size

    def __len__(self) -> int:
        return self._native.size

    def insert(self, data: dict, priorities, timeout: float | None = None, attributes: dict | None = None):
        """Inserts n items of T steps each from ``{field: array[n, T, ...]}`` (each item
        its own episode) with one copy per column. ``priorities``: n numbers or one.
        Returns the keys (np.uint64[n]). Blocks on the rate limiter up to ``timeout``;
        on ``Timeout`` the exception's ``partial`` holds the keys already inserted.
        For a device store the arrays may be torch tensors (on the device: no copy
        through the host). ``attributes``: ``{name: array[n] or scalar}`` for a table
        with attributes (every one of them); a key of 0 marks an item dropped as
        stale under ``max_staleness``."""
        if self._store._device_columns is not None:
            if attributes is not None or self._native.attributes:
                raise InvalidArgument(f"table '{self.name}': item attributes need a host store in this version")
            from .torch.device_store import insert
            return insert(self, data, priorities, timeout)
        if attributes is None and not self._has_attributes:
            return self._native.insert(data, priorities, timeout)
        return self._native.insert(data, priorities, timeout, records=records(self._native.attributes, self.name,
                                                                               attributes, _items_in(data)))

    @functools.cached_property
    def _has_attributes(self) -> bool:
        return bool(self._native.attributes)

    def sample(self, n: int | None = None, timeout: float | None = None, fields: list[str] | None = None,
               device=None, tokens: int | None = None, packed: bool = False) -> Sample:
        """Draws n items (with replacement, by the sampler). ``fields`` limits which
        fields are collected. On ``Timeout`` the exception's ``partial`` is a Sample
        of the items drawn before the deadline (they count as sampled).

        ``device=None``: ``data`` holds numpy arrays. ``device="cuda"``: torch tensors
        on that GPU, gathered straight from the store's memory by the GPU (no staging
        copy on the host), ready on the current CUDA stream. ``device="cpu"``: torch
        CPU tensors (sharing the drawn arrays' memory), so that code written for
        ``"cuda"`` runs unchanged without a GPU. The other fields stay numpy.

        ``tokens=B`` instead of ``n``: as many whole items as fit in ``B`` steps,
        each picked as ``sample(n)`` picks (same probabilities); the draw stops at
        the first pick that would pass the budget (that pick is put back). Their
        rows come packed end to end, with no padding: ``s.packed()`` gives the
        varlen layout (``cu_seqlens``) without a copy. Waits (up to ``timeout``)
        only for the first item. A first pick longer than ``B`` is refused.

        ``packed=True`` (host tables): the n items' rows come packed as a token
        sample's do, gathered with no padding, so ``s.packed()`` copies nothing
        (whole groups of very different lengths, for instance)."""
        if tokens is not None:
            if n is not None:
                raise InvalidArgument(f"table '{self.name}': sample takes n or tokens, not both (got n={n}, tokens={tokens})")
            return self._sample_tokens(as_int("tokens", tokens, 1), timeout, fields, device)
        if n is None:
            raise InvalidArgument(f"table '{self.name}': sample needs n (items) or tokens (a step budget)")
        n = as_int("n", n)
        if packed:
            if self._selection is not None or self._store._device_columns is not None:
                raise InvalidArgument(f"table '{self.name}': sample(packed=True) needs a table that selects on the "
                                      f"host over a host store in this version")
            self._check_fields(fields)
            if device is not None:
                torch_module()
            s = self._native.sample(n, timeout, fields, True)
            return s if device is None else s.to(device)
        if is_host_device(device):
            if self._selection is None and self._store._device_columns is None:
                draw = functools.partial(self._native.sample, n, timeout, fields)
            else:
                self._check_fields(fields)
                draw = functools.partial(self._draw, n, timeout, fields, self._store._device_columns, to_host=True)
            return draw() if device is None else host_tensors(draw)
        self._check_fields(fields)
        from .torch import resolve
        if self._store._staged:
            # Rows not in memory as they are sampled (compressed, stacked, or in a
            # file store) are read on the host, then copied to the device.
            dev = resolve(device)
            return on_device(functools.partial(self._native.sample, n, timeout, fields), dev)
        columns = self._store._columns_for(resolve(device))  # before drawing: bad devices change nothing
        return self._draw(n, timeout, fields, columns)

    def _sample_tokens(self, tokens, timeout, fields, device) -> Sample:
        """``sample(tokens=...)``: packed on the host from a host store; gathered
        packed by the device from a device store, or from host memory when
        ``device`` is a GPU (``reprise.torch.collect``, one row number per step)."""
        if self._selection is not None:
            raise InvalidArgument(f"table '{self.name}': sample(tokens=...) needs a table that selects on the host "
                                  f"(no selection_device) in this version")
        self._check_fields(fields)
        device_columns = self._store._device_columns
        if device_columns is None and (is_host_device(device) or self._store._staged):
            if device is not None:
                torch_module()  # before drawing: without torch the call changes nothing
            if not is_host_device(device):  # rows read on the host (Store._staged), then moved
                from .torch import resolve
                device = resolve(device)
            s = self._native.sample_tokens(tokens, timeout, fields)
            return s if device is None else s.to(device)
        from .torch.collect import collect_rows
        if is_host_device(device):
            columns = device_columns
        else:
            from .torch import resolve
            columns = self._store._columns_for(resolve(device))  # before drawing: bad devices change nothing
        rows = self._native.sample_tokens_rows(tokens, timeout)
        s = collect_rows(rows, columns, fields, None, self._native.attributes, packed=True)
        if not is_host_device(device):
            return s
        s = _to_host(s)
        return s if device is None else s.to(device)

    def _draw(self, n, timeout, fields, columns, to_host=False, stream=None) -> Sample:
        """Draws n items and collects them from ``columns`` (None: on the host). A
        partial draw (timeout, interrupt) is collected the same way into ``err.partial``."""
        if getattr(self._selection, "resident", False):
            return self._draw_resident(n, timeout, fields, columns, to_host, stream)
        schema = self._native.attributes
        try:
            rows = self._sample_rows(n, timeout)
        except BaseException as e:
            rows = getattr(e, "partial", None)
            if isinstance(rows, _native.SampleRows):
                e.partial = _collect(rows, columns, fields, to_host, stream, schema)
            raise
        return _collect(rows, columns, fields, to_host, stream, schema)

    def _draw_resident(self, n, timeout, fields, columns, to_host, stream) -> Sample:
        """A device-resident draw (``reprise.torch.resident``): rows gathered on
        the mirror's device when ``columns`` is None, then moved to the host."""
        sel = self._selection
        if columns is None:
            columns = self._store._columns_for(sel.device)
        names = columns.fields if fields is None else fields
        try:
            s = sel.draw(n, timeout, columns, names, stream)
        except BaseException as e:
            partial = getattr(e, "partial", None)
            if isinstance(partial, Sample):
                self._resident_attributes(partial, sel.device)
                if to_host:
                    _to_host(partial)
            raise
        self._resident_attributes(s, sel.device)
        return _to_host(s) if to_host else s

    def _resident_attributes(self, s: Sample, device):
        """A device-resident draw's attributes, looked up by key right after it
        (the table only learns which items a device drew when it folds them)."""
        if not self._native.attributes:
            return
        torch = torch_module()
        found, _ = self._native.attributes_of(np.asarray(s.keys))
        s.attributes = {k: torch.from_numpy(v).to(device) for k, v in found.items()}

    def iterate(self, batch_size: int, device=None, prefetch: int = 2, timeout: float | None = None,
                fields: list[str] | None = None, num_batches: int | None = None):
        """Yields samples of ``batch_size`` for ever (or ``num_batches`` times), with
        ``data`` as ``sample(..., device=device)`` gives it.

        With ``device="cuda"`` the next ``prefetch`` batches are gathered on a side
        CUDA stream while the caller uses the current one; each batch is ready on the
        caller's current stream when it is yielded. ``update_priorities`` for a batch
        applies at once; batches already in flight were drawn before it. On the host
        (``device`` None or ``"cpu"``) each batch is drawn when it is asked for."""
        batch_size = as_int("batch_size", batch_size, 1)
        prefetch = as_int("prefetch", prefetch, 0)
        if num_batches is not None:
            num_batches = as_int("num_batches", num_batches, 0)
        self._check_fields(fields)
        if is_host_device(device) or self._store._staged:
            if device is not None:
                torch_module()  # now, not at the first batch: without torch the call fails here
            return self._iterate_host(batch_size, timeout, fields, num_batches, device)
        from .torch import iterate, resolve
        dev = resolve(device)
        columns = self._store._columns_for(dev)

        def draw(stream):
            return self._draw(batch_size, timeout, fields, columns, stream=stream)

        return iterate(draw, dev, prefetch, num_batches)

    def static_sample(self, batch_size: int, steps: int = 1, fields: list[str] | None = None):
        """A ``reprise.torch.StaticSample``: ``batch_size`` device-resident draws of
        items of at most ``steps`` steps into fixed device buffers, for CUDA graphs.
        ``admit()`` draws (on the host side, outside a graph); ``draw()`` gathers the
        fields into ``[batch_size, steps, *shape]`` tensors and can be captured with
        the training step that uses them. Needs a table that draws device-resident
        (``selection_device``, a Uniform or Prioritized sampler, no
        ``max_times_sampled``); see docs/gpu.md."""
        batch_size = as_int("batch_size", batch_size, 1)
        steps = as_int("steps", steps, 1)
        self._check_fields(fields)
        sel = self._selection
        if not getattr(sel, "resident", False):
            why = self._native.resident_refusal() or "it was restored from a checkpoint"
            raise InvalidArgument(f"table '{self.name}' cannot make a static sample: it does not draw "
                                  f"device-resident ({why}); expected a table with selection_device, a Uniform or "
                                  f"Prioritized sampler and max_times_sampled=0")
        from .torch.static import StaticSample
        columns = self._store._columns_for(sel.device)
        names = columns.fields if fields is None else list(fields)
        return StaticSample(self.name, sel, columns, names, batch_size, steps)

    def _iterate_host(self, batch_size, timeout, fields, num_batches, device):
        """Draws each batch when it is asked for: on the host a draw is a copy by
        the calling thread, with no side stream to overlap it with, so drawing ahead
        would gain nothing and would only make batches older than the priority
        updates made since (``prefetch`` is checked, and otherwise unused)."""
        produced = 0
        while num_batches is None or produced < num_batches:
            yield self.sample(batch_size, timeout, fields, device)
            produced += 1

    def _check_fields(self, fields):
        if fields is None:
            return
        if isinstance(fields, str) or not all(isinstance(f, str) for f in fields):
            raise InvalidArgument(f"fields must be a list of field names, got {fields!r}")
        known = list(self._store.signature)
        for f in fields:
            if f not in known:
                raise NotFound(f"unknown field '{f}'; expected one of {known}")

    def _sample_rows(self, n: int, timeout):
        """Draws n items and returns their held rows (a native ``SampleRows``)."""
        if self._selection is None:
            # One epoch holds the rows for the collector instead of a reference per block.
            return self._native.sample_rows(n, timeout, pinned=True)
        sel = self._selection
        deadline = None if timeout is None else time.monotonic() + max(0.0, float(timeout))
        rows = None
        with sel.lock:
            while True:
                sel.sync()
                need = n - (0 if rows is None else len(rows))
                slots, seqs, probabilities = sel.draw(need)
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                rows, starved = self._native.sample_candidates(rows, n, left, slots, seqs, probabilities)
                if not starved:
                    return rows

    def update_priorities(self, keys, priorities) -> int:
        """Sets priorities by key. Keys no longer in the table (evicted since they were
        sampled) are skipped. Returns how many were applied. Every priority is checked
        before any is applied."""
        return self._native.update_priorities(keys, priorities)

    @property
    def attributes(self) -> dict:
        """``{name: dtype}`` of the item attributes."""
        return dict(self._native.attributes)

    @property
    def max_staleness(self) -> int | None:
        return self._native.max_staleness

    @property
    def version(self) -> int | None:
        """The policy version (None without an int64 attribute ``version``)."""
        return self._native.version

    def set_version(self, version: int) -> int:
        """Sets the policy version (monotone: a lower one is refused). With
        ``max_staleness=k``, every item whose version is below ``version - k``
        leaves at once, before this returns: no later draw can return it. Returns
        how many left (also counted in ``info()["stale_removed"]``)."""
        return self._native.set_version(as_int("version", version, minimum=-(1 << 63)))

    def update_attributes(self, keys, attributes: dict) -> int:
        """Sets attributes by key, ``{name: array[len(keys)] or scalar}`` (a reward
        computed later by a verifier). Keys no longer in the table are skipped;
        returns how many items were updated. Every value is checked before any is
        applied."""
        import numpy as np
        keys = np.ascontiguousarray(keys, dtype=np.uint64)
        if not isinstance(attributes, dict) or not attributes:
            raise InvalidArgument(f"table '{self.name}': update_attributes takes {{name: values}}, got {attributes!r}")
        schema = self._native.attributes
        staged = [(name, values(schema, self.name, name, v, len(keys))) for name, v in attributes.items()]
        check_fixed(f"table '{self.name}'", attributes, self.max_staleness is not None,
                    "group" in attributes and self.info()["groups"] is not None)
        return min(self._native.update_attribute(keys, name, v) for name, v in staged)

    def attributes_of(self, keys) -> tuple[dict, "np.ndarray"]:
        """``({name: array[n]}, found[n])``: the attributes of items by key; a key no
        longer in the table has found False (and zeros)."""
        import numpy as np
        return self._native.attributes_of(np.ascontiguousarray(keys, dtype=np.uint64))

    def delete(self, keys) -> int:
        """Removes items by key; keys no longer present are skipped. Returns how many."""
        return self._native.delete(keys)

    def reset(self):
        """Removes every item and restarts the rate limiter's counts."""
        self._native.reset()

    @property
    def extensions(self) -> list[Extension]:
        """The extensions attached to this table."""
        return [_from_spec(s) for s in json.loads(self._native.extensions_json())]

    def stats(self) -> dict:
        """What the table's extensions report, ``{name: figures}`` (see
        ``reprise.extensions``); ``{}`` without extensions."""
        return json.loads(self._native.stats_json())

    def info(self) -> dict:
        """Size, settings and counters, including time callers spent blocked."""
        return self._native.info()

    def items(self) -> list[tuple[int, float, int, int]]:
        """``[(key, priority, times_sampled, length)]`` in insertion order."""
        self._fold()
        return self._native.items()

    def _fold(self):
        """Credits draws counted on a device to the items' times_sampled."""
        if getattr(self._selection, "resident", False):
            self._selection.fold()

    def __repr__(self):
        return (f"Table({self.name!r}, sampler={self._sampler!r}, remover={self._remover!r}, "
                f"size={self.size}, max_size={self.info()['max_size']})")
