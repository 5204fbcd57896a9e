"""Transitions: a replay buffer of (obs, action, reward, next_obs, done) for the classic
single-process loop, over one store and one table.

Layout. Every environment has its own writer, and every observation is stored once. Row i
of an episode holds the observation s_i and what led to it: the action a_{i-1}, the reward
r_{i-1} and whether s_i is terminal (row 0, the episode's first observation, holds a zero
action and reward). An episode of L steps is L + 1 rows. Transition t with an n-step window
is an item over rows t .. t + m, m = min(n, L - t): neighbouring transitions share rows, and
the final observation of an episode is its last row, whether the episode terminated or was
truncated. So ``add`` writes one row per environment (two at an episode's first step).

Frame stacks. With ``frame_stack=k`` an observation is k frames stacked along its first
axis, the newest last (as ``VecFrameStack`` + ``VecTransposeImage`` give Atari frames), and a
row holds one frame: s_i's row holds its newest frame, and an episode's first observation
also writes its k - 1 older frames as rows before it. A transition's item then starts k - 1
rows earlier (m + k rows) and s_t, s_{t+m} are read back as the k rows ending at theirs. Each
``add`` checks that ``next_obs``'s frames 0..k-2 are ``obs``'s frames 1..k-1. Memory per
transition drops about k-fold (Atari: one 84x84 frame instead of a 4x84x84 stack).

Targets. For an item of m + 1 rows: ``reward`` = sum_{k<m} gamma^k r_{t+k} (the n-step
return), ``next_obs`` = s_{t+m}, ``done`` = s_{t+m} is terminal, ``discount`` = gamma^m, or 0
when ``done``. Truncation is not termination: the window stops at the episode's last row and
bootstrapping goes on from it. These equal Stable-Baselines3's ``NStepReplayBuffer`` (whose
``discounts`` is gamma^m with ``dones`` separate).

When items appear. Transition t becomes an item once its window is known: when s_{t+n} is
written, or when the episode ends. So ``len`` lags the number of steps added by n - 1 per
environment in a running episode (none for ``n_step=1``); nothing is sampled from a window
that is not complete yet.

Capacity. The table holds ``capacity`` items, FIFO beyond. Items of one environment share
rows, but each episode takes one row more than it has transitions, and writers lease whole
blocks; the store is sized for that (``_store_steps``), so that it never has to evict an
item itself and the buffer holds exactly ``capacity`` transitions once full. With
``min_episode_length=1`` (no assumption) that is up to 2 rows per transition; a larger value
sizes it for episodes at least that long (about ``1 + 1/min_episode_length`` rows per
transition), and if shorter episodes come anyway the store evicts whole blocks and the buffer
holds fewer than ``capacity`` for a while.

Ending an episode early. ``end_episode(env)`` ends an environment's running episode at its
last step as a truncation: its pending transitions become items at once, with windows
stopping at the last row, and bootstrapping goes on from it. The items are those an ``add``
with ``truncated=True`` on that last step would have made (with several environments they
come after the items that ``add`` made for the environments after it); the next ``add``
starts a new episode with its ``obs``.

Pickling. A buffer pickles as a copy that shares nothing with the original: the table and
store go through a checkpoint (``reprise.pickling``: items, keys, priorities, the random
generator's state), and beside them the settings, ``max_priority`` and each environment's
running episode: its step count and its newest min(n, steps + 1) rows, which the copy's
writer appends again. So the copy completes pending windows as the original would, and
draws what the original would draw. Those rows take room twice in the copy's store (under
the items that already reference them, and in the block the copy's writer leases), and the
unused rest of the original writer's block stays unused in the copy until its items are
evicted: a copy still holds exactly ``capacity`` (the tests pickle full buffers sized
tightly), but copies of copies made every few steps add a block per environment each, and
the store then evicts blocks as for episodes shorter than ``min_episode_length``. The
copy's store goes in the default directory (``/dev/shm``).

Cost. ``add``: per environment one or two row copies and one table insert per completed
transition (O(log N) prioritized); arguments that already are arrays of the field's dtype
and shape are used as they are. ``sample`` on the host: the table's draw, then only the
rows a transition returns are copied out of the store, each once, into the batch's arrays
(two observations per item, whatever n); on a GPU every row of each item is gathered (n + 1
observations for an n-step item, of which two are returned).
"""

from __future__ import annotations

import ctypes
import math
import os
from typing import NamedTuple

import numpy as np

from . import _native, selectors
from ._convert import as_int
from .errors import InvalidArgument
from .sample import Sample
from .signature import Field

_SETTINGS = "transitions.json"  # a file store's buffer settings (TransitionBuffer.open)
from .store import Store
from .table import Table
from ._pool import POOL as _POOL
from .torch._device import is_host_device, torch_module

_OBS, _ACTION, _REWARD, _TERMINATED = "obs", "action", "reward", "terminated"
_FLOAT32 = ("reward", "done", "discount")  # batch fields returned as float32
_F32, _BOOL = np.dtype(np.float32), np.dtype(bool)  # the reward's and the flags' dtypes


