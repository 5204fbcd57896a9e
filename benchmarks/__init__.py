"""Reprise's benchmarks against its peers, one suite folder per area.

Run every script as a module from the repository root (the peers' venvs too), e.g.
``python -m benchmarks.core.compare --quick``; nothing here edits ``sys.path``.

- ``common/``: what every suite shares: configuration, payloads, timing, processes,
  the per-system harness (``Bench``) and the drivers' helpers. numpy and the standard
  library only, so every peer's venv can import it.
- ``core/``, ``serving/``, ``remote/``, ``checkpoint/``, ``gpu/``: one suite each, with
  its driver ``compare.py`` and Reprise's side of it.
- ``peers/``: the other systems' sides, run from their own venvs (``setup_peers.sh``).

See README.md for every script and its command, RESULTS.md for the numbers.
"""
