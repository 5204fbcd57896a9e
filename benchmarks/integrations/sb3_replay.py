"""One replay arm of the integrations comparison, part 1, in its own process (so its memory is
its own): ``python -m benchmarks.integrations.sb3_replay --arm reprise --data DIR [--quick]``
(``DIR`` holds the driver's recordings, ``workloads.record``).

For each observation kind (``cartpole``, ``atari``; ``--only`` picks): build the arm's buffer
(``workloads.ARMS``) with the kind's capacity, ``add`` the recorded steps in a loop until
``fill_factor`` x capacity have gone in (the buffer full and wrapped), read its memory
(reserved and resident, ``workloads`` says how), then time ``add`` of one step (transitions/s)
and ``sample(256)`` as torch tensors on the CPU (samples/s): warm-up, rounds, medians
(``common.timing.timed_rounds``). Prints one JSON object (``common.bench``).
"""

from __future__ import annotations

import ctypes
import gc
import os
import statistics

import numpy as np

from benchmarks.common.bench import Bench, package_versions
from benchmarks.common.timing import timed_rounds
from benchmarks.integrations.workloads import (ARM_KINDS, ARMS, BATCH, LARGE_CAPACITY, OBS_KINDS, Steps, data_path,
                                               episode_lengths, load, make_config, resident_bytes)


def spaces_for(kind: str):
    from gymnasium import spaces
    if kind == "cartpole":
        import gymnasium as gym
        env = gym.make("CartPole-v1")
        try:
            return env.observation_space, env.action_space
        finally:
            env.close()
    return spaces.Box(0, 255, (4, 84, 84), np.uint8), spaces.Discrete(6)


def reprise_buffer_class():
    """(class, path): the SB3 integration, or (while it is not importable) an adapter over
    ``rp.TransitionBuffer`` with the same ``add``/``sample``."""
    try:
        from reprise.integrations.sb3 import RepriseReplayBuffer
        return RepriseReplayBuffer, "reprise.integrations.sb3.RepriseReplayBuffer"
    except ImportError:
        return TransitionAdapter, "rp.TransitionBuffer (reprise.integrations.sb3 not importable)"


class TransitionAdapter:
    """SB3's ``add``/``sample`` over ``rp.TransitionBuffer`` (n_envs=1, discrete actions)."""

    def __init__(self, buffer_size, observation_space, action_space, device="cpu", n_envs=1,
                 min_episode_length=1, **_):
        import reprise as rp
        self.transitions = rp.TransitionBuffer(buffer_size, observation_space.shape, observation_space.dtype,
                                               (1,), "int64", min_episode_length=min_episode_length)

    def add(self, obs, next_obs, action, reward, done, infos):
        trunc = np.array([bool(i.get("TimeLimit.truncated", False)) for i in infos])
        self.transitions.add(obs, action, reward, next_obs, done & ~trunc, done & trunc)

    def sample(self, batch_size):
        return self.transitions.sample(batch_size)

    def size(self):
        return len(self.transitions)

    def close(self):
        self.transitions.close()


def build(arm: str, kind: str, capacity: int, min_episode: int = 1):
    """(buffer, path, reserved bytes, store or None); ``min_episode``: the ``reprise_mel``
    and ``reprise_fs`` arms' ``min_episode_length``."""
    obs_space, act_space = spaces_for(kind)
    if arm.startswith("sb3"):
        from stable_baselines3.common.buffers import ReplayBuffer
        opt = arm == "sb3_opt"
        buf = ReplayBuffer(capacity, obs_space, act_space, device="cpu", optimize_memory_usage=opt,
                           handle_timeout_termination=not opt)
        arrays = [buf.observations, buf.actions, buf.rewards, buf.dones, buf.timeouts]
        if not opt:
            arrays.append(buf.next_observations)
        path = (f"stable_baselines3 ReplayBuffer(optimize_memory_usage={opt}, "
                f"handle_timeout_termination={not opt})")
        return buf, path, sum(a.nbytes for a in arrays), None
    cls, name = reprise_buffer_class()
    mel = min_episode if arm in ("reprise_mel", "reprise_fs") else 1
    stack = {"frame_stack": 4} if arm == "reprise_fs" else {}
    buf = cls(capacity, obs_space, act_space, device="cpu", min_episode_length=mel, **stack)
    store = buf.transitions.store
    return buf, f"{name}(min_episode_length={mel}{', frame_stack=4' if stack else ''})", \
        os.path.getsize(store.path), store


