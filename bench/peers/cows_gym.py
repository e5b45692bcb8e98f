"""craftrl's ``crafter/cows`` task as a plain ``gymnasium.Env``, so that peer libraries train on the identical task.

Why a wrapper and not a re-implementation: the task (10 extra cows within +-5 tiles at reset, +1 per
``eat_cow`` increase, the 600-step cap as truncation, Crafter's deaths as termination) and Crafter's exact fast
paths (world generation, step and render) all come from ``craftrl.envs.registry.make("crafter/cows")``, the
very factory craftrl's own env processes call. Only the interface changes:

* observation: the 64x64x3 ``uint8`` image itself (HWC), not ``{"image": ...}``; SB3's ``CnnPolicy`` transposes
  it, RLlib's script normalises it;
* actions: ``Discrete(17)``, as in Crafter;
* ``info``: only ``{"cows_killed": int}`` (the episode's kills so far; at the last step of an episode, the
  episode's total). craftrl's own info (semantic map, inventory, achievements) is dropped because peers ship
  every step's info between processes, and nothing in it is part of the task; this favours the peers, if
  anything.

Seeds: ``seed`` fixes the env's sequence of worlds, as craftrl's env processes fix theirs at their first reset.
With ``follow_reset_seeds=False`` the env ignores the seeds a library passes to ``reset`` and keeps that
sequence: the peer scripts use it so that every env of every run plays its own worlds (``world_seed``), whereas
the libraries' own schemes overlap (RLlib seeds sub-env j of env runner w with ``seed + w + j``, so neighbouring
runners replay the same worlds; SB3 seeds env i with ``seed + i``, so seeds 0 and 1 share worlds).

``episode_log_dir`` lets libraries whose episodes end inside worker processes (RLlib's env runners) report cows
per episode without going through their metrics API: each finished episode appends one JSON line
``{"end_time": unix seconds, "cows": int, "length": int}`` to a file of its own process in that directory.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from pathlib import Path
from typing import Any

import gymnasium
import numpy as np

TASK = "crafter/cows"


def world_seed(run_seed: int, env_index: int) -> int:
    """The world sequence of env ``env_index`` in a run seeded ``run_seed``: distinct for every env and run."""
    return run_seed * 10_007 + env_index


class CowsGymEnv(gymnasium.Env):
    """``crafter/cows`` from craftrl's registry behind the standard gymnasium API (see the module docstring)."""

    metadata = {"render_modes": ["rgb_array"]}

    def __init__(self, seed: int | None = None, episode_log_dir: str | os.PathLike | None = None,
                 follow_reset_seeds: bool = True) -> None:
        from craftrl.envs.registry import make

        # ``seed`` fixes the sequence of worlds; ``reset(seed=s)`` restarts it from ``s`` when following reset seeds
        self.sim = make(TASK, seed=seed)
        self.follow_reset_seeds = follow_reset_seeds
        image_space = self.sim.observation_space["image"]
        self.observation_space = gymnasium.spaces.Box(0, 255, image_space.shape, np.uint8)
        self.action_space = gymnasium.spaces.Discrete(int(self.sim.action_space.n))
        self.render_mode = "rgb_array"
        self._episode_length = 0
        self._episode_log: Path | None = None
        if episode_log_dir is not None:
            directory = Path(episode_log_dir)
            directory.mkdir(parents=True, exist_ok=True)
            self._episode_log = directory / f"episodes-{os.getpid()}-{uuid.uuid4().hex[:8]}.jsonl"

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        obs, info = self.sim.reset(seed=seed if self.follow_reset_seeds else None)
        self._episode_length = 0
        return obs["image"], {"cows_killed": int(info["cows_killed"])}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.sim.step(int(action))
        self._episode_length += 1
        cows = int(info["cows_killed"])
        if (terminated or truncated) and self._episode_log is not None:
            with self._episode_log.open("a") as log:
                log.write(json.dumps({"end_time": time.time(), "cows": cows, "length": self._episode_length}) + "\n")
        return obs["image"], float(reward), bool(terminated), bool(truncated), {"cows_killed": cows}

    def render(self) -> np.ndarray:
        return self.sim.render()

    def close(self) -> None:
        self.sim.close()
