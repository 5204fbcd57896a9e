"""Cluster-mode checkpoints: each shard in the single-table format (its own
directory, written by its owner) plus ``manifest.json`` (shard map, step, seed,
the owners' draw boundaries and each shard checkpoint's manifest CRC), written by
rank 0 last, under a temporary name renamed when complete: a directory without a
manifest is not a checkpoint."""

from __future__ import annotations

import json
import os
import zlib

from .. import checkpoint as single
from ..errors import Corrupt, InvalidArgument

MANIFEST = "manifest.json"
FORMAT = "reprise-cluster-checkpoint"
VERSION = 1


def _manifest_crc(shard_dir: str) -> int:
    with open(os.path.join(shard_dir, "MANIFEST.json"), "rb") as f:
        return zlib.crc32(f.read())


def save(table, path) -> str:
    g = table._g
    root = os.path.join(os.fspath(path), f"cluster-{table.step:010d}")
    if g.rank == 0:
        os.makedirs(root, mode=0o700, exist_ok=True)
    g.barrier("save: making the directory")
    mine = None
    if table.shard is not None:
        shard_root = os.path.join(root, f"shard-{table.shard:04d}")
        os.makedirs(shard_root, mode=0o700, exist_ok=True)
        made = single.save(shard_root, [table._table])
        mine = {"shard": table.shard, "dir": os.path.relpath(made, root), "manifest_crc": _manifest_crc(made),
                "boundaries": [list(b) for b in table._boundaries]}
    shards = sorted((s for s in g.all_gather_object(mine, "save: gathering shard checkpoints") if s), key=lambda s: s["shard"])
    if g.rank == 0:
        manifest = {"format": FORMAT, "version": VERSION, "name": table.name, "step": table.step,
                    "seed": table._seed, "num_shards": table.num_shards, "shards": shards,
                    "signature": [[k, list(f.shape), f.dtype] for k, f in table._signature.items()],
                    "sampler": list(table._sampler._spec()), "remover": list(table._remover._spec()),
                    "rate_limiter": list(table._rate_limiter._spec()), "max_times_sampled": table._max_times,
                    "shards_by": table._shards_by, "attributes": [list(a) for a in table._schema],
                    "max_staleness": table._max_staleness, "policy_version": table.version,
                    "groups": None if table._groups is None else list(table._groups),
                    "assignment": table._assignment}
        tmp = os.path.join(root, MANIFEST + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(manifest, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, os.path.join(root, MANIFEST))
    g.barrier("save: waiting for the manifest")
    return root


def _group_settings(groups) -> dict:
    """The constructor's group arguments from a manifest's ``groups`` entry."""
    if groups is None:
        return {}
    size, timeout, on_timeout = groups
    return {"group_size": size, "group_timeout": timeout, "on_group_timeout": on_timeout}


def _find(path) -> str:
    path = os.fspath(path)
    if os.path.exists(os.path.join(path, MANIFEST)):
        return path
    found = sorted(d for d in (os.listdir(path) if os.path.isdir(path) else [])
                   if d.startswith("cluster-") and os.path.exists(os.path.join(path, d, MANIFEST)))
    if not found:
        raise InvalidArgument(f"no cluster checkpoint (a directory with {MANIFEST}) under {path!r}")
    return os.path.join(path, found[-1])


def restore(cls, path, group, topology, assignment, timeout, data_backend, verify_rows):
    from ..rate_limiters import RateLimiter
    from ..selectors import Prioritized
    from .. import selectors as S
    from ..signature import Field
    root = _find(path)
    with open(os.path.join(root, MANIFEST)) as f:
        try:
            m = json.load(f)
        except ValueError as e:
            raise Corrupt(f"{root}: {MANIFEST} is not valid JSON ({e})") from None
    if m.get("format") != FORMAT or m.get("version") != VERSION:
        raise Corrupt(f"{root}: not a version {VERSION} {FORMAT} manifest")

    def selector(spec):
        return Prioritized(spec[1]) if spec[0] == "Prioritized" else getattr(S, spec[0])()

    signature = {k: Field(tuple(shape), dtype) for k, shape, dtype in m["signature"]}
    shards = m["shards"]
    by_shard = {s["shard"]: s for s in shards}
    loaded: dict = {}

    class _Lazy(dict):  # loads only the shard this rank owns, when the constructor asks
        def __getitem__(self, s):
            if s not in by_shard:
                raise Corrupt(f"{root}: the manifest lists no shard {s}")
            if s not in loaded:
                d = os.path.join(root, by_shard[s]["dir"])
                if _manifest_crc(d) != by_shard[s]["manifest_crc"]:
                    raise Corrupt(f"{d}: its manifest does not match the CRC the cluster manifest recorded")
                loaded[s] = single.load(d)[m["name"]]
            return loaded[s]

    capacity = 1
    table = cls(m["name"], signature, capacity, sampler=selector(m["sampler"]), remover=selector(m["remover"]),
                rate_limiter=RateLimiter(*m["rate_limiter"]), seed=m["seed"], group=group, shards=m["shards_by"],
                topology=topology, assignment=assignment or m["assignment"], timeout=timeout,
                max_times_sampled=m["max_times_sampled"], data_backend=data_backend, verify_rows=verify_rows,
                attributes=dict(m.get("attributes", [])) or None, max_staleness=m.get("max_staleness"),
                **_group_settings(m.get("groups")),
                _restore=_Lazy(), _expect_shards=m["num_shards"])
    table._step = int(m["step"])
    table._version = m.get("policy_version", table._version)
    if table.shard is not None:
        table._boundaries = [tuple(b) for b in by_shard[table.shard]["boundaries"]]
    return table
