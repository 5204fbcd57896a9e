"""Soak: the remote service under faults for minutes (issue 18).

    python -m benchmarks.soak --minutes 10      # the full run
    python -m benchmarks.soak --seconds 60      # the CI version (tests/test_soak.py)

``run.py`` drives the processes and faults, ``clients.py`` is every client process,
``faults.py`` the malformed connections and wrong tokens, ``ledger.py`` the exact
accounting of committed items against the checkpoints, ``report.py`` the measurements,
criteria, summary and plot. Results: ``benchmarks/out/soak-<date>-<seconds>s.{json,md,png}``.
"""
