"""Run MineStudio's ``MinecraftSim`` under craftrl's supervised env processes.

MinecraftSim already follows the env contract. This module adds what craftrl needs around it:

* a pre-flight check that raises ONE clear ``MinecraftUnavailableError`` naming everything missing
  (the ``minestudio`` package, its engine jar, Java, a renderer) and how to provide it. Without it,
  ``MinecraftSim()`` would prompt on stdin and download a 458 MB engine, which hangs inside an env
  process; craftrl never downloads or prompts;
* ``MinecraftEnv``, a thin wrapper that copies dict actions (MinecraftSim mutates them), accepts
  ``reset(seed=...)``, and never reports a step as both terminated and truncated (MinecraftSim sets
  both on every episode end; a ``time_limit`` lets the wrapper tell a timeout from a real ending).
"""

from __future__ import annotations

import copy
import importlib
import importlib.util
import os
import shutil
from pathlib import Path
from typing import Any

ENGINE_JAR = Path("engine") / "build" / "libs" / "mcprec-6.13.jar"


class MinecraftUnavailableError(RuntimeError):
    """MinecraftSim cannot run here; the message lists what is missing and how to provide it."""


def minestudio_dir() -> Path | None:
    """MineStudio's data directory: ``$MINESTUDIO_DIR``, else minestudio's own default, else None."""
    if os.environ.get("MINESTUDIO_DIR"):
        return Path(os.environ["MINESTUDIO_DIR"])
    try:
        utils = importlib.import_module("minestudio.utils")
        return Path(utils.get_mine_studio_dir())
    except Exception:  # noqa: BLE001 - any failure just means "no default known"
        return None


def missing_requirements() -> list[str]:
    """Human-readable list of what MinecraftSim lacks on this machine (empty when it can run)."""
    missing = []
    if importlib.util.find_spec("minestudio") is None:
        missing.append("the Python package `minestudio` is not installed: `pip install minestudio` "
                       "(MineStudio 1.1.x, https://github.com/CraftJarvis/MineStudio)")
    else:
        directory = minestudio_dir()
        if directory is None or not (directory / ENGINE_JAR).is_file():
            where = "MINESTUDIO_DIR is not set" if directory is None else f"{directory / ENGINE_JAR} does not exist"
            missing.append(
                f"the Minecraft engine is missing ({where}): on a machine with network access, download "
                "`engine.zip` from the Hugging Face repo CraftJarvis/SimulatorEngine, unzip it into a directory "
                f"so that <dir>/{ENGINE_JAR.as_posix()} exists, and set MINESTUDIO_DIR=<dir>")
    if shutil.which("java") is None:
        missing.append("no `java` on PATH: install a JDK (MineStudio asks for JDK 8, e.g. apt openjdk-8-jdk)")
    if os.environ.get("MINESTUDIO_GPU_RENDER") != "1" and shutil.which("xvfb-run") is None:
        missing.append("no `xvfb-run` on PATH for CPU rendering: `apt install xvfb`, "
                       "or render on a GPU with VirtualGL and MINESTUDIO_GPU_RENDER=1")
    return missing


def check_minecraft_available() -> None:
    """Raise ``MinecraftUnavailableError`` listing every missing requirement, or return quietly."""
    missing = missing_requirements()
    if missing:
        lines = "\n".join(f"  - {item}" for item in missing)
        raise MinecraftUnavailableError(
            "MinecraftSim cannot run on this machine; craftrl never downloads or prompts. Missing:\n"
            f"{lines}\nThe embedded default environment needs none of this: use craftrl.envs.make('crafter/cows').")


class MinecraftEnv:
    """Contract-conformant wrapper around a ``MinecraftSim`` (see the module docstring for why)."""

    def __init__(self, sim: Any, time_limit: int | None = None) -> None:
        self.sim = sim
        self.time_limit = time_limit
        self.step_count = 0

    def reset(self, seed: int | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
        # MinecraftSim seeds the world at construction only; a per-reset seed cannot be honoured.
        self.step_count = 0
        return self.sim.reset()

    def step(self, action: Any) -> tuple[dict[str, Any], float, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.sim.step(copy.deepcopy(action))
        self.step_count += 1
        if terminated and truncated:
            timed_out = self.time_limit is not None and self.step_count >= self.time_limit
            terminated, truncated = not timed_out, timed_out
        return obs, float(reward), bool(terminated), bool(truncated), info

    def render(self) -> Any:
        return self.sim.render()

    def close(self) -> None:
        self.sim.close()


def make_minecraft_sim(time_limit: int | None = None, **sim_kwargs: Any) -> MinecraftEnv:
    """Check the requirements, then build ``minestudio.simulator.MinecraftSim(**sim_kwargs)`` wrapped.

    Pass the same ``time_limit`` as the ``JudgeResetCallback`` in ``callbacks`` so that time-outs are
    reported as truncations.
    """
    check_minecraft_available()
    from minestudio.simulator import MinecraftSim  # noqa: PLC0415 - optional dependency

    return MinecraftEnv(MinecraftSim(**sim_kwargs), time_limit=time_limit)
