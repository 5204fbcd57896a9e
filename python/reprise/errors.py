"""Typed errors. Each names what was wrong and what was expected; a call that
raises one of these changed nothing (see ``Timeout.partial`` for the exception)."""


class RepriseError(Exception):
    """Base class of every Reprise error."""


class InvalidArgument(RepriseError, ValueError):
    """A bad shape, dtype, field, priority or argument."""


class Timeout(RepriseError, TimeoutError):
    """A blocking call ran past its timeout.

    ``partial`` holds what the call had done before the deadline so that nothing is
    lost: for ``Table.insert`` the keys of the items inserted so far (a numpy array),
    for ``Table.sample`` a ``Sample`` of the items drawn so far. ``None`` when the call
    did nothing. A ``KeyboardInterrupt`` (Ctrl-C) that stops a blocked call carries
    ``partial`` the same way.
    """

    partial = None


class NotFound(RepriseError, KeyError):
    """An unknown table, field or key."""

    def __str__(self):  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class ResourceExhausted(RepriseError):
    """The store has no free block for new steps, and evicting the items of its oldest
    blocks could not free one (writers or samples hold them, or they belong to tables
    made with ``evict_when_store_full=False``)."""


class Corrupt(RepriseError):
    """A checkpoint or message failed validation."""


class Unauthenticated(RepriseError):
    """A missing or wrong token."""


class CollectiveError(RepriseError):
    """A cluster-mode collective failed on some rank: a peer died, raised, or did
    not arrive within the table's timeout. Every rank's call ends with it (or with
    the error the failing rank raised); the table's process group cannot be used
    after it."""


class CollectiveMismatch(CollectiveError):
    """Ranks made different cluster-mode calls at the same point (another table,
    step, operation or argument): every rank gets this error, naming who differed."""


__all__ = [
    "RepriseError",
    "InvalidArgument",
    "Timeout",
    "NotFound",
    "ResourceExhausted",
    "Corrupt",
    "Unauthenticated",
    "CollectiveError",
    "CollectiveMismatch",
]


class CapacityWarning(UserWarning):
    """A table's ``max_size`` that its store cannot hold: the store will evict items
    (or refuse writes) before the table is full. The rule: ``capacity >= (max_size + 1)
    x steps per item + 2 x block_steps``."""
