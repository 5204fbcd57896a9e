"""GPU benchmark: Reprise's GPU path against TorchRL's in one process (``compare.py``;
sections in ``transfers.py`` and ``prioritized.py``, shared parts in ``context.py``, the
table in ``report.py``)."""
