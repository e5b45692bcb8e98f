"""A synthetic env with Minecraft's timing and none of its game: for rollout tests and benchmarks.

MinecraftSim steps at about 20-60 frames/s per instance, resets take 10-60 s, frames are 128x128 to 360x640 RGB,
and instances hang or crash. What a rollout worker must get right with such envs is waiting, not computing:
keep every instance busy while some of them are slow or resetting. ``LatencyBoundEnv`` reproduces that timing by
sleeping, so dozens of instances fit on a few cores; its observations and rewards mean nothing (registered as
``synthetic/latency``, it is not a stand-in for MinecraftSim's game).

Randomness (step and reset times, episode lengths, failures) comes from the seed given to ``reset`` (or to the
constructor), so envs of one worker drift out of step as Minecraft instances do, reproducibly.
"""

from __future__ import annotations

import os
import time
from typing import Any

import gymnasium
import numpy as np


class LatencyBoundEnv:
    """Sleeps ``step_latency_s`` (± ``step_jitter`` of it, uniform) per step and ``reset_latency_s`` (uniform in
    [1 - ``reset_jitter``, 1 + ``reset_jitter``] times it) per reset; episodes last a uniform number of steps in
    [1 - ``length_jitter``, 1 + ``length_jitter``] times ``episode_length`` and end truncated.

    ``hang_rate`` and ``crash_rate`` are per-step probabilities of sleeping forever (a hung instance, which only
    ``step_timeout`` ends) and of exiting the process (a crashed JVM). Observations are ``{"image": uint8
    obs_shape, "t": steps into the episode}``: one random frame per env, with its first row stamped by the step
    count, so each step moves a frame's full size through the pipe.
    """

    def __init__(self, step_latency_s: float = 0.02, step_jitter: float = 0.5, reset_latency_s: float = 1.2,
                 reset_jitter: float = 0.5, episode_length: int = 100, length_jitter: float = 0.5,
                 obs_shape: tuple[int, int, int] = (64, 64, 3), num_actions: int = 17, hang_rate: float = 0.0,
                 crash_rate: float = 0.0, seed: int | None = None) -> None:
        for name, value in (("step_jitter", step_jitter), ("reset_jitter", reset_jitter),
                            ("length_jitter", length_jitter)):
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"LatencyBoundEnv {name}: expected a fraction in [0, 1], got {value!r}")
        for name, value in (("step_latency_s", step_latency_s), ("reset_latency_s", reset_latency_s),
                            ("hang_rate", hang_rate), ("crash_rate", crash_rate)):
            if not value >= 0:
                raise ValueError(f"LatencyBoundEnv {name}: expected a number >= 0, got {value!r}")
        if len(obs_shape) != 3 or obs_shape[2] != 3 or min(obs_shape) < 1:
            raise ValueError(f"LatencyBoundEnv obs_shape: expected (height, width, 3), got {obs_shape!r}")
        if episode_length < 1:
            raise ValueError(f"LatencyBoundEnv episode_length: expected >= 1, got {episode_length!r}")
        self.step_latency_s, self.step_jitter = float(step_latency_s), float(step_jitter)
        self.reset_latency_s, self.reset_jitter = float(reset_latency_s), float(reset_jitter)
        self.episode_length, self.length_jitter = int(episode_length), float(length_jitter)
        self.hang_rate, self.crash_rate = float(hang_rate), float(crash_rate)
        self.obs_shape = tuple(int(v) for v in obs_shape)
        self.observation_space = gymnasium.spaces.Dict({
            "image": gymnasium.spaces.Box(0, 255, self.obs_shape, np.uint8),
            "t": gymnasium.spaces.Box(0, np.iinfo(np.int64).max, (), np.int64)})
        self.action_space = gymnasium.spaces.Discrete(num_actions)
        self._rng = np.random.default_rng(seed if seed is not None else (os.getpid() * 7919 + time.time_ns()))
        self._frame = self._rng.integers(0, 256, self.obs_shape, dtype=np.uint8)
        self._t = 0
        self._length = self.episode_length

    def _uniform(self, mean: float, jitter: float) -> float:
        return mean * self._rng.uniform(1.0 - jitter, 1.0 + jitter) if jitter else mean

    def _obs(self) -> dict[str, Any]:
        frame = self._frame.copy()
        frame[0, :, :] = self._t % 256
        return {"image": frame, "t": np.int64(self._t)}

    def reset(self, seed: int | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        time.sleep(self._uniform(self.reset_latency_s, self.reset_jitter))
        self._t = 0
        self._length = max(1, round(self._uniform(self.episode_length, self.length_jitter)))
        return self._obs(), {}

    def step(self, action: Any) -> tuple[dict[str, Any], float, bool, bool, dict[str, Any]]:
        if self.crash_rate and self._rng.random() < self.crash_rate:
            os._exit(7)
        if self.hang_rate and self._rng.random() < self.hang_rate:
            time.sleep(1e9)
        time.sleep(self._uniform(self.step_latency_s, self.step_jitter))
        self._t += 1
        return self._obs(), 0.0, False, self._t >= self._length, {}

    def render(self) -> np.ndarray:
        return self._obs()["image"]

    def close(self) -> None:
        pass

