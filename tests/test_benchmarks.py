"""Smoke tests of the benchmarks (benchmarks/README.md): every comparison's ``--quick`` run,
so that benchmark code cannot rot unseen.

Each driver runs as a module from the repository root in a subprocess (as its README
command does), with its outputs in a temporary directory. A driver records a failing
workload in its JSON and goes on (a peer that cannot do something must not lose the other
numbers), so exiting 0 proves little: each test also reads the JSON and requires every
Reprise workload to have its numbers and no error, every present peer to have run without
errors, and every absent peer (no venv here, no torchrl, no CUDA) to be skipped with a
reason printed on stderr. The full-run sizes are checked against the numbers RESULTS.md
was measured with, so a refactor cannot change them unseen, and every module must be
listed in benchmarks/README.md and run without editing ``sys.path``.
"""

from __future__ import annotations

import glob
import importlib.util
import json
import os
import shutil
import subprocess
import sys

import pytest

HAS_TORCH = importlib.util.find_spec("torch") is not None

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIMEOUT_S = 180  # per driver; a quick run takes 10-50 s on 2 busy cores


def run_module(module: str, *args: str, timeout: float = TIMEOUT_S) -> subprocess.CompletedProcess:
    """``python -m module args`` from the repository root; asserts it exits 0."""
    r = subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, capture_output=True,
                       text=True, timeout=timeout)
    assert r.returncode == 0, (f"{module} exited {r.returncode}\n--- stdout\n{r.stdout[-3000:]}"
                               f"\n--- stderr\n{r.stderr[-6000:]}")
    return r


def report_in(out_dir, prefix: str) -> dict:
    paths = glob.glob(os.path.join(str(out_dir), f"{prefix}-*-quick.json"))
    assert len(paths) == 1, f"expected one {prefix} report in {out_dir}, found {paths}"
    with open(paths[0]) as f:
        return json.load(f)


def errors_in(tree, path: str = "") -> list[str]:
    """Every ``error`` recorded anywhere in a JSON tree, with where."""
    found = []
    if isinstance(tree, dict):
        if "error" in tree:
            found.append(f"{path}: {str(tree['error']).splitlines()[0]}")
        for k, v in tree.items():
            found += errors_in(v, f"{path}/{k}")
    elif isinstance(tree, list):
        for i, v in enumerate(tree):
            found += errors_in(v, f"{path}[{i}]")
    return found


def check_systems(report: dict, stderr: str, expected: dict[str, list[str]]) -> None:
    """``expected``: system -> workload keys it must have measured, if it ran. Reprise
    (and the plain socket) must run; a peer runs cleanly or is skipped with a reason
    that was printed."""
    systems = report["systems"]
    for name, keys in expected.items():
        s = systems[name]
        if name in ("reprise", "socket"):
            assert "results" in s, f"{name} did not run: {s}"
        if "results" not in s:
            assert s.get("skipped"), f"{name}: neither results nor a reason: {s}"
            assert f"== {name}: SKIPPED" in stderr, f"{name} skipped without a printed note"
            continue
        results = s["results"]
        assert not errors_in(results), f"{name} recorded errors: {errors_in(results)}"
        for k in keys:
            e = results.get(k)
            assert e is not None, f"{name}: no result for {k} (has {sorted(results)})"
            if "unsupported" in e:  # e.g. Reverb has no batched insert
                continue
            assert "skipped" not in e, f"{name} {k} skipped: {e}"


def rate(e: dict) -> float:
    for unit in ("items", "samples", "rounds"):
        if f"{unit}_per_s" in e:
            return e[f"{unit}_per_s"]
    raise AssertionError(f"no rate in {e}")


# --- the drivers' --quick runs ------------------------------------------------------------------
CORE_KEYS = ([f"{w}[{s}]" for w in ("insert_batched", "insert_step", "sample_uniform")
              for s in ("400B", "4KB", "40KB", "400KB")] + ["prioritized_round"])


