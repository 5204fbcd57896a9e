"""The soak's ledger: what the writers committed against what the checkpoints hold.

Inputs: the writers' records (``B`` begin, ``C`` commit = the flush returned, ``L`` the
pool reported the server lost and returned, ``F`` failed), the checkpointer's request
times, and the checkpoint directories themselves, read straight from their files
(``docs/checkpoints.md``, format 1: the table's ``seq``/``range_start`` arrays, the ``id``
and ``payload`` column files) after ``rp.checkpoint.verify`` has checked every file's size
and CRC-32. Nothing is loaded into a store.

Epochs: epoch 1 is the first server; epoch 2 the server restarted from checkpoint ``C``,
the newest complete checkpoint before the SIGKILL (what the restarted server says it
restored). A batch belongs to the epoch in which its begin record was written.

For every checkpoint ``S`` (each periodic one and ``F``, taken after the clients stopped),
of epoch ``e``, requested at ``s`` and answered at ``t``:

1. **Structure** (FIFO remover, no deletes): the items' insertion numbers are exactly
   ``[next_seq - size, next_seq)``, so the table holds the newest items by the server's own
   insertion order; ``num_deletes`` is 0 and ``num_store_evictions`` is 0 (no eviction but
   the remover's).
2. **No phantom**: every item's id was begun by a writer in epoch ``e``, or (epoch 2) is one
   of ``C``'s items. ``C``'s items keep their insertion numbers across the restart, which
   are below every epoch-2 insertion, so (with 1) the ones ``S`` holds must be exactly
   ``C``'s newest, each with its number from ``C``: checked exactly.
3. **Integrity**: every item's payload is its id repeated.
4. **Committed items are present or evicted by rule.** The candidates are the items whose
   flush returned before ``s`` in epoch ``e``. A candidate ``X`` may be missing only if no
   item known to be older than ``X`` is present, because a FIFO remover evicts oldest
   first. Known older: an earlier item of ``X``'s own batch (one ``create_items`` on one
   writer stream, applied in order), any item whose flush returned before ``X``'s batch
   began, and (epoch 2) any of ``C``'s items. Since (1) shows the present items fill the
   newest insertion numbers without a gap, a candidate that was inserted and is missing
   was evicted by the remover; (4) catches a candidate that was never inserted (a flush
   that returned for items the server dropped) whenever anything older than it is still
   present, and (5) bounds the rest.
5. **Counts**: items inserted in the epoch by the time of ``S`` (``next_seq`` minus the
   epoch's first) lie between the candidates committed before ``s`` and the items whose
   batch began before ``t``.

Across the crash: committed epoch-1 items missing from ``C`` are either evicted by rule in
``C`` (checked by 4) or committed after ``C`` was requested: the loss a crash is allowed
("in the last checkpoint before the crash"); these are counted. A flush that returned
success after the SIGKILL for items begun before it is an error. ``C`` must be the
newest complete checkpoint when the server was killed, and the one it restored.
"""

from __future__ import annotations

import glob
import os
import re

import numpy as np

from benchmarks.soak.clients import payload_matches

_FILE = re.compile(r"(writer|sampler|updater|checkpointer)-(\d+)-(\d+)\.txt$")
STATUS = {"C": 1, "L": 2, "F": 3}   # 0: no outcome recorded (killed during the batch)
# A flush is timed after it returns: one that returned just before the SIGKILL may read a
# little later on a busy machine. Success reported this long after the server was seen dead
# is an error.
LATE_S = 1.0


