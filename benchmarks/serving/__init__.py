"""Serving comparison: Reprise's same-host server against cpprb's multi-process buffers,
Reverb and a Redis baseline (``compare.py``; workloads in ``workloads.py``, Reprise's
side in ``reprise_serving.py``)."""
