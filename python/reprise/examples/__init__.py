"""Runnable programs that use Reprise for its real job.

- ``reprise.examples.apex``: distributed Ape-X DQN (actor processes, a learner, prioritized
  replay and a parameter table served by ``rp.Server``). ``reprise demo apex``.
- ``reprise.examples.offline``: a Decision-Transformer-style model trained on ``[B, T]``
  windows of an imported dataset. ``reprise demo offline``.

What both demos share, each module one concept: ``stopping`` (SIGINT and SIGTERM at any
moment: children stopped quietly, a summary written, exit 130 or 143), ``rundirs`` (a new
``./reprise-runs/<demo>-<time>-<pid>`` per run, or ``--out``, locked while the run lives),
``devices`` (``--device`` refused up front where this machine lacks it) and ``progress``
(a bar on a terminal, lines elsewhere).
"""
