"""One aggregation worker as a process (tests/test_aggregate.py runs it in a namespace).

Each rank's data is drawn from a seed of (seed, size index, round, rank), so every rank can
compute the expected sum itself. Prints one JSON line: whether every result was right, the
seconds each round took, retransmissions and the smallest count seen. Exit code 0 if right.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np


def data(seed: int, k: int, rnd: int, rank: int, n: int, dtype: str) -> np.ndarray:
    rng = np.random.default_rng([seed, k, rnd, rank])
    if dtype == "int32":
        return rng.integers(-(2**20), 2**20, n).astype(np.int32)
    return rng.standard_normal(n).astype(np.float32)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--address", required=True)
    p.add_argument("--job", type=int, default=1)
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--size", type=int, required=True)
    p.add_argument("--dtype", default="int32")
    p.add_argument("--bytes", default="40000", help="comma-separated gradient sizes in bytes")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--drop-rate", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=20.0)
    p.add_argument("--token")
    p.add_argument("--dead-rank", type=int, default=-1, help="segments without this rank are right too")
    p.add_argument("--hang-after", type=int, default=-1, help="sleep forever after this many rounds (to be killed)")
    p.add_argument("--on-path", action="store_true")
    a = p.parse_args()
    import reprise as rp

    w = rp.aggregate.Worker(a.address, job=a.job, rank=a.rank, size=a.size, dtype=a.dtype, token=a.token,
                            timeout=a.timeout, drop_rate=a.drop_rate, seed=a.seed, on_path=a.on_path,
                            allow_partial=a.dead_rank >= 0)
    print(json.dumps({"joined": a.rank}), flush=True)
    ok, seconds, retransmits, min_count, done = True, [], 0, a.size, 0
    for k, nbytes in enumerate(int(b) for b in a.bytes.split(",")):
        n = max(1, nbytes // 4)
        for rnd in range(a.rounds):
            if done == a.hang_after:
                time.sleep(3600)
            x = data(a.seed, k, rnd, a.rank, n, a.dtype)
            t = time.perf_counter()
            y = w.allreduce(x)
            seconds.append(time.perf_counter() - t)
            done += 1
            report = w.last_report
            retransmits += int(report["retransmits"])
            counts = np.repeat(report["counts"], w.segment_values)[:n]
            min_count = min(min_count, int(counts.min()))
            everyone = [data(a.seed, k, rnd, r, n, a.dtype) for r in range(a.size)]
            full = np.sum(everyone, axis=0, dtype=everyone[0].dtype)
            want = full
            if a.dead_rank >= 0:
                without = full - everyone[a.dead_rank]
                want = np.where(counts == a.size, full, without)
            right = np.array_equal(y, want) if a.dtype == "int32" else np.allclose(y, want, rtol=1e-5, atol=1e-4)
            if not right:
                bad = np.flatnonzero(y != want)[:5].tolist()
                print(json.dumps({"wrong": {"size": nbytes, "round": rnd, "indices": bad}}), flush=True)
            ok &= bool(right)
    w.close()
    print(json.dumps({"ok": ok, "seconds": seconds, "retransmits": retransmits, "min_count": min_count}), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
