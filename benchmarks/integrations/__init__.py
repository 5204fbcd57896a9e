"""Integrations comparison (issue 33): Reprise inside Stable-Baselines3 and TorchRL against
the buffers it replaces (``compare.py``; recorded transitions, arms and sizes in
``workloads.py``)."""