def test_core_quick_measures_every_workload(tmp_path):
    r = run_module("benchmarks.core.compare", "--quick", "--out-dir", str(tmp_path))
    report = report_in(tmp_path, "core")
    check_systems(report, r.stderr,
                  {n: CORE_KEYS for n in ("reprise", "cpprb", "torchrl", "reverb")})
    results = report["systems"]["reprise"]["results"]
    assert all(rate(results[k]) > 0 for k in CORE_KEYS)
    for k in CORE_KEYS:  # the table on stdout has a number in Reprise's column
        row = next(line for line in r.stdout.splitlines() if line.startswith(f"| {k} |"))
        assert row.split("|")[3].strip()[0].isdigit(), row


SERVING_KEYS = ([f"writer1[{s},{v}]" for s in ("400B", "400KB") for v in ("step", "batch")]
                + ["mixed[step]", "mixed[batch]", "apex", "apex-paced"])


def test_serving_quick_measures_every_workload(tmp_path):
    r = run_module("benchmarks.serving.compare", "--quick", "--out-dir", str(tmp_path))
    report = report_in(tmp_path, "serving")
    check_systems(report, r.stderr,
                  {n: SERVING_KEYS for n in ("reprise", "cpprb", "reverb", "redis")})
    results = report["systems"]["reprise"]["results"]
    for k in SERVING_KEYS + ["writer1[400B,step-inproc]", "writer1[400KB,step-inproc]"]:
        e = results[k]
        if k.startswith("apex"):
            assert "push" in e and "sample" in e and e["learner_rounds_per_s"] >= 0, e
        else:
            assert e["items_per_s"] >= 0, e
    assert all(results[k]["items_per_s"] > 0 for k in SERVING_KEYS if k.startswith("writer1"))
    assert "## 3. Ape-X" in r.stdout and "| push 200 transitions (11.3 MB), p50 | ms |" in r.stdout


def test_remote_quick_measures_every_point(tmp_path):
    r = run_module("benchmarks.remote.compare", "--quick", "--out-dir", str(tmp_path))
    report = report_in(tmp_path, "remote")
    clients = report["config"]["clients"]
    points = [f"{op}[{s}/{n}c]" for op in ("insert", "sample") for s in ("4KB", "400KB")
              for n in clients]
    check_systems(report, r.stderr, {"socket": [f"socket[{n}c]" for n in clients],
                                     "reprise": points, "reverb": points})
    results = report["systems"]["reprise"]["results"]
    assert all(results[k]["items_per_s"] > 0 for k in points)
    assert all(report["systems"]["socket"]["results"][f"socket[{n}c]"]["gb_per_s"] > 0
               for n in clients)
    assert sum(line.startswith(("| insert ", "| sample ")) for line in r.stdout.splitlines()) \
        == len(points)


def test_checkpoint_quick_saves_loads_and_measures_during_a_save(tmp_path):
    r = run_module("benchmarks.checkpoint.compare", "--quick", "--dir", str(tmp_path / "ckpt"),
                   "--out-dir", str(tmp_path))
    report = report_in(tmp_path, "checkpoint")
    assert not errors_in(report["save_load"]) and not errors_in(report["during"])
    for key, e in report["save_load"].items():
        assert e["save"]["gb_per_s"] > 0 and e["load"]["cold"]["gb_per_s"] > 0, (key, e)
    assert set(report["during"]) == {"full", "headroom"}
    for e in report["during"].values():
        assert not e["errors"], e["errors"]
        assert e["writer_items_per_s_without"] > 0 and e["sampler_items_per_s_without"] > 0, e
    rv = report["reverb"]
    assert "checkpoint_idle" in rv or ("skipped" in rv and "reverb: SKIPPED" in r.stderr), rv
    assert not os.path.exists(tmp_path / "ckpt"), "the checkpoint directory was left behind"
    assert "## 2. Writer and sampler throughput during a save" in r.stdout


