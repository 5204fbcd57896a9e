"""Stores on huge pages: which directories give them, what `huge_pages=True` refuses,
and (in a private mount namespace, as root) stores that really get them."""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import reprise as rp
from reprise import _native

SIG = {"x": rp.Field((100,), "float32")}
MIB = 1 << 20


def test_huge_pages_on_a_directory_without_them_is_refused_naming_it_and_leaves_nothing(tmp_path):
    kind, _, why = _native.page_backing(str(tmp_path))
    if kind != "small":
        pytest.skip(f"{tmp_path} hands out huge pages ({kind})")
    with pytest.raises(rp.errors.InvalidArgument) as e:
        rp.Store(SIG, capacity=1024, directory=tmp_path, huge_pages=True)
    msg = str(e.value)
    assert "huge_pages=True needs a directory that hands out huge pages" in msg, msg
    assert why in msg and str(tmp_path) in msg, msg
    assert "hugetlbfs" in msg and "huge=within_size" in msg, msg
    assert os.listdir(tmp_path) == []


def test_dev_shm_says_why_it_gives_no_huge_pages():
    kind, page, why = _native.page_backing("/dev/shm")
    if kind != "small":
        pytest.skip(f"/dev/shm hands out huge pages here ({kind})")
    assert page == 4096 and "/dev/shm is on a tmpfs" in why
    before = set(os.listdir("/dev/shm"))
    with pytest.raises(rp.errors.InvalidArgument, match="but /dev/shm is on a tmpfs"):
        rp.Store(SIG, capacity=1024, huge_pages=True)
    assert set(os.listdir("/dev/shm")) <= before


def test_a_store_without_huge_pages_reports_none_and_bad_values_are_refused(tmp_path):
    with rp.Store(SIG, capacity=1024) as store:
        t = rp.Table("t", store)
        t.insert({"x": np.ones((8, 1, 100), np.float32)}, priorities=np.ones(8))
        if _native.page_backing("/dev/shm")[0] == "small":
            assert store.huge_page_bytes == 0
        del t
    with pytest.raises(rp.errors.InvalidArgument, match="huge_pages must be True or False, got 'yes'"):
        rp.Store(SIG, capacity=64, huge_pages="yes")
    with pytest.raises(rp.errors.InvalidArgument, match="huge_pages=True is for host stores; a store on cuda"):
        rp.Store(SIG, capacity=64, huge_pages=True, device="cuda")
    with pytest.raises(rp.errors.RepriseError, match="cannot use /nonexistent-reprise-dir for shared memory"):
        rp.Store(SIG, capacity=64, directory="/nonexistent-reprise-dir", huge_pages=True)


def test_a_server_config_passes_huge_pages_on(tmp_path):
    from reprise.server_config import build
    config = {"stores": [{"name": "s", "capacity": 64, "directory": str(tmp_path), "huge_pages": True,
                          "fields": {"x": {"dtype": "float32"}}}],
              "tables": [{"name": "t", "store": "s"}]}
    if _native.page_backing(str(tmp_path))[0] == "small":
        with pytest.raises(rp.errors.InvalidArgument, match="huge_pages=True needs"):
            build(config)
    config["stores"][0]["huge_pages"] = "yes"
    with pytest.raises(rp.errors.InvalidArgument, match="huge_pages"):
        build(config)


# --- Real huge pages: a private mount namespace --------------------------------------------

# Run as root inside `unshare --mount`: the mounts vanish with the process.
_CHILD = textwrap.dedent("""
    import json, os, sys
    import numpy as np
    import reprise as rp
    from reprise import _native

    directory, huge_pages = sys.argv[1], sys.argv[2] == "1"
    out = {"backing": list(_native.page_backing(directory))}
    sig = {"x": rp.Field((1000,), "float32")}
    try:
        store = rp.Store(sig, capacity=4096, block_steps=64, directory=directory, huge_pages=huge_pages)
    except rp.errors.RepriseError as e:
        out["error"] = [type(e).__name__, str(e)]
        out["left"] = os.listdir(directory)
        print(json.dumps(out)); sys.exit(0)
    out["file_bytes"] = os.stat(store.path).st_size
    table = rp.Table("t", store, max_size=4096)
    rows = np.arange(4096 * 1000, dtype=np.float32).reshape(4096, 1, 1000)
    for i in range(0, 4096, 512):
        table.insert({"x": rows[i:i + 512]}, priorities=np.ones(512))
    out["huge_page_bytes"] = store.huge_page_bytes
    s = table.sample(256)
    x = np.asarray(s.data["x"]).reshape(256, 1000)
    out["rows_intact"] = bool(np.all(x[:, 0] % 1000 == 0) and np.all(x - x[:, :1] == np.arange(1000)))
    out["sampled"] = len(x)
    del table, s
    store.close()
    out["left"] = os.listdir(directory)
    print(json.dumps(out))
""")