# --- records ----------------------------------------------------------------------------------
def read_records(directory: str) -> dict:
    """Every record file of ``directory``: writer batches, checkpoint requests, calls."""
    batches, requests, calls, corrupt = [], [], [], []
    for path in sorted(glob.glob(os.path.join(directory, "*.txt"))):
        m = _FILE.search(path)
        if m is None:
            continue
        role, slot, inc = m.group(1), int(m.group(2)), int(m.group(3))
        open_batch = {}
        pending_cb = None
        with open(path) as f:
            lines = f.read().split("\n")
        for line in lines[:-1]:          # the last piece is empty, or a line cut by SIGKILL
            p = line.split(" ")
            if p[0] == "B":
                b = {"slot": slot, "inc": inc, "seq": int(p[1]), "n": int(p[2]), "t_begin": float(p[3]),
                     "status": 0, "t_end": np.inf}
                open_batch[b["seq"]] = b
                batches.append(b)
            elif p[0] in STATUS:
                b = open_batch[int(p[1])]
                b["status"], b["t_end"] = STATUS[p[0]], float(p[3])
            elif p[0] == "K":
                calls.append({"role": role, "slot": slot, "kind": p[1], "start": float(p[2]), "wait": float(p[3]),
                              "limit": float(p[4]), "ok": p[5] == "1", "n": int(p[6]), "error": p[7]})
            elif p[0] == "CB":
                pending_cb = {"t_begin": float(p[1]), "wall_ns": int(p[2]), "t_end": np.inf, "path": None}
                requests.append(pending_cb)
            elif p[0] == "CE" and pending_cb is not None:
                pending_cb["t_end"], pending_cb["path"] = float(p[1]), p[2]
                pending_cb = None
            elif p[0] == "X":
                corrupt.append({"slot": slot, "id": int(p[1])})
    return {"batches": batches, "requests": requests, "calls": calls, "corrupt_samples": corrupt}


# --- checkpoints ------------------------------------------------------------------------------
def read_checkpoint(rp, path: str, table: str) -> dict:
    """The items of ``table`` in checkpoint ``path``: ids, insertion numbers, payload check."""
    manifest = rp.checkpoint.verify(path)   # sizes and CRC-32 of every file, or Corrupt
    if manifest.get("compression") is not None:
        raise ValueError(f"{path}: compression {manifest['compression']!r}; the soak saves uncompressed")
    t = next(x for x in manifest["tables"] if x["index"]["name"] == table)
    store = manifest["stores"][t["store"]]
    with np.load(os.path.join(path, t["file"])) as z:
        seq, start, length, ranges = z["seq"], z["range_start"], z["range_len"], z["num_ranges"]
    if not ((ranges == 1).all() and (length == 1).all()):
        raise ValueError(f"{path}: expected one-step items")
    pieces = np.fromfile(os.path.join(path, store["rows"]), "<i8").reshape(-1, 2)
    order = np.argsort(pieces[:, 0], kind="stable")
    starts, counts = pieces[order, 0], pieces[order, 1]
    offsets = (np.cumsum(pieces[:, 1]) - pieces[:, 1])[order]
    j = np.searchsorted(starts, start.astype(np.int64), side="right") - 1
    if (j < 0).any() or (start.astype(np.int64) >= starts[j] + counts[j]).any():
        raise ValueError(f"{path}: an item's row is in no saved piece")
    pos = offsets[j] + (start.astype(np.int64) - starts[j])
    ids = np.fromfile(os.path.join(path, store["columns"]["id"]), "<i8")[pos]
    payload = np.memmap(os.path.join(path, store["columns"]["payload"]), np.uint8, mode="r").reshape(-1, 4096)
    ok = np.ones(len(ids), bool)
    for a in range(0, len(ids), 4096):
        ok[a:a + 4096] = payload_matches(ids[a:a + 4096], payload[pos[a:a + 4096]])
    del payload
    idx = t["index"]
    counters = dict(zip(["num_inserts", "num_samples", "num_evictions", "num_deletes", "num_store_evictions"],
                        idx["counters"]))
    return {"path": path, "name": os.path.basename(path), "ids": ids, "seq": seq.astype(np.int64),
            "next_seq": int(idx["next_seq"]), "max_size": int(idx["max_size"]), "payload_ok": ok,
            "counters": counters}


def request_of(name: str, requests: list) -> dict | None:
    """The checkpoint request that made directory ``ckpt-<ns>``: the last one begun
    (wall clock) at or before the save's time."""
    ns = int(name.split("-")[1])
    before = [r for r in requests if r["wall_ns"] <= ns]
    return max(before, key=lambda r: r["wall_ns"]) if before else None


