"""`reprise doctor` prints what a bug report needs and changes nothing."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import reprise as rp


def doctor(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "reprise.cli", "doctor", *args], capture_output=True, text=True,
                          timeout=120)


def test_doctor_json_reports_versions_gpu_shared_memory_and_the_runtime_directory():
    store = rp.Store({"x": rp.Field((), "float32")}, capacity=64)
    server = rp.Server([rp.Table("t", store)], name="doctor-test")
    try:
        r = doctor("--json")
        assert r.returncode == 0, r.stderr
        report = json.loads(r.stdout)
    finally:
        server.stop()
        store.close()
    assert report["reprise"] == rp.__version__
    assert report["packages"]["numpy"]
    assert set(report["torch"]) >= {"installed"}
    assert report["shared_memory"]["size_bytes"] == shutil.disk_usage("/dev/shm").total
    kind, page, _ = rp._native.page_backing("/dev/shm")
    assert report["shared_memory"]["pages"]["kind"] == kind in ("small", "transparent", "hugetlbfs")
    assert report["shared_memory"]["pages"]["page_bytes"] == page
    runtime = report["runtime_directory"]
    assert os.path.isdir(runtime["path"]) and "doctor-test" in runtime["servers"]
    stores = report["shared_memory"]["stores"]
    assert stores["files"] >= 1 and stores["sized_bytes"] >= 64 * 4


def test_doctor_counts_what_compressed_store_files_take_against_their_size():
    import numpy as np
    sig = {"x": rp.Field((64, 64), "uint8", compress="zstd")}
    store = rp.Store(sig, capacity=4096, block_steps=64)
    try:
        with store.writer() as w:
            for i in range(4000):
                w.append({"x": np.full((64, 64), i % 7, np.uint8)})
        r = json.loads(doctor("--json").stdout)["shared_memory"]["stores"]
        st = os.stat(store.path)
        # The compressed store's file: 16 MiB sized, a small part of it in memory.
        assert r["sized_bytes"] >= st.st_size and st.st_blocks * 512 < st.st_size / 10
        assert r["allocated_bytes"] < r["sized_bytes"]
        text = doctor().stdout
        assert any(line.startswith("store files ") and "sized" in line and "in memory" in line
                   for line in text.splitlines()), text
    finally:
        store.close()


def test_doctor_text_and_a_bad_flag():
    r = doctor()
    assert r.returncode == 0, r.stderr
    for label in ("reprise ", "python ", "torch ", "/dev/shm ", "/dev/shm page ", "memlock limit ",
                  "runtime dir "):
        assert any(line.startswith(label) for line in r.stdout.splitlines()), (label, r.stdout)
    bad = doctor("--jsn")
    assert bad.returncode == 2 and "unrecognized arguments: --jsn" in bad.stderr
