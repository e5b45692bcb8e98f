"""The env contract every craftrl environment follows, and a checker for it.

The contract is gymnasium's reset/step signature without requiring gymnasium's base class, so that
MineStudio's ``MinecraftSim`` fits it unchanged:

* ``reset(seed=None) -> (obs, info)``
* ``step(action) -> (obs, reward, terminated, truncated, info)``
* ``render() -> uint8 [H, W, 3]`` (frames for videos)
* ``close()``

``obs`` is a dict holding at least ``"image"``: uint8 ``[H, W, 3]``. ``terminated`` means the episode
ended for good (no bootstrap); ``truncated`` means it was cut short (time limit, env restart) and the
trainer bootstraps with the value of the final observation. A step is never both.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import numpy as np

from craftrl.utils.describe import describe_value

Obs = dict[str, Any]
Info = dict[str, Any]


@runtime_checkable
class Env(Protocol):
    def reset(self, seed: int | None = None) -> tuple[Obs, Info]: ...

    def step(self, action: Any) -> tuple[Obs, float, bool, bool, Info]: ...

    def render(self) -> np.ndarray: ...

    def close(self) -> None: ...


class ContractError(ValueError):
    """An env returned something that breaks the env contract."""


IMAGE_EXPECTATION = "expected a dict with 'image': uint8 [H, W, 3]"
STEP_EXPECTATION = "expected a tuple (obs, reward, terminated, truncated, info)"
REQUIRED_METHODS = ("reset", "step", "close")


def check_env_methods(env: Any, where: str = "env_generator") -> None:
    """Raise ``ContractError`` unless ``env`` has the methods rollout workers call (``render`` is optional)."""
    missing = [name for name in REQUIRED_METHODS if not callable(getattr(env, name, None))]
    if missing:
        raise ContractError(f"{where}: returned {describe_value(env)} without {', '.join(m + '()' for m in missing)} "
                            "(expected an env with reset/step/render/close, see docs/envs.md)")


def check_obs(obs: Any, where: str) -> None:
    """Raise ``ContractError`` unless ``obs`` is a dict with a uint8 ``[H, W, 3]`` ``"image"``."""
    if not isinstance(obs, dict):
        raise ContractError(f"{where} returned an observation that is {describe_value(obs)} ({IMAGE_EXPECTATION})")
    if "image" not in obs:
        keys = ", ".join(repr(key) for key in list(obs)[:8]) or "none"
        raise ContractError(f"{where} returned an observation without key 'image' (keys: {keys}; "
                            f"{IMAGE_EXPECTATION})")
    image = obs["image"]
    if not isinstance(image, np.ndarray) or image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] != 3:
        raise ContractError(f"{where} returned obs['image'] as {describe_value(image)} ({IMAGE_EXPECTATION})")


def check_step_result(result: Any, where: str = "step") -> None:
    """Raise ``ContractError`` unless ``result`` is a valid 5-tuple from ``step``."""
    if not isinstance(result, tuple) or len(result) != 5:
        old_gym = isinstance(result, tuple) and len(result) == 4
        hint = "; the old gym API returns (obs, reward, done, info)" if old_gym else ""
        raise ContractError(f"{where} returned {describe_value(result)} ({STEP_EXPECTATION}{hint})")
    obs, reward, terminated, truncated, info = result
    check_obs(obs, where)
    if not isinstance(reward, (int, float, np.integer, np.floating)):
        raise ContractError(f"{where} returned a reward that is {describe_value(reward)} (expected a scalar number)")
    for name, flag in (("terminated", terminated), ("truncated", truncated)):
        if not isinstance(flag, (bool, np.bool_)):
            raise ContractError(f"{where} returned {name} as {describe_value(flag)} (expected a bool)")
    if terminated and truncated:
        raise ContractError(f"{where} returned terminated=True and truncated=True (expected at most one: "
                            "a step is never both)")
    if not isinstance(info, dict):
        raise ContractError(f"{where} returned info as {describe_value(info)} (expected a dict)")


def check_reset_result(result: Any, where: str = "reset") -> None:
    """Raise ``ContractError`` unless ``result`` is a valid ``(obs, info)`` pair from ``reset``."""
    if not isinstance(result, tuple) or len(result) != 2:
        hint = "; the old gym API returns only obs" if isinstance(result, dict) else ""
        raise ContractError(f"{where} returned {describe_value(result)} (expected a tuple (obs, info){hint})")
    obs, info = result
    check_obs(obs, where)
    if not isinstance(info, dict):
        raise ContractError(f"{where} returned info as {describe_value(info)} (expected a dict)")


def declared_task_metrics(env: Any) -> tuple[str, ...]:
    """The env's ``task_metrics`` (docs/envs.md); one that is not a tuple or list of names is a contract error."""
    declared = getattr(env, "task_metrics", ())
    if not isinstance(declared, (tuple, list)) or not all(isinstance(name, str) for name in declared):
        raise ContractError(f"env_generator: task_metrics: expected a tuple of info keys (str), got {declared!r}")
    return tuple(declared)
