"""Saving and restoring a ``RepriseStorage``: ``state_dict``/``load_state_dict`` and
``dumps``/``loads`` (TorchRL's checkpointer protocol).

- ``state_dict`` holds the elements as tensors: their positions, data (the elements'
  dtypes) and priorities (f64, as the table holds them), plus the signature, length,
  cursor and the table's sampler. Keys, times sampled and the table's random state are
  not kept. ``load_state_dict`` validates everything first: a bad one changes nothing.
- ``dumps(path)`` writes ``reprise_storage.json`` (length, cursor, signature, the
  checkpoint's name), ``positions.npz`` (key and row of every position) and a Reprise
  checkpoint of the table (``ckpt-*``, which ``rp.checkpoint.load`` and
  ``rp.Server(checkpoint_dir=)`` read too); it replaces what an earlier dump put there.
  ``loads`` takes that table and store over whole: the same keys, priorities, times
  sampled, draws to come and rows (a checkpoint restores rows in place).

Both cost one copy of the data; ``dumps`` writes it once more through the checkpoint.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import torch
from torchrl.data.replay_buffers.checkpointers import StorageCheckpointerBase

from ... import checkpoint
from ...errors import InvalidArgument
from ...selectors import Prioritized, Uniform
from .indexing import positions
from .signature import Spec, described

FORMAT = "reprise-torchrl"
VERSION = 1


class Checkpointer(StorageCheckpointerBase):
    """``storage.dumps(path)``/``loads(path)``: a Reprise checkpoint of the table plus the positions."""

    def dumps(self, storage, path):
        dump(storage, path)

    def loads(self, storage, path):
        load(storage, path)


def _head(storage) -> dict:
    return {"_format": FORMAT, "_version": VERSION, "max_size": storage.max_size, "_len": storage._len,
            "last_cursor": storage._last_cursor_index, "initialized": storage._spec is not None}


def _check_head(storage, head: dict, what: str):
    if not isinstance(head, dict) or head.get("_format", head.get("format")) != FORMAT:
        raise InvalidArgument(f"RepriseStorage: {what} is not a RepriseStorage's")
    if head["max_size"] != storage.max_size:
        raise InvalidArgument(f"RepriseStorage: {what} holds max_size={head['max_size']}, this storage "
                              f"has max_size={storage.max_size}")


def _check_spec(storage, spec: Spec, what: str):
    if storage._spec is not None and not storage._spec.same(spec):
        raise InvalidArgument(f"RepriseStorage: {what} holds elements {spec.state()}, this storage holds "
                              f"{storage._spec.state()}")


def _restore_head(storage, head: dict):
    storage._len = int(head["_len"])
    if head.get("last_cursor") is not None:
        storage._set_last_cursor(int(head["last_cursor"]))


def state_dict(storage) -> dict:
    storage._check_open()
    sd = _head(storage)
    spec = storage._spec
    if spec is None:
        return sd
    filled = np.flatnonzero(storage._rows >= 0)
    if filled.size:
        tensors = storage._read(filled, (filled.size,), torch.device("cpu"))
    else:
        tensors = [torch.empty((0, *leaf.shape), dtype=leaf.dtype) for leaf in spec.leaves]
    priority = dict((k, p) for k, p, _, _ in storage._table.items())
    sd.update(
        spec=spec.state(),
        sampler=list(storage._table._sampler._spec()),
        positions=torch.from_numpy(filled),
        data={leaf.name: t for leaf, t in zip(spec.leaves, tensors)},
        priorities=torch.tensor([priority[int(k)] for k in storage._keys[filled]], dtype=torch.float64),
    )
    return sd


def load_state_dict(storage, state_dict: dict):
    storage._check_open()
    _check_head(storage, state_dict, "the state_dict")
    if not state_dict["initialized"]:
        storage._empty()
        _restore_head(storage, state_dict)
        return
    spec = Spec.from_state(state_dict["spec"], storage._spec)
    _check_spec(storage, spec, "the state_dict")
    sampler = tuple(state_dict["sampler"])
    table = storage._table
    if table is not None and table._sampler._spec() != sampler:
        raise InvalidArgument(f"RepriseStorage: the state_dict was saved from a table sampling with {sampler}, "
                              f"this storage's samples with {table._sampler._spec()}")
    pos = positions(state_dict["positions"], storage.max_size, "saved position")
    k = pos.size
    data = {}
    for leaf in spec.leaves:
        t = state_dict["data"][leaf.name]
        if t.dtype != leaf.dtype or tuple(t.shape) != (k, *leaf.shape):
            raise InvalidArgument(f"RepriseStorage: the state_dict's field '{leaf.name}' is "
                                  f"{described(t.dtype, t.shape)}, expected {described(leaf.dtype, (k, *leaf.shape))}")
        data[leaf.name] = leaf.to_numpy(t)
    priorities = np.asarray(state_dict["priorities"], dtype=np.float64).reshape(-1)
    if priorities.size != k or not (np.isfinite(priorities) & (priorities >= 0)).all():
        raise InvalidArgument(f"RepriseStorage: the state_dict needs {k} finite priorities >= 0, got {priorities!r}")
    if np.unique(pos).size != k:
        raise InvalidArgument("RepriseStorage: the state_dict names a position twice")
    if table is None:
        kind, exponent = sampler
        storage._create(spec, Prioritized(exponent) if kind == "Prioritized" else Uniform())
    else:
        storage._empty()
    storage._spec = spec
    storage.initialized = True
    if k:
        storage._write(pos, data, priorities)
    _restore_head(storage, state_dict)
    storage._bump_mutation_revision()


def dump(storage, path):
    storage._check_open()
    path = Path(path).absolute()
    path.mkdir(parents=True, exist_ok=True)
    meta_path = path / "reprise_storage.json"
    previous = None
    if meta_path.exists():
        with open(meta_path) as f:
            previous = json.load(f).get("checkpoint")
    meta = _head(storage)
    meta["checkpoint"] = None
    if storage._spec is not None:
        storage._wait_for_reads()
        meta["checkpoint"] = Path(checkpoint.save(path, storage._table, progress=False)).name
        meta["spec"] = storage._spec.state()
        np.savez(path / "positions.npz", keys=storage._keys, rows=storage._rows)
    tmp = path / "reprise_storage.json.tmp"
    with open(tmp, "w") as f:
        json.dump(meta, f)
    os.replace(tmp, meta_path)
    if previous and previous != meta["checkpoint"] and (path / previous).is_dir():
        shutil.rmtree(path / previous)


def load(storage, path):
    storage._check_open()
    path = Path(path).absolute()
    with open(path / "reprise_storage.json") as f:
        meta = json.load(f)
    _check_head(storage, meta, f"{path}")
    if not meta["initialized"]:
        storage._empty()
        _restore_head(storage, meta)
        return
    spec = Spec.from_state(meta["spec"], storage._spec)
    _check_spec(storage, spec, f"{path}")
    with np.load(path / "positions.npz") as z:
        keys, rows = z["keys"].astype(np.uint64), z["rows"].astype(np.int64)
    if keys.shape != (storage.max_size,) or rows.shape != (storage.max_size,):
        raise InvalidArgument(f"RepriseStorage: {path}/positions.npz does not hold {storage.max_size} positions")
    tables = checkpoint.load(path / meta["checkpoint"], progress=False, directory=storage._directory)
    table = next(iter(tables.values()))
    try:
        live = {k for k, _, _, _ in table.items()}
        missing = [int(k) for k in keys[keys != 0] if int(k) not in live]
        if missing:
            raise InvalidArgument(f"RepriseStorage: {path}: the checkpoint lacks item {missing[0]:#x} of the "
                                  f"saved positions")
        sampler = storage._prioritized
        if sampler is not None and table._sampler._spec() != ("Prioritized", float(sampler.alpha)):
            raise InvalidArgument(f"RepriseStorage: {path} holds a table sampling with {table._sampler!r}; this "
                                  f"storage's ReprisePrioritizedSampler needs alpha={sampler.alpha}")
    except BaseException:
        table.store.close()
        raise
    storage._take(table, keys, rows, spec)
    _restore_head(storage, meta)