# --- the checks -------------------------------------------------------------------------------
class Ledger:
    def __init__(self, records: dict, batch: int, t_kill: float | None = None, t_dead: float | None = None):
        self.batch = batch
        self.t_kill = np.inf if t_kill is None else t_kill
        self.t_dead = np.inf if t_dead is None else t_dead
        b = records["batches"]
        self.slot = np.array([x["slot"] for x in b], np.int64)
        self.inc = np.array([x["inc"] for x in b], np.int64)
        self.seq = np.array([x["seq"] for x in b], np.int64)
        self.n = np.array([x["n"] for x in b], np.int64)
        self.t_begin = np.array([x["t_begin"] for x in b], float)
        self.t_end = np.array([x["t_end"] for x in b], float)
        self.status = np.array([x["status"] for x in b], np.int64)
        self.epoch = np.where(self.t_begin < self.t_kill, 1, 2)
        self.key = (self.slot << 48) | (self.inc << 32) | (self.seq // batch)
        order = np.argsort(self.key)
        self._sorted_keys, self._sorted_idx = self.key[order], order
        if len(np.unique(self.key)) != len(self.key):
            raise ValueError("two begin records for one batch: the writers' ids are not unique")
        self.errors: list[str] = []
        self.restored: dict | None = None   # C, once known

    def batch_of(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(index of each id's batch, or -1 where no writer began it; its position in the batch)."""
        ids = np.asarray(ids, np.int64)
        seq = ids & 0xFFFFFFFF
        if not len(self._sorted_keys):
            return np.full(len(ids), -1), seq
        key = (ids >> 32 << 32) | (seq // self.batch)
        i = np.minimum(np.searchsorted(self._sorted_keys, key), len(self._sorted_keys) - 1)
        b = np.where(self._sorted_keys[i] == key, self._sorted_idx[i], -1)
        pos = seq - self.seq[np.maximum(b, 0)]
        b = np.where((b >= 0) & (pos >= self.n[np.maximum(b, 0)]), -1, b)
        return b, pos

    def _error(self, what: str, ids=None) -> None:
        shown = ""
        if ids is not None:
            ids = np.asarray(ids)
            shown = f" (ids {[hex(int(i)) for i in ids[:5]]}{'...' if len(ids) > 5 else ''})"
        self.errors.append(what + shown)

    def check(self, ck: dict, epoch: int, s: float, t: float) -> dict:
        """Checks 1-5 of the module doc for checkpoint ``ck`` of ``epoch``, requested at ``s``
        and answered at ``t``. Returns its counts; errors go to ``self.errors``."""
        name = ck["name"]
        ids, seq = ck["ids"], ck["seq"]
        size = len(ids)
        before = len(self.errors)
        # 1. structure
        if size and not np.array_equal(np.sort(seq), np.arange(ck["next_seq"] - size, ck["next_seq"])):
            self._error(f"{name}: insertion numbers are not the newest {size} (FIFO order broken)")
        if len(np.unique(ids)) != size:
            self._error(f"{name}: an id is held twice")
        c = ck["counters"]
        if c["num_deletes"] or c["num_store_evictions"]:
            self._error(f"{name}: {c['num_deletes']} deletes, {c['num_store_evictions']} store evictions (expected 0)")
        # 2. no phantom; in epoch 2, C's items are exactly those of C's newest insertion numbers
        b, pos = self.batch_of(ids)
        rc = self.restored if epoch == 2 else None
        in_c = np.zeros(size, bool)
        if rc is not None:
            in_c = seq < rc["next_seq"]
            keep = rc["seq"] >= ck["next_seq"] - size
            if not (np.array_equal(np.sort(ids[in_c]), np.sort(rc["ids"][keep]))
                    and np.array_equal(np.sort(seq[in_c]), np.sort(rc["seq"][keep]))):
                self._error(f"{name}: the restored items it holds are not the newest of the restored checkpoint")
            id_to_seq = dict(zip(rc["ids"].tolist(), rc["seq"].tolist()))
            if any(id_to_seq.get(i) != q for i, q in zip(ids[in_c].tolist(), seq[in_c].tolist())):
                self._error(f"{name}: a restored item changed its insertion number")
        phantom = (b < 0) & ~in_c
        if phantom.any():
            self._error(f"{name}: {int(phantom.sum())} items no writer began", ids[phantom])
        wrong_epoch = (b >= 0) & ~in_c & (self.epoch[np.maximum(b, 0)] != epoch)
        if wrong_epoch.any():
            self._error(f"{name}: {int(wrong_epoch.sum())} items of another epoch (not restored)", ids[wrong_epoch])
        # 3. integrity
        if not ck["payload_ok"].all():
            self._error(f"{name}: {int((~ck['payload_ok']).sum())} payloads differ from their id",
                        ids[~ck["payload_ok"]])
        # 4. committed items of this epoch present, or evicted by rule
        nb = len(self.n)
        mine = (b >= 0) & ~in_c
        present = np.bincount(b[mine], minlength=nb)
        first_pos = np.full(nb, np.iinfo(np.int64).max)
        np.minimum.at(first_pos, b[mine], pos[mine])
        committed = self.status == STATUS["C"]
        cand = committed & (self.t_end < s) & (self.epoch == epoch)
        held, need = present[cand], self.n[cand]
        gap = (held > 0) & (held < need) & (first_pos[cand] != need - held)
        if gap.any():
            self._error(f"{name}: {int(gap.sum())} committed batches miss items before ones they still hold")
        t_min = -np.inf if in_c.any() else np.min(self.t_end[(present > 0) & committed], initial=np.inf)
        younger = (held < need) & (self.t_begin[cand] > t_min)
        if younger.any():
            i = np.flatnonzero(cand)[younger]
            self._error(f"{name}: {int((need - held)[younger].sum())} committed items missing although older "
                        "items are present (not FIFO)", (self.slot[i] << 48) | (self.inc[i] << 32) | self.seq[i])
        # 5. counts
        base = rc["next_seq"] if rc is not None else 0
        inserted = ck["next_seq"] - base
        committed_n = int(need.sum())
        begun_n = int(self.n[(self.t_begin < t) & (self.epoch == epoch)].sum())
        if not committed_n <= inserted <= begun_n:
            self._error(f"{name}: {inserted} inserted in epoch {epoch}, outside [{committed_n} committed, "
                        f"{begun_n} begun]")
        return {"name": name, "epoch": epoch, "size": size, "next_seq": ck["next_seq"], "inserted": inserted,
                "committed_before": committed_n, "begun_before": begun_n, "committed_present": int(held.sum()),
                "evicted_by_rule": int((need - held).sum()), "restored_present": int(in_c.sum()),
                "errors": len(self.errors) - before}

    def set_restored(self, ck: dict) -> None:
        """``C``: what epoch 2 starts from."""
        self.restored = {"ids": ck["ids"], "seq": ck["seq"], "next_seq": ck["next_seq"]}

    def crash_losses(self, c_ck: dict, c_request: float) -> dict:
        """Committed epoch-1 items not in ``C``, split by whether their flush returned before
        ``C`` was requested (then check 4 judged them) or after (lost in the crash: allowed)."""
        committed = (self.status == STATUS["C"]) & (self.epoch == 1)
        b, _ = self.batch_of(c_ck["ids"])
        present = np.bincount(b[b >= 0], minlength=len(self.n))
        missing = np.where(committed, self.n - present, 0)
        after = self.t_end >= c_request
        late = committed & (self.t_end > self.t_dead + LATE_S)
        if late.any():
            self._error(f"{int(self.n[late].sum())} items' flush returned success after the server was killed")
        reported = (self.status == STATUS["L"]) & (self.epoch == 1)
        return {"committed_epoch1": int(self.n[committed].sum()),
                "in_restored": int(present[committed].sum()),
                "evicted_before_request": int(missing[~after].sum()),
                "lost_in_crash_allowed": int(missing[after].sum()),
                "reported_lost_by_pool": int(self.n[reported].sum())}

    def totals(self) -> dict:
        by = {k: int(self.n[self.status == v].sum()) for k, v in STATUS.items()}
        return {"batches": int(len(self.n)), "items_begun": int(self.n.sum()), "items_committed": by["C"],
                "items_reported_lost": by["L"], "items_failed": by["F"],
                "items_unknown": int(self.n[self.status == 0].sum())}
