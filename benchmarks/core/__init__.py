"""Core comparison: Reprise in process against cpprb, TorchRL and Reverb (``compare.py``;
workloads and their timing in ``workloads.py``, Reprise's side in ``reprise_core.py``)."""
