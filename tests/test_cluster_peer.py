"""The cluster-mode peer comparison (benchmarks/cluster/peer.py): its ``--quick`` run on this
machine, Reprise's ShardedTable and TorchRL's remote replay buffers on the same workload.

Reprise must measure every batch size without an error. Each TorchRL buffer (Ray transport,
distributed transport, torch.distributed.rpc) either measures every batch size too, or is
recorded with the error that stopped it, and the markdown names it: a peer that cannot run
here must say why, never disappear. About 35 s on 2 idle cores (Ray's start-up is most of it).
"""

from __future__ import annotations

import glob
import os

import pytest

from test_benchmarks import errors_in, report_in, run_module

TORCHRL = ("torchrl-ray", "torchrl-distributed", "torchrl-rpc")


def check_measured(name: str, entry: dict, cfg: dict) -> None:
    results = entry["results"]
    assert sorted(results) == sorted(f"b{b}" for b in cfg["batches"]), (name, sorted(results))
    for key, e in results.items():
        assert e["batch"] == int(key[1:]) and e["rows_per_worker_step"] == e["batch"] // 2, (name, key, e)
        assert len(e["sample_items_per_s_rounds"]) == cfg["rounds"], (name, key, e)
        assert len(e["insert_items_per_s_rounds"]) == cfg["rounds"], (name, key, e)
        assert e["sample_items_per_s"] > 0 and e["insert_items_per_s"] > 0 and e["sample_step_ms"] > 0, (name, key, e)


def test_quick_run_measures_reprise_and_each_torchrl_buffer_or_records_why_not(tmp_path):
    pytest.importorskip("torch.distributed")
    pytest.importorskip("torchrl")
    pytest.importorskip("ray")
    r = run_module("benchmarks.cluster.peer", "--quick", "--out-dir", str(tmp_path), timeout=240)
    report = report_in(tmp_path, "cluster-peer")
    assert len(glob.glob(os.path.join(str(tmp_path), "cluster-peer-*-quick.md"))) == 1
    cfg = report["config"]
    assert (cfg["batches"], cfg["row_floats"]) == ([256, 1024], 1024)
    systems = report["systems"]
    assert sorted(systems) == sorted(("reprise",) + TORCHRL), sorted(systems)

    assert not errors_in(systems["reprise"]), errors_in(systems["reprise"])
    check_measured("reprise", systems["reprise"], cfg)
    ran = []
    for name in TORCHRL:
        entry = systems[name]
        if "results" in entry:
            assert "error" not in entry, (name, entry["error"])
            check_measured(name, entry, cfg)
            ran.append(name)
        else:
            assert isinstance(entry.get("error"), str) and entry["error"].strip(), (name, entry)
            assert f"- `{name}`: " in r.stdout, f"{name} failed but the markdown's Errors list omits it"

    assert "| system | B (rows/step, both workers) |" in r.stdout
    if ran:
        for key in ("b256", "b1024"):
            ratio = report["ratios"][key]
            assert ratio["best_torchrl"] in ran and sorted(ratio["each"]) == sorted(ran), ratio
            best = systems[ratio["best_torchrl"]]["results"][key]["sample_items_per_s"]
            assert ratio["sample"] == pytest.approx(systems["reprise"]["results"][key]["sample_items_per_s"] / best)
            assert ratio["goal_met"] == (ratio["sample"] >= report["goal"]["sample_ratio_min"])
        assert "## Against the goal" in r.stdout and "TorchRL's fastest buffer here" in r.stdout
