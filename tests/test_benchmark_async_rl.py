"""Smoke test of the async-RL benchmark (issue 34; benchmarks/README.md, "Async RL"): its
``--quick`` run, so the benchmark cannot rot unseen, and its full-run sizes.

The driver runs as a module from the repository root in a subprocess (as the README's
command does), its outputs in a temporary directory; the test reads its JSON: every
Reprise workload and every TorchRL row measured with no error, the packed batches checked
by the sides themselves (``check``), the ratios and the goal line present. ~10 s on 2
idle cores (two short processes, one importing torch). Skipped without torchrl.
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys

import pytest
from test_benchmarks import errors_in

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPRISE_KEYS = ["insert", "sample_pack", "sample_pack[first]", "sample_pack[groups]", "staleness"]
TORCHRL_KEYS = ["insert", "insert[prebuilt]", "sample_pack", "sample_pack[first]", "sample_pack[groups]",
                "staleness", "staleness[max_size]"]


def test_async_rl_quick_measures_both_systems_and_states_the_goal(tmp_path):
    pytest.importorskip("torchrl")
    r = subprocess.run([sys.executable, "-m", "benchmarks.async_rl.compare", "--quick", "--out-dir", str(tmp_path)],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"exit {r.returncode}\n--- stdout\n{r.stdout[-3000:]}\n--- stderr\n{r.stderr[-6000:]}"
    paths = glob.glob(os.path.join(str(tmp_path), "async_rl-*-quick.json"))
    assert len(paths) == 1, paths
    with open(paths[0]) as f:
        report = json.load(f)
    assert not errors_in(report["systems"]), errors_in(report["systems"])
    reprise = report["systems"]["reprise#1"]["results"]
    torchrl = report["systems"]["torchrl#1"]["results"]
    assert set(TORCHRL_KEYS) <= set(torchrl), sorted(torchrl)
    assert reprise["sample_pack[groups]"]["check"]["whole_groups"]
    budget = report["config"]["token_budget"]
    for name, results, keys in (("reprise", reprise, REPRISE_KEYS), ("torchrl", torchrl, TORCHRL_KEYS)):
        for k in keys:
            e = results[k]
            assert e["tokens_per_s"] > 0 and e["rounds"], (name, k, e)
            if k.startswith(("sample_pack", "staleness")):
                assert e["check"]["checked_items"] >= 1 and e["check"]["checked_tokens"] > 0, (name, k, e["check"])
                assert e["tokens_per_call"] > 0 and e["items_per_call"] >= 1, (name, k)
                assert e["minor_faults_per_call"] >= 0, (name, k)
    # Reprise's draw keeps to the token budget; the staleness draws only fresh enough items
    assert reprise["sample_pack"]["check"]["checked_tokens"] <= budget
    assert reprise["sample_pack"]["tokens_per_call"] <= budget
    for results in (reprise, torchrl):
        st = results["staleness"]
        assert st["final_version"] > report["config"]["max_staleness"], st
        assert min(st["check"]["versions_seen"]) >= st["final_version"] - report["config"]["max_staleness"]
    assert reprise["staleness"]["version_reported"] == reprise["staleness"]["final_version"]
    assert torchrl["sample_pack[groups]"]["check"]["whole_groups"]
    summary = report["summary"]
    for row in ("insert", "sample_pack", "staleness", "sample_pack[first]", "insert[prebuilt]",
                "staleness[max_size]", "sample_pack[groups]"):
        assert summary[row]["ratio"] > 0, (row, summary[row])
    (goal,) = report["goals"]
    assert goal["check"] == "sample_pack: Reprise / TorchRL" and goal["value"] > 0
    assert "| sample_pack | draw 65,536 tokens + pack (varlen) |" in r.stdout
    assert "## Goal" in r.stdout and "whole GRPO groups" in r.stdout


def test_async_rl_full_run_sizes_are_the_issues(monkeypatch):
    monkeypatch.syspath_prepend(ROOT)
    from benchmarks.async_rl.workloads import FULL, Sequences, make_config

    cfg = make_config(False, None)
    assert (cfg.min_len, cfg.max_len, cfg.group_size, cfg.token_budget, cfg.max_staleness) \
        == (256, 16_384, 8, 65_536, 2)
    assert (FULL["max_size"], FULL["store_capacity"], FULL["block_steps"]) == (100_000, 1 << 24, 4096)
    seqs = Sequences(cfg, cfg.insert_groups)  # ~4M tokens, lengths inside the range
    assert 3_500_000 < seqs.tokens < 4_500_000, seqs.describe()
    assert seqs.lengths.min() >= 256 and seqs.lengths.max() <= 16_384


def test_gpu_packed_gather_benchmark_runs_emulated(tmp_path):
    """The GPU packed-gather benchmark's smoke run with "cuda" mapped to the CPU: it
    draws, checks every draw and reports both rates (the numbers are noise here)."""
    pytest.importorskip("torch")
    out = tmp_path / "gpu_packed.json"
    r = subprocess.run([sys.executable, "-m", "benchmarks.async_rl.gpu_packed", "--emulate", "--quick",
                        "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"exit {r.returncode}\n--- stdout\n{r.stdout[-3000:]}\n--- stderr\n{r.stderr[-6000:]}"
    report = json.loads(out.read_text())
    assert report["emulated"] and report["packed_gather"]["gbps"] > 0 and report["pinned_memcpy"]["gbps"] > 0
    assert report["packed_gather"]["tokens_per_call_median"] > 0 and report["ratio"] > 0


def test_dataplane_quick_measures_reprise_and_redis(tmp_path):
    """The data-plane benchmark's smoke run (issue 35), Reprise and the Redis list only (the
    Ray queue starts a Ray instance, which the quick run leaves out): every cell measured, no
    Reprise draw past the staleness bound."""
    import shutil
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed")
    pytest.importorskip("redis")
    r = subprocess.run([sys.executable, "-m", "benchmarks.async_rl.dataplane", "--quick", "--producers", "1",
                        "--systems", "reprise,redis", "--out-dir", str(tmp_path)],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"exit {r.returncode}\n--- stdout\n{r.stdout[-3000:]}\n--- stderr\n{r.stderr[-6000:]}"
    (path,) = glob.glob(os.path.join(str(tmp_path), "dataplane-*-quick.json"))
    with open(path) as f:
        results = json.load(f)["results"]
    for system in ("reprise", "redis"):
        cell = results[system]["1"]
        assert cell["batches"] > 0 and cell["tokens_per_s"] > 0, (system, cell)
    assert results["reprise"]["1"]["drawn_past_bound"] == 0


def test_dataplane_reports_the_median_run_of_each_cell():
    from benchmarks.async_rl.dataplane import _median_run
    runs = [{"tokens_per_s": 3.0, "id": "a"}, {"tokens_per_s": 1.0, "id": "b"}, {"tokens_per_s": 2.0, "id": "c"}]
    got = _median_run(runs)
    assert got["id"] == "c" and got["tokens_per_s_runs"] == [3.0, 1.0, 2.0]
    assert _median_run(runs[:2])["id"] == "b"   # an even count: the lower middle
    assert _median_run([{"skipped": "no ray"}]) == {"skipped": "no ray"}