def _in_private_mount(tmp_path, fstype: str, options: str, huge_pages: bool) -> dict:
    if os.geteuid() != 0:
        pytest.skip("mounting a private tmpfs/hugetlbfs needs root")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    script = tmp_path / "child.py"
    script.write_text(_CHILD)
    cmd = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
           f'mount -t {fstype} -o {options} none "$1" && exec "$2" "$3" "$1" "$4"', "sh",
           str(mnt), sys.executable, str(script), "1" if huge_pages else "0"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if r.returncode != 0 and ("mount" in r.stderr or "unshare" in r.stderr) and not r.stdout:
        pytest.skip(f"cannot mount a private {fstype} here: {r.stderr.strip()[-300:]}")
    assert r.returncode == 0, r.stderr
    import json
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("mode", ["within_size", "advise"])
def test_a_store_on_a_huge_tmpfs_gets_huge_pages_and_keeps_its_rows(tmp_path, mode):
    out = _in_private_mount(tmp_path, "tmpfs", f"huge={mode},size=64m", huge_pages=True)
    assert out["backing"] == ["transparent", 2 * MIB, mode], out
    assert "error" not in out, out
    assert out["file_bytes"] % (2 * MIB) == 0 and out["file_bytes"] >= 4096 * 4000, out
    # 16 MB of rows written: on huge=advise only the store's own madvise makes them huge.
    assert out["huge_page_bytes"] >= 4 * MIB, out
    assert out["rows_intact"] and out["sampled"] == 256, out
    assert out["left"] == [], out


def test_a_store_on_a_huge_tmpfs_without_asking_gets_them_too(tmp_path):
    out = _in_private_mount(tmp_path, "tmpfs", "huge=advise,size=64m", huge_pages=False)
    assert "error" not in out and out["huge_page_bytes"] >= 4 * MIB and out["rows_intact"], out


def _free_huge_pages() -> int:
    with open("/proc/meminfo") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("HugePages_Free:"))


def test_a_store_on_hugetlbfs_uses_the_pool_or_says_it_is_empty(tmp_path):
    free = _free_huge_pages()
    out = _in_private_mount(tmp_path, "hugetlbfs", "pagesize=2M", huge_pages=True)
    assert out["backing"] == ["hugetlbfs", 2 * MIB, ""], out
    needed = -(-4096 * 4000 // (2 * MIB))
    if free >= needed + 1:
        assert "error" not in out, out
        assert out["file_bytes"] == needed * 2 * MIB, out
        assert out["huge_page_bytes"] == needed * 2 * MIB and out["rows_intact"], out
    else:
        kind, msg = out["error"]
        assert kind == "ResourceExhausted", out
        assert f"needs {needed} huge pages of 2 MiB" in msg and "raise vm.nr_hugepages" in msg, msg
    assert out["left"] == [], out


# --- Where restored stores go -----------------------------------------------------------

def test_a_checkpoint_loads_into_the_directory_asked_for_and_refuses_huge_pages_there(tmp_path):
    where = tmp_path / "stores"
    where.mkdir()
    rows = np.arange(32 * 100, dtype=np.float32).reshape(32, 1, 100)
    with rp.Store(SIG, capacity=256, block_steps=16) as store:
        t = rp.Table("t", store, sampler=rp.selectors.Fifo())
        t.insert({"x": rows}, priorities=np.ones(32))
        saved = rp.checkpoint.save(tmp_path / "ck", [t])
        items = t.items()
        del t
    loaded = rp.checkpoint.load(saved, directory=where)
    got = loaded["t"]
    assert os.path.dirname(got.store.path) == str(where) and not got.store.huge_pages
    assert got.items() == items
    x = np.asarray(got.sample(64).data["x"])  # Fifo draws the oldest item each time
    np.testing.assert_array_equal(x, np.repeat(rows[:1], 64, axis=0))
    got.store.close()
    del got, loaded
    assert os.listdir(where) == []
    if _native.page_backing(str(where))[0] == "small":
        with pytest.raises(rp.errors.InvalidArgument, match="huge_pages=True needs"):
            rp.checkpoint.load(saved, directory=where, huge_pages=True)
        assert os.listdir(where) == []


def test_a_server_restores_into_the_directory_of_the_stores_it_was_given(tmp_path):
    where = tmp_path / "stores"
    where.mkdir()
    with rp.Store(SIG, capacity=256, block_steps=16) as store:
        t = rp.Table("t", store)
        t.insert({"x": np.ones((4, 1, 100), np.float32)}, priorities=np.ones(4))
        rp.checkpoint.save(tmp_path / "ck", [t])
        del t
    fresh_store = rp.Store(SIG, capacity=256, block_steps=16, directory=where)
    server = rp.Server([rp.Table("t", fresh_store)], checkpoint_dir=tmp_path / "ck")
    try:
        served = server.tables[0]
        assert server.restored_from is not None and len(served) == 4
        assert os.path.dirname(served.store.path) == str(where)
        assert served.store.huge_pages == fresh_store.huge_pages is False
    finally:
        server.stop()
        served.store.close()
        fresh_store.close()
