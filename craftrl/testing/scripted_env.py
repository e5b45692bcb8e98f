"""Tiny deterministic envs for testing supervision and rollout code without a real game.

``ScriptedEnv`` is cheap (8×8 images), counts steps, and can be told to misbehave in the ways the
``EnvPool`` must survive: die (``os._exit``), hang, or raise, in ``step`` or ``reset``. It can also
start a long-lived child process, standing in for Minecraft's JVM, to check that a restart kills the
whole process group. Failures are counted per env process, so a freshly restarted env misbehaves
again only after the same number of calls.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import Any

import numpy as np

FAILURE_MODES = ("exit", "hang", "raise", "unpicklable")


class ScriptedEnv:
    """Reward 1 per step; the image encodes the step count; episodes last ``episode_length`` steps.

    ``fail_in`` ("step" or "reset") and ``fail_mode`` (one of ``FAILURE_MODES``) make the
    ``fail_at``-th call of that method in this process fail (1-based).
    ``end_with`` says how an episode ends at ``episode_length``: "terminated" or "truncated".
    Images are ``image_side`` pixels square, ``image_growth`` more for each episode after the first (large
    frames take the env process's shared memory, ``shared_frames.py``).
    """

    def __init__(self, episode_length: int = 5, end_with: str = "terminated", fail_in: str | None = None,
                 fail_mode: str = "raise", fail_at: int = 1, spawn_child: bool = False,
                 step_sleep_s: float = 0.0, later_reset_sleep_s: float = 0.0, image_side: int = 8,
                 image_growth: int = 0) -> None:
        if end_with not in ("terminated", "truncated"):
            raise ValueError(f"ScriptedEnv end_with: expected 'terminated' or 'truncated', got {end_with!r}")
        if fail_in not in (None, "step", "reset"):
            raise ValueError(f"ScriptedEnv fail_in: expected None, 'step' or 'reset', got {fail_in!r}")
        if fail_mode not in FAILURE_MODES:
            raise ValueError(f"ScriptedEnv fail_mode: expected one of {FAILURE_MODES}, got {fail_mode!r}")
        self.episode_length = episode_length
        self.end_with = end_with
        self.fail_in, self.fail_mode, self.fail_at = fail_in, fail_mode, fail_at
        self.step_sleep_s = step_sleep_s
        self.later_reset_sleep_s = later_reset_sleep_s  # every reset but this process's first is this slow
        self.image_side, self.image_growth = image_side, image_growth
        self.calls = {"step": 0, "reset": 0}
        self.t = 0
        self.episode = 0
        self.child = None
        if spawn_child:
            self.child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1000)"])

    def _maybe_fail(self, method: str) -> bool:
        """Fail as scripted; True where the failure is an unpicklable reply (the caller builds it)."""
        self.calls[method] += 1
        if self.fail_in != method or self.calls[method] != self.fail_at:
            return False
        if self.fail_mode == "unpicklable":
            return True
        if self.fail_mode == "exit":
            os._exit(3)
        if self.fail_mode == "hang":
            time.sleep(10_000)
        raise RuntimeError(f"ScriptedEnv: scripted failure in {method} call {self.calls[method]}")

    def _obs(self) -> dict[str, Any]:
        side = self.image_side + self.image_growth * max(self.episode - 1, 0)
        return {"image": np.full((side, side, 3), self.t % 256, np.uint8), "t": np.int64(self.t)}

    def _info(self) -> dict[str, Any]:
        return {"pid": os.getpid(), "child_pid": None if self.child is None else self.child.pid,
                "t": self.t, "episode": self.episode}

    def reset(self, seed: int | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
        unpicklable = self._maybe_fail("reset")
        if self.later_reset_sleep_s and self.calls["reset"] > 1:
            time.sleep(self.later_reset_sleep_s)
        self.t = 0
        self.episode += 1
        info = dict(self._info(), seed=seed)
        if unpicklable:
            info["callback"] = lambda: None  # no pipe can carry this
        return self._obs(), info

    def step(self, action: Any) -> tuple[dict[str, Any], float, bool, bool, dict[str, Any]]:
        unpicklable = self._maybe_fail("step")
        if self.step_sleep_s:
            time.sleep(self.step_sleep_s)
        self.t += 1
        over = self.t >= self.episode_length
        info = dict(self._info(), action=action)
        if unpicklable:
            info["callback"] = lambda: None  # no pipe can carry this
        return self._obs(), 1.0, over and self.end_with == "terminated", over and self.end_with == "truncated", info

    def render(self) -> np.ndarray:
        return self._obs()["image"]

    def close(self) -> None:
        if self.child is not None:
            self.child.kill()
            self.child.wait()