def malloc_trim() -> bool:
    """Hands the heap's free pages back to the kernel (glibc's ``malloc_trim(0)``), so that
    memory freed before and reused by the buffer is counted by the resident delta; False
    where there is no glibc (the delta is then not reported)."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
        return True
    except (OSError, AttributeError):
        return False


def warm_up(arm: str, kind: str, steps: Steps, min_episode: int) -> None:
    buf = build(arm, kind, 2 * BATCH, min_episode)[0]
    for _ in range(4 * BATCH):
        buf.add(*steps.next_args())
    for _ in range(3):
        buf.sample(BATCH)
    if hasattr(buf, "close"):
        buf.close()
    del buf
    gc.collect()


def reserved_at(arm: str, kind: str, capacity: int, min_episode: int) -> dict:
    """{capacity: reserved bytes per transition} of an empty buffer of that size (the store's
    file is sparse until written: nothing is allocated); SB3's is the same at every size."""
    buf, _, reserved, _ = build(arm, kind, capacity, min_episode)
    buf.close()
    return {capacity: reserved / capacity}


def measure(cfg, arm: str, kind: str, data_dir: str) -> dict:
    rec = load(data_path(data_dir, kind))
    steps = Steps(rec)
    capacity = cfg.capacity[kind]
    min_episode = min(episode_lengths(rec))
    warm_up(arm, kind, steps, min_episode)  # torch's and the arm's lazily loaded code, out of the memory delta
    trimmed = malloc_trim()  # memory the warm-up freed: reused by the buffer, it must count as new
    before = resident_bytes()
    buf, path, reserved, store = build(arm, kind, capacity, min_episode)
    try:
        add = buf.add
        for _ in range(cfg.fill_factor * capacity):
            add(*steps.next_args())
        held = buf.size()
        rss = resident_bytes() - before
        entry = dict(path=path, capacity=capacity, shortest_episode=min_episode, held=int(held),
                     recorded_steps=len(steps.args), synthetic=bool(rec["synthetic"]), reserved_bytes=reserved,
                     reserved_per_transition=reserved / capacity, rss_delta_bytes=rss,
                     rss_per_transition=rss / capacity if trimmed else None)
        if store is not None:
            st = os.stat(store.path)
            entry.update(store_steps=store.capacity, store_rows_per_transition=store.capacity / capacity,
                         shm_committed_per_transition=st.st_blocks * 512 / capacity)
            entry["reserved_per_transition_at"] = reserved_at(arm, kind, LARGE_CAPACITY, min_episode)
        add_rates = timed_rounds(lambda: add(*steps.next_args()), 1, cfg)
        sample_rates = timed_rounds(lambda: buf.sample(BATCH), BATCH, cfg)
        check = buf.sample(BATCH)
        assert tuple(check.observations.shape if hasattr(check, "observations") else check.obs.shape) == \
            (BATCH, *rec["obs"].shape[1:]), "a sampled batch has the wrong shape"
        entry.update(items_per_s=statistics.median(add_rates), add_rounds=add_rates,
                     samples_per_s=statistics.median(sample_rates), sample_rounds=sample_rates)
        return entry
    finally:
        if hasattr(buf, "close"):
            buf.close()


def main() -> None:
    bench = Bench("sb3-replay", "integrations", make_config,
                  lambda ap: (ap.add_argument("--arm", required=True, choices=ARMS),
                              ap.add_argument("--data", required=True, help="the driver's recordings")))
    import torch

    torch.set_num_threads(bench.cfg.torch_threads)
    arm = bench.args.arm
    bench.system = f"replay:{arm}"
    bench.versions.update(package_versions("stable-baselines3", "torch", "gymnasium", "ale-py", "reprise"))
    for kind in OBS_KINDS:
        if kind in ARM_KINDS.get(arm, (kind,)) and os.path.exists(data_path(bench.args.data, kind)):
            bench.run(kind, measure, bench.cfg, arm, kind, bench.args.data)
    bench.finish()


if __name__ == "__main__":
    main()
