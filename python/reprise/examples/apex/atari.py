"""Atari games in the demo: which ``--env`` ids are Atari (``ALE/<Game>-v5``), the modules
the atari extra brings, and the usual DQN preprocessing. ``config`` reads the first to pick
the Atari preset; ``envs`` uses all three."""

from __future__ import annotations

# The modules an Atari environment needs, and the package that brings each.
ATARI_MODULES = {"ale_py": "ale-py", "cv2": "opencv-python-headless"}


def is_atari(env_id: str) -> bool:
    return env_id.startswith("ALE/")


def make_atari_env(env_id: str):
    """``env_id`` with the usual DQN preprocessing: no-op starts, frame skip 4 (max-pooled),
    84x84 grey, 4 stacked frames."""
    import ale_py
    import gymnasium as gym
    gym.register_envs(ale_py)
    env = gym.make(env_id, frameskip=1, repeat_action_probability=0.0)
    env = gym.wrappers.AtariPreprocessing(env, noop_max=30, frame_skip=4, screen_size=84,
                                          terminal_on_life_loss=False, grayscale_obs=True, scale_obs=False)
    return gym.wrappers.FrameStackObservation(env, 4)