def test_gpu_quick_runs_every_section(tmp_path):
    out = tmp_path / "gpu.json"
    r = run_module("benchmarks.gpu.compare", "--quick", "--out", str(out))
    with open(out) as f:
        results = json.load(f)
    sections = ("memcpy", "collect", "latency", "sumtree", "table_prio", "device")
    assert all(s in results for s in sections), sorted(results)
    errors = errors_in(results)
    if "torchrl_import_error" in results:  # TorchRL absent: said so, and nothing else failed
        assert "TorchRL unavailable" in r.stdout
        errors = [e for e in errors if not e.startswith(("/torchrl_import_error:",
                                                          "/header/torchrl:"))]
    assert not errors, errors
    if results["header"]["mode"] == "cpu-emulated":
        assert "no CUDA: --quick runs --device cpu-emulated" in r.stdout
        assert "skipped" in results["memcpy"]
    assert results["collect"]["configs"] and all(
        c["reprise"][f"b{b}"]["sample"]["gbps"] > 0
        for c in results["collect"]["configs"].values() for b in results["collect"]["batches"])
    assert results["sumtree"]["reprise"]["round"]["us_median"] > 0
    resident = results["latency"]["resident"]
    assert resident["static_graph"]["us_median"] > 0 and resident["churn32"]["insert_and_sample"]["us_median"] > 0
    assert resident["transition"]["fused"]["us_median"] > 0 and resident["transition"]["per_field"]["us_median"] > 0
    assert "| workload | reprise | peer (TorchRL) |" in r.stdout


def _private_huge_mount(tmp_path) -> list[str]:
    """The command prefix that runs a command in a private mount namespace with a
    ``huge=within_size`` tmpfs at ``tmp_path/huge`` (its path is the prefix's last
    argument's neighbour); skips where that cannot be done (not root, no unshare)."""
    if os.geteuid() != 0:
        pytest.skip("a private huge-page tmpfs needs root")
    mnt = tmp_path / "huge"
    mnt.mkdir()
    prefix = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
              'mount -t tmpfs -o huge=within_size,size=512m none "$1" && shift && exec "$@"', "sh", str(mnt)]
    probe = subprocess.run([*prefix, "true"], capture_output=True, text=True, timeout=30)
    if probe.returncode != 0:
        pytest.skip(f"cannot mount a private tmpfs here: {probe.stderr.strip()[-200:]}")
    return prefix


def test_huge_pages_quick_compares_small_and_huge_pages(tmp_path):
    _private_huge_mount(tmp_path)  # the script mounts its own; this only checks that it can
    out = tmp_path / "huge-pages.json"
    r = run_module("benchmarks.core.huge_pages", "--quick", "--pairs", "1", "--out", str(out))
    with open(out) as f:
        report = json.load(f)
    assert report["huge_backing"] == "transparent" and set(report["rows"]) == {"400B", "4000B"}
    for row, cell in report["rows"].items():
        assert cell["huge_page_bytes"] > 0, (row, cell)
        for metric in ("fill_gbps", "sample_items_per_s"):
            assert cell[metric]["small"] > 0 and cell[metric]["huge"] > 0 and cell[metric]["ratio_median"] > 0
    assert report["rows"]["400B"]["prioritized_rounds_per_s"]["huge"] > 0
    assert "huge/small" in r.stdout
    assert not [m for m in os.listdir("/tmp") if m.startswith("reprise-huge-")]


