"""Runnable programs that use Reprise for its real job.

- ``reprise.examples.apex``: distributed Ape-X DQN (actor processes, a learner, prioritized
  replay and a parameter table served by ``rp.Server``). ``reprise demo apex``.
- ``reprise.examples.offline``: a Decision-Transformer-style model trained on ``[B, T]``
  windows of an imported dataset. ``reprise demo offline``.
"""
