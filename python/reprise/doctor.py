"""``reprise doctor``: what this machine gives Reprise, for a bug report or a first check.

Prints Reprise's and Python's versions, the optional packages (torch and CUDA, triton,
gymnasium, ...), the shared-memory filesystem stores live in (/dev/shm: size and free
space), the locked-memory limit the GPU path needs to page-lock a store, and the runtime
directory where local servers keep their sockets (with the servers found there).
``--json`` prints the same as one JSON object. Nothing is changed."""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import json
import os
import platform
import resource
import shutil
import sys

OPTIONAL = ["numpy", "torch", "triton", "gymnasium", "ale_py", "matplotlib", "h5py", "minari", "cupy", "jax"]


def _version(module: str) -> str | None:
    try:
        return importlib.metadata.version({"ale_py": "ale-py", "cupy": "cupy"}.get(module, module))
    except importlib.metadata.PackageNotFoundError:
        return None


def _torch() -> dict:
    if _version("torch") is None:
        return {"installed": False}
    try:
        import torch
    except Exception as e:  # a broken install is worth reporting, not a crash
        return {"installed": True, "error": f"{type(e).__name__}: {e}"}
    info = {"installed": True, "version": torch.__version__, "cuda_build": torch.version.cuda,
            "cuda_available": torch.cuda.is_available(), "devices": []}
    if info["cuda_available"]:
        info["devices"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return info


def _disk(path: str) -> dict:
    from . import _native
    try:
        usage = shutil.disk_usage(path)
        kind, page, detail = _native.page_backing(path)
    except OSError as e:
        return {"path": path, "error": e.strerror}
    except Exception as e:
        return {"path": path, "error": str(e)}
    stale = [{"path": os.fspath(p), "bytes": n} for p, n in _native.stale_stores(path)]
    return {"path": path, "size_bytes": usage.total, "free_bytes": usage.free,
            "pages": {"kind": kind, "page_bytes": page, "detail": detail}, "stale_stores": stale,
            "stores": _stores_in(path)}


def _stores_in(path: str) -> dict:
    """This user's store files in ``path``: how many, their sizes and what they take
    (a file's allocated blocks: less than its size while rows are unwritten, or where
    compressed fields gave their raw pages back)."""
    files, sized, allocated = 0, 0, 0
    try:
        entries = list(os.scandir(path))
    except OSError:
        entries = []
    for e in entries:
        if not e.name.startswith("reprise-"):
            continue
        try:
            st = e.stat(follow_symlinks=False)
        except OSError:
            continue
        if st.st_uid == os.getuid() and e.is_file(follow_symlinks=False):
            files, sized, allocated = files + 1, sized + st.st_size, allocated + st.st_blocks * 512
    return {"files": files, "sized_bytes": sized, "allocated_bytes": allocated}


def _pages_text(shm: dict) -> str:
    p = shm["pages"]
    if p["kind"] == "small":
        return "4 KiB (huge pages need another directory: docs/sharp-edges.md)"
    if p["kind"] == "hugetlbfs":
        return f"hugetlbfs, {_bytes(p['page_bytes'])} pages"
    return f"huge pages (tmpfs huge={p['detail']})"


def _runtime() -> dict:
    from . import _native
    try:
        directory = _native.socket_dir()
    except Exception as e:
        return {"error": str(e)}
    names = sorted(os.listdir(directory))
    return {"path": directory, "servers": sorted(n[:-5] for n in names if n.endswith(".sock")),
            "files": len(names)}


def report() -> dict:
    """Everything ``reprise doctor`` prints, as a dict."""
    from . import __version__
    memlock = resource.getrlimit(resource.RLIMIT_MEMLOCK)[0]
    return {
        "reprise": __version__,
        "python": f"{platform.python_version()} ({sys.executable})",
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "memory_bytes": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"),
        "packages": {m: _version(m) for m in OPTIONAL},
        "torch": _torch(),
        "shared_memory": _disk("/dev/shm"),
        "memlock_limit_bytes": None if memlock == resource.RLIM_INFINITY else memlock,
        "runtime_directory": _runtime(),
    }


def _bytes(n: int | None) -> str:
    if n is None:
        return "unlimited"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{n} B"
        n /= 1024
    return f"{n} B"


def _stale_text(stale: list) -> str:
    total = sum(f["bytes"] for f in stale)
    names = ", ".join(os.path.basename(f["path"]) for f in stale[:5]) + (", ..." if len(stale) > 5 else "")
    return (f"stale stores  {len(stale)} file(s), {_bytes(total)}, of processes that are gone ({names}): "
            "the next store created there removes them")


def _text(r: dict) -> str:
    t = r["torch"]
    if not t["installed"]:
        torch_line = "not installed (pip install 'reprise[demo]' or 'reprise[gpu]')"
    elif "error" in t:
        torch_line = f"cannot be imported: {t['error']}"
    else:
        cuda = (f"CUDA {t['cuda_build']}, {len(t['devices'])} GPU(s): {', '.join(t['devices'])}"
                if t["cuda_available"] else
                f"no usable GPU ({'CPU-only build' if t['cuda_build'] is None else 'CUDA ' + t['cuda_build'] + ' build'})")
        torch_line = f"{t['version']}, {cuda}"
    shm = r["shared_memory"]
    shm_line = shm.get("error") or f"{_bytes(shm['size_bytes'])}, {_bytes(shm['free_bytes'])} free"
    run = r["runtime_directory"]
    run_line = run.get("error") or (f"{run['path']} ({len(run['servers'])} server socket(s)"
                                    + (f": {', '.join(run['servers'])}" if run["servers"] else "") + ")")
    packages = ", ".join(f"{k} {v}" for k, v in r["packages"].items() if v) or "none"
    missing = ", ".join(k for k, v in r["packages"].items() if not v) or "none"
    lines = [
        f"reprise       {r['reprise']}",
        f"python        {r['python']}",
        f"platform      {r['platform']}, {r['cpus']} CPUs, {_bytes(r['memory_bytes'])} memory",
        f"torch         {torch_line}",
        f"packages      {packages}",
        f"not installed {missing}",
        f"/dev/shm      {shm_line} (stores live here; a store larger than the free space fails)",
        *([f"/dev/shm page {_pages_text(shm)}"] if "pages" in shm else []),
        *([f"store files   {shm['stores']['files']}: {_bytes(shm['stores']['sized_bytes'])} sized, "
           f"{_bytes(shm['stores']['allocated_bytes'])} in memory"] if shm.get("stores", {}).get("files") else []),
        *([_stale_text(shm["stale_stores"])] if shm.get("stale_stores") else []),
        f"memlock limit {_bytes(r['memlock_limit_bytes'])} (GPU samples page-lock the store: see docs/gpu.md)",
        f"runtime dir   {run_line}",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="reprise doctor", description=__doc__.split("\n\n")[0])
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    a = p.parse_args(argv)
    r = report()
    print(json.dumps(r, indent=2) if a.json else _text(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
