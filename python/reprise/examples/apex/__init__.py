"""Distributed Ape-X DQN on Reprise.

    reprise demo apex                      # CartPole-v1 until solved (or --time-limit)
    reprise demo apex --smoke              # about a minute; shows learning
    reprise demo apex --env ALE/Pong-v5    # Atari, with the usual preprocessing (pip install 'reprise[atari]')
    python -m reprise.examples.apex --help

The processes (Horgan et al., "Distributed Prioritized Experience Replay", as laid out in the
in-network replay papers):

- the **supervisor** (this process) owns the tables and serves them with ``rp.Server``; it
  starts the learner and the actors, restarts any that die (and gives up on one that keeps
  dying), shows progress, and at the end (solved, time limit, SIGINT or SIGTERM) stops them,
  evaluates the newest parameters and writes ``summary.json`` and ``apex.png`` into a new
  ``./reprise-runs/apex-<time>-<pid>`` (or ``--out``);
- **actors** (``--actors``, default: the cores available) each run ``--envs-per-actor``
  environments with Ape-X's per-environment epsilon ``0.4 ** (1 + 7 i / (N - 1))``, write every
  step once through ``rp.Client(server.local_address)`` and make one item per n-step
  transition over the n + 1 steps it spans (so transitions share their steps), with an initial
  priority |TD error| computed locally from the actor's copy of the network;
- the **learner** (GPU when present) trains a dueling double DQN from the ``replay`` table
  (``Prioritized`` sampler, importance weights, priority updates). A ``SampleToInsertRatio``
  limiter sets how many samples the learner may draw per inserted transition, blocking whichever
  side runs ahead. It publishes its parameters as the one item of the ``params`` table (Reverb's
  "variable container"), which actors sample; a restarted learner reloads them from there.

Episode returns and evaluations travel back to the supervisor through two more Reprise tables
(``episodes`` and ``evals``, both queues).

Modules, each using only those before it: ``atari`` (telling an Atari id, its preprocessing),
``config`` (``Config``, the Atari and smoke presets, the command line), ``envs`` (environments,
the check of ``--env``, greedy evaluation), ``model`` (the dueling Q network and its flat parameters), ``nstep`` (n-step
items and their targets), ``tables`` (the four tables), ``actor``, ``learner``, ``processes``
(starting, restarting and stopping them), ``plots``, ``supervisor`` (the run, progress, the
final evaluation and summary, how a run ends; ``run`` and ``main``). From ``reprise.examples``
they use ``stopping`` (SIGINT and SIGTERM), ``rundirs`` (one output directory per run),
``devices`` (the ``--device`` check) and ``progress`` (the progress line).
"""

from .actor import actor_epsilon
from .config import Config, parse_args
from .envs import env_spec, make_env
from .model import make_network
from .nstep import NStepTransitions, n_step_targets
from .supervisor import main, run

__all__ = ["Config", "NStepTransitions", "actor_epsilon", "env_spec", "main", "make_env", "make_network",
           "n_step_targets", "parse_args", "run"]
