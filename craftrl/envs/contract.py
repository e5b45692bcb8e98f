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


def check_obs(obs: Any, where: str) -> None:
    """Raise ``ContractError`` unless ``obs`` is a dict with a uint8 ``[H, W, 3]`` ``"image"``."""
    if not isinstance(obs, dict):
        raise ContractError(f"{where}: expected obs to be a dict with an 'image' key, got {type(obs).__name__}")
    image = obs.get("image")
    if not isinstance(image, np.ndarray) or image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] != 3:
        got = f"{image.dtype} {image.shape}" if isinstance(image, np.ndarray) else type(image).__name__
        raise ContractError(f"{where}: expected obs['image'] to be uint8 [H, W, 3], got {got}")


def check_step_result(result: Any, where: str = "step") -> None:
    """Raise ``ContractError`` unless ``result`` is a valid 5-tuple from ``step``."""
    if not isinstance(result, tuple) or len(result) != 5:
        raise ContractError(f"{where}: expected (obs, reward, terminated, truncated, info), got {result!r:.200}")
    obs, reward, terminated, truncated, info = result
    check_obs(obs, where)
    if not isinstance(reward, (int, float, np.integer, np.floating)):
        raise ContractError(f"{where}: expected a scalar reward, got {type(reward).__name__}")
    for name, flag in (("terminated", terminated), ("truncated", truncated)):
        if not isinstance(flag, (bool, np.bool_)):
            raise ContractError(f"{where}: expected {name} to be a bool, got {type(flag).__name__}")
    if terminated and truncated:
        raise ContractError(f"{where}: a step cannot be both terminated and truncated")
    if not isinstance(info, dict):
        raise ContractError(f"{where}: expected info to be a dict, got {type(info).__name__}")


def check_reset_result(result: Any, where: str = "reset") -> None:
    """Raise ``ContractError`` unless ``result`` is a valid ``(obs, info)`` pair from ``reset``."""
    if not isinstance(result, tuple) or len(result) != 2:
        raise ContractError(f"{where}: expected (obs, info), got {result!r:.200}")
    obs, info = result
    check_obs(obs, where)
    if not isinstance(info, dict):
        raise ContractError(f"{where}: expected info to be a dict, got {type(info).__name__}")
