"""What every benchmark suite shares (numpy and the standard library only):

- ``config``: one ``Config`` type: a suite's full-run numbers, or its ``--quick`` ones.
- ``payload``: random payloads, priorities, fill helpers, the sanity check of a batch.
- ``timing``: one clock, timed rounds, windows, per-call times, percentiles.
- ``processes``: spawned process groups and pools, a server child process, running a
  benchmark module in another interpreter.
- ``bench``: ``Bench``, one system's run of one suite (arguments, budget, log, JSON).
- ``driver``: what the ``compare.py`` drivers share (machine, memcpy, running each
  system, output files).
- ``page_cache``: dropping files from the page cache and checking what is resident.

This package imports none of its modules, so any venv can run one of them alone
(``python -m benchmarks.common.driver --memcpy-only NBYTES ROUNDS``).
"""
