"""``ShardedTable``: one replay table sharded across the ranks of a
torch.distributed job (GEAR's cluster mode). Design and reasoning:
``docs/cluster.md``.

Every public method is a collective (SPMD): each rank of the group calls it with
the same arguments, in the same order. One ``sample`` step is one all_gather of a
fixed-size summary per rank (plus, for ordered selectors, one of each shard's
local best), a plan every rank computes alike in Rust, local draws by each
shard's owner, and one ``all_to_all_single`` of packed rows whose split sizes
follow from the plan.
"""

from __future__ import annotations

import math
import os
import time

import numpy as np

from .. import _native
from .._attributes import arrays, check_fixed, check_schema, record_size
from .._convert import as_int
from ..errors import CollectiveError, CollectiveMismatch, Corrupt, InvalidArgument, NotFound, Timeout
from ..rate_limiters import MinSize, RateLimiter
from ..sample import Sample
from ..selectors import Fifo, Selector, Uniform
from ..signature import Field
from ..store import Store
from ..table import Table
from ..torch._device import is_host_device, torch_module
from ..torch.collect import gather
from . import _rows, placement
from ._group import Group
from ._header import (OP, OPS, W_ARG, W_ERROR, W_EXPIRED, W_INSERTS, W_MASS, W_MAXLEN, W_NEXT_SEQ, W_OP, W_OWNER,
                      W_SAMPLES, W_SIZE, W_STEP, W_TABLE, WORDS, bits_f64, f64_bits)
from .topology import consumers as topology_consumers

C = _native.cluster

RANDOM = ("Uniform", "Prioritized")
POLL_MAX = 0.05


