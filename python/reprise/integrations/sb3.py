"""Stable-Baselines3 over Reprise: a replay buffer for SB3's off-policy algorithms, and a
prioritized DQN.

``RepriseReplayBuffer`` is an SB3 ``ReplayBuffer`` (``replay_buffer_class=`` of DQN, SAC,
TD3) backed by one ``rp.TransitionBuffer``: every observation is stored once (SB3's default
buffer stores each one twice, as ``obs`` and ``next_obs``), n-step returns come from rows
that neighbouring transitions share, and sampling is Reprise's (uniform or prioritized).
``PrioritizedDQN`` is SB3's DQN with prioritized replay: importance weights on the
per-sample Huber loss and |TD error| fed back as priorities.

What ``add`` receives. SB3's algorithms call ``add(obs, next_obs, action, reward, done,
infos)`` once per ``VecEnv`` step, ``next_obs`` already holding the real final observation
of a finished environment (``OffPolicyAlgorithm._store_transition`` copies
``infos[i]["terminal_observation"]`` there, un-normalised under ``VecNormalize``), as for
SB3's own buffer. ``done`` ends an episode; with ``handle_timeout_termination`` (the
default) a ``done`` whose info says ``"TimeLimit.truncated"`` is a truncation (the target
bootstraps from the final observation), otherwise a termination.

Continuity. The ``TransitionBuffer`` stores an episode's first observation once and then
only ``next_obs``; so each environment's ``obs`` must be the previous step's ``next_obs``.
When it is not (``learn()`` called again resets the environments mid-episode, or an
unpickled buffer is fed by freshly reset environments), that environment's episode is
ended there as a truncation (``TransitionBuffer.end_episode``) and a new one begins with
``obs``: no transition crosses the gap. This costs one comparison of an observation per
environment and step (of their bytes first: one comparison for all of them when nothing
changed).

Seeds. ``seed=None`` (the default) seeds the table with ``torch.initial_seed()``: SB3's
``set_random_seed(seed)``, which every algorithm given ``seed=`` runs before it builds its
buffer, makes that the algorithm's seed; without one it is torch's own seed, drawn from
the operating system. ``replay_buffer_kwargs=dict(seed=...)`` sets it explicitly. The
draw consumes nothing from numpy's or torch's generators.

Pickling (``save_replay_buffer``/``load_replay_buffer``). The buffer pickles with its
``TransitionBuffer``, which pickles as a copy (a Reprise checkpoint of its table, see
``reprise.transitions``): the same transitions, priorities, keys and random-generator
state, so it draws what the original would have drawn, and each running episode with its
pending windows. Fed the steps that continue those episodes, the copy completes them as
the original would; fed anything else (environments reset since), the continuity check
above ends them as truncations.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np

try:
    import torch as th
    from gymnasium import spaces
    from stable_baselines3.common.buffers import ReplayBuffer
    from stable_baselines3.common.preprocessing import get_action_dim, get_obs_shape
    from stable_baselines3.common.type_aliases import ReplayBufferSamples
    from stable_baselines3.common.utils import get_device
    from stable_baselines3.dqn import DQN
    from torch.nn import functional as F
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError("reprise.integrations.sb3 needs Stable-Baselines3 (and so torch and gymnasium): "
                      "pip install 'reprise[sb3]'") from e

try:  # SB3 >= 2.6; before, the same schedule as a closure
    from stable_baselines3.common.utils import LinearSchedule
except ImportError:  # pragma: no cover - depends on the SB3 version
    from stable_baselines3.common.utils import get_linear_fn as LinearSchedule

from .._convert import as_int
from ..errors import InvalidArgument
from ..transitions import TransitionBuffer, equal_bytes

__all__ = ["RepriseReplayBuffer", "PrioritizedReplayBufferSamples", "PrioritizedDQN"]

_SPACES = (spaces.Box, spaces.Discrete, spaces.MultiDiscrete, spaces.MultiBinary)
# SB3 >= 2.7 samples carry n-step discounts, and its algorithms use them.
_SB3_DISCOUNTS = "discounts" in ReplayBufferSamples._fields
_F32, _BOOL = np.dtype(np.float32), np.dtype(bool)


class PrioritizedReplayBufferSamples(NamedTuple):
    """SB3's ``ReplayBufferSamples`` and what prioritized replay adds: ``weights`` [B, 1]
    float32 (importance weights, largest 1) and ``keys`` [B] int64 on the CPU, for
    ``RepriseReplayBuffer.update_priorities``."""

    observations: th.Tensor
    actions: th.Tensor
    next_observations: th.Tensor
    dones: th.Tensor
    rewards: th.Tensor
    discounts: th.Tensor | None
    weights: th.Tensor
    keys: th.Tensor


class RepriseReplayBuffer(ReplayBuffer):
    """An SB3 ``ReplayBuffer`` over an ``rp.TransitionBuffer``.

    SB3 passes ``buffer_size``, the spaces, ``device``, ``n_envs``,
    ``optimize_memory_usage`` and ``handle_timeout_termination``; the rest come through
    ``replay_buffer_kwargs``:

    - ``n_steps``, ``gamma``: n-step returns as SB3's ``NStepReplayBuffer`` (pass the
      algorithm's ``gamma``); samples then carry ``discounts``.
    - ``alpha``: None for uniform sampling, a number >= 0 for prioritized
      (``PrioritizedDQN`` sets it); ``epsilon`` is added to |TD error| for priorities.
    - ``seed``: the table's seed (None: ``torch.initial_seed()``, see the module doc).
    - ``min_episode_length``, ``block_steps``, ``directory``: the store's sizing and
      place (``rp.TransitionBuffer``); pass the shortest episode length you expect to
      bring memory near one observation per transition.
    - ``frame_stack``: with ``VecFrameStack(env, k)`` (Atari), k: each step stores only its
      newest frame (an episode's first also the k - 1 before it) and samples put the stacks
      back together, about k times less memory than one stack per step. Observations must
      be stacks along their first axis, the newest last (``VecFrameStack`` then
      ``VecTransposeImage``, as SB3 wraps Atari for CNN policies); other layouts are
      refused at the first ``add`` that shows it.
    - ``compress="zstd"`` (and ``level``): observations stored compressed, one zstd frame
      per row (``rp.Field``'s ``compress``); with ``frame_stack`` an Atari transition takes a
      few hundred bytes (benchmarks/RESULTS.md, "Atari frames").

    It holds ``buffer_size`` transitions in all (SB3: ``buffer_size // n_envs`` per
    environment), FIFO beyond. ``size()`` is the number of transitions held, over all
    environments. ``optimize_memory_usage=True`` is refused: every observation is stored
    once already, with timeouts handled."""

    def __init__(self, buffer_size: int, observation_space: spaces.Space, action_space: spaces.Space,
                 device: th.device | str = "auto", n_envs: int = 1, optimize_memory_usage: bool = False,
                 handle_timeout_termination: bool = True, *, n_steps: int = 1, gamma: float = 0.99,
                 alpha: float | None = None, epsilon: float = 1e-6, seed: int | None = None,
                 min_episode_length: int = 1, block_steps: int = 64, directory: str | None = None,
                 frame_stack: int = 1, compress: str | None = None, level: int | None = None):
        # ReplayBuffer.__init__ is not called: it allocates SB3's arrays. These are the
        # attributes BaseBuffer and ReplayBuffer set that others read.
        buffer_size = as_int("RepriseReplayBuffer: buffer_size", buffer_size, 1)
        n_envs = as_int("RepriseReplayBuffer: n_envs", n_envs, 1)
        n_steps = as_int("RepriseReplayBuffer: n_steps", n_steps, 1)
        for space, role in ((observation_space, "observation"), (action_space, "action")):
            if not isinstance(space, _SPACES):
                raise InvalidArgument(f"RepriseReplayBuffer: {role} space must be a Box, Discrete, MultiDiscrete "
                                      f"or MultiBinary space, got {space!r}")
        if n_steps > 1 and not _SB3_DISCOUNTS:
            raise InvalidArgument("RepriseReplayBuffer: n_steps > 1 needs Stable-Baselines3 2.7 or later, whose "
                                  "algorithms use the samples' discounts")
        if optimize_memory_usage:
            raise InvalidArgument("RepriseReplayBuffer: optimize_memory_usage=True is not needed and not "
                                  "supported: every observation is stored once already (with timeouts handled); "
                                  "pass optimize_memory_usage=False")
        if not isinstance(handle_timeout_termination, (bool, np.bool_)):
            raise InvalidArgument(f"RepriseReplayBuffer: handle_timeout_termination must be True or False, "
                                  f"got {handle_timeout_termination!r}")
        self.buffer_size = max(buffer_size // n_envs, 1)
        self.observation_space, self.action_space = observation_space, action_space
        self.obs_shape = get_obs_shape(observation_space)
        self.action_dim = get_action_dim(action_space)
        self.device = get_device(device)
        self.n_envs = n_envs
        self.pos = 0  # steps added, modulo buffer_size: SB3's cursor, kept for code that reads it
        self.optimize_memory_usage = False
        self.handle_timeout_termination = bool(handle_timeout_termination)
        self.n_steps = n_steps
        self.gamma = gamma
        if seed is None:
            seed = th.initial_seed()
        self._config = dict(
            capacity=self.buffer_size * n_envs, obs_shape=self.obs_shape, obs_dtype=observation_space.dtype,
            action_shape=(self.action_dim,), action_dtype=self._maybe_cast_dtype(action_space.dtype),
            n_envs=n_envs, n_step=n_steps, gamma=gamma, alpha=alpha, epsilon=epsilon, seed=seed,
            block_steps=block_steps, min_episode_length=min_episode_length, directory=directory,
            frame_stack=frame_stack, compress=compress, level=level)
        try:
            self._transitions = TransitionBuffer(**self._config)
        except InvalidArgument as e:
            raise InvalidArgument(f"RepriseReplayBuffer: {e}") from None
        # The continuity check's state: the previous add's next_obs (a copy) and whether
        # each environment's episode ended there (True before any step: nothing to continue).
        self._last_next_obs: np.ndarray | None = None
        self._ended = [True] * n_envs

    # --- writing --------------------------------------------------------------------------------

    def add(self, obs: np.ndarray, next_obs: np.ndarray, action: np.ndarray, reward: np.ndarray,
            done: np.ndarray, infos: list[dict[str, Any]]) -> None:
        """One ``VecEnv`` step of all ``n_envs`` environments, as SB3's algorithms call it
        (see the module doc for ``next_obs``, timeouts and continuity). Raises
        ``InvalidArgument`` naming the argument on wrong shapes, lossy dtypes or infos."""
        n, nd, transitions = self.n_envs, np.ndarray, self._transitions
        obs_dtype, obs_shape, action_dtype, action_shape, _ = transitions._batch_types
        if (type(obs) is nd and type(next_obs) is nd and type(action) is nd and type(reward) is nd
                and type(done) is nd and obs.shape == next_obs.shape == obs_shape and action.shape == action_shape
                and reward.shape == done.shape == (n,) and done.dtype.kind == "b"):
            # The usual call: arrays of the shapes SB3 gives, as they are; and when they also
            # have the stored dtypes, TransitionBuffer.add's own checks are these.
            fast = (obs.dtype is obs_dtype and next_obs.dtype is obs_dtype and action.dtype is action_dtype
                    and reward.dtype is _F32 and done.dtype is _BOOL)
        else:
            obs, next_obs, action, reward, done = self._arguments(obs, next_obs, action, reward, done)
            fast = False
        dones = done.tolist()
        if not isinstance(infos, (list, tuple)) or len(infos) != n or not all(map(isinstance, infos, (dict,) * n)):
            raise InvalidArgument(f"add: infos expects a list of {n} dicts (one per environment), got {infos!r:.200}")
        if not any(dones):  # done is all False, as both flags are
            terminated = truncated = done
        elif self.handle_timeout_termination and any([bool(i.get("TimeLimit.truncated", False)) for i in infos]):
            timeout = np.array([bool(i.get("TimeLimit.truncated", False)) for i in infos])
            terminated, truncated = done & ~timeout, done & timeout
        else:
            terminated, truncated = done, np.zeros(n, bool)
        ended = self._ended
        if not all(ended):
            last = self._last_next_obs
            # Equal bytes are equal values: one comparison of all environments settles the usual case.
            if any(ended) or obs.dtype != last.dtype or not equal_bytes(obs, last):
                self._end_discontinued(obs)
        if fast:
            transitions._add_arrays(obs, action, reward, next_obs, terminated, truncated)
        else:
            transitions.add(obs, action, reward, next_obs, terminated, truncated)
        self._last_next_obs, self._ended = next_obs.copy(), dones
        self.pos = (self.pos + 1) % self.buffer_size

    def _arguments(self, obs, next_obs, action, reward, done) -> tuple:
        """``add``'s arrays in SB3's shapes, ``done`` as bools; ``InvalidArgument`` naming
        the first that cannot be."""
        n = self.n_envs
        obs, next_obs = np.asarray(obs), np.asarray(next_obs)
        if isinstance(self.observation_space, spaces.Discrete):  # as SB3: (n,) -> (n, 1)
            obs, next_obs = _reshaped("obs", obs, (n, *self.obs_shape)), _reshaped("next_obs", next_obs,
                                                                                   (n, *self.obs_shape))
        if n == 1 and obs.shape == next_obs.shape == self.obs_shape:  # one environment's, as TransitionBuffer
            obs, next_obs = obs[None], next_obs[None]
        for name, value in (("obs", obs), ("next_obs", next_obs)):
            if value.shape != (n, *self.obs_shape):
                raise InvalidArgument(f"add: {name} expects shape {(n, *self.obs_shape)} (n_envs={n}, "
                                      f"observation {self.obs_shape}), got {value.shape}")
        action = _reshaped("action", action, (n, self.action_dim))
        reward = _reshaped("reward", reward, (n,))
        done = _reshaped("done", done, (n,))
        if done.dtype.kind != "b":  # 0 and 1 of an integer dtype are bools too
            if done.dtype.kind not in "iu" or not all(d == 0 or d == 1 for d in done.tolist()):
                raise InvalidArgument(f"add: done expects {n} bools, got {done.dtype}{list(done.shape)}: "
                                      f"{done.tolist()}")
            done = done.astype(bool)
        return obs, next_obs, action, reward, done

    def _end_discontinued(self, obs: np.ndarray) -> None:
        """Ends, as a truncation, the episode of each environment whose ``obs`` is not the
        ``next_obs`` of its previous step (equal values, NaN equal to NaN; equal bytes
        first, the cheap test)."""
        last = self._last_next_obs
        same_dtype = obs.dtype == last.dtype
        for i, ended in enumerate(self._ended):
            if not ended and not (same_dtype and equal_bytes(obs[i], last[i])) \
                    and not np.array_equal(obs[i], last[i], equal_nan=True):
                self._transitions.end_episode(i)

    def __setstate__(self, state: dict) -> None:
        """Unpickles; a buffer pickled before the continuity state was kept as
        (``_last_next_obs``, ``_ended``) had one array or None per environment."""
        last = state.get("_last_next_obs")
        if "_ended" not in state and isinstance(last, list):
            template = next((x for x in last if x is not None), None)
            state["_last_next_obs"] = None if template is None else \
                np.stack([template if x is None else x for x in last])
            state["_ended"] = [x is None for x in last]
        self.__dict__.update(state)

    # --- reading --------------------------------------------------------------------------------

    def sample(self, batch_size: int, env=None, beta: float = 1.0):
        """``batch_size`` transitions drawn by the table (with replacement) as torch tensors
        on the buffer's device: SB3's ``ReplayBufferSamples`` (observations and actions
        in their stored dtypes, ``dones``/``rewards`` float32 [B, 1]; ``discounts``
        gamma^m [B, 1] when ``n_steps`` > 1, 0 where ``dones`` is 1, else None), or with
        ``alpha`` set a ``PrioritizedReplayBufferSamples`` whose ``weights`` use ``beta``.
        ``env``: a ``VecNormalize`` to normalise observations and rewards with, as SB3
        does (with ``n_steps`` > 1 the n-step return is normalised as a whole: the same
        scaling, but ``clip_reward`` applies to the return, not to each reward).
        Raises ``InvalidArgument`` when the buffer holds nothing yet."""
        dev = self.device
        gather = dev if env is None and dev.type == "cuda" else None
        b = self._transitions.sample(batch_size, device=gather, beta=beta)
        obs, next_obs, reward = b.obs, b.next_obs, b.reward.reshape(-1, 1)
        if env is not None:
            obs = th.as_tensor(self._normalize_obs(obs.numpy(), env))
            next_obs = th.as_tensor(self._normalize_obs(next_obs.numpy(), env))
            reward = th.as_tensor(self._normalize_reward(reward.numpy(), env))
        to = _same if dev.type == "cpu" else lambda t: t.to(dev)  # CPU tensors are on a CPU device already
        fields = dict(observations=to(obs), actions=to(b.action), next_observations=to(next_obs),
                      dones=to(b.done.reshape(-1, 1)), rewards=to(reward),
                      discounts=to(b.discount.reshape(-1, 1)) if self.n_steps > 1 else None)
        if self._transitions.alpha is None:
            if not _SB3_DISCOUNTS:
                del fields["discounts"]
            return ReplayBufferSamples(**fields)
        return PrioritizedReplayBufferSamples(weights=to(b.weights.reshape(-1, 1)), keys=b.keys, **fields)

    def _get_samples(self, batch_inds, env=None):
        raise NotImplementedError("RepriseReplayBuffer: the table draws the transitions; call sample(batch_size)")

    def update_priorities(self, keys, td_errors) -> int:
        """Sets the priorities of sampled transitions (``samples.keys``) to ``|td_error| +
        epsilon``; see ``rp.TransitionBuffer.update_priorities``. Returns how many applied."""
        return self._transitions.update_priorities(keys, td_errors)

    # --- state ----------------------------------------------------------------------------------

    def size(self) -> int:
        """Transitions held now, over all environments."""
        return len(self._transitions)

    def __len__(self) -> int:
        return len(self._transitions)

    @property
    def full(self) -> bool:
        """Whether the buffer holds ``buffer_size * n_envs`` transitions."""
        return len(self._transitions) >= self._transitions.capacity

    @property
    def transitions(self) -> TransitionBuffer:
        """The ``rp.TransitionBuffer`` underneath (its ``table`` and ``store`` for
        ``info()``, checkpoints and serving)."""
        return self._transitions

    def reset(self) -> None:
        """Empties the buffer: a new ``TransitionBuffer`` as constructed (same seed)."""
        self._transitions.close()
        self._transitions = TransitionBuffer(**self._config)
        self._last_next_obs, self._ended = None, [True] * self.n_envs
        self.pos = 0

    def close(self) -> None:
        """Closes the ``TransitionBuffer`` (its store file is removed). Idempotent."""
        self._transitions.close()

    def __repr__(self):
        return f"RepriseReplayBuffer({self._transitions!r}, device={self.device})"


def _same(tensor: th.Tensor) -> th.Tensor:
    return tensor


def _reshaped(name: str, value, shape: tuple) -> np.ndarray:
    if type(value) is np.ndarray and value.shape == shape:
        return value
    arr = np.asarray(value)
    if arr.size != math.prod(shape):
        raise InvalidArgument(f"add: {name} expects {math.prod(shape)} values, shape {shape}, got {arr.dtype}"
                              f"{list(arr.shape)}")
    return arr.reshape(shape)


class PrioritizedDQN(DQN):
    """SB3's DQN with prioritized experience replay (Schaul et al., 2016) on a
    ``RepriseReplayBuffer``.

    ``alpha``: how much priorities count (P(i) ~ p_i^alpha). ``beta``: the importance
    weights' exponent at the start, annealed linearly to ``beta_final`` over the first
    ``beta_fraction`` of training (``learn``'s ``total_timesteps``), then kept.
    ``prioritized_epsilon``: added to |TD error|. ``n_steps``: n-step returns, given to
    the buffer with the algorithm's ``gamma``. Every other argument is DQN's;
    ``replay_buffer_class`` must be ``RepriseReplayBuffer`` or a subclass (the default).

    ``train`` is DQN's, except that the Huber loss is per sample, weighted by the
    importance weights before the mean, and the |TD errors| of each batch go back to the
    buffer as its transitions' priorities (new transitions get the largest so far)."""

    def __init__(self, policy, env, *args, alpha: float = 0.6, beta: float = 0.4, beta_final: float = 1.0,
                 beta_fraction: float = 1.0, prioritized_epsilon: float = 1e-6, n_steps: int = 1,
                 replay_buffer_class: type[RepriseReplayBuffer] | None = None,
                 replay_buffer_kwargs: dict[str, Any] | None = None, _init_setup_model: bool = True, **kwargs):
        replay_buffer_class = RepriseReplayBuffer if replay_buffer_class is None else replay_buffer_class
        if not (isinstance(replay_buffer_class, type) and issubclass(replay_buffer_class, RepriseReplayBuffer)):
            raise InvalidArgument(f"PrioritizedDQN: replay_buffer_class must be RepriseReplayBuffer or a subclass, "
                                  f"got {replay_buffer_class!r}")
        _check_number("alpha", alpha, "a finite number >= 0", lambda a: 0.0 <= a < math.inf)
        for name, value in (("beta", beta), ("beta_final", beta_final)):
            _check_number(name, value, "a number in [0, 1]", lambda b: 0.0 <= b <= 1.0)
        _check_number("beta_fraction", beta_fraction, "a number in (0, 1]", lambda f: 0.0 < f <= 1.0)
        kwargs_buffer = dict(replay_buffer_kwargs or {})
        if kwargs_buffer.get("alpha", alpha) is None:
            raise InvalidArgument("PrioritizedDQN: replay_buffer_kwargs alpha=None would sample uniformly; "
                                  "give a number >= 0 (or leave it out and pass alpha=)")
        kwargs_buffer.setdefault("alpha", alpha)
        kwargs_buffer.setdefault("epsilon", prioritized_epsilon)
        n_steps = as_int("PrioritizedDQN: n_steps", n_steps, 1)
        if n_steps > 1:
            kwargs_buffer.setdefault("n_steps", n_steps)
        # DQN's own n_steps stays 1: SB3 would ignore it with a custom buffer class, and warn.
        super().__init__(policy, env, *args, replay_buffer_class=replay_buffer_class,
                         replay_buffer_kwargs=kwargs_buffer, _init_setup_model=False, **kwargs)
        self.alpha, self.beta, self.beta_final, self.beta_fraction = alpha, beta, beta_final, beta_fraction
        if _init_setup_model:
            self._setup_model()

    def _setup_model(self) -> None:
        if self.replay_buffer_kwargs.get("n_steps", 1) > 1:
            self.replay_buffer_kwargs.setdefault("gamma", self.gamma)
        super()._setup_model()
        self.beta_schedule = LinearSchedule(self.beta, self.beta_final, self.beta_fraction)

    def train(self, gradient_steps: int, batch_size: int = 100) -> None:
        self.policy.set_training_mode(True)
        self._update_learning_rate(self.policy.optimizer)
        beta = self.beta_schedule(self._current_progress_remaining)
        losses = []
        for _ in range(gradient_steps):
            data = self.replay_buffer.sample(batch_size, env=self._vec_normalize_env, beta=beta)
            discounts = data.discounts if data.discounts is not None else self.gamma
            with th.no_grad():
                next_q_values, _ = self.q_net_target(data.next_observations).max(dim=1)
                target_q_values = data.rewards + (1 - data.dones) * discounts * next_q_values.reshape(-1, 1)
            current_q_values = th.gather(self.q_net(data.observations), dim=1, index=data.actions.long())
            per_sample = F.smooth_l1_loss(current_q_values, target_q_values, reduction="none")
            loss = (data.weights * per_sample).mean()
            losses.append(loss.item())
            self.policy.optimizer.zero_grad()
            loss.backward()
            th.nn.utils.clip_grad_norm_(self.policy.parameters(), self.max_grad_norm)
            self.policy.optimizer.step()
            self.replay_buffer.update_priorities(data.keys, (current_q_values - target_q_values).detach().reshape(-1))
        self._n_updates += gradient_steps
        self.logger.record("train/n_updates", self._n_updates, exclude="tensorboard")
        self.logger.record("train/loss", np.mean(losses))
        self.logger.record("train/beta", beta)


def _check_number(name: str, value, expected: str, ok) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) \
            or math.isnan(float(value)) or not ok(float(value)):
        raise InvalidArgument(f"PrioritizedDQN: {name} must be {expected}, got {value!r}")
