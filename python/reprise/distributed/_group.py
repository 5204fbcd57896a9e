"""The ranks of a cluster-mode table: a private gloo group for control messages
(and CPU rows) with the table's timeout, every collective wrapped so that a dead,
late or failing peer ends each rank's call with a ``RepriseError``."""

from __future__ import annotations

import os
import socket
from datetime import timedelta

import numpy as np

from ..errors import CollectiveError, InvalidArgument

HOST_ENV = "REPRISE_HOST_ID"
_RETIRED: list = []  # closed subgroup tables' groups, kept so that no group name repeats (Group.new_group)


def _dist():
    try:
        import torch.distributed as dist
    except ImportError:  # pragma: no cover - torch is a test dependency
        raise InvalidArgument("cluster mode needs torch (pip install torch)") from None
    if not dist.is_available() or not dist.is_initialized():
        raise InvalidArgument(
            "cluster mode runs inside a torch.distributed job: call "
            "torch.distributed.init_process_group(...) first (torchrun, Ray Train and "
            "torch.multiprocessing.spawn all work)"
        )
    return dist


def host_name() -> str:
    """This process's host as cluster mode groups ranks: ``$REPRISE_HOST_ID`` when
    set (tests emulating several hosts on one machine), else the hostname."""
    return os.environ.get(HOST_ENV) or socket.gethostname()


class Group:
    """The ranks of ``group`` (None: the whole job), numbered 0..size-1 in group
    order, with a dedicated gloo group for control. ``timeout`` bounds every
    collective."""

    def __init__(self, group, timeout: float, what: str):
        dist = _dist()
        self.dist = dist
        self.what = what
        self.broken: str | None = None
        base = dist.group.WORLD if group is None else group
        self.ranks = list(dist.get_process_group_ranks(base))
        self.size = len(self.ranks)
        self.rank = dist.get_rank(base)
        if self.rank < 0:
            raise InvalidArgument(f"{what}: this process is not a member of the given group")
        self.backend = str(dist.get_backend(base)).lower()
        self.timeout = timeout
        self._base = base
        self.whole_job = len(self.ranks) == dist.get_world_size()
        self.control = self.new_group(self.ranks, "creating the control group")
        hosts = self.all_gather_object(host_name(), "gathering host names")
        names = sorted(set(hosts), key=hosts.index)
        self.host_of_rank = np.array([names.index(h) for h in hosts], dtype=np.uint32)
        self.host_names = names

    def new_group(self, ranks: list, doing: str):
        """A gloo group of ``ranks`` (job ranks) with this table's timeout.

        Group names must never repeat in a process: torch (up to 2.11 at least) names
        a group made by its members alone after a hash of its ranks and of how many
        groups the rank holds, so a table made after another over the same ranks was
        closed got its group's name again, and its ranks met the first group's stale
        rendezvous keys and waited for ever. So a table over the whole job makes its
        groups the job-wide way (every rank of the job calls this, in the same order;
        names from a counter that never goes back), and a subgroup's table makes them
        among its members and never destroys them (``close`` keeps them: see
        ``retire``)."""
        dist, limit = self.dist, timedelta(seconds=self.timeout)
        if self.whole_job:
            return self._guard(doing, lambda: dist.new_group(ranks, backend="gloo", timeout=limit))
        return self._guard(doing, lambda: dist.new_group(ranks, backend="gloo", timeout=limit,
                                                         use_local_synchronization=True))

    def retire(self, group):
        """Lets ``group`` (made by ``new_group``) go when the table closes: destroyed
        where the job names groups from its counter; kept (its gloo threads with it)
        for a subgroup's table, whose next group's name would otherwise repeat."""
        if group is None or group is self.dist.GroupMember.NON_GROUP_MEMBER:
            return
        if not self.whole_job:
            _RETIRED.append(group)
            return
        try:
            self.dist.destroy_process_group(group)
        except Exception:  # the job's group may already be gone
            pass

    def _guard(self, doing: str, fn):
        if self.broken is not None:
            raise CollectiveError(f"{self.what}: its process group failed earlier ({self.broken}); make a new table")
        try:
            return fn()
        except CollectiveError:
            raise
        except Exception as e:  # gloo raises RuntimeError/DistBackendError on timeouts and dead peers
            self.broken = f"{doing}: {type(e).__name__}: {e}".strip()
            raise CollectiveError(
                f"{self.what}: {doing} failed on rank {self.rank} of {self.size} within the "
                f"{self.timeout:g} s timeout (a peer died, raised, or called something else): {e}"
            ) from e

    def all_gather(self, words: np.ndarray, doing: str) -> np.ndarray:
        """``[size, len(words)]``: every rank's ``words`` (int64), in rank order."""
        import torch
        t = torch.from_numpy(np.ascontiguousarray(words, dtype=np.int64))
        out = torch.empty(self.size * t.numel(), dtype=torch.int64)
        self._guard(doing, lambda: self.dist.all_gather_into_tensor(out, t, group=self.control))
        return out.numpy().reshape(self.size, -1)

    def all_gather_object(self, obj, doing: str) -> list:
        out = [None] * self.size
        self._guard(doing, lambda: self.dist.all_gather_object(out, obj, group=self.control))
        return out

    def all_to_all(self, send, recv, send_splits, recv_splits, doing: str, group=None):
        """``all_to_all_single`` of byte tensors with known splits (no count exchange)."""
        g = self.control if group is None else group
        recv_splits = recv_splits if isinstance(recv_splits, list) else list(map(int, recv_splits))
        send_splits = send_splits if isinstance(send_splits, list) else list(map(int, send_splits))
        self._guard(doing, lambda: self.dist.all_to_all_single(
            recv, send, output_split_sizes=recv_splits, input_split_sizes=send_splits, group=g))

    def close(self):
        """Lets the control group go (``retire``); later calls fail clearly."""
        if self.broken is None:
            self.broken = "the table was closed"
        self.retire(self.control)

    def barrier(self, doing: str):
        self.all_gather(np.zeros(1, dtype=np.int64), doing)
