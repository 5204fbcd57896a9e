"""Async LLM post-training data (issue 34): variable-length token sequences with per-item
version, reward and group, inserted in GRPO groups, drawn by a token budget and packed into
the varlen layout; Reprise against TorchRL's LLM replay composition (``compare.py``; sizes,
sequences and timing in ``workloads.py``, the two sides in ``reprise_async.py`` and
``torchrl_async.py``)."""
