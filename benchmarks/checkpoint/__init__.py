"""Checkpoint benchmark: Reprise's save and load, throughput during a save, and Reverb's
checkpoint (``compare.py``; measurements in ``measure.py``, tables in ``report.py``)."""