class ShardedTable:
    """A replay table whose items live in shards, one per host (``shards="host"``:
    the host's first rank owns it, the others reach it through a same-host server)
    or one per rank (``shards="rank"``). A collective constructor: every rank of
    ``group`` (None: the whole job) calls it with the same arguments.

    ``capacity_per_shard`` steps and ``max_size_per_shard`` items per shard;
    ``sampler``/``remover``/``rate_limiter``/``max_times_sampled`` as for
    ``reprise.Table`` (the limiter gates ``sample`` on the counters summed over all
    shards, and each shard's inserts on its own). ``seed`` keys the draws: the same
    seed and the same inserts give the same batches. ``topology`` picks the
    consumers (None: every rank); ``assignment`` ``"local"`` fills each consumer
    from its own host first, ``"iid"`` gives each an iid sub-batch. ``timeout``
    (seconds) bounds every collective. ``data_backend``: ``"gloo"`` (rows cross on
    the host) or ``"nccl"`` (CUDA rows over the job's NCCL group; one GPU per
    rank). ``verify_rows`` checks each received row's CRC-32.

    ``attributes``, ``max_staleness``, ``group_size``, ``group_timeout`` and
    ``on_group_timeout`` are ``reprise.Table``'s, for every shard: items carry their
    attributes through the exchange (``sample.attributes``), ``set_version`` moves
    every shard's version at once, a group is admitted in the shard its members
    were written to (write a group's members through one host's writers) and
    drawn whole, and ``sample(tokens=B)`` fills each consumer with whole items (or
    groups) up to ``B`` steps from one global draw (docs/async-rl.md, "Cluster mode").
    """

    def __init__(self, name: str, signature: dict, capacity_per_shard: int, sampler: Selector | None = None,
                 remover: Selector | None = None, max_size_per_shard: int | None = None,
                 rate_limiter: RateLimiter | None = None, seed: int = 0, group=None, shards: str = "host",
                 topology=None, assignment: str = "local", timeout: float = 60.0, max_times_sampled: int = 0,
                 block_steps: int = 64, data_backend: str | None = None, verify_rows: bool = True,
                 attributes: dict | None = None, max_staleness: int | None = None, group_size: int | None = None,
                 group_timeout: float | None = None, on_group_timeout: str = "drop",
                 _restore=None, _expect_shards: int | None = None):
        what = f"sharded table '{name}'"
        if not isinstance(name, str) or not name:
            raise InvalidArgument(f"table name must be a non-empty string, got {name!r}")
        if not isinstance(signature, dict) or not signature or not all(isinstance(f, Field) for f in signature.values()):
            raise InvalidArgument(f"{what}: signature must be a non-empty dict of name -> reprise.Field")
        if shards not in ("host", "rank"):
            raise InvalidArgument(f"{what}: shards must be 'host' or 'rank', got {shards!r}")
        if assignment not in ("local", "iid"):
            raise InvalidArgument(f"{what}: assignment must be 'local' or 'iid', got {assignment!r}")
        if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or not timeout > 0:
            raise InvalidArgument(f"{what}: timeout must be a number of seconds > 0, got {timeout!r}")
        if data_backend not in (None, "gloo", "nccl"):
            raise InvalidArgument(f"{what}: data_backend must be None, 'gloo' or 'nccl', got {data_backend!r}")
        seed = as_int(f"{what}: seed", seed, minimum=0)
        schema = check_schema(name, attributes)
        if max_staleness is not None:
            max_staleness = as_int(f"{what}: max_staleness", max_staleness, minimum=0)
        if group_size is not None:
            group_size = as_int(f"{what}: group_size", group_size, minimum=1)
        groups = None if group_size is None else (group_size, group_timeout, on_group_timeout)
        sampler = Uniform() if sampler is None else sampler
        remover = Fifo() if remover is None else remover
        rate_limiter = MinSize(1) if rate_limiter is None else rate_limiter
        for role, sel in (("sampler", sampler), ("remover", remover)):
            if not isinstance(sel, Selector):
                raise InvalidArgument(f"{what}: {role} must be a reprise.selectors selector, got {sel!r}")
        if not isinstance(rate_limiter, RateLimiter):
            raise InvalidArgument(f"{what}: rate_limiter must be a reprise.rate_limiters limiter, got {rate_limiter!r}")
        self.name = name
        self._what = what
        self._signature = dict(signature)
        self._sampler, self._remover, self._rate_limiter = sampler, remover, rate_limiter
        self._sampler_spec, self._limiter_spec = sampler._spec(), rate_limiter._spec()
        self._max_times = as_int(f"{what}: max_times_sampled", max_times_sampled, minimum=0)
        self._schema = schema
        self._record = record_size(schema)
        self._max_staleness = max_staleness
        self._groups = groups
        self._unit = 1 if group_size is None else group_size  # rows per drawn unit
        # The policy version (0 until set_version; None without an int64 'version').
        self._version: int | None = 0 if dict(schema).get("version") == "int64" else None
        self._seed = seed
        self._assignment = assignment
        self._shards_by = shards
        self._verify = bool(verify_rows)
        self._table_id = C.table_id(name)
        self._table_word = int(np.uint64(self._table_id).view(np.int64))  # the header's W_TABLE
        self._step = 0
        self._last_batch: int | None = None  # per consumer, of the last sample step
        # Where the owner's next_seq (in its step summary) rose: (next_seq, step) at
        # each rise, so an item's visible step is the step of the first rise above
        # its seq. Steps without inserts add nothing.
        self._boundaries: list[tuple[int, int]] = []

        g = self._g = Group(group, float(timeout), what)
        config = (name, [(k, repr(f)) for k, f in signature.items()], int(capacity_per_shard),
                  sampler._spec(), remover._spec(), max_size_per_shard, rate_limiter._spec(), self._max_times, seed,
                  shards, assignment, block_steps, schema, max_staleness, groups)
        configs = g.all_gather_object(config, "comparing constructor arguments")
        differ = [r for r, c in enumerate(configs) if c != configs[0]]
        if differ:
            raise CollectiveMismatch(f"{what}: ranks {differ} passed other constructor arguments than rank 0 "
                                     f"(every rank must make the same table)")
        hosts = g.host_of_rank
        if shards == "rank":
            owners = list(range(g.size))
        else:
            owners = [int(np.nonzero(hosts == h)[0][0]) for h in range(len(g.host_names))]
        if _expect_shards is not None and len(owners) != _expect_shards:
            raise InvalidArgument(f"{what}: the checkpoint holds {_expect_shards} shards but this job makes "
                                  f"{len(owners)} (shards={shards!r}); restore on the same number of shards")
        if len(owners) > C.MAX_SHARDS:
            raise InvalidArgument(f"{what}: {len(owners)} shards, more than the {C.MAX_SHARDS} global keys can name")
        self._owner = np.array(owners, dtype=np.int64)
        self._shard_host = hosts[self._owner].astype(np.uint32)
        mine = np.nonzero(self._owner == g.rank)[0]
        self.shard = int(mine[0]) if len(mine) else None
        self._consumers = topology_consumers(topology, g.size)
        self._consumer_ranks = np.array(self._consumers, dtype=np.int64)
        self._consumer = g.rank in self._consumers
        self._consumer_host = hosts[self._consumer_ranks].astype(np.uint32)
        self._data_backend = self._pick_backend(data_backend)

        self._store = self._table = self._server = None
        self._send = self._recv = None  # the exchange's buffers (uint8 tensors), see _kept
        self._poison = False  # tests: fill the buffers with 0xA5 after every step
        if self.shard is not None:
            if _restore is not None:
                self._table = _restore[self.shard]
                self._store = self._table.store
            else:
                self._store = Store(signature, capacity=capacity_per_shard, block_steps=block_steps)
                self._table = Table(name, self._store, sampler=sampler, remover=remover,
                                    max_size=max_size_per_shard, rate_limiter=rate_limiter,
                                    max_times_sampled=self._max_times, seed=seed,
                                    attributes=dict(schema) or None, max_staleness=max_staleness,
                                    group_size=group_size, group_timeout=group_timeout,
                                    on_group_timeout=on_group_timeout)
        self._local_address = None
        if shards == "host":
            address = None
            if self.shard is not None and (hosts == hosts[g.rank]).sum() > 1:
                from ..server import Server
                self._server = Server([self._table], name=f"reprise-cluster-{os.getpid()}-{self._table_id:x}-{self.shard}")
                address = self._server.local_address
            addresses = g.all_gather_object(address, "sharing same-host server addresses")
            if self.shard is None:
                self._local_address = addresses[int(self._owner[np.nonzero(self._shard_host == hosts[g.rank])[0][0]])]
        # Same-host reads (rows on the host): an owner's own rows, and with shards="host"
        # those for the other ranks of its host, cross the exchange as locators (header,
        # record, the store row numbers of the item's steps); the consumer copies the
        # rows from the owner's shared memory itself. Only rows for other hosts cross
        # in full. locators[s, d]: the part from s to d holds locators (the same on
        # every rank). Rows that are not the columns' bytes as they lie (compressed or
        # stacked fields) always cross in full: the owner assembles them.
        locators = np.zeros((g.size, g.size), dtype=bool)
        in_place = all(f.compress is None and f.stack == 1 for f in signature.values())
        if self._data_backend != "nccl" and in_place:
            for s in self._owner:
                if shards == "host":
                    locators[s] = hosts == hosts[s]
                locators[s, s] = True
        self._layouts = {}  # steps -> the rows' layout (_layout)
        self._use_locators(locators)
        # The ranks of a host that shares a shard (shards="host", several ranks there)
        # meet in a barrier of their own before the owner freezes the shard (none of
        # them is still inside a write into it), and after a step in which some of them
        # read the owner's rows (the owner lets the rows' blocks go once they have).
        self._host_group = None
        if shards == "host":
            # Every host of several ranks gets a group; over the whole job every rank
            # makes each of them, in host order, and keeps its own (Group.new_group).
            for host in sorted(set(hosts.tolist())):
                members = [g.ranks[r] for r in range(g.size) if hosts[r] == host]
                if len(members) < 2 or (not g.whole_job and host != hosts[g.rank]):
                    continue
                made = g.new_group(members, "creating the host group")
                if host == hosts[g.rank]:
                    self._host_group = made
        self._reader = None  # a local client of this host's owner's server, made on the first read
        self._columns = {}  # owner -> its store's columns as flat bytes (_column_bytes)

    # ------------------------------------------------------------------ setup

    def _use_locators(self, locators: np.ndarray):
        """Sets which parts of a step's exchange hold locators (``locators[s, d]``, the
        same on every rank; all False sends every row in full, as the checks of the
        zero-copy reads compare against) and what this rank keeps of it."""
        rank = self._g.rank
        self._locators = locators
        self._locate_to = locators[rank].tolist()  # this rank's parts that hold locators
        self._located = np.ascontiguousarray(locators[:, rank])  # the parts to it that do
        # The one owner whose memory this rank reads (its own, or its host's), if any.
        self._reads_from = int(np.nonzero(self._located)[0][0]) if self._located.any() else None
        self._layouts.clear()

    def _pick_backend(self, asked):
        backend = asked or ("nccl" if "nccl" in self._g.backend else "gloo")
        if backend == "nccl":
            import torch
            if not torch.cuda.is_available():
                raise InvalidArgument(f"{self._what}: data_backend='nccl' needs CUDA; pass data_backend='gloo'")
            if "nccl" not in self._g.backend:
                raise InvalidArgument(f"{self._what}: data_backend='nccl' needs a group made with the NCCL backend, "
                                      f"this one uses {self._g.backend!r}")
            here = (self._g.host_names[self._g.host_of_rank[self._g.rank]], torch.cuda.current_device())
            devices = self._g.all_gather_object(here, "checking one GPU per rank")
            if len(set(devices)) != len(devices):
                raise InvalidArgument(
                    f"{self._what}: NCCL cannot run two ranks on one GPU (ranks share {sorted(devices)}); "
                    f"give each rank its own GPU (torch.cuda.set_device(local_rank)) or pass data_backend='gloo' "
                    f"(rows cross on the host, then go to the GPU)")
        return backend

    @property
    def num_shards(self) -> int:
        return len(self._owner)

    @property
    def consumers(self) -> list[int]:
        """The ranks (in group order) that receive batches."""
        return list(self._consumers)

    @property
    def step(self) -> int:
        """The number of ``sample`` steps taken so far."""
        return self._step

    @property
    def local_table(self) -> Table | None:
        """This rank's shard (None on ranks that own none)."""
        return self._table

    def writer(self, max_sequence_length: int | None = None):
        """A writer into this host's shard (``create_item(table.name, ...)``): in
        process on the owner, through the host's same-host server elsewhere."""
        if self._table is not None:
            return self._store.writer(max_sequence_length)
        from ..client import Client
        return Client(self._local_address).writer(max_sequence_length=max_sequence_length)

    def insert(self, data: dict, priorities, timeout: float | None = None, attributes: dict | None = None) -> np.ndarray:
        """``Table.insert`` into this rank's shard (owners only); returns global keys
        (0 for an item dropped as stale under ``max_staleness``). Not a collective."""
        if self._table is None:
            raise InvalidArgument(f"{self._what}: rank {self._g.rank} owns no shard; write through table.writer()")
        keys = np.asarray(self._table.insert(data, priorities, timeout, attributes=attributes), dtype=np.uint64)
        out = C.global_keys(self.shard, keys)
        out[keys == 0] = 0
        return out

    @property
    def attributes(self) -> dict:
        """``{name: dtype}`` of the item attributes."""
        return dict(self._schema)

    @property
    def max_staleness(self) -> int | None:
        return self._max_staleness

    @property
    def version(self) -> int | None:
        """The policy version (``set_version``'s; 0 before the first, None without an
        int64 attribute ``version``)."""
        return self._version

    def set_version(self, version: int) -> int:
        """Sets every shard's policy version (monotone: a lower one is refused on
        every rank): ``Table.set_version`` on each shard, so with ``max_staleness``
        every stale item has left every shard before any rank returns, and no later
        ``sample`` can draw one. Returns how many items left over all shards. A
        collective: every rank passes the same version."""
        err = None
        try:
            version = as_int("version", version, minimum=-(1 << 63))
            if dict(self._schema).get("version") != "int64":
                raise InvalidArgument(f"{self._what}: set_version needs an int64 attribute 'version' "
                                      f"(attributes={{'version': 'int64', ...}})")
            now = self._version if self._table is None or self._table.version is None else self._table.version
            if now is not None and version < now:
                raise InvalidArgument(f"{self._what}: version {version} is below the current {now}; "
                                      f"versions only move forward")
        except InvalidArgument as e:
            err, version = e, 0
        self._begin(OP["set_version"], version, err)
        removed = 0 if self._table is None else self._table.set_version(version)
        self._version = version
        totals = self._g.all_gather(np.array([removed], dtype=np.int64), "set_version: counting stale items")
        return int(totals.sum())

    # -------------------------------------------------------------- the header

    def _header(self, op: int, arg: int, error: bool = False, expired: bool = False) -> np.ndarray:
        words = [self._table_word, self._step, op, arg, int(error), int(expired)]
        if self._table is not None:
            size, mass, next_seq, inserts, samples, maxlen = self._table._native.shard_summary()
            words += [1, size, f64_bits(mass), next_seq, inserts, samples, maxlen]
        words += [0] * (WORDS - len(words))
        return np.array(words, dtype=np.int64)

    def _agree(self, heads: np.ndarray, op: int, err: Exception | None):
        """Raises on every rank when the ranks' calls differ or one could not make it."""
        calls = heads[:, W_TABLE:W_ERROR + 1]  # table, step, op, argument (the call), and error
        if (calls == calls[0]).all() and not calls[0, W_ERROR - W_TABLE]:
            return  # the usual case: the same call everywhere, no rank failed
        keys = heads[:, W_TABLE:W_ARG + 1]
        if (keys != keys[0]).any():
            def says(h):
                name = "this table" if h[W_TABLE] == heads[self._g.rank][W_TABLE] else "another table"
                return f"{OPS.get(int(h[W_OP]), 'op ' + str(h[W_OP]))}({int(h[W_ARG])}) at step {int(h[W_STEP])} of {name}"
            calls = "; ".join(f"rank {r}: {says(h)}" for r, h in enumerate(heads))
            raise CollectiveMismatch(f"{self._what}: the ranks made different calls ({calls}); every rank must "
                                     f"call the same method with the same arguments in the same order")
        failed = np.nonzero(heads[:, W_ERROR])[0].tolist()
        if failed:
            if err is not None:
                raise err
            raise CollectiveError(f"{self._what}: rank(s) {failed} could not make the {OPS[op]} call "
                                  f"(they raised; see their error)")

    def _begin(self, op: int, arg: int, err: Exception | None, freeze: bool = False, expired: bool = False):
        """The header gather every collective starts with; returns the headers."""
        if freeze and self._host_group is not None:
            # A rank that writes into another rank's shard (shards="host") must be
            # out of its write before that shard freezes: wait until every rank of
            # the host has entered the call (only they write into its shard).
            g = self._g
            g._guard(f"{OPS[op]} step {self._step}: entering", lambda: g.dist.barrier(group=self._host_group))
        if freeze and self._table is not None and err is None:
            self._table._native.freeze()
        try:
            heads = self._g.all_gather(self._header(op, arg, err is not None, expired), f"{OPS[op]} step {self._step}")
            self._agree(heads, op, err)
        except BaseException:
            self._thaw()
            raise
        return heads

    def _thaw(self):
        if self._table is not None:
            self._table._native.thaw()

    # ------------------------------------------------------------------ sample

    def sample(self, batch_size: int | None = None, device=None, timeout: float | None = None,
               tokens: int | None = None) -> Sample | None:
        """One global draw of ``batch_size`` items per consumer: a collective.
        Consumers get a ``Sample`` of ``batch_size`` items of the draw of
        ``batch_size * len(consumers)`` (global ``probabilities`` and
        ``table_size``, so importance weights are right), other ranks None.
        ``device="cuda"``: ``data`` holds tensors there (``"cpu"``: torch CPU
        tensors; None: numpy arrays). Waits (every rank together)
        while the rate limiter, on counters summed over the shards, forbids the
        step; past ``timeout`` every rank raises ``Timeout``.

        ``tokens=B`` instead of ``batch_size``: whole items up to ``B`` steps for each
        consumer, from one global draw made as ``sample(n)`` makes it: each pick goes
        to the consumer with the fewest steps so far, and the draw stops at the first
        pick that would take that consumer past ``B`` (put back, not counted). The
        consumers' token counts differ by at most the longest item drawn. The rows
        arrive packed (``packed_data``, ``packed()`` copies nothing on the host). A
        first pick longer than ``B`` raises ``InvalidArgument`` on every rank and
        changes nothing. Random samplers need ``max_times_sampled=0`` here.

        With ``group_size`` G, a draw picks groups (by the sum of their members'
        priorities) and each consumer gets whole groups, members side by side:
        ``batch_size`` must be a multiple of G; a token budget counts a group's
        members together."""
        err = None
        try:
            if (batch_size is None) == (tokens is None):
                raise InvalidArgument(f"{self._what}: sample takes batch_size or tokens (a token budget), "
                                      f"exactly one of them")
            if tokens is not None:
                tokens = as_int("tokens", tokens, 1)
                if self._sampler_spec[0] in RANDOM and self._max_times:
                    raise InvalidArgument(
                        f"{self._what}: a token budget over a {self._sampler_spec[0]} sampler needs "
                        f"max_times_sampled=0 (items used up within a step would move the picks the budget "
                        f"was cut on); for consume-once use a Fifo sampler with max_times_sampled=1")
            else:
                batch_size = as_int("batch_size", batch_size, 1)
                if batch_size % self._unit:
                    raise InvalidArgument(f"{self._what}: batch_size {batch_size} is not a multiple of group_size "
                                          f"{self._unit}; each consumer gets whole groups")
            if timeout is not None and not (isinstance(timeout, (int, float)) and timeout >= 0):
                raise InvalidArgument(f"{self._what}: timeout must be None or seconds >= 0, got {timeout!r}")
            if device is not None:   # the torch.device the rows go to; None: numpy
                from ..torch import resolve
                device = torch_module().device("cpu") if is_host_device(device) else resolve(device)
        except InvalidArgument as e:
            err, batch_size, tokens = e, (-1 if batch_size is not None else None), (-1 if tokens is not None else None)
        op, arg = (OP["sample"], batch_size) if tokens is None else (OP["sample_tokens"], tokens)
        if tokens is None and batch_size is None:
            op, arg = OP["sample"], -1
        total = max(batch_size or 0, 0) * len(self._consumers)  # the global draw (items)
        deadline = None if timeout is None else time.monotonic() + float(timeout)
        poll = 0.001
        while True:
            expired = deadline is not None and time.monotonic() >= deadline
            heads = self._begin(op, arg, err, freeze=True, expired=expired)
            owners = heads[self._owner]
            plan = None
            permits = self._permits(owners.sum(axis=0))
            if permits >= (total if tokens is None else self._unit):
                try:
                    plan = (self._plan(owners, total // self._unit) if tokens is None
                            else self._plan_tokens(owners, tokens, np.floor(permits / self._unit)))
                except BaseException:
                    self._thaw()
                    raise
                if plan is not None:
                    break
            self._thaw()
            if heads[:, W_EXPIRED].any():
                want = f"a step of {total}" if tokens is None else "the first item of a token step"
                raise Timeout(f"{self._what}: the rate limiter (or max_times_sampled: too few draws left) did not "
                              f"allow {want} before the timeout (global size {int(owners[:, W_SIZE].sum())}, "
                              f"min_size_to_sample {self._rate_limiter.min_size_to_sample})")
            time.sleep(poll)
            poll = min(2 * poll, POLL_MAX)
        if tokens is None:
            self._last_batch = batch_size
        out = self._exchange(owners, plan, device)
        if self._poison:  # a check's debug mode: no step may read what an earlier one left
            for buf in (self._send, self._recv):
                if buf is not None:
                    buf.fill_(0xA5)
        return out

    def _permits(self, totals: np.ndarray) -> float:
        """How many items the rate limiter lets this step draw, on the counters
        summed over the shards (``totals``: the owners' header words summed; 0
        below its minimum size)."""
        spi, min_size, min_diff, _ = self._limiter_spec
        size = int(totals[W_SIZE])
        if size == 0 or size < max(1, min_size):
            return 0
        allowed = float(totals[W_INSERTS]) * spi - float(totals[W_SAMPLES]) - min_diff  # inf without a bound
        return max(0.0, allowed if math.isinf(allowed) else math.floor(allowed))

    def _plan(self, owners: np.ndarray, batch: int) -> dict | None:
        """Per position: shard, target, consumer rank; and what the owners need.
        None when an ordered selector's items have fewer draws left than the batch
        (``max_times_sampled``): the step waits for inserts, as one table would."""
        kind = self._sampler_spec
        steps = int(owners[:, W_MAXLEN].max())
        table_size = int(owners[:, W_SIZE].sum())
        if kind[0] in RANDOM:
            shard, index, mass, by_mass, divisor, table_size = C.plan(
                kind[0] == "Prioritized", owners[:, W_SIZE].astype(np.uint64), bits_f64(owners[:, W_MASS]),
                batch, self._seed, self._table_id, self._step)
            plan = {"shard": shard, "index": index, "mass": mass, "by_mass": by_mass, "divisor": divisor}
        else:
            shard, index, _, mine = self._merge(kind, owners, batch, table_size)
            if len(shard) < batch:
                return None
            plan = {"shard": shard, "picks": self._picks(shard, index, mine)}
        consumer = C.assign(self._assignment, shard, self._shard_host, self._consumer_host)
        plan["dest"] = self._consumer_ranks[consumer]
        plan["steps"], plan["table_size"] = steps, table_size
        return plan

    def _plan_tokens(self, owners: np.ndarray, tokens: int, permits: float) -> dict | None:
        """The plan of a token-budget step: the global draw's first picks, as
        ``_plan`` makes them, cut where they stop fitting (``C.token_cut``), each
        sent to the consumer it was cut for. The picks' lengths come from their
        owners (one gather per round of candidates; rounds double until the cut
        falls inside one). ``permits``: units the rate limiter allows. None when no item can be drawn (ordered selectors whose
        items are used up): the step waits."""
        kind = self._sampler_spec
        table_size = int(owners[:, W_SIZE].sum())
        consumers = len(self._consumers)
        cap = int(min(permits, consumers * tokens + 1))  # every item has a step at least
        k = min(cap, 16 * consumers)
        while True:
            if kind[0] in RANDOM:
                shard, index, mass, by_mass, divisor, table_size = C.plan(
                    kind[0] == "Prioritized", owners[:, W_SIZE].astype(np.uint64), bits_f64(owners[:, W_MASS]),
                    k, self._seed, self._table_id, self._step)
                lengths = np.zeros(k, dtype=np.int64)
                if self._table is not None:
                    here = np.nonzero(shard == self.shard)[0]
                    lengths[here] = self._table._native.planned_lengths(
                        by_mass, np.ascontiguousarray(index[here]), np.ascontiguousarray(mass[here]),
                        int(owners[self.shard, W_SIZE]), float(bits_f64(owners[self.shard:self.shard + 1, W_MASS])[0]))
                lengths = self._g.all_gather(lengths, f"sample step {self._step}: gathering lengths").max(axis=0)
            else:
                shard, index, lengths, mine = self._merge(kind, owners, k, table_size)
            if len(shard) == 0:
                return None
            consumer = C.token_cut(lengths.astype(np.uint32), consumers, tokens)
            m = len(consumer)
            if m < len(shard) or len(shard) < k or k >= cap:
                break
            k = min(cap, 2 * k)
        plan = {"shard": shard[:m], "packed": True}
        if kind[0] in RANDOM:
            plan.update(index=index[:m], mass=mass[:m], by_mass=by_mass, divisor=divisor)
        else:
            plan["picks"] = self._picks(shard[:m], index[:m], mine)
        plan["dest"] = self._consumer_ranks[consumer]
        # A row holds one item: with groups, as long as the longest item ever inserted.
        steps = int(lengths[:m].max()) if self._unit == 1 else int(owners[:, W_MAXLEN].max())
        plan["steps"], plan["table_size"] = steps, table_size
        return plan

    def _merge(self, kind, owners, batch, table_size):
        """``(shard, index, lengths, mine)`` of an ordered selector's draw of
        ``batch``: per position its shard, its candidate there and its length;
        ``mine``, this shard's candidates ``(slots, seqs)`` (None without one)."""
        k = C.candidates_needed(kind, self._max_times, batch)
        words = np.zeros(1 + 6 * k, dtype=np.int64)
        mine = None
        if self._table is not None:
            slots, seqs, prios, times, lengths = self._table._native.ranked(k)
            visible = self._visible_steps(seqs)
            n = len(slots)
            words[0] = n
            words[1:].reshape(6, k)[:, :n] = [slots, seqs.astype(np.int64), prios.view(np.int64), times, visible,
                                              lengths]
            mine = (slots, seqs)
        rows = self._g.all_gather(words, f"sample step {self._step}: gathering candidates")[self._owner]
        counts = rows[:, 0].astype(np.uint64)
        parts = [r[1:].reshape(6, k)[:, :int(n)] for r, n in zip(rows, counts)]
        cat = np.concatenate(parts, axis=1) if parts else np.zeros((6, 0), dtype=np.int64)
        shard, index = C.merge(kind, self._max_times, counts, cat[0].astype(np.uint32), cat[1].astype(np.uint64),
                               np.ascontiguousarray(cat[2]).view(np.float64), cat[3].astype(np.uint32),
                               cat[4].astype(np.uint64), batch, table_size)
        first = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
        lengths = cat[5][first[shard.astype(np.int64)] + index.astype(np.int64)] if len(shard) else \
            np.zeros(0, dtype=np.int64)
        return shard, index, lengths, mine

    def _picks(self, shard, index, mine):
        """This shard's ``(slots, seqs)`` at the merged positions it owns, in order."""
        if mine is None:
            return None
        at = index[shard == self.shard].astype(np.int64)
        return np.ascontiguousarray(mine[0][at]), np.ascontiguousarray(mine[1][at])

    def _visible_steps(self, seqs: np.ndarray) -> np.ndarray:
        """The step from which each of ``seqs`` could be drawn."""
        b = np.array(self._boundaries, dtype=np.int64).reshape(-1, 2)
        at = np.searchsorted(b[:, 0], seqs.astype(np.int64), side="right")
        steps = np.append(b[:, 1], self._step)
        return steps[at]

    def _exchange(self, owners, plan, device):
        g = self._g
        # Per row: a drawn unit takes self._unit rows (a group's members, unfilled
        # rows past a partial group's); plan["shard"], ["dest"] are per unit.
        shard, dest = plan["shard"], plan["dest"]
        if self._unit > 1:
            shard, dest = np.repeat(shard, self._unit), np.repeat(dest, self._unit)
        lay, stride_to, strides_from = self._layout(plan["steps"])
        # The consumer of each row this rank sends (in position order), the rows each
        # rank sends it, and the rank each of its positions comes from.
        mine, recv_rows, sources = C.route(shard, dest, self._owner, -1 if self.shard is None else self.shard,
                                           g.rank, g.size)
        failure, held, rows = None, None, None
        try:
            if self._table is not None:
                native = self._table._native
                if "picks" in plan:
                    rows, filled = native.draw_ranked(plan["picks"][0], plan["picks"][1], plan["table_size"])
                else:
                    here = plan["shard"] == self.shard  # my units
                    rows, filled = native.draw_planned(
                        plan["by_mass"], plan["index"][here], plan["mass"][here], plan["divisor"],
                        plan["table_size"], int(owners[self.shard, W_SIZE]),
                        float(bits_f64(owners[self.shard:self.shard + 1, W_MASS])[0]))
                rise = int(owners[self.shard, W_NEXT_SEQ])
                if not self._boundaries or rise > self._boundaries[-1][0]:
                    self._boundaries.append((rise, self._step))
            self._thaw()
            if rows is not None:
                # This rank's rows (positions in order), each packed into its
                # destination's part, after the part's status, in one native pass.
                send = self._kept("_send", g.size * _rows.STATUS + mine.size * max(stride_to),
                                  pinned=self._data_backend == "nccl")
                sizes, located = rows.pack_parts(send.numpy(), mine, stride_to, lay.offsets, lay.loc_offsets,
                                                 self._locate_to, self.shard, filled, self._record)
                send = send[:sum(sizes)]
                if located:
                    held, rows = rows, None  # readers copy from these rows' blocks: kept until they have
            else:
                sizes = [_rows.STATUS] * g.size
                send = self._kept("_send", _rows.STATUS * g.size, pinned=self._data_backend == "nccl")
                _rows.write_statuses(send.numpy(), np.cumsum(sizes) - sizes, 0, np.zeros(g.size, np.int64))
        except BaseException as e:  # still take part in the exchange, telling every rank
            self._thaw()
            failure = e
            sizes = _rows.STATUS + np.bincount(mine, minlength=g.size) * np.array(stride_to)
            send = np.zeros(int(sizes.sum()), dtype=np.uint8)
            _rows.write_statuses(send, np.cumsum(sizes) - sizes, 1, np.zeros(g.size, np.int64))
        finally:
            if rows is not None:
                rows.release()
        recv_splits = [_rows.STATUS + n * stride for n, stride in zip(recv_rows, strides_from.tolist())]
        try:
            recv = self._all_to_all(send, sizes, recv_splits)
            self._step += 1
            if failure is not None:
                raise failure
            starts, statuses, declared = _rows.statuses(recv, recv_splits)
            if any(statuses):
                bad = [s for s in range(g.size) if statuses[s] != 0]
                raise CollectiveError(f"{self._what}: rank(s) {bad} failed while drawing their rows at step "
                                      f"{self._step - 1}; see their error")
            out = None if not self._consumer else \
                self._receive(recv, starts, np.array(recv_rows), sources, lay, strides_from, plan, device, declared)
        except BaseException:
            try:
                self._reads_done(shard, dest, held)
            except Exception:  # noqa: BLE001 - the error on its way says more
                pass
            raise
        self._reads_done(shard, dest, held)
        return out

    def _reads_done(self, shard, dest, held):
        """Ends a step's same-host reads: where this host's owner sent locators to
        another rank of the host (known alike on each of them from the plan), every
        rank of the host meets in a barrier once it has copied its rows; then the
        owner lets the drawn rows go (``held``)."""
        try:
            hosts = self._g.host_of_rank
            source = self._owner[shard] if self._host_group is not None else None
            if source is not None and \
                    ((hosts[source] == hosts[self._g.rank]) & (source != dest) & self._locators[source, dest]).any():
                g = self._g
                g._guard(f"sample step {self._step - 1}: same-host reads done",
                         lambda: g.dist.barrier(group=self._host_group))
        finally:
            if held is not None:
                held.release()

    def _layout(self, steps: int) -> tuple:
        """``(layout, stride_to, strides_from)`` of a step's rows of ``steps`` steps: the
        ``_rows.Layout``, the row size of this rank's part for each destination (a
        list: locators to the ranks that read this rank's memory) and of each
        source's part for this rank (int64), worked out once per ``steps``."""
        got = self._layouts.get(steps)
        if got is None:
            lay = _rows.Layout(self._signature, steps, self._record)
            rank = self._g.rank
            got = self._layouts[steps] = (
                lay, np.where(self._locators[rank], lay.loc_stride, lay.stride).tolist(),
                np.where(self._locators[:, rank], lay.loc_stride, lay.stride).astype(np.int64))
        return got

    def _kept(self, name: str, nbytes: int, pinned: bool = False):
        """``nbytes`` of the uint8 buffer kept in ``self.<name>`` across steps, grown by
        doubling (no allocation, so no page faults, once it is big enough). Reusing
        it is safe: every step waits for its exchange to end, and has copied the
        received rows out, before the next begins. ``pinned``: page-locked (the NCCL
        path's send buffer, so its copy to the GPU is one DMA)."""
        buf = getattr(self, name)
        if buf is None or buf.numel() < nbytes:
            torch = torch_module()
            size = max(nbytes, 2 * (0 if buf is None else buf.numel()), 1 << 16)
            buf = torch.empty(size, dtype=torch.uint8, pin_memory=pinned)
            setattr(self, name, buf)
        return buf[:nbytes]

    def _all_to_all(self, send, send_splits, recv_splits):
        """The exchange; returns the received bytes as a uint8 tensor (on the GPU
        with NCCL, else on the host)."""
        import torch
        doing = f"sample step {self._step}: exchanging rows"
        total = sum(recv_splits)
        if self._data_backend == "nccl":
            dev = torch.device("cuda", torch.cuda.current_device())
            s = (send if torch.is_tensor(send) else torch.from_numpy(send)).to(dev, non_blocking=True)
            r = torch.empty(total, dtype=torch.uint8, device=dev)
            self._g.all_to_all(s, r, send_splits, recv_splits, doing, group=self._g._base)
            return r
        r = self._kept("_recv", total)
        self._g.all_to_all(send if torch.is_tensor(send) else torch.from_numpy(send), r, send_splits, recv_splits,
                           doing)
        return r

    def _receive(self, recv, starts, recv_rows, sources, lay, strides_from, plan, device, declared) -> Sample:
        """The consumer's sample from the received parts (``recv_rows[s]`` rows from
        rank s; ``sources``: the rank each position comes from, in position order):
        rows, and from the owner whose memory this rank reads (``_locators``)
        locators of the rows it copies from there itself."""
        packed = plan.get("packed", False)
        located = self._located & (recv_rows > 0)
        if device is not None and recv.device.type == "cpu" and located.any() and not recv_rows[~located].any():
            # Every row is read from one owner's memory: gathered straight into tensors
            # on the device (in place from the host memory, registered, on a GPU).
            owner = int(np.nonzero(located)[0][0])
            header, records, data = self._gather_located(
                recv.numpy()[starts[owner] + _rows.STATUS:], int(recv_rows[owner]), plan["steps"],
                int(declared[owner]), owner, device, packed)
        elif recv.device.type == "cpu":  # one native pass from the receive buffer (and shared memory)
            columns = self._column_bytes(self._reads_from) if located.any() else ()
            header, records, data = _rows.unpack_received(
                recv.numpy(), starts, recv_rows, sources, lay, self._verify, self._what, declared, device, packed,
                self._located, columns, strides_from)
        else:  # rows that arrived on a GPU are unpacked there (padded; packed() unpads)
            order = np.argsort(sources, kind="stable")  # the order rows arrive in
            rows = _rows.in_position_order(recv, starts, recv_rows, lay.stride, order)
            header, records, data = _rows.unpack(rows, self._signature, plan["steps"], self._verify, self._what,
                                                 device, declared=declared, sources=sources, record=self._record)
            packed = False
        attributes = arrays(self._schema, records.tobytes(), len(header)) if self._schema else {}
        if device is not None and attributes:
            torch = torch_module()
            attributes = {k: torch.from_numpy(v).to(device) for k, v in attributes.items()}
        fields = dict(keys=header["key"].copy(), probabilities=header["probability"].copy(),
                      priorities=header["priority"].copy(), times_sampled=header["times_sampled"].astype(np.int64),
                      table_size=int(plan["table_size"]), lengths=header["length"].astype(np.int64),
                      attributes=attributes)
        return Sample._packed(data, **fields) if packed else Sample(**fields, data=data)

    def _gather_located(self, part, n: int, steps: int, declared: int, owner: int, device, packed: bool):
        """``(header, records, data)`` of ``n`` locators at the start of ``part`` (uint8),
        ``data`` gathered from ``owner``'s store straight into tensors on ``device``
        (padded ``[m, T, *shape]``, or with ``packed`` the steps end to end). The CRC
        (``verify_rows``), the count of filled rows and every row number are checked
        first; on a GPU the gather has finished when this returns (the owner lets the
        rows go after the step)."""
        torch = torch_module()
        lay = self._layout(steps)[0]
        at, loc_stride = lay.loc_offsets[0], lay.loc_stride
        rows = part[:n * loc_stride].reshape(n, loc_stride)
        header = rows[:, :_rows.HEADER].copy().view(_rows.HEADER_DTYPE).reshape(-1)
        if self._verify and n:
            bad = C.check_rows(rows.reshape(-1), loc_stride)
            if bad >= 0:
                raise _rows.crc_failure(self._what, header[bad])
        filled = header["flags"] == 1
        _rows.check_counts(np.array([filled.sum()]), np.array([declared]), self._what, ranks=[owner])
        header, rows = header[filled], rows[filled]
        records = rows[:, _rows.HEADER:_rows.HEADER + self._record].reshape(-1).copy()
        longest = min(int(header["length"].max()), steps) if len(header) else 0
        index = np.ascontiguousarray(rows[:, at:at + longest * 8]).view(np.int64).reshape(len(header), longest)
        columns = self._columns_of(owner, device)
        capacity = next(iter(columns.views.values())).shape[0]
        if ((index < -1) | (index >= capacity)).any():
            raise Corrupt(f"{self._what}: a locator from rank {owner} names a row outside its store of {capacity} rows")
        names = list(self._signature)
        if packed:
            flat = index[index >= 0]  # each item's steps, end to end
            data = {k: v[0] for k, v in gather(columns, names, torch.from_numpy(flat).to(device), 1, flat.size,
                                               False).items()}
        else:
            data = gather(columns, names, torch.from_numpy(index.reshape(-1)).to(device), len(header), longest,
                          bool((index < 0).any()))
        if device.type == "cuda":
            torch.cuda.current_stream(device).synchronize()
        return header, records, data

    def _column_bytes(self, owner: int) -> list:
        """``owner``'s store columns (this rank's own, or this host's owner's), one flat
        uint8 array per field, mapped here (once)."""
        if owner not in self._columns:
            columns = self._columns_of(owner, torch_module().device("cpu"))
            self._columns[owner] = [columns.views[name].numpy().view(np.uint8).reshape(-1)
                                    for name in self._signature]
        return self._columns[owner]

    def _columns_of(self, owner: int, device):
        """The columns of ``owner``'s store for ``device`` (a torch device): this rank's
        own, or this host's owner's, mapped here through a local client of its
        same-host server (made once); registered with the GPU for a CUDA device."""
        if owner == self._g.rank:
            return self._store._columns_for(device)
        if self._reader is None:
            from ..client import Client
            self._reader = Client(self._local_address)
        return self._reader._columns_for(self.name, device)

    # ------------------------------------------------------- updates, deletes

    def update_priorities(self, keys, priorities) -> int:
        """Sets priorities by global key; each rank passes its own (possibly none).
        Routed to the owning shards in one all_to_all and applied in rank order.
        Returns how many were applied over all shards. A collective."""
        def check(keys):
            from .._convert import priorities as as_priorities
            p = as_priorities(priorities, len(keys))
            bad = np.nonzero(~np.isfinite(p) | (p < 0))[0]
            if len(bad):
                raise InvalidArgument(f"{self._what}: priority {p[bad[0]]} of key {int(keys[bad[0]])} must be "
                                      f"finite and >= 0")
            return p.view(np.uint64)[:, None]

        return self._route(OP["update_priorities"], keys, check,
                           lambda local, words: self._table.update_priorities(local, words[:, 0].view(np.float64)))

    def delete(self, keys) -> int:
        """Removes items by global key (each rank its own list); returns how many
        were removed over all shards. A collective."""
        return self._route(OP["delete"], keys, None, lambda local, _: self._table.delete(local))

    def update_attributes(self, keys, attributes: dict) -> int:
        """``Table.update_attributes`` by global key: each rank passes its own keys
        and values (possibly none), every rank the same attribute names. Routed to
        the owning shards in one all_to_all (8 bytes per key and attribute);
        every value is checked before anything moves. Returns how many items were
        updated over all shards. A collective."""
        dtypes = dict(self._schema)
        names = sorted(attributes) if isinstance(attributes, dict) else []

        def check(keys):
            from .._attributes import values
            if not isinstance(attributes, dict) or not attributes:
                raise InvalidArgument(f"{self._what}: update_attributes takes {{name: values}}, got {attributes!r}")
            check_fixed(self._what, attributes, self._max_staleness is not None, self._groups is not None)
            words = np.zeros((len(keys), len(names)), dtype=np.uint64)
            for j, name in enumerate(names):
                raw = np.frombuffer(values(self._schema, self.name, name, attributes[name], len(keys)), np.uint8)
                size = np.dtype(dtypes[name]).itemsize
                words.view(np.uint8).reshape(len(keys), len(names), 8)[:, j, :size] = raw.reshape(len(keys), size)
            return words

        def apply(local, words):
            done = []
            for j, name in enumerate(names):
                size = np.dtype(dtypes[name]).itemsize
                raw = np.ascontiguousarray(words.view(np.uint8).reshape(len(local), len(names), 8)[:, j, :size])
                done.append(self._table.update_attributes(local, {name: raw.view(np.dtype(dtypes[name]).newbyteorder("<"))
                                                                  .reshape(-1)}))
            return min(done) if done else 0

        import zlib
        return self._route(OP["update_attributes"], keys, check, apply,
                           arg=zlib.crc32(",".join(names).encode()))

    def _route(self, op, keys, check, apply, arg: int = 0) -> int:
        """Routes global ``keys`` to their shards' owners with the uint64 words
        ``check(keys)`` returns per key (``[n, w]``; it raises ``InvalidArgument``
        on bad values; None: no words), where ``apply(local_keys, words)`` runs on
        the owner and returns a count. ``arg`` goes in the header (ranks whose
        calls differ in it all raise). Returns the counts summed."""
        import torch
        g = self._g
        err, shard, words = None, None, None
        try:
            keys = np.ascontiguousarray(np.asarray(keys, dtype=np.uint64).reshape(-1))
            shard, generation, slot = C.split_keys(keys)
            words = np.zeros((len(keys), 0), dtype=np.uint64) if check is None else check(keys)
            if len(shard) and int(shard.max()) >= self.num_shards:
                raise InvalidArgument(f"{self._what}: key {int(keys[np.argmax(shard)])} names shard "
                                      f"{int(shard.max())}, but there are {self.num_shards}")
        except (InvalidArgument, NotFound, ValueError, TypeError) as e:
            err = e if isinstance(e, (InvalidArgument, NotFound)) else InvalidArgument(f"{self._what}: keys: {e}")
        self._begin(op, arg, err)
        width = 8 * (1 + words.shape[1])  # bytes per key
        dest = self._owner[shard.astype(np.int64)] if shard is not None else np.zeros(0, dtype=np.int64)
        order = np.argsort(dest, kind="stable")
        counts = np.bincount(dest, minlength=g.size).astype(np.int64)
        matrix = g.all_gather(counts, f"{OPS[op]}: counting keys")  # [source, dest]
        payload = np.concatenate([keys[:, None], words], axis=1)
        payload = np.ascontiguousarray(payload[order]).view(np.uint8).reshape(-1)
        recv_counts = matrix[:, g.rank]
        r = torch.empty(int(recv_counts.sum()) * width, dtype=torch.uint8)
        g.all_to_all(torch.from_numpy(payload), r, counts * width, recv_counts * width, f"{OPS[op]}: routing keys")
        done = 0
        if self._table is not None:
            got = r.numpy().view(np.uint64).reshape(-1, width // 8)
            _, generation, slot = C.split_keys(np.ascontiguousarray(got[:, 0]))
            local, found = self._table._native.local_keys(generation, slot)
            done = apply(local[found], np.ascontiguousarray(got[found, 1:]))
        totals = g.all_gather(np.array([done], dtype=np.int64), f"{OPS[op]}: counting what was applied")
        return int(totals.sum())

    # ------------------------------------------------------------ information

    def info(self) -> dict:
        """Global and per-shard figures (a collective)."""
        self._begin(OP["info"], 0, None)
        mine = None if self._table is None else self._table.info()
        infos = [i for i in self._g.all_gather_object(mine, "info: gathering shard figures") if i is not None]
        total = {k: sum(i[k] for i in infos) for k in ("size", "max_size", "num_inserts", "num_samples",
                                                       "num_evictions", "num_deletes", "num_store_evictions",
                                                       "stale_removed", "stale_dropped")}
        return {"name": self.name, "num_shards": self.num_shards, "step": self._step, "consumers": self.consumers,
                "sampler": infos[0]["sampler"], "remover": infos[0]["remover"], **total,
                "attributes": self.attributes, "max_staleness": self._max_staleness, "version": self._version,
                "groups": self._group_figures(infos),
                "shards": [{"shard": s, "rank": int(self._owner[s]), "host": self._g.host_names[self._shard_host[s]],
                            **{k: i[k] for k in ("size", "num_inserts", "num_samples", "num_evictions")}}
                           for s, i in enumerate(infos)]}

    def _group_figures(self, infos: list) -> dict | None:
        """The shards' group counters summed (None without ``group_size``)."""
        if self._groups is None:
            return None
        counts = ("admitted", "dropped", "duplicates", "live", "partial", "pending", "pending_items")
        size, timeout, on_timeout = self._groups
        return {**{k: sum(i["groups"][k] for i in infos) for k in counts}, "group_size": size, "timeout": timeout,
                "on_timeout": on_timeout}

    def placement_report(self, batch_size: int | None = None) -> dict:
        """Each host's share of the sampling mass against its consumers' share, and
        the rows (and bytes) per step expected to cross hosts under this table's
        assignment, for steps of ``batch_size`` per consumer (default: the last
        ``sample``'s). A collective."""
        if batch_size is None:
            if self._last_batch is None:
                raise InvalidArgument(f"{self._what}: placement_report needs batch_size (no sample step yet)")
            batch_size = self._last_batch
        batch_size = as_int("batch_size", batch_size, 1)
        heads = self._begin(OP["placement_report"], batch_size, None)
        return placement.report(self, heads[self._owner], batch_size * len(self._consumers))

    # ------------------------------------------------------------ checkpoints

    def save(self, path) -> str:
        """A checkpoint of every shard (the usual format) plus a manifest with the
        shard map, step, seed and each shard checkpoint's CRC: a collective. Returns
        the checkpoint's directory."""
        from .checkpoint import save
        self._begin(OP["save"], 0, None)
        return save(self, path)

    @classmethod
    def restore(cls, path, group=None, topology=None, assignment: str | None = None, timeout: float = 60.0,
                data_backend: str | None = None, verify_rows: bool = True) -> "ShardedTable":
        """The table saved under ``path`` (a ``save`` directory, or the newest under
        ``path``), on a job with the same number of shards: a collective. It
        continues with the batches the saved run would have drawn."""
        from .checkpoint import restore
        return restore(cls, path, group, topology, assignment, timeout, data_backend, verify_rows)

    def close(self):
        """Stops this rank's same-host server, closes its shard's store and its
        private control group."""
        self._columns.clear()
        if self._reader is not None:
            self._reader.close()  # (and its mapped columns)
            self._reader = None
        if self._host_group is not None:
            self._g.retire(self._host_group)
            self._host_group = None
        self._g.close()
        if self._server is not None:
            self._server.stop()
            self._server = None
        if self._store is not None:
            self._store.close()

    def __repr__(self):
        return (f"ShardedTable({self.name!r}, shards={self.num_shards}, sampler={self._sampler!r}, "
                f"consumers={len(self._consumers)}, step={self._step})")


__all__ = ["ShardedTable"]
