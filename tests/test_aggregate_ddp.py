"""`rp.aggregate.ddp_hook`: a DistributedDataParallel job whose gradients are averaged through
the aggregation daemon trains to the same parameters as one averaged by gloo's all-reduce:
bit for bit in int32 mode (against gloo summing the same fixed-point values), and within
float32 rounding in float32 mode (sums in another order)."""

import os
import socket
import subprocess
import sys

import numpy as np
import pytest

import reprise as rp

torch = pytest.importorskip("torch")
HERE = os.path.dirname(os.path.abspath(__file__))
WORLD = 2


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def train(via: str, tmp_path, daemon: str | None = None, job: int = 1) -> list[np.ndarray]:
    init = f"tcp://127.0.0.1:{free_port()}"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    procs = [subprocess.Popen([sys.executable, os.path.join(HERE, "aggregate_ddp_ranks.py"), "--rank", str(r),
                               "--world", str(WORLD), "--init", init, "--via", via, "--daemon", daemon or "",
                               "--job", str(job), "--out", str(tmp_path / f"{via}-{r}.npz")],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in range(WORLD)]
    for r, p in enumerate(procs):
        try:
            _, err = p.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise AssertionError(f"{via}: rank {r} did not finish in 120 s")
        assert p.returncode == 0, f"{via}: rank {r} failed:\n{err[-3000:]}"
    params = []
    for r in range(WORLD):
        with np.load(tmp_path / f"{via}-{r}.npz") as f:
            params.append([f[k] for k in sorted(f.files, key=lambda k: int(k.split("_")[1]))])
    for a, b in zip(params[0], params[1]):
        np.testing.assert_array_equal(a, b, err_msg=f"{via}: the replicas diverged")
    return params[0]


def test_ddp_hook_int32_is_bit_for_bit_the_gloo_fixed_point_reference(tmp_path):
    with rp.aggregate.Daemon("127.0.0.1:0") as d:
        daemon = train("daemon-int32", tmp_path, d.address, job=1)
        assert d.stats()["segments_completed"] > 0
    reference = train("reference-int32", tmp_path)
    for a, b in zip(daemon, reference):
        np.testing.assert_array_equal(a, b)


def test_ddp_hook_float32_matches_gloo_allreduce(tmp_path):
    with rp.aggregate.Daemon("127.0.0.1:0") as d:
        daemon = train("daemon-float32", tmp_path, d.address, job=2)
    gloo = train("gloo", tmp_path)
    for a, b in zip(daemon, gloo):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
