"""benchmarks/innetwork/placement.py with tiny sizes: both deployments run, insert and sample what
they say; with namespaces (root), the learner's link carries only the sampled batches (+ priority
updates) when Reprise runs on the middle node, and every pushed byte with Redis on the learner.

One run of the script (2 actors, ~1.5 s window each deployment) in a subprocess with a timeout;
without root it runs on loopback addresses and the link checks are skipped.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys

import pytest

from benchmarks.innetwork.netns import can_namespace

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FRAME = (4, 21, 21)
T_BYTES = 2 * 4 * 21 * 21 + 8 + 4   # 3,540 B per transition
SAMPLE = 512


def _no_shaping() -> str | None:
    """Why namespaces that could be made must not be: every link is shaped with ``tc``."""
    if can_namespace()[0] and shutil.which("tc") is None:
        return "no `tc` command (iproute2): links cannot be shaped"
    return None


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("placement")
    args = ["--quick", "--actors", "2", "--seconds", "1.5", "--warmup", "1.0",
            "--actor-period", "0.05", "--learner-period", "0.2", "--out-dir", str(out)]
    if _no_shaping():
        args += ["--namespaces", "off"]
    p = subprocess.Popen([sys.executable, "-m", "benchmarks.innetwork.placement", *args], cwd=ROOT,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = p.communicate(timeout=50)
    except subprocess.TimeoutExpired:
        p.kill()
        stdout, stderr = p.communicate(timeout=10)
        pytest.fail(f"placement did not finish in 50 s\n{stderr[-4000:]}")
    assert p.returncode == 0, f"exit {p.returncode}\n{stdout[-2000:]}\n{stderr[-4000:]}"
    (path,) = glob.glob(os.path.join(str(out), "placement-*-quick.json"))
    with open(path) as f:
        rep = json.load(f)
    rep["_stdout"], rep["_stderr"] = stdout, stderr
    rep["_prefix"] = f"rp{p.pid % 10000}"  # netns.Network's default prefix in that process
    return rep


def deployment(report, name):
    point = report["points"]["2"]
    d = point["deployments"][name]
    if "skipped" in d:
        pytest.skip(f"{name}: {d['skipped']}")
    assert "error" not in d, d
    return point, d


def test_both_deployments_insert_and_sample_what_they_say(report):
    cfg = report["config"]
    assert cfg["frame"] == list(FRAME) and cfg["transition_bytes"] == T_BYTES
    skipped = {}
    for name in ("reprise", "redis"):
        d = report["points"]["2"]["deployments"][name]
        if "skipped" in d:   # redis-server or the redis package missing: says which
            skipped[name] = d["skipped"]
            assert f"== {name}: SKIPPED: {d['skipped']}" in report["_stderr"]
            continue
        assert "error" not in d, d
        assert d["pushes_total"] > 0 and d["items_pushed_total"] == d["pushes_total"] * 200
        # every pushed item reached the replay: Reprise's table counted it, Redis's drain stored it
        assert d["items_stored_total"] == d["items_pushed_total"], d
        assert d["rounds_total"] > 0 and d["sampled_total"] == d["rounds_total"] * SAMPLE
        assert d["bad_batches"] == []
        assert d["push"]["n"] > 0 and d["push"]["p50_ms"] > 0
        assert d["sample"]["n"] > 0 and d["sample"]["p50_ms"] > 0
        assert d["inserted_items_per_s"] > 0 and d["sampled_items_per_s"] > 0
    _, rp = deployment(report, "reprise")
    assert rp["table"]["num_samples"] == rp["sampled_total"]
    assert "| 2 | reprise |" in report["_stdout"]
    if skipped:
        pytest.skip("; ".join(f"{name}: {why}" for name, why in skipped.items()))
    assert "| 2 | redis |" in report["_stdout"]


def test_learner_link_carries_samples_with_reprise_and_pushes_with_redis(report):
    point = report["points"]["2"]
    if not point["namespaced"]:
        assert all(d.get("learner_link") is None for d in point["deployments"].values())
        assert "n/a" in report["_stdout"]
        pytest.skip(f"loopback fallback ({_no_shaping() or point['fallback_reason']}): no link to count")
    _, rp = deployment(report, "reprise")
    _, rd = deployment(report, "redis")
    # Reprise in the middle: below what the actors pushed, and about the sampled batches +
    # updates (a round's batch ~ 512 x (transition + per-item metadata), its update 512 x 16 B;
    # +2 rounds for the window's edges, +30% for TCP/IP, HTTP/2 and gRPC framing and acks)
    link = rp["learner_link"]["bytes"]
    assert link < rp["pushed_bytes_in_window"], rp
    per_round = SAMPLE * (T_BYTES + 64) + SAMPLE * 16
    bound = 1.3 * (rp["learner_rounds_in_window"] + 2) * per_round + 256 * 1024
    assert link <= bound, (link, bound, rp["learner_rounds_in_window"])
    assert link >= 0.9 * rp["learner_rounds_in_window"] * SAMPLE * T_BYTES, rp
    # Redis on the learner: every pushed byte crosses the learner's link
    assert rd["learner_link"]["bytes"] >= 0.95 * rd["pushed_bytes_in_window"], rd
    assert rd["learner_link"]["bytes"] > link


def test_fallback_runs_without_namespaces(tmp_path):
    args = ["--quick", "--actors", "1", "--seconds", "0.6", "--warmup", "0.6",
            "--deployments", "reprise", "--namespaces", "off", "--out-dir", str(tmp_path)]
    r = subprocess.run([sys.executable, "-m", "benchmarks.innetwork.placement", *args], cwd=ROOT,
                       capture_output=True, text=True, timeout=40)
    assert r.returncode == 0, r.stderr[-4000:]
    (path,) = glob.glob(os.path.join(str(tmp_path), "placement-*-quick.json"))
    with open(path) as f:
        rep = json.load(f)
    point = rep["points"]["1"]
    assert not point["namespaced"] and point["rate"] is None
    d = point["deployments"]["reprise"]
    assert "error" not in d, d
    assert d["push"]["n"] > 0 and d["items_stored_total"] == d["items_pushed_total"]
    assert "learner_link" not in d and "Loopback fallback" in r.stdout


def test_the_generated_config_is_a_valid_reprise_serve_config(tmp_path):
    from reprise.server_config import check
    from benchmarks.innetwork.placement import FULL, server_toml
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib
    cfg = dict(FULL)
    config = tomllib.loads(server_toml(cfg, 8, "0.0.0.0:0"))
    check(config)
    (table,) = config["tables"]
    assert table["sampler"] == {"kind": "Prioritized", "priority_exponent": 0.6}
    assert table["max_size"] == 65_536 and table["remover"] == "Fifo"
    assert config["token"] and config["stores"][0]["capacity"] >= 65_536


def test_nothing_left_behind(report):
    if not can_namespace()[0] or shutil.which("ip") is None:
        pytest.skip("no namespaces here")
    r = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=10)
    mine = report["_prefix"]
    assert not [l for l in r.stdout.splitlines() if l.startswith(mine)], r.stdout
    r = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, timeout=10)
    assert f": {mine}" not in r.stdout, r.stdout
