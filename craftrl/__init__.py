"""craftrl: distributed online PPO for game agents on Ray.

Public entry points are imported lazily so that ``import craftrl`` stays cheap inside env processes.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "start_rolloutmanager": "craftrl.api",
    "start_trainer": "craftrl.api",
    "ray_init": "craftrl.ray_bootstrap",
    "load_config": "craftrl.config.loading",
    "build_config": "craftrl.config.validate",
    "ConfigError": "craftrl.config.validate",
    "OnlineConfig": "craftrl.config.schema",
    "Fragment": "craftrl.rollout.fragment",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'craftrl' has no attribute {name!r}")
