"""Writes the format-v1 checkpoint fixtures under tests/data/ and what loading them must give.

The committed fixtures were written by the Python checkpoint code of commit 9619e5f, before the
format moved into Rust (crates/core/src/checkpoint/); tests/test_checkpoint.py loads them and
checks every item, counter and the continuation of the sampler against checkpoint_v1_expected.json.
Run from the repository root: ``python tests/data/make_checkpoint_v1.py``.
"""

import json
import shutil
from pathlib import Path

import numpy as np

import reprise as rp
from reprise import selectors as S

HERE = Path(__file__).parent
SIG = {"obs": rp.Field((3,), "float32"), "act": rp.Field((), "int64")}


def step(i):
    return {"obs": np.array([i, -i, 0.5 * i], np.float32), "act": i}


def tables():
    store = rp.Store(SIG, capacity=48, block_steps=4)
    t = rp.Table("replay", store, sampler=S.Prioritized(0.8), remover=S.Fifo(), max_size=12, seed=5,
                 rate_limiter=rp.rate_limiters.SampleToInsertRatio(2.0, 3, 100.0))
    q = rp.Table.queue("queue", store, max_size=12)
    with store.writer() as w:  # both tables over the same steps; the store wraps once
        episode = 0
        for i in range(60):
            w.append(step(i))
            episode += 1
            if i % 2:
                w.create_item(t, min(2, episode), 1.0 + i % 5)
            if i % 3 == 0 and i >= 30:
                w.create_item(q, 1, 1.0)
            if i % 9 == 8:
                w.end_episode()
                episode = 0
    keys = t.sample(5).keys
    t.update_priorities(keys[:3], [0.25, 4.0, 9.5])
    t.delete(keys[3:4])
    q.sample(2)
    return store, t, q


def state(t, q, inserted):
    """What the tables hold and do next; the same calls on a loaded copy must give the same."""
    def info(table):
        return {k: v for k, v in table.info().items() if k != "rate_limiter"} | {
            "rate_limiter": {k: v for k, v in table.info()["rate_limiter"].items() if not k.startswith("blocked")}}
    out = {"replay_items": t.items(), "queue_items": q.items(), "replay_info": info(t), "queue_info": info(q)}
    draws = []
    for _ in range(3):
        s = t.sample(4)
        draws.append({"keys": s.keys.tolist(), "probabilities": s.probabilities.tolist(),
                      "obs": s.data["obs"].tolist(), "act": s.data["act"].tolist()})
    out["replay_draws"] = draws
    out["queue_draw"] = q.sample(3).data["act"].tolist()
    out["inserted_keys"] = t.insert(inserted, 2.0).tolist()
    return out


def main():
    inserted = {"obs": np.full((2, 1, 3), 7.0, np.float32), "act": np.array([[700], [701]], np.int64)}
    expected = {}
    for name, compression in (("checkpoint_v1", None), ("checkpoint_v1_zstd", "zstd")):
        store, t, q = tables()
        out = HERE / name
        shutil.rmtree(out, ignore_errors=True)
        saved = Path(rp.checkpoint.save(out, [t, q], compression=compression))
        saved.rename(out / "ckpt-00000000000000000001")
        expected[name] = state(t, q, inserted)
        store.close()
    assert expected["checkpoint_v1"] == expected["checkpoint_v1_zstd"]
    (HERE / "checkpoint_v1_expected.json").write_text(json.dumps(expected["checkpoint_v1"], indent=1) + "\n")


if __name__ == "__main__":
    main()