def test_gpu_quick_collects_from_a_store_on_huge_pages(tmp_path):
    prefix = _private_huge_mount(tmp_path)
    out = tmp_path / "gpu.json"
    r = subprocess.run([*prefix, sys.executable, "-m", "benchmarks.gpu.compare", "--quick", "--only", "collect",
                        "--no-peers", "--huge-dir", str(tmp_path / "huge"), "--out", str(out)],
                       cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert r.returncode == 0, r.stderr[-3000:]
    with open(out) as f:
        results = json.load(f)
    errors = [e for e in errors_in(results) if not e.startswith("/header/torchrl:")]  # --no-peers
    assert not errors, errors
    assert results["header"]["huge_dir"][1] == "transparent"
    for rk, cell in results["collect"]["configs"].items():
        if cell["row_bytes"] < 4000:
            assert "reprise_huge" not in cell
            continue
        huge = cell["reprise_huge"]
        assert huge["huge_page_bytes_after_fill"] > 0, huge
        assert all(huge[f"b{b}"]["sample"]["gbps"] > 0 for b in results["collect"]["batches"])
    assert "store on 2 MiB pages" in r.stdout


def test_host_draw_quick_measures_both_ways_of_holding_rows(tmp_path):
    out = tmp_path / "host-draw.json"
    r = run_module("benchmarks.gpu.host_draw", "--quick", "--out", str(out))
    with open(out) as f:
        results = json.load(f)
    assert sorted(results["batches"]) == ["1024", "256", "4096"]
    for b in results["batches"].values():
        assert b["epoch"]["us_median"] > 0 and b["references"]["us_median"] > 0 and b["references_over_epoch"] > 0
        if HAS_TORCH:  # the device-resident arm (emulated): one admission, no work per item
            assert b["resident"]["us_median"] > 0 and b["epoch_over_resident"] > 0
    assert "| batch | epoch median (us) |" in r.stdout


def test_cluster_quick_measures_sample_against_bare_collectives(tmp_path):
    pytest.importorskip("torch.distributed")
    from benchmarks.innetwork.netns import can_namespace
    links = can_namespace()[0] and shutil.which("tc") is not None  # also on shaped links (root, tc): ~15 s more
    # ~15 s on 2 idle cores (2 spawned gloo ranks); the timeout leaves room for a busy machine
    r = run_module("benchmarks.cluster.compare", "--quick", "--out-dir", str(tmp_path),
                   *(["--links", "10gbit"] if links else []), timeout=240)
    report = report_in(tmp_path, "cluster")
    assert not errors_in(report["systems"]), errors_in(report["systems"])
    if links:
        linked = report["systems"]["world2@10gbit"]
        # every byte one rank sent the other crossed both ranks' links
        crossing = sum(e["exchange_bytes_per_step"] * e["steps"] / 2 for e in linked["results"]["bandwidth"].values())
        for h, carried in linked["link_bytes"].items():
            assert carried["tx_bytes"] + carried["rx_bytes"] > crossing, (h, carried, crossing)
        assert "| 2, links at 10gbit | iid | 1024 |" in r.stdout and "crosses two shaped links" in r.stdout
    res = report["systems"]["world2"]["results"]
    assert set(res["bandwidth"]) == {"iid/b256", "iid/b1024", "iid/b256/no-crc", "iid/b1024/no-crc",
                                     "iid/b1024/exchange", "local-hosts/b1024", "host-shard/b1024",
                                     "host-shard/b1024/exchange"}
    for key, e in res["bandwidth"].items():
        assert e["sample_gb_per_s"] > 0 and e["bare_gb_per_s_same_payload"] > 0 and e["ratio"] > 0, (key, e)
        # rows read from shared memory (an owner's own; with one shard on the host, all) come as
        # locators: the exchange carries less than the payload, except with every row through it
        full = key.endswith("/exchange")
        assert e["steps"] == 12 and (e["exchange_bytes_per_step"] >= e["payload_bytes_per_step"]) == full, (key, e)
    # one shard on the host: the reader's half of the rows cross as 88-byte locators, not 4 KB rows
    host = res["bandwidth"]["host-shard/b1024"]["exchange_bytes_per_step"]
    assert host < 0.6 * res["bandwidth"]["host-shard/b1024/exchange"]["exchange_bytes_per_step"]
    # iid on one host: about half the rows cross ranks; local with a host per rank: few
    assert 300 < res["bandwidth"]["iid/b1024"]["remote_rows_per_step"]["mean"] < 724
    assert res["bandwidth"]["local-hosts/b1024"]["remote_rows_per_step"]["mean"] < 100
    lat = res["latency"]
    assert lat["sample_us"]["p50"] > 0 and lat["gather64_us"]["p50"] > 0 and lat["ratio_vs_gather64"] > 0
    control = res["control"]
    assert control["constant"] and control["sent_bytes_per_rank"] == 128, control
    assert control["gathered_bytes_per_rank"] == 256 and set(control["batches"]) == {2, 256, 1024}
    assert "## 1. Collected bytes/s" in r.stdout and "| 2 | iid | 1024 |" in r.stdout
    assert "128 B sent and 256 B gathered per rank per call" in r.stdout
    assert "predictions, not measurements" in r.stdout


EXTENSIONS_KEYS = ["insert_batched[400B]", "insert_batched[4KB]", "insert_step[400B]",
                   "sample_uniform[400B]", "prioritized_round", "insert_batched[400B,no-evict]"]


def test_extensions_overhead_quick_measures_every_workload_on_and_off(tmp_path):
    r = run_module("benchmarks.extensions_overhead", "--quick", "--out-dir", str(tmp_path))
    report = report_in(tmp_path, "extensions")
    assert not errors_in(report["core"]), errors_in(report["core"])
    assert list(report["core"]) == EXTENSIONS_KEYS
    for key, e in report["core"].items():
        on, off = e["arms"]["on"], e["arms"]["off"]
        assert len(on["rounds"]) == len(off["rounds"]) == report["config"]["pairs"], key
        assert off[f"{e['unit']}_per_s"] > 0 and on["ratio_paired"] > 0, (key, e)
    apex = report["apex"]
    assert all(len(runs) == 1 and "results" in runs[0] for runs in apex["runs"].values()), apex["runs"]
    assert not errors_in(apex["variants"]), errors_in(apex["variants"])
    assert apex["variants"]["apex"]["push_p50_ms"]["on"] > 0
    assert "| prioritized_round | rounds/s |" in r.stdout and "| apex-paced | sample p50 (ms) |" in r.stdout


def test_dashboard_cost_quick_measures_the_server_with_and_without_clients(tmp_path):
    r = run_module("benchmarks.dashboard_cost", "--quick", "--out-dir", str(tmp_path))
    report = report_in(tmp_path, "dashboard")
    (phases,) = report["rounds"]
    assert sorted(p["phase"] for p in phases) == ["events", "idle", "poll"]
    for p in phases:
        assert p["cpu_pct"] >= 0 and p["seconds"] > 0, p
        if p["phase"] != "idle":  # every client got a snapshot, none failed
            assert p["clients"]["snapshots"] >= report["config"]["clients"], p
            assert p["clients"]["errors"] == 0, p
    assert report["load"]["inserted"] > 0 and report["load"]["sampled"] > 0, report["load"]
    assert "| 10 x /api/snapshot at 1 Hz |" in r.stdout


def test_integrations_quick_measures_every_arm_and_states_the_goals(tmp_path):
    pytest.importorskip("stable_baselines3")
    pytest.importorskip("torchrl")
    # ~35 s on 2 busy cores: 8 short processes, each importing torch
    r = run_module("benchmarks.integrations.compare", "--quick", "--out-dir", str(tmp_path), timeout=150)
    report = report_in(tmp_path, "integrations")
    assert not errors_in(report["systems"]), errors_in(report["systems"])
    replay = report["summary"]["replay"]
    assert set(replay) == {"cartpole", "atari"}
    for kind, arms in replay.items():
        expected = {"sb3", "sb3_opt", "reprise", "reprise_mel"} | ({"reprise_fs"} if kind == "atari" else set())
        assert set(arms) == expected, (kind, sorted(arms))
        for arm, s in arms.items():
            assert s["items_per_s"] > 0 and s["samples_per_s"] > 0 and s["reserved_per_transition"] > 0, (kind, arm)
            assert s["held"] == s["capacity"], (kind, arm, s)
    atari = replay["atari"]  # SB3's default stores each frame stack twice, optimize_memory_usage once
    assert atari["sb3"]["reserved_per_transition"] == pytest.approx(2 * atari["sb3_opt"]["reserved_per_transition"],
                                                                    rel=0.01)
    # frame_stack=4 keeps one 84x84 frame a row: several times less than a stack a row
    assert atari["reprise_fs"]["reserved_per_transition"] < atari["reprise_mel"]["reserved_per_transition"] / 3
    dqn = report["summary"]["dqn"]
    assert dqn["sb3"]["steps_per_s"] > 0 and dqn["reprise"]["steps_per_s"] > 0 and dqn["ratio"] > 0
    assert all(row["ratio"] > 0 for row in report["summary"]["torchrl"].values())
    assert {g["goal"] for g in report["goals"]} == {"never slower", ">= 2x less memory"}
    assert "## Goals (issue 33)" in r.stdout and "| prioritized_round | rounds/s |" in r.stdout


# --- the full runs' sizes --------------------------------------------------------------------
@pytest.fixture
def benchmarks_importable(monkeypatch):
    monkeypatch.syspath_prepend(ROOT)


def test_full_run_sizes_are_the_ones_results_md_was_measured_with(benchmarks_importable):
    from benchmarks.cluster.compare import FULL as cluster
    from benchmarks.core.workloads import make_config as core_config
    from benchmarks.remote.workloads import make_config as remote_config
    from benchmarks.remote.workloads import table_specs
    from benchmarks.serving.workloads import make_config as serving_config

    core = core_config(False, None)
    assert (core.rounds, core.round_seconds, core.warmup_seconds) == (7, 0.4, 0.3)
    assert core.insert_capacity_items == {"400B": 100_000, "4KB": 100_000, "40KB": 13_421,
                                          "400KB": 1_342}
    assert core.sample_table_items_by_size == {"400B": 10_000, "4KB": 10_000, "40KB": 10_000,
                                               "400KB": 2_684}
    assert core.prio_table_items == 1_000_000
    serving = serving_config(False, None)
    assert serving.writer_capacity_items == {"400B": 100_000, "400KB": 1_342}
    assert (serving.mixed_table_items, serving.mixed_warmup_seconds, serving.mixed_seconds) \
        == (100_000, 1.0, 4.0)
    assert (serving.apex_table_items, serving.apex_warmup_seconds, serving.apex_seconds) \
        == (50_000, 3.0, 15.0)
    remote = remote_config(False, None)
    assert (remote.rounds, remote.warmup_seconds, remote.window_seconds) == (3, 0.5, 2.0)
    assert remote.clients == [1, 2, 4, 8]
    assert [(s["name"], s["items"], s["batch"]) for s in table_specs(remote)] == [
        ("insert_4KB", 16_384, 256), ("insert_400KB", 1_024, 16),
        ("sample_4KB", 16_384, 256), ("sample_400KB", 1_024, 16)]
    assert (cluster["worlds"], cluster["items_per_shard"], cluster["batches"], cluster["row_floats"]) \
        == ([1, 2, 4], 4096, [256, 1024], 1024)
    assert (cluster["warmup_steps"], cluster["rounds"], cluster["steps_per_round"],
            cluster["tiny_items"], cluster["tiny_steps_per_round"]) == (20, 5, 40, 1024, 60)
    from benchmarks.dashboard_cost import FULL as dashboard
    from benchmarks.extensions_overhead import FULL as extensions
    assert extensions == dict(pairs=15, round_seconds=0.4, warmup_seconds=0.3, apex_pairs=0)
    assert (dashboard["seconds"], dashboard["rounds"], dashboard["clients"], dashboard["items"]) \
        == (30.0, 3, 10, 100_000)
    from benchmarks.integrations.workloads import FULL as integrations
    assert (integrations["capacity"], integrations["record_steps"], integrations["fill_factor"]) \
        == ({"cartpole": 100_000, "atari": 4_096}, {"cartpole": 20_000, "atari": 6_000}, 2)
    assert (integrations["rounds"], integrations["round_seconds"], integrations["replay_repeats"],
            integrations["dqn_steps"], integrations["dqn_repeats"], integrations["torchrl_passes"]) \
        == (5, 0.3, 3, 20_000, 3, 2)


# --- the package's layout ----------------------------------------------------------------------
def benchmark_modules() -> list[str]:
    """Every module under benchmarks/, as a path relative to it (``core/compare.py``);
    not the peers' venvs (``.venvs/``) or results (``out/``)."""
    out = []
    for folder, dirs, files in os.walk(os.path.join(ROOT, "benchmarks")):
        dirs[:] = [d for d in dirs if not d.startswith((".", "__")) and d != "out"]
        for name in files:
            if name.endswith(".py") and name != "__init__.py":
                out.append(os.path.relpath(os.path.join(folder, name),
                                           os.path.join(ROOT, "benchmarks")))
    return sorted(out)


def test_every_benchmark_module_is_in_the_readme_and_none_edits_sys_path():
    with open(os.path.join(ROOT, "benchmarks", "README.md")) as f:
        readme = f.read()
    modules = benchmark_modules()
    assert len(modules) > 30, modules
    assert [m for m in modules if f"`{m}`" not in readme] == []
    for m in modules:
        with open(os.path.join(ROOT, "benchmarks", m)) as f:
            src = f.read()
        assert "sys.path.insert" not in src and "sys.path.append" not in src, m
