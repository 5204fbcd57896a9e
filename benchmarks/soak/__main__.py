"""``python -m benchmarks.soak [--minutes M | --seconds S] [--seed N] [--durable] [--out-dir DIR] [--keep]``.

Runs the soak (``run.Soak``), checks it (``report.analyze``), writes
``<out-dir>/soak-<date>-<S>s.json``, ``.md`` and ``.png``, prints the summary, and exits 0
when every criterion passed, 1 when one failed (2: the run itself broke)."""

from __future__ import annotations

import argparse
import datetime as dt
import os
import shutil
import signal
import sys
import tempfile
import time

from benchmarks.common.driver import OUT, host_info, write_outputs
from benchmarks.soak import report
from benchmarks.soak.run import Plan, Soak


def log(msg: str) -> None:
    print(f"[soak {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.soak", description=__doc__.split("\n\n")[1])
    d = ap.add_mutually_exclusive_group()
    d.add_argument("--minutes", type=float, help="length of the run (the issue's full soak: 10)")
    d.add_argument("--seconds", type=float, help="length of the run in seconds (CI: 60)")
    ap.add_argument("--seed", type=int, default=1, help="seeds every fault schedule and client")
    ap.add_argument("--out-dir", default=OUT, help="where the .json, .md and .png go (default benchmarks/out)")
    ap.add_argument("--checkpoint-every", type=float, help="seconds between checkpoints (default: 30, or the "
                    "run's length / 8 under 3 minutes)")
    ap.add_argument("--server-env", action="append", default=[], metavar="NAME=VALUE",
                    help="an environment variable for the server process (diagnosis, e.g. MALLOC_ARENA_MAX=2)")
    ap.add_argument("--durable", action="store_true", help="the durable arm: the store is a durable file store, and "
                    "every item whose flush returned before the server SIGKILL must be in the store it reopens")
    ap.add_argument("--keep", action="store_true", help="keep the work directory (records, checkpoints, logs)")
    a = ap.parse_args(argv)
    seconds = a.seconds if a.seconds is not None else 60.0 * (a.minutes if a.minutes is not None else 10.0)
    plan = Plan.for_seconds(seconds, a.seed)
    if a.checkpoint_every is not None:
        plan.checkpoint_every = a.checkpoint_every
    plan.durable = a.durable
    os.makedirs(a.out_dir, exist_ok=True)
    now = dt.datetime.now()
    stem = f"soak-{now:%Y%m%d-%H%M%S}-{seconds:.0f}s" + ("-durable" if a.durable else "")
    base = None
    if a.durable:
        # The durable arm's file store needs a disk (a file store refuses a tmpfs).
        from reprise.file_store import disk_directory
        base = disk_directory()
        if base is None:
            raise SystemExit("the durable arm needs a writable directory on a disk; /tmp, /var/tmp and . are not")
    work = tempfile.mkdtemp(prefix="reprise-soak-", dir=base)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(2))   # run the finally below
    soak = Soak(plan, work, log=log, server_env=dict(kv.split("=", 1) for kv in a.server_env))
    import reprise as rp
    try:
        result = soak.run()
        log("checking the ledger")
        rep = report.analyze(rp, soak, result)
    except BaseException:
        log(f"the run broke; its files are in {work}")
        a.keep = True
        raise
    finally:
        soak.kill_everything()
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)
    rep.update(date=now.isoformat(timespec="seconds"), host=host_info(), work_dir=work if a.keep else None)
    write_outputs(a.out_dir, stem, rep, report.markdown(rep, stem), json_default=float)
    report.plot(rep, os.path.join(a.out_dir, stem + ".png"))
    log(f"wrote {os.path.join(a.out_dir, stem)}.png")
    return 0 if rep["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