class TransitionBatch(NamedTuple):
    """A sampled batch of B transitions, torch tensors on the sample's device except ``keys``.

    ``obs``, ``next_obs``: [B, *obs_shape] in the stored dtype. ``action``: [B, *action_shape]
    in its dtype. ``reward`` (the n-step return), ``done``, ``discount``, ``weights``:
    float32 [B]. ``keys``: int64 [B] on the CPU (the table's uint64 keys, bit for bit), for
    ``update_priorities``."""

    obs: object
    action: object
    reward: object
    next_obs: object
    done: object
    discount: object
    weights: object
    keys: object


def _store_steps(capacity: int, n_envs: int, n_step: int, block_steps: int, min_episode_length: int,
                 frame_stack: int = 1) -> int:
    """Rows a store needs so that ``capacity`` items never need a store eviction.

    Per environment the live rows run from its oldest item's first row to its newest row:
    its items, one extra row per episode among them (at most items / min_episode_length, plus
    a partial episode at each end; k extra rows with frame stacks of k), up to n - 1 rows of
    transitions not complete yet, and k - 1 rows before the oldest item's first transition.
    Rounding to blocks adds one block per environment at each end of that span, and one more
    for the block being leased while the table is full."""
    k = frame_stack
    rows = capacity + k * -(-capacity // min_episode_length) + n_envs * (n_step + 2 * k)
    blocks = -(-rows // block_steps) + 3 * n_envs
    return blocks * block_steps


def equal_bytes(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether two arrays of one dtype hold the same bytes: one memcmp where both are
    contiguous (no temporary, unlike ``np.array_equal``), else through ``tobytes``."""
    same = _native.same_bytes(a, b)
    return a.tobytes() == b.tobytes() if same is None else same


def _shape_text(dtype, shape) -> str:
    return f"{np.dtype(dtype).name}[{','.join(str(d) for d in shape)}]"


def _to_array(name: str, value, field: Field, expected) -> tuple[np.ndarray, np.dtype]:
    """``value`` as a numpy array of ``field``'s dtype (and the dtype it came in), refusing
    conversions that lose information: floats never go into integer or bool fields; integers
    and bools go into any field whose dtype keeps their values; floats are rounded into
    narrower floats, unless a value overflows. ``expected()`` describes what was expected."""
    if hasattr(value, "detach") and hasattr(value, "cpu"):  # a torch tensor, on any device
        value = value.detach().cpu().numpy()
    try:
        src = np.asarray(value)
    except Exception as e:  # ragged lists and the like
        raise InvalidArgument(f"add: {name} expects {expected()}, got {type(value).__name__} ({e})") from None
    target = np.dtype(field.dtype)
    if src.dtype == target:
        return src, src.dtype
    if src.dtype.kind not in "biuf":
        raise InvalidArgument(f"add: {name} expects {expected()}, got {type(value).__name__} of {src.dtype} "
                              f"(not numbers)")
    if src.dtype.kind == "f" and target.kind != "f":
        got = _shape_text(src.dtype, src.shape)
        raise InvalidArgument(f"add: {name} expects {expected()}, got {got}: converting {src.dtype} to {target} "
                              f"would lose information")
    with np.errstate(over="ignore", invalid="ignore"):
        out = src.astype(target)
    if src.dtype.kind == "f":
        lost = np.isinf(out) & ~np.isinf(src)
    else:
        lost = out.astype(src.dtype) != src
    if np.any(lost):
        bad, got = src[lost].flat[0].item(), _shape_text(src.dtype, src.shape)
        raise InvalidArgument(f"add: {name} expects {expected()}, got {got} holding {bad!r}, "
                              f"which {target} cannot hold")
    return out, src.dtype


class TransitionBuffer:
    """A replay buffer of transitions with n-step returns, uniform or prioritized.

    ``capacity``: transitions held once full (FIFO beyond). ``obs_shape``/``obs_dtype`` and
    ``action_shape``/``action_dtype``: one step's observation and action. ``n_envs``:
    environments written side by side (``add`` takes a leading dimension of ``n_envs``; one
    writer each). ``n_step``, ``gamma``: n-step returns and discounts. ``alpha``: None for
    uniform sampling, else prioritized with P(i) = p_i^alpha / sum_k p_k^alpha; new
    transitions get the largest priority set so far (1.0 at first). ``epsilon``: added to
    |TD error| by ``update_priorities``. ``seed``: the table's seed (None: from the OS).
    ``block_steps``, ``min_episode_length``: the store's block size and the episode length its
    size assumes (see the module doc). ``frame_stack``: k > 1 for observations of k frames
    stacked along their first axis, the newest last: each row then holds one frame (see the
    module doc). ``compress="zstd"`` (and ``level``, 1-19, default 3): observations stored
    compressed, one zstd frame per row (``Field``'s ``compress``); with frame stacks an Atari
    transition then takes a few hundred bytes. ``directory``: where the store's file goes.
    ``backing="file"``: the store is a file store in ``directory`` (on a disk, bigger than
    memory; ``Store``'s ``backing``): ``close()`` ends the running episodes as truncations
    and keeps the buffer there, and ``TransitionBuffer.open(directory)`` reopens it. With
    ``durable=True`` too (``Store``'s ``durable``), ``commit()`` returns once every
    transition added so far is on disk, and ``open`` of a buffer whose process was killed
    brings back every transition a commit covered (its running episodes are not)."""

    def __init__(self, capacity: int, obs_shape, obs_dtype="float32", action_shape=(), action_dtype="int64", *,
                 n_envs: int = 1, n_step: int = 1, gamma: float = 0.99, alpha: float | None = None,
                 epsilon: float = 1e-6, seed: int | None = None, block_steps: int = 64,
                 min_episode_length: int = 1, frame_stack: int = 1, compress: str | None = None,
                 level: int | None = None, directory: str | None = None, name: str = "transitions",
                 backing: str = "memory", durable: bool = False):
        capacity = as_int("capacity", capacity, 1)
        n_envs = as_int("n_envs", n_envs, 1)
        n_step = as_int("n_step", n_step, 1)
        block_steps = as_int("block_steps", block_steps, 1)
        min_episode_length = as_int("min_episode_length", min_episode_length, 1)
        frame_stack = as_int("frame_stack", frame_stack, 1)
        gamma = _number("gamma", gamma, "a number in [0, 1]", lambda g: 0.0 <= g <= 1.0)
        epsilon = _number("epsilon", epsilon, "a finite number >= 0", lambda e: 0.0 <= e < math.inf)
        if alpha is not None:
            alpha = _number("alpha", alpha, "None (uniform) or a finite number >= 0", lambda a: 0.0 <= a < math.inf)
        try:
            obs_field, action_field = Field(obs_shape, obs_dtype), Field(action_shape, action_dtype)
            Field((), compress=compress, level=level)  # checks compress and level
        except InvalidArgument as e:
            raise InvalidArgument(f"observation or action: {e}") from None
        if frame_stack > 1:
            if len(obs_field.shape) < 2 or obs_field.shape[0] != frame_stack:
                raise InvalidArgument(f"frame_stack={frame_stack} needs observations of {frame_stack} frames stacked "
                                      f"along their first axis (shape ({frame_stack}, ...)), got obs_shape "
                                      f"{tuple(obs_field.shape)}")
            obs_field = Field(obs_field.shape[1:], obs_field.dtype)  # a row holds one frame
        obs_field = Field(obs_field.shape, obs_field.dtype, compress=compress, level=level)
        signature = {_OBS: obs_field, _ACTION: action_field,
                     _REWARD: Field((), "float32"), _TERMINATED: Field((), "bool")}
        steps = _store_steps(capacity, n_envs, n_step, block_steps, min_episode_length, frame_stack)
        store = Store(signature, capacity=steps, block_steps=block_steps, directory=directory, backing=backing,
                      durable=durable)
        try:
            sampler = selectors.Uniform() if alpha is None else selectors.Prioritized(alpha)
            table = Table(name, store, sampler=sampler, remover=selectors.Fifo(), max_size=capacity, seed=seed)
            self._attach(table, self._settings_of(capacity, n_envs, n_step, gamma, alpha, epsilon, frame_stack))
            if backing == "file":
                self._save_settings()
        except BaseException:
            store.close()
            raise

    @classmethod
    def open(cls, directory) -> "TransitionBuffer":
        """Reopens the buffer a ``TransitionBuffer(..., backing="file")`` closed in
        ``directory``: its store and table as ``Store.open`` maps them (nothing copied),
        its settings and ``max_priority``, no episode running."""
        store = Store.open(directory)
        try:
            saved = store._file.read_json(_SETTINGS)
            if saved is None:
                raise InvalidArgument(f"{os.fspath(directory)} is a file store but not a TransitionBuffer's (it has "
                                      f"no {_SETTINGS}): open it with rp.Store.open")
            buffer = cls.__new__(cls)
            buffer._attach(store.tables[saved["name"]], saved["settings"])
            buffer._max_priority = buffer._saved_priority = float(saved["max_priority"])
            return buffer
        except BaseException:
            store.close()
            raise

    def _save_settings(self) -> None:
        """A file store's ``transitions.json``: what ``open`` needs besides the store."""
        self._store._file.write_json(_SETTINGS, {"name": self._table.name, "settings": self._settings(),
                                                 "max_priority": self._max_priority})
        self._saved_priority = self._max_priority

    def commit(self) -> None:
        """Returns once every transition added so far is on disk (a durable buffer,
        ``durable=True``): a buffer reopened after its process is killed has them, with
        the ``max_priority`` new ones get. Concurrent commits share one."""
        if not self._store.durable:
            raise InvalidArgument("commit() is for durable buffers: TransitionBuffer(..., directory=D, "
                                  "backing='file', durable=True)")
        if self._max_priority != self._saved_priority:
            self._save_settings()
        self._store.commit()

    def _settings(self) -> dict:
        """This buffer's settings, as ``_attach`` takes them (pickles, ``open``)."""
        return self._settings_of(self._capacity, self._n_envs, self._n_step, self._gamma, self._alpha,
                                 self._epsilon, self._k)

    @staticmethod
    def _settings_of(capacity, n_envs, n_step, gamma, alpha, epsilon, frame_stack) -> dict:
        return dict(capacity=capacity, n_envs=n_envs, n_step=n_step, gamma=gamma, alpha=alpha, epsilon=epsilon,
                    frame_stack=frame_stack)

    def _attach(self, table: Table, settings: dict) -> None:
        """Makes ``table`` (and its store) this buffer's, with one writer per environment and
        no episode running: what construction and unpickling share."""
        self._store, self._table = table.store, table
        self._signature = self._store.signature
        self._capacity, self._n_envs, self._n_step = settings["capacity"], settings["n_envs"], settings["n_step"]
        self._gamma, self._alpha, self._epsilon = settings["gamma"], settings["alpha"], settings["epsilon"]
        self._k = k = settings.get("frame_stack", 1)
        self._writers = [self._store.writer(max_sequence_length=self._n_step + k) for _ in range(self._n_envs)]
        self._max_priority = 1.0
        self._saved_priority = None  # the max_priority a file store's transitions.json holds
        self._episode_steps = [0] * self._n_envs  # steps of each environment's current episode
        # What add checks each argument against (dtype, one environment's shape, all of
        # them), and an episode's first row after its observation (zero action and reward).
        # ``_fields``: what add takes (the observation as a whole stack with frame stacks).
        frame = self._signature[_OBS]
        self._fields = {**self._signature, _OBS: Field((k, *frame.shape), frame.dtype) if k > 1
                        else Field(frame.shape, frame.dtype)}
        self._layouts = {name: (np.dtype(f.dtype), tuple(f.shape), (self._n_envs, *f.shape))
                         for name, f in self._fields.items()}
        self._batch_types = (*self._layouts[_OBS][::2], *self._layouts[_ACTION][::2], (self._n_envs,))
        self._first_row = {name: np.zeros((1, *f.shape), f.dtype) for name, f in self._signature.items()
                           if name != _OBS}
        self._prefix_rows = {name: np.zeros((k - 1, *f.shape), f.dtype) for name, f in self._signature.items()
                             if name != _OBS}
        self._columns = None  # the store's columns as numpy rows, made by the first host sample
        self._powers = {}  # {T: gamma^0 .. gamma^(T-1)} for host samples of items up to T rows

    # --- writing --------------------------------------------------------------------------------

    def add(self, obs, action, reward, next_obs, terminated, truncated) -> None:
        """Adds one step of each environment: arrays with a leading dimension of ``n_envs``,
        or (with ``n_envs=1``) of one environment without it.

        ``obs`` is stored only at an episode's first step (the first ``add``, and the first
        after one that ended the episode); later it must be the previous step's ``next_obs``.
        ``next_obs`` is the observation the step led to: on the step that ends an episode,
        the final observation (not the next episode's first). ``terminated`` and
        ``truncated`` end the episode; both true counts as terminated. Every argument is
        checked before anything is written: a rejected call changes nothing."""
        n, nd = self._n_envs, np.ndarray
        obs_dtype, obs_shape, action_dtype, action_shape, batch = self._batch_types
        if (type(obs) is nd and type(next_obs) is nd and type(action) is nd and type(reward) is nd
                and type(terminated) is nd and type(truncated) is nd
                and obs.shape == next_obs.shape == obs_shape and action.shape == action_shape
                and reward.shape == terminated.shape == truncated.shape == batch
                and obs.dtype is obs_dtype and next_obs.dtype is obs_dtype and action.dtype is action_dtype
                and reward.dtype is _F32 and terminated.dtype is _BOOL and truncated.dtype is _BOOL):
            # The usual call: arrays of all environments in the fields' dtypes, used as they are.
            o, no, a, r, term, trunc = obs, next_obs, action, reward, terminated, truncated
        else:
            o, no, a, r, term, trunc = self._arguments(obs, action, reward, next_obs, terminated, truncated)
        self._add_arrays(o, a, r, no, term, trunc)

    def _add_arrays(self, o, a, r, no, term, trunc) -> None:
        """``add`` of arguments already ``[n_envs, *shape]`` arrays of their fields' dtypes
        (``_batch_types``; for wrappers that have checked as much): checks the rewards,
        then writes."""
        n, k = self._n_envs, self._k
        rewards = r.tolist()
        if not all(map(math.isfinite, rewards)):
            raise InvalidArgument(f"add: reward must be finite, got {rewards}")
        if n == 1 and k == 1:  # the common case, without the general loop's bookkeeping
            w, steps = self._writers[0], self._episode_steps[0]
            if steps == 0:
                w.extend({_OBS: o, **self._first_row})
            w.extend({_OBS: no, _ACTION: a, _REWARD: r, _TERMINATED: term})
            self._episode_steps[0] = steps = steps + 1
            if steps >= self._n_step:
                w.create_item(self._table._native, self._n_step + 1, self._max_priority)
            if term[0] or trunc[0]:
                self._finish_episode(0)
            return
        if k > 1:
            if not all(equal_bytes(no[i, :-1], o[i, 1:]) for i in range(n)):
                env = next(i for i in range(n) if not equal_bytes(no[i, :-1], o[i, 1:]))
                raise InvalidArgument(
                    f"add: with frame_stack={k}, next_obs's frames 0..{k - 2} must be obs's frames 1..{k - 1} (stacks "
                    f"along the first axis, the newest last, as VecFrameStack and VecTransposeImage give them); "
                    f"environment {env}'s are not")
            stacks, o, no = o, o[:, -1:], no[:, -1:]  # the newest frames, as [n_envs, 1, ...]
            o, no = o.reshape(n, *o.shape[2:]), no.reshape(n, *no.shape[2:])
        # Each environment's rows as [1, ...] arrays of the fields' dtypes: written with
        # one-row extends, which take their bytes as they are (no conversion of numpy scalars).
        if n == 1:
            rows = ((self._writers[0], o, no, a, r, term, term[0] or trunc[0]),)
        else:
            rows = zip(self._writers, o[:, None], no[:, None], a[:, None], r[:, None], term[:, None],
                       (term | trunc).tolist())
        table, n_step, first, priority = self._table._native, self._n_step, self._first_row, self._max_priority
        episode_steps = self._episode_steps
        span = n_step + k  # an item's rows: s_t's frames (k rows, the last s_t's) to s_{t+n}
        for i, (w, o_i, no_i, a_i, r_i, term_i, end) in enumerate(rows):
            steps = episode_steps[i]
            if steps == 0:
                if k > 1:  # the first observation's older frames, as rows before the episode's first
                    w.extend({_OBS: stacks[i, :-1], **self._prefix_rows})
                w.extend({_OBS: o_i, **first})
            w.extend({_OBS: no_i, _ACTION: a_i, _REWARD: r_i, _TERMINATED: term_i})
            episode_steps[i] = steps = steps + 1
            if steps >= n_step:  # transition steps - n: its window is complete
                w.create_item(table, span, priority)
            if end:
                self._finish_episode(i)

    def _arguments(self, obs, action, reward, next_obs, terminated, truncated) -> tuple:
        """``add``'s arguments checked and converted (``_to_array``), each as
        ``[n_envs, *shape]`` of its field's dtype: (obs, next_obs, action, reward,
        terminated, truncated). Raises ``InvalidArgument`` naming the first that is wrong."""
        n, (dtype, shape, many) = self._n_envs, self._layouts[_OBS]
        o, given = _to_array("obs", obs, self._fields[_OBS], lambda: self._expected(_OBS))
        if n == 1 and o.shape == shape:
            single = True
        elif o.shape == many:
            single = False
        else:
            raise InvalidArgument(f"add: obs expects {self._expected(_OBS)}, got {_shape_text(given, o.shape)}")
        return (o.reshape(many), self._checked("next_obs", next_obs, _OBS, single),
                self._checked("action", action, _ACTION, single), self._checked("reward", reward, _REWARD, single),
                self._checked("terminated", terminated, _TERMINATED, single),
                self._checked("truncated", truncated, _TERMINATED, single))

    def end_episode(self, env: int | None = None) -> None:
        """Ends environment ``env``'s running episode (every environment's with None) at its
        last step, as a truncation: its pending transitions become items now, their windows
        stopping at that step, which they bootstrap from. The items are those an ``add`` with
        ``truncated=True`` would have made on that step; the next ``add`` starts a new episode
        and stores its ``obs``. An environment with no running episode is left as it is.
        For a reset that leaves an episode unfinished (an agent that stops collecting, an
        environment reset from outside)."""
        if env is None:
            envs = range(self._n_envs)
        elif isinstance(env, bool) or not isinstance(env, (int, np.integer)) or not 0 <= env < self._n_envs:
            raise InvalidArgument(f"end_episode: env must be None (every environment) or an environment index in "
                                  f"[0, {self._n_envs}), got {env!r}")
        else:
            envs = (int(env),)
        for i in envs:
            if self._episode_steps[i]:
                self._finish_episode(i)

    def _finish_episode(self, i: int) -> None:
        """Ends environment ``i``'s episode after its last step: the transitions whose
        windows were waiting for later steps (the newest n - 1, or all of a shorter episode)
        become items over the rows up to the last."""
        w, steps = self._writers[i], self._episode_steps[i]
        for t in range(max(0, steps - self._n_step + 1), steps):  # oldest first: FIFO order
            w.create_item(self._table, steps - t + self._k, self._max_priority)
        w.end_episode()
        self._episode_steps[i] = 0

    def _expected(self, field: str) -> str:
        f = self._fields[field]
        one, many = _shape_text(f.dtype, f.shape), _shape_text(f.dtype, (self._n_envs, *f.shape))
        return f"{one} or {many}" if self._n_envs == 1 else f"{many} (n_envs={self._n_envs})"

    def _checked(self, name: str, value, field: str, single: bool) -> np.ndarray:
        f = self._fields[field]
        arr, given = _to_array(name, value, f, lambda: self._expected(field))
        want = f.shape if single else (self._n_envs, *f.shape)
        if arr.shape != want:
            like = "one environment's obs" if single else f"obs of {self._n_envs} environments"
            raise InvalidArgument(f"add: {name} expects {_shape_text(f.dtype, want)} (as for {like}), "
                                  f"got {_shape_text(given, arr.shape)}")
        return arr.reshape(self._n_envs, *f.shape)

    # --- reading --------------------------------------------------------------------------------

    def sample(self, batch_size: int, device=None, beta: float = 1.0) -> TransitionBatch:
        """Draws ``batch_size`` transitions (with replacement) into a ``TransitionBatch`` of
        torch tensors: ``device`` None or "cpu" on the host, a CUDA device gathered there
        by the GPU. ``weights``: prioritized replay's importance weights
        ``(N * P(i)) ** -beta`` divided by the batch's largest, as float32; all ones when
        sampling is uniform. Raises ``InvalidArgument`` when the buffer is empty (nothing
        else could fill it while this thread waits)."""
        if type(batch_size) is not int or batch_size < 1:  # the checks, past the usual int and float
            batch_size = as_int("batch_size", batch_size, 1)
        if type(beta) is not float or not 0.0 <= beta < math.inf:
            beta = _number("beta", beta, "a finite number >= 0", lambda b: 0.0 <= b < math.inf)
        if len(self._table) == 0:
            raise InvalidArgument(f"cannot sample from an empty TransitionBuffer: add transitions first "
                                  f"(n_step={self._n_step}: a transition is held once its window is complete)")
        torch = torch_module()
        if is_host_device(device):  # numpy: the arithmetic below is cheaper there than in torch
            s, found = self._sample_host(batch_size)
            fields = {k: torch.from_numpy(v) for k, v in found.items()}
            dev = torch.device("cpu")
        else:
            s = self._table.sample(batch_size, timeout=0, device=device)
            dev = s.data[_OBS].device
            powers = self._gamma ** torch.arange(s.data[_REWARD].shape[1], device=dev, dtype=torch.float64)
            found = _targets(s.data, torch.from_numpy(s.lengths - 1).to(dev), torch.arange(batch_size, device=dev),
                             powers, torch.where, lambda x: x.double(), self._k,
                             torch.arange(self._k, device=dev))
            fields = {k: (v.float() if k in _FLOAT32 else v).contiguous() for k, v in found.items()}
        if self._alpha is None:
            weights = torch.from_numpy(np.ones(batch_size, np.float32)) if dev.type == "cpu" else \
                torch.ones(batch_size, dtype=torch.float32, device=dev)
        else:
            weights = torch.from_numpy(s.importance_weights(beta).astype(np.float32)).to(dev)
        return TransitionBatch(weights=weights, keys=torch.from_numpy(s.keys.view(np.int64)), **fields)

    def _sample_host(self, batch_size: int) -> tuple[Sample, dict]:
        """Draws ``batch_size`` items and gathers their transitions from the store's
        memory: (the draw's ``Sample``, without data; ``{field: numpy array}`` of
        ``TransitionBatch``'s fields but the weights and keys, each new and contiguous).
        Only the rows a transition returns are copied (``_gather_transitions``), each
        once; the draw's rows are held (a reference per block, as ``Table.sample``
        does) until the copies are done."""
        rows = self._table._native.sample_rows(batch_size, 0)
        try:
            index = np.empty(batch_size * (self._n_step + self._k), np.int64)
            keys, probabilities, priorities, times_sampled, table_size, lengths, n, t, ragged, filled = \
                rows.index(index)
            if not filled:  # items longer than n_step + k rows cannot be drawn; kept for safety
                index = np.empty(n * t, np.int64)
                n, t, ragged = rows.fill_index(index)
            if self._columns is None:
                self._columns = _host_columns(self._store)
            powers = self._powers.get(t)
            if powers is None:
                powers = self._powers[t] = self._gamma ** np.arange(t, dtype=np.float64)
            found = _gather_transitions(self._columns, index[:n * t].reshape(n, t), lengths, ragged, powers,
                                        self._k)
        finally:
            rows.release()
        s = Sample(keys=keys, probabilities=probabilities, priorities=priorities, times_sampled=times_sampled,
                   table_size=int(table_size), lengths=lengths)
        return s, found

    def update_priorities(self, keys, td_errors) -> int:
        """Sets the priorities of sampled transitions to ``|td_error| + epsilon``. ``keys``:
        ``batch.keys`` (or the same values as any integer array); ``td_errors``: one number per
        key (numpy, a list, or a torch tensor on any device). Keys of transitions evicted since
        are skipped; returns how many were applied. The largest priority set so far is what new
        transitions get. Checked before anything changes."""
        keys = _numpy(keys)
        td = _numpy(td_errors)
        if keys.shape == (0,):  # [] is float64 to numpy
            keys = keys.astype(np.uint64)
        if keys.ndim != 1 or keys.dtype.kind not in "iu":
            raise InvalidArgument(f"update_priorities: keys must be a 1-D integer array (batch.keys), "
                                  f"got {keys.dtype}{list(keys.shape)}")
        if td.shape != keys.shape or td.dtype.kind not in "biuf":
            raise InvalidArgument(f"update_priorities: td_errors must be {keys.shape[0]} numbers (one per key), "
                                  f"got {td.dtype}{list(td.shape)}")
        td = td.astype(np.float64)
        bad = ~np.isfinite(td)
        if bad.any():
            i = int(np.argmax(bad))
            raise InvalidArgument(f"update_priorities: td_errors must be finite, got {td[i]} for key {keys[i]}")
        if keys.dtype == np.int64:
            keys = keys.view(np.uint64)
        priorities = np.abs(td) + self._epsilon
        applied = self._table.update_priorities(keys.astype(np.uint64), priorities)
        if len(priorities):
            self._max_priority = max(self._max_priority, float(priorities.max()))
        return applied

    # --- state ----------------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._table)

    @property
    def size(self) -> int:
        """Transitions held now."""
        return len(self._table)

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def n_envs(self) -> int:
        return self._n_envs

    @property
    def n_step(self) -> int:
        return self._n_step

    @property
    def gamma(self) -> float:
        return self._gamma

    @property
    def alpha(self) -> float | None:
        return self._alpha

    @property
    def max_priority(self) -> float:
        """The priority new transitions get: the largest set so far, 1.0 at first."""
        return self._max_priority

    @property
    def store(self) -> Store:
        return self._store

    @property
    def table(self) -> Table:
        return self._table

    def __reduce__(self):
        """Pickles a copy: the table and store through a checkpoint, with the settings,
        ``max_priority`` and each running episode's step count and newest rows (see the
        module doc). The original is not changed."""
        if self._store.closed:
            raise InvalidArgument("cannot pickle a closed TransitionBuffer")
        running = []
        for w, steps in zip(self._writers, self._episode_steps):
            # The rows later items of this episode reach back to: the newest n, or all of it.
            rows = w.recent_rows(min(self._n_step, steps + 1) + self._k - 1) if steps else None
            running.append(None if rows is None else (steps, _read_rows(self._store, rows)))
        return _unpickled, (type(self), self._table, self._settings(), self._max_priority, running)

    def close(self) -> None:
        """Drops the transitions of unfinished windows, closes the writers and the store
        (removing its file). A file store's buffer instead ends its running episodes as
        truncations (``end_episode``), saves its settings and keeps its files for
        ``open``. Idempotent."""
        if self._store._file is not None and not self._store.closed:
            self.end_episode()
            self._save_settings()
        for w in self._writers:
            w.close()
        self._store.close()

    def __enter__(self) -> "TransitionBuffer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self):
        sampling = "uniform" if self._alpha is None else f"prioritized(alpha={self._alpha})"
        return (f"TransitionBuffer(size={len(self)}, capacity={self._capacity}, n_envs={self._n_envs}, "
                f"n_step={self._n_step}, gamma={self._gamma}, {sampling})")


def _unpickled(cls, table: Table, settings: dict, max_priority: float, running: list) -> TransitionBuffer:
    """``TransitionBuffer.__reduce__``'s other half: a buffer over the unpickled ``table``
    whose writers append each running episode's newest rows again and go on from there."""
    buf = cls.__new__(cls)
    try:
        buf._attach(table, settings)
        buf._max_priority = max_priority
        for i, episode in enumerate(running):
            if episode is not None:
                steps, rows = episode
                buf._writers[i].extend(rows)
                buf._episode_steps[i] = steps
    except BaseException:
        table.store.close()
        raise
    return buf


def _host_columns(store: Store) -> dict:
    """The columns of a host store as numpy views of its mapped memory: ``{field:
    (uint8[capacity, row_bytes], dtype, shape)}`` (a ``Store`` has no row reader of its
    own; a TransitionBuffer's store is always on the host). The views stay valid while
    the store's native object is alive (its mapping); whoever keeps them keeps the store."""
    address, nbytes = store._native.memory()
    memory = np.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(address))
    signature = store.signature
    out = {}
    for col, (name, offset, row_bytes) in enumerate(store._native.column_layout()):
        field = signature[name]
        if field.compress is not None:
            column = _PackedColumn(store._native, col, row_bytes)
        else:
            column = memory[offset:offset + store.capacity * row_bytes].reshape(store.capacity, row_bytes)
        out[name] = (column, np.dtype(field.dtype), tuple(field.shape))
    return out


class _PackedColumn:
    """A compressed column's rows, read (decompressed) by the store's native row reader."""

    def __init__(self, native, col: int, row_bytes: int):
        self._native, self._col, self.shape = native, col, (None, row_bytes)

    def take(self, rows: np.ndarray, out: np.ndarray) -> np.ndarray:
        self._native.read_rows(self._col, rows, out.reshape(-1))
        return out


def _rows_of(columns: dict, name: str, rows: np.ndarray, pooled: bool = False) -> np.ndarray:
    """A copy of field ``name`` at ``rows`` (int64, any shape S): ``array[*S, *shape]``.
    ``pooled``: its memory from ``_POOL`` (reused once the array and every view of it
    are gone; for the batches' large observations)."""
    column, dtype, shape = columns[name]
    if isinstance(column, _PackedColumn):
        flat = np.ascontiguousarray(rows, np.int64).reshape(-1)
        size = flat.size * column.shape[1]
        out = _POOL.empty(size) if pooled else np.empty(size, np.uint8)
        return column.take(flat, out).view(dtype).reshape(*rows.shape, *shape)
    if not pooled:
        return column.take(rows, axis=0).view(dtype).reshape(*rows.shape, *shape)
    flat = np.ascontiguousarray(rows).reshape(-1)
    out = _POOL.empty(flat.size * column.shape[1]).reshape(flat.size, column.shape[1])
    np.take(column, flat, axis=0, out=out, mode="clip")  # "clip": no buffered copy; the rows are in range
    return out.view(dtype).reshape(*rows.shape, *shape)


def _read_rows(store: Store, rows) -> dict:
    """Copies of the step data in ``rows`` of a host store: ``{field: array[len(rows), *shape]}``."""
    columns, rows = _host_columns(store), np.asarray(rows, np.int64)
    return {name: _rows_of(columns, name, rows) for name in columns}


def _gather_transitions(columns: dict, index: np.ndarray, lengths: np.ndarray, ragged: bool, powers,
                        k: int = 1) -> dict:
    """The transitions of drawn items, read from a host store's ``columns``
    (``_host_columns``): ``index[B, T]`` holds each item's rows (-1 past its end when
    ``ragged``), ``lengths`` their counts, ``powers`` gamma^0 .. gamma^(T-1), ``k`` the frame
    stack. The same targets as ``_targets`` (see it and the module doc), but only the rows
    used are copied: s_t's k rows, s_{t+m}'s k rows, the action of row k, the terminal flag
    of the last row and the rewards of rows k .. k + m - 1 (every item has at least k + 1
    rows). float32 for ``_FLOAT32``."""
    b, t = index.shape
    last = lengths - 1  # each item's final row: s_{t+m}'s newest frame
    action_row = index[:, k]
    if t == k + 1:  # every item is k + 1 rows (n_step=1): m = 1, the return is the one reward
        final = action_row
        reward = _rows_of(columns, _REWARD, action_row)
        m = None
    else:
        final = index[np.arange(b), last]
        after = index[:, k:]
        rewards = _rows_of(columns, _REWARD, np.maximum(after, 0) if ragged else after).astype(np.float64)
        if ragged:
            rewards[after < 0] = 0.0  # rows past an item add nothing
        reward = (rewards * powers[:t - k]).sum(1).astype(np.float32)
        m = last - k + 1
    done = _rows_of(columns, _TERMINATED, final)
    discount = np.where(done, 0.0, powers[1] if m is None else powers[m]).astype(np.float32)
    if k == 1:
        first, next_rows = index[:, 0], final
    else:  # the stacks: rows 0 .. k-1, and the k rows ending at the final one
        first = index[:, :k]
        next_rows = index[:, 1:k + 1] if m is None else index[np.arange(b)[:, None], last[:, None] - k + 1 + np.arange(k)]
    return dict(obs=_rows_of(columns, _OBS, first, pooled=True), action=_rows_of(columns, _ACTION, action_row),
                next_obs=_rows_of(columns, _OBS, next_rows, pooled=True), done=done.astype(np.float32), reward=reward,
                discount=discount)


def _targets(data: dict, last, rows, powers, where, as_f64, k: int = 1, stack=None) -> dict:
    """The transitions of sampled items ``data[field][B, T, ...]`` (numpy arrays or torch
    tensors alike): an item of m + k rows (``last`` = m + k - 1) holds s_t's k frames in
    rows 0 .. k-1 (k = 1: s_t itself) and ends at s_{t+m}'s newest frame; its rewards are in
    rows k .. k + m - 1 (rows past the item are zeros, so they add nothing). ``powers`` =
    gamma^0 .. gamma^(T-1); ``stack``: 0 .. k-1 (an ``arange`` of the same kind), with k > 1."""
    frames, done = data[_OBS], data[_TERMINATED][rows, last]
    if k == 1:
        obs, next_obs = frames[:, 0], frames[rows, last]
    else:
        obs, next_obs = frames[:, :k], frames[rows[:, None], last[:, None] - k + 1 + stack]
    t = data[_REWARD].shape[1]
    return dict(obs=obs, action=data[_ACTION][:, k], next_obs=next_obs, done=done,
                reward=(as_f64(data[_REWARD][:, k:]) * powers[:t - k]).sum(1),
                discount=where(done, 0.0, powers[last - k + 1]))


def _number(name: str, value, expected: str, ok) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise InvalidArgument(f"{name} must be {expected}, got {value!r}")
    x = float(value)
    if math.isnan(x) or not ok(x):
        raise InvalidArgument(f"{name} must be {expected}, got {value!r}")
    return x


def _numpy(value) -> np.ndarray:
    if hasattr(value, "detach") and hasattr(value, "cpu"):
        value = value.detach().cpu().numpy()
    try:
        return np.asarray(value)
    except Exception as e:
        raise InvalidArgument(f"update_priorities: expected arrays of numbers, got {type(value).__name__} ({e})") \
            from None
