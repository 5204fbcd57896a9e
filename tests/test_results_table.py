"""The "Today's figures" table of benchmarks/RESULTS.md is generated from
benchmarks/current.json by ``python -m benchmarks.current``: the table in the file must be
exactly what the script renders (so a hand edit fails here), every row's history link must
name a heading of RESULTS.md, and ``--from`` must merge a driver's JSON into the records."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from benchmarks import current

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def copies(tmp_path):
    """current.json and RESULTS.md copied aside, so a merge changes nothing in the tree."""
    records, results = tmp_path / "current.json", tmp_path / "RESULTS.md"
    shutil.copy(current.RECORDS, records)
    shutil.copy(current.RESULTS, results)
    return str(records), str(results)


def run(copies, *args: str) -> int:
    records, results = copies
    return current.main([*args, "--records", records, "--results", results])


def record(records_path: str, suite: str, workload: str) -> dict:
    return next(r for r in current.load(records_path)["records"]
                if (r["suite"], r["workload"]) == (suite, workload))


def write_report(tmp_path, name: str, report: dict) -> str:
    path = tmp_path / name
    path.write_text(json.dumps(report))
    return str(path)


HOST = {"cpus": 8, "cpu_model": "Test CPU", "mem_gib": 31.0, "gpu": None, "platform": "Linux"}


def test_results_md_holds_exactly_the_rendered_table():
    with open(current.RESULTS) as f:
        assert current.problems(current.load(), f.read()) == []


def test_the_check_command_passes_on_the_tree():
    r = subprocess.run([sys.executable, "-m", "benchmarks.current", "--check"], cwd=ROOT,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr


def test_a_hand_edit_of_the_table_is_caught(copies):
    records, results = copies
    with open(results) as f:
        text = f.read()
    begin, end = text.index(current.BEGIN), text.index(current.END)
    row = next(line for line in text[begin:end].splitlines() if line.startswith("| core |"))
    figure = row.split(" | ")[2]  # the row's Reprise figure, whatever today's value is
    edited = text[:begin] + text[begin:end].replace(row, row.replace(f" | {figure} | ", " | 9.99 zz/s | ", 1), 1) \
        + text[end:]
    assert edited != text
    problems = current.problems(current.load(records), edited)
    assert problems and "differs" in problems[0]


def test_every_record_is_complete_and_links_to_a_heading():
    doc = current.load()
    with open(current.RESULTS) as f:
        heads = set(current.headings(f.read()))
    seen = set()
    for r in doc["records"]:
        where = f"{r['suite']}/{r['workload']}"
        assert r["suite"] in current.SUITES, where
        assert (r["suite"], r["workload"]) not in seen, f"{where} twice"
        seen.add((r["suite"], r["workload"]))
        assert r["label"] and r["unit"], where
        if r.get("goal"):
            assert r["goal"]["op"] in (">=", "<=") and isinstance(r["goal"]["value"], (int, float)), where
        if r.get("reprise") is not None or r.get("ratio") is not None:  # measured: say when, where, how
            assert r["date"] and r["machine"] and r["command"] and r["history"] in heads, where


def test_goals_are_judged_on_the_ratio_or_on_the_figure():
    rec = {"reprise": 2.0, "peer_value": 4.0, "goal": {"op": ">=", "value": 0.5}}
    assert current.ratio_of(rec) == 0.5 and current.met(rec) is True
    assert current.met({**rec, "ratio_is": "peer/reprise"}) is True          # 2.0 >= 0.5
    assert current.met({**rec, "goal": {"op": "<=", "value": 0.4}}) is False
    assert current.met({**rec, "goal": {"on": "reprise", "op": "<=", "value": 1.0}}) is False
    assert current.met({"reprise": None, "goal": {"op": ">=", "value": 1}}) is None
    assert current.met({**rec, "goal": None}) is None


def test_merging_a_core_run_updates_its_records_and_the_table(tmp_path, copies):
    records, results = copies
    report = {"date": "2027-01-02T03:04:05", "quick": False, "host": HOST, "systems": {
        "reprise": {"results": {"insert_batched[400B]": {"items_per_s": 12e6, "gb_per_s": 4.8},
                                "insert_step[400B]": {"items_per_s": 1e6}}},
        "cpprb": {"results": {"insert_batched[400B]": {"items_per_s": 8e6}}},
        "torchrl": {"results": {"insert_batched[400B]": {"items_per_s": 10e6}}},
        "reverb": {"skipped": "venv missing"}}}
    path = write_report(tmp_path, "core-20270102-030405.json", report)
    untouched = record(records, "core", "insert_batched[4KB]")
    assert run(copies, "--from", path) == 0

    rec = record(records, "core", "insert_batched[400B]")
    assert (rec["reprise"], rec["peer"], rec["peer_value"]) == (12e6, "TorchRL", 10e6)
    assert rec["ratio"] == pytest.approx(1.2)
    assert current.met(rec) is True
    assert (rec["date"], rec["run"], rec["history"]) == ("2027-01-02", "core-20270102-030405", None)
    assert rec["machine"] == "8-core Test CPU, 31.0 GiB, no GPU"
    assert rec["command"] == "python -m benchmarks.core.compare"
    assert record(records, "core", "insert_batched[4KB]") == untouched  # not in the run
    with open(results) as f:
        text = f.read()
    assert current.problems(current.load(records), text) == []
    assert "| 12.0M items/s | TorchRL | 10.0M items/s | 1.20x | >= 1.2x | met | 2027-01-02 |" in text


def test_merging_cluster_and_remote_runs(tmp_path, copies):
    records, _ = copies
    cluster = {"date": "2027-01-02T00:00:00", "quick": False, "host": HOST, "command": "python -m benchmarks.cluster.compare",
               "systems": {"world2": {"results": {
                   "bandwidth": {"iid/b1024": {"sample_gb_per_s": 3.0, "bare_gb_per_s_same_payload": 4.0}},
                   "latency": {"sample_us": {"p50": 600.0}, "gather64_us": {"p50": 250.0}}}}}}
    run(copies, "--from", write_report(tmp_path, "cluster-20270102-000000.json", cluster),
        "--history", "Cluster mode (issue 13)")
    bw = record(records, "cluster", "world2/iid/b1024")
    assert bw["ratio"] == pytest.approx(0.75) and current.met(bw) is True
    assert bw["peer"] == "bare all_to_all_single, same bytes" and bw["history"] == "Cluster mode (issue 13)"
    lat = record(records, "cluster", "world2/latency")
    assert lat["ratio"] == pytest.approx(2.4) and current.met(lat) is True

    sock = {f"socket[{n}c]": {"gb_per_s": g} for n, g in ((1, 4.0), (8, 2.0))}
    remote = {"date": "2027-01-03T00:00:00", "quick": False, "host": HOST, "systems": {
        "socket": {"results": sock},
        "reprise": {"results": {"sample[400KB/1c]": {"items_per_s": 8e3, "gb_per_s": 3.2},
                                "sample[400KB/8c]": {"items_per_s": 3e3, "gb_per_s": 1.2}}}}}
    run(copies, "--from", write_report(tmp_path, "remote-20270103-000000.json", remote))
    rec = record(records, "remote", "sample[400KB]")
    assert (rec["reprise"], rec["peer_value"]) == (1.2, 2.0)   # 8 clients: 60%, the lower share
    assert rec["ratio"] == pytest.approx(0.6) and "8 client" in rec["note"]


def test_quick_runs_and_unknown_files_are_refused(tmp_path, copies):
    records, _ = copies
    before = current.load(records)
    quick = write_report(tmp_path, "core-20270102-030405-quick.json",
                         {"date": "2027-01-02T00:00:00", "quick": True, "host": HOST, "systems": {}})
    with pytest.raises(SystemExit, match="--quick"):
        run(copies, "--from", quick)
    other = write_report(tmp_path, "gpu.json", {"date": "2027-01-02T00:00:00", "quick": False})
    with pytest.raises(SystemExit, match="cannot tell which suite"):
        run(copies, "--from", other)
    assert current.load(records) == before
