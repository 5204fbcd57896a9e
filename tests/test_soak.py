"""The soak benchmark's 60 s version (issue 18): `reprise serve` on loopback under 8 client
processes, client SIGKILLs, malformed connections, wrong tokens, a stalled reader and one
server SIGKILL + restart from its checkpoint directory (benchmarks/soak/).

Asserted exactly: the ledger (every committed item is in the checkpoints, evicted by the
FIFO rule, or lost with the crash after the last checkpoint; nothing unwritten or corrupt
is ever held), refused tokens, the server's descriptors back to their count before any
client, no call past its timeout and none failing but during the crash, no process left
behind. Asserted loosely (a 60 s run on 2 cores shared with other tests): RSS growth after
warm-up under 25% (the full run's limit is 10%) and the stalled reader keeping others at
50% or more of their throughput (full run: 80%); benchmarks/RESULTS.md has the full runs.
"""

import glob
import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest

import reprise as rp
from benchmarks.soak.clients import PAYLOAD_BYTES, payload_of
from benchmarks.soak.ledger import Ledger, read_checkpoint
from benchmarks.soak.report import thresholds

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SECONDS = 60


def run_soak(out_dir, timeout=300, seconds=SECONDS, extra=()):
    """Runs the soak in a session of its own; on a timeout the whole group is SIGKILLed."""
    proc = subprocess.Popen([sys.executable, "-m", "benchmarks.soak", "--seconds", str(seconds), "--seed", "1",
                             "--out-dir", str(out_dir), *extra], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        raise AssertionError(f"the soak ran past {timeout} s:\n{out[-4000:]}") from None
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return proc.returncode, out


def test_soak_60s_keeps_its_ledger_descriptors_and_timeouts_under_faults(tmp_path):
    code, out = run_soak(tmp_path)
    found = glob.glob(str(tmp_path / "soak-*.json"))
    assert found, f"no report (exit {code}):\n{out[-4000:]}"
    with open(found[0]) as f:
        rep = json.load(f)
    assert glob.glob(str(tmp_path / "soak-*.png")) and glob.glob(str(tmp_path / "soak-*.md"))
    led, fa, crash = rep["ledger"], rep["faults"], rep["crash"]

    # The faults happened: kills landed mid-batch, the server was killed and restored its
    # newest checkpoint, bad connections and tokens were tried.
    assert fa["writer_kills_mid_batch"] >= 1, fa
    assert crash["restored_from"] and crash["restored_from"] == crash["newest_checkpoint"], crash
    assert led["restored"] and led["restored"]["committed_epoch1"] > 0, led["restored"]
    assert sum(m["count"] for m in fa["malformed"].values()) >= 10, fa["malformed"]
    assert fa["tokens"].get("refused", 0) >= 5 and fa["tokens"].get("accepted", 0) == 0, fa["tokens"]
    assert len(led["checkpoints"]) >= 4, led["checkpoints"]

    # Exact criteria.
    assert led["error_count"] == 0, "\n".join(led["errors"][:20])
    assert led["final"]["evicted_by_rule"] > 0   # the FIFO rule was exercised, not avoided
    assert not fa["server_deaths"] and not fa["server_logs_with_panics"], fa
    fds = rep["fds"]
    assert fds["final"] is not None and fds["final"] <= fds["baseline"], fds
    w = rep["waits"]
    assert w["violations"] == 0 and not w["hangs"] and w["failed_away_from_crash"] == 0, w["by_kind"]
    assert not fa["leftovers"] and not fa["stragglers"], fa

    # Loose in CI (see the module doc).
    th = thresholds(SECONDS)
    assert rep["rss"]["growth"] is not None and rep["rss"]["growth"] < th["rss_growth"], rep["rss"]
    for k, v in rep["stall"]["median_ratio"].items():
        assert v is not None and v >= th["stall_ratio"], (k, rep["stall"]["pairs"])
    assert code == 0, out[-4000:]


def test_soak_durable_arm_loses_no_flushed_item_when_the_server_is_killed(tmp_path):
    """The durable arm (issue 36): a durable file store; the store the killed server leaves
    holds every item whose flush returned before the SIGKILL (or evicted by FIFO)."""
    from reprise.file_store import disk_directory
    if disk_directory() is None:
        pytest.skip("the durable arm needs a directory on a disk; /tmp, /var/tmp and . are memory file systems here")
    code, out = run_soak(tmp_path, seconds=45, extra=("--durable",))
    found = glob.glob(str(tmp_path / "soak-*-durable.json"))
    assert found, f"no report (exit {code}):\n{out[-4000:]}"
    with open(found[0]) as f:
        rep = json.load(f)
    led, crash = rep["ledger"], rep["crash"]
    assert rep["plan"]["durable"] and crash["restored_from"] == crash["durable_state"], crash
    r = led["restored"]
    assert r["committed_epoch1"] > 0 and r["in_restored"] > 0, r
    assert r["errors"] == 0 and r["lost_in_crash_allowed"] == 0, r
    assert rep["criteria"]["durable_no_flushed_item_lost"]["pass"], rep["criteria"]
    assert led["error_count"] == 0, "\n".join(led["errors"][:20])
    assert not rep["faults"]["leftovers"] and not rep["faults"]["stragglers"], rep["faults"]


# --- the ledger's checks, on synthetic records (fast) ----------------------------------------------

BATCH = 4


def one_writer(batches=10):
    """Writer slot 0, incarnation 0: batch k begins at t=k and its flush returns at k+0.5."""
    return {"batches": [{"slot": 0, "inc": 0, "seq": k * BATCH, "n": BATCH, "t_begin": float(k),
                         "status": 1, "t_end": k + 0.5} for k in range(batches)]}


def held(items, next_seq=None):
    """A checkpoint holding the writer's items ``items`` (indexes = insertion numbers)."""
    items = np.asarray(items, np.int64)
    return {"name": "ckpt-test", "ids": items.copy(), "seq": items.copy(),
            "next_seq": int(items.max()) + 1 if next_seq is None else next_seq,
            "payload_ok": np.ones(len(items), bool),
            "counters": {"num_deletes": 0, "num_store_evictions": 0}}


def test_ledger_accepts_the_newest_items_and_counts_the_rest_as_evicted():
    ledger = Ledger(one_writer(), BATCH)
    r = ledger.check(held(range(28, 40)), epoch=1, s=10.0, t=10.1)
    assert ledger.errors == []
    assert r["evicted_by_rule"] == 28 and r["committed_present"] == 12 and r["inserted"] == 40


@pytest.mark.parametrize("mutation, message", [
    ("dropped_mid_batch", "miss items before ones they still hold"),
    ("dropped_batch_head", "missing although older items are present"),
    ("phantom", "items no writer began"),
    ("corrupt", "payloads differ"),
    ("hole", "not the newest"),
    ("too_many_inserts", "inserted in epoch 1, outside"),
])
def test_ledger_names_each_kind_of_loss(mutation, message):
    ledger = Ledger(one_writer(), BATCH)
    items = list(range(27, 40))
    ck = None
    if mutation == "dropped_mid_batch":      # item 35 never inserted: the server renumbered the rest
        items.remove(35)
        ck = held(items)
        ck["seq"] = np.arange(40 - len(items) - 1, 39)
        ck["next_seq"] = 39
    elif mutation == "dropped_batch_head":   # item 36 (first of the last batch) never inserted
        items.remove(36)
        ck = held(items)
        ck["seq"] = np.arange(39 - len(items), 39)
        ck["next_seq"] = 39
    elif mutation == "phantom":
        ck = held(items[1:])
        ck["ids"][0] = 1 << 50
    elif mutation == "corrupt":
        ck = held(items[1:])
        ck["payload_ok"][3] = False
    elif mutation == "hole":                 # evicted out of FIFO order
        ck = held([i for i in items if i != 30])
    elif mutation == "too_many_inserts":
        ck = held(items[1:], next_seq=400)
        ck["seq"] = np.arange(400 - len(ck["ids"]), 400)
    ledger.check(ck, epoch=1, s=10.0, t=10.1)
    assert any(message in e for e in ledger.errors), ledger.errors


def test_read_checkpoint_finds_every_item_id_and_payload(make_store, tmp_path):
    store = make_store({"id": rp.Field((), "int64"), "payload": rp.Field((PAYLOAD_BYTES,), "uint8")},
                       capacity=256, block_steps=16)
    table = rp.Table("replay", store, remover=rp.selectors.Fifo(), max_size=40)
    ids = (7 << 48) + np.arange(100, dtype=np.int64)
    for a in range(0, 100, 25):   # several inserts: the saved rows span several blocks
        table.insert({"id": ids[a:a + 25, None], "payload": payload_of(ids[a:a + 25])[:, None]}, priorities=1.0)
    ck = read_checkpoint(rp, rp.checkpoint.save(str(tmp_path), [table]), "replay")
    order = np.argsort(ck["seq"])
    np.testing.assert_array_equal(ck["ids"][order], ids[60:])
    np.testing.assert_array_equal(ck["seq"][order], np.arange(60, 100))
    assert ck["next_seq"] == 100 and ck["payload_ok"].all() and ck["max_size"] == 40

