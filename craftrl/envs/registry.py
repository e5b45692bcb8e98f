"""Named tasks: ``make("crafter/cows")`` builds an env, ``env_generator(...)`` a picklable factory for it."""

from __future__ import annotations

import functools
import importlib
from typing import Any, Callable

# name -> "module:function"; resolved lazily so that listing tasks imports no game.
_REGISTRY: dict[str, str | Callable[..., Any]] = {
    "crafter/cows": "craftrl.envs.crafter.tasks:make_cows",
    "crafter/score": "craftrl.envs.crafter.tasks:make_score",
    "minecraft/sim": "craftrl.envs.minecraft:make_minecraft_sim",
    "synthetic/latency": "craftrl.envs.latency:LatencyBoundEnv",  # Minecraft's timing by sleeping; no game
}


def register(name: str, factory: str | Callable[..., Any], overwrite: bool = False) -> None:
    """Register ``factory`` (a callable or a ``"module:function"`` path) under ``name``."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"register: expected a non-empty task name, got {name!r}")
    if name in _REGISTRY and not overwrite:
        raise ValueError(f"register: task {name!r} is already registered (pass overwrite=True to replace it)")
    _REGISTRY[name] = factory


def registered() -> list[str]:
    return sorted(_REGISTRY)


def _resolve(name: str) -> Callable[..., Any]:
    if name not in _REGISTRY:
        raise KeyError(f"make: unknown task {name!r}; expected one of {registered()}")
    factory = _REGISTRY[name]
    if isinstance(factory, str):
        module_name, _, attribute = factory.partition(":")
        factory = getattr(importlib.import_module(module_name), attribute)
    return factory


def make(name: str, **kwargs: Any) -> Any:
    """Build the env registered as ``name``; ``kwargs`` override the task's defaults."""
    return _resolve(name)(**kwargs)


def env_generator(name: str, **kwargs: Any) -> Callable[[], Any]:
    """A zero-argument, picklable env generator for ``EnvPool``: resolves the name now, builds later.

    It holds the factory itself, not the name, so tasks registered at run time in the parent process
    also work in env processes (the factory is pickled by reference, or by value with cloudpickle).
    """
    return functools.partial(_resolve(name), **kwargs)
