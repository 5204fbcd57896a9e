"""The header every collective call of a ``ShardedTable`` starts with: ``WORDS``
int64 words per rank, all_gathered, so each rank learns every rank's call (table,
step, op, argument: a mismatch is caught before any data moves) and every owner's
shard figures. ``W_*`` name the words; f64 figures travel as their bit patterns.
``table`` writes it, ``placement`` reads it."""

from __future__ import annotations

import numpy as np

(W_TABLE, W_STEP, W_OP, W_ARG, W_ERROR, W_EXPIRED, W_OWNER, W_SIZE, W_MASS, W_NEXT_SEQ, W_INSERTS,
 W_SAMPLES, W_MAXLEN) = range(13)
WORDS = 16
OPS = {1: "sample", 2: "update_priorities", 3: "delete", 4: "info", 5: "save", 6: "placement_report",
       7: "sample_tokens", 8: "set_version", 9: "update_attributes"}
OP = {v: k for k, v in OPS.items()}


def f64_bits(x: float) -> int:
    """The int64 header word that carries the float ``x``."""
    return int(np.array([x], dtype=np.float64).view(np.int64)[0])


def bits_f64(words) -> np.ndarray:
    """The floats carried by header words ``words``."""
    return np.ascontiguousarray(words, dtype=np.int64).view(np.float64)
