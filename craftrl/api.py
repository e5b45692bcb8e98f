"""MineStudio-compatible entry points, named as in its quick start.

A MineStudio script ends with::

    start_rolloutmanager(policy_generator, env_generator, online_cfg)
    start_trainer(policy_generator, env_generator, online_cfg)

and the same two lines work with ``from craftrl import start_rolloutmanager, start_trainer``. ``online_cfg``
may be a plain dict, an OmegaConf ``DictConfig`` or an ``OnlineConfig``; it is validated against the schema
before anything starts, so a typo fails in one line instead of after Ray and the env processes are up.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

from craftrl.config.loading import check_generator
from craftrl.config.schema import OnlineConfig
from craftrl.config.validate import build_config


def _validated(policy_generator: Callable[[], Any], env_generator: Callable[[], Any],
               online_cfg: Mapping[str, Any] | OnlineConfig) -> OnlineConfig:
    check_generator("policy_generator", policy_generator, where="start arguments")
    check_generator("env_generator", env_generator, where="start arguments")
    return online_cfg if isinstance(online_cfg, OnlineConfig) else build_config(online_cfg)


def start_rolloutmanager(policy_generator: Callable[[], Any], env_generator: Callable[[], Any],
                         online_cfg: Mapping[str, Any] | OnlineConfig) -> Any:
    """Create (or reuse) the named ``rollout_manager`` actor with its workers, replay buffer and statistics.

    Returns the manager's actor handle. Not implemented yet: the rollout system lands with issue 5.
    """
    _validated(policy_generator, env_generator, online_cfg)
    raise NotImplementedError("start_rolloutmanager: the rollout manager is not implemented yet (issue 5, Rollout)")


def start_trainer(policy_generator: Callable[[], Any], env_generator: Callable[[], Any],
                  online_cfg: Mapping[str, Any] | OnlineConfig, whole_config: str | None = None) -> Any:
    """Run the PPO trainer until ``train_config.num_iterations``; blocks like MineStudio's ``fit()``.

    ``whole_config`` is the config file's text, saved with checkpoints. Not implemented yet: the trainer
    lands with issue 7.
    """
    _validated(policy_generator, env_generator, online_cfg)
    if whole_config is not None and not isinstance(whole_config, str):
        raise TypeError(f"start_trainer: whole_config: expected the config source text (str) or None, "
                        f"got {type(whole_config).__name__}")
    raise NotImplementedError("start_trainer: the PPO trainer is not implemented yet (issue 7, PPO trainer)")
