"""``CrafterSim``: Crafter behind the craftrl env contract, with MineStudio-style callbacks.

Crafter (``crafter.Env``) has the old gym API: ``reset() -> obs`` and ``step -> (obs, reward, done,
info)`` with death and its own episode-length cap merged into ``done``. This class splits them back
into ``terminated`` (the player died) and ``truncated`` (length cap), wraps the image in a dict, and
lets callbacks mutate the world at reset (summon cows, give items), rewrite actions and rewrite step
results, mirroring how ``MinecraftSim`` is configured.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any, Sequence

import gymnasium
import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    from craftrl.envs.crafter.callbacks import CrafterCallback

# Crafter's built-in episode cap; tasks normally end earlier through JudgeResetCallback.
CRAFTER_DEFAULT_LENGTH = 10000


def _install_fast_paths() -> None:
    """Exact, faster drop-ins for Crafter's world generation and step/render (both tested bit-identical).

    Each refuses to install when the installed opensimplex or Crafter is not the version it reproduces;
    Crafter's own code then stays in place, so results are never silently different, only slower.
    """
    from craftrl.envs.crafter import fast_step, fast_worldgen

    for name, module in (("world generation", fast_worldgen), ("step and render", fast_step)):
        try:
            module.install()
        except RuntimeError as error:
            warnings.warn(f"CrafterSim: using Crafter's own {name} ({error})", RuntimeWarning, stacklevel=3)


class CrafterSim:
    """A Crafter world with dict observations ``{"image": uint8 [H, W, 3]}`` and 17 discrete actions.

    ``obs_size`` is ``(height, width)`` in pixels. ``seed`` fixes the sequence of worlds (Crafter
    derives each episode's world from the seed and the episode number); ``reset(seed=s)`` restarts
    that sequence from ``s``. ``length`` is Crafter's own cap (truncation).

    ``fast`` (default on) swaps in exact, faster versions of Crafter's world generation
    (``fast_worldgen``: the identical world; with a random policy resets were much of an env's CPU time) and of
    its step and render (``fast_step``: identical frames and state).
    If the installed opensimplex or Crafter is not the version they reproduce, Crafter's own code stays in
    place (with a warning), so results are never silently different.

    ``task_metrics`` names the ``info`` keys that say how well the task goes (docs/envs.md); the progress line
    shows them.

    ``semantic_map`` (default off) adds ``info["semantic"]``, Crafter's object-id map of the whole world, to
    every reset and step. Scripted agents want it; the training pipeline never reads it, and it costs CPU each step
    and adds to the bytes of each step's reply between processes, so it is left out unless asked for.
    """

    def __init__(
        self,
        obs_size: tuple[int, int] = (64, 64),
        callbacks: Sequence[CrafterCallback] = (),
        seed: int | None = None,
        area: tuple[int, int] = (64, 64),
        view: tuple[int, int] = (9, 9),
        length: int = CRAFTER_DEFAULT_LENGTH,
        fast: bool = True,
        semantic_map: bool = False,
        task_metrics: tuple[str, ...] = (),
    ) -> None:
        import crafter  # imported here so that merely importing craftrl.envs stays cheap

        from craftrl.envs.crafter import reproducible

        reproducible.install()  # a seed fixes the whole episode (Crafter's despawn order follows memory addresses)
        self.task_metrics = tuple(task_metrics)
        if fast:
            _install_fast_paths()

        if len(obs_size) != 2 or min(obs_size) < 9:
            raise ValueError(f"CrafterSim obs_size: expected (height, width) of at least 9 pixels, got {obs_size!r}")
        from craftrl.envs.crafter.callbacks import CrafterCallback

        for callback in callbacks:
            if not isinstance(callback, CrafterCallback):
                raise TypeError(f"CrafterSim callbacks: expected CrafterCallback instances, got {type(callback).__name__}")
        self.obs_size = (int(obs_size[0]), int(obs_size[1]))
        self.callbacks = list(callbacks)
        seed = int(np.random.SeedSequence().entropy % (2**31 - 1)) if seed is None else int(seed)
        # crafter's size is (width, height); its rendered image then has shape (height, width, 3).
        self._game = crafter.Env(area=area, view=view, size=(self.obs_size[1], self.obs_size[0]),
                                 reward=True, length=length, seed=seed)
        self._game.craftrl_skip_semantic = not semantic_map  # read by fast_step's step
        self.rng = np.random.default_rng(seed)
        self.step_count = 0
        self._last_obs: dict[str, Any] | None = None
        self.observation_space = gymnasium.spaces.Dict(
            {"image": gymnasium.spaces.Box(0, 255, (*self.obs_size, 3), np.uint8)})
        self.action_space = gymnasium.spaces.Discrete(len(crafter.constants.actions))
        self.action_names: list[str] = list(crafter.constants.actions)

    @property
    def semantic_map(self) -> bool:
        """Whether infos carry ``semantic``; one flag, the one fast_step's step reads."""
        return not self._game.craftrl_skip_semantic

    # The Crafter internals callbacks act on.
    @property
    def world(self) -> Any:
        return self._game._world

    @property
    def player(self) -> Any:
        return self._game._player

    def observe(self) -> dict[str, Any]:
        """Render the current world; callbacks that change it at reset call this to refresh ``obs``."""
        return {"image": self._game.render()}

    def reset(self, seed: int | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
        if seed is not None:
            self._game._seed = int(seed)
            self._game._episode = 0
            self.rng = np.random.default_rng(int(seed))
        obs = {"image": self._game.reset()}
        self.step_count = 0
        info = self._base_info()
        for callback in self.callbacks:
            obs, info = callback.after_reset(self, obs, info)
        if self.semantic_map:  # after the callbacks, which may have changed the world (summoned cows)
            info["semantic"] = self._game._sem_view()
        self._last_obs = obs
        return obs, info

    def step(self, action: Any) -> tuple[dict[str, Any], float, bool, bool, dict[str, Any]]:
        if self._game._player is None:
            raise RuntimeError("CrafterSim.step: call reset() before step()")
        action = self._validate_action(action)
        for callback in self.callbacks:
            action = callback.before_step(self, action)
        action = self._validate_action(action)
        image, reward, done, crafter_info = self._game.step(action)
        self.step_count += 1
        terminated = bool(crafter_info["discount"] == 0.0)
        truncated = bool(done and not terminated)
        obs = {"image": image}
        info = self._base_info(crafter_info)
        reward = float(reward)
        for callback in self.callbacks:
            obs, reward, terminated, truncated, info = callback.after_step(
                self, obs, reward, terminated, truncated, info)
        if terminated and truncated:
            truncated = False  # death wins: there is nothing to bootstrap from
        self._last_obs = obs
        return obs, float(reward), bool(terminated), bool(truncated), info

    def render(self) -> np.ndarray:
        if self._last_obs is None:
            raise RuntimeError("CrafterSim.render: call reset() before render()")
        image = self._last_obs["image"]
        for callback in self.callbacks:
            image = callback.after_render(self, image)
        return image

    def close(self) -> None:
        for callback in self.callbacks:
            callback.before_close(self)

    def _validate_action(self, action: Any) -> int:
        if isinstance(action, np.ndarray) and action.size == 1:
            action = action.reshape(()).item()
        if not isinstance(action, (int, np.integer)) or isinstance(action, bool) or not 0 <= action < self.action_space.n:
            raise ValueError(f"CrafterSim.step: expected an int action in [0, {self.action_space.n}), got {action!r}")
        return int(action)

    def _base_info(self, crafter_info: dict[str, Any] | None = None) -> dict[str, Any]:
        """Task metrics every Crafter task reports; ``achievements`` are per-episode counters."""
        player = self.player
        achievements = dict(player.achievements)
        info = {
            "step": self.step_count,
            "achievements": achievements,
            "inventory": dict(player.inventory),
            "player_pos": np.array(player.pos),
            "cows_killed": int(achievements["eat_cow"]),
        }
        if crafter_info is not None:
            info["crafter_reward"] = float(crafter_info["reward"])
            if self.semantic_map:
                info["semantic"] = crafter_info["semantic"]
        return info
