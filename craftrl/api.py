"""MineStudio-compatible entry points, named as in its quick start.

A MineStudio script ends with::

    start_rolloutmanager(policy_generator, env_generator, online_cfg)
    start_trainer(policy_generator, env_generator, online_cfg)

and the same two lines work with ``from craftrl import start_rolloutmanager, start_trainer``. ``online_cfg``
may be a plain dict, an OmegaConf ``DictConfig`` or an ``OnlineConfig``; it is validated against the schema
before anything starts, so a typo fails in one line instead of after Ray and the env processes are up.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, Callable, Mapping

from craftrl.config.loading import check_generator
from craftrl.config.schema import OnlineConfig
from craftrl.config.validate import build_config


def _validated(policy_generator: Callable[[], Any], env_generator: Callable[[], Any],
               online_cfg: Mapping[str, Any] | OnlineConfig) -> OnlineConfig:
    check_generator("policy_generator", policy_generator, where="start arguments")
    check_generator("env_generator", env_generator, where="start arguments")
    return online_cfg if isinstance(online_cfg, OnlineConfig) else build_config(online_cfg)


def _absolute_paths(config: OnlineConfig) -> OnlineConfig:
    """Relative output paths resolve against the caller's directory, not each actor's (MineStudio's trap)."""
    from pathlib import Path

    from craftrl.run_dir import RunDirectory

    return RunDirectory(Path.cwd()).resolve_config_paths(config)


def start_rolloutmanager(policy_generator: Callable[[], Any], env_generator: Callable[[], Any],
                         online_cfg: Mapping[str, Any] | OnlineConfig) -> Any:
    """Start the named ``rollout_manager`` actor with its workers, the replay buffer and episode statistics.

    Starts a local Ray sized to the config when none is running. Replaces the actors of a previous start.
    Returns the manager's actor handle; workers start producing fragments right away.
    """
    import ray

    from craftrl.ray_bootstrap import ray_init
    from craftrl.rollout.start import start_rollout_system

    config = _absolute_paths(_validated(policy_generator, env_generator, online_cfg))
    if not ray.is_initialized():
        ray_init(config)
    return start_rollout_system(policy_generator, env_generator, config).manager


def start_trainer(policy_generator: Callable[[], Any], env_generator: Callable[[], Any],
                  online_cfg: Mapping[str, Any] | OnlineConfig, whole_config: str | None = None, *,
                  run_dir: str | None = None) -> Any:
    """Run the PPO trainer until ``train_config.num_iterations``; blocks like MineStudio's ``fit()``.

    Needs the rollout side (``start_rolloutmanager``) running. ``whole_config`` is the config file's text,
    saved in the run directory. Metrics go to the run's ``metrics`` actor; without one (a plain API call),
    a run directory is created under ``output_root``. Progress shows on this process's console while it runs
    (``craftrl.progress``). Returns Ray Train's ``Result``.
    """
    import ray

    from craftrl.config.loading import config_to_dict
    from craftrl.progress import ProgressDisplay
    from craftrl.ray_bootstrap import ray_init
    from craftrl.run_dir import RunDirectory
    from craftrl.system import METRICS, find
    from craftrl.train.trainer import run_trainer
    from craftrl.weights import pull_retry_advice, ray_pull_timeout_ms

    config = _absolute_paths(_validated(policy_generator, env_generator, online_cfg))
    if whole_config is not None and not isinstance(whole_config, str):
        raise TypeError(f"start_trainer: whole_config: expected the config source text (str) or None, "
                        f"got {type(whole_config).__name__}")
    if not ray.is_initialized():
        ray_init(config)
    if run_dir is None:
        directory = RunDirectory.create(config.output_root, config.logger_config.name)
        directory.save_config(config, whole_config or "", "config.py")
        run_dir = str(directory.root)
    if find(METRICS) is None:
        start_metrics_sink(run_dir, config)
    slow_pulls = functools.partial(pull_retry_advice, pull_timeout_ms=ray_pull_timeout_ms())
    with ProgressDisplay(Path(run_dir) / "metrics.jsonl", config.train_config.num_iterations,
                         config.logger_config.console_interval, advice=(slow_pulls,)):
        return run_trainer(policy_generator, config_to_dict(config), storage_path=str(Path(run_dir) / "ray_train"))


_METRICS_SINKS: list[Any] = []


def start_metrics_sink(run_dir: str, config: OnlineConfig) -> Any:
    """The named ``metrics`` actor every component logs to (metrics.jsonl, TensorBoard, wandb); ``start_trainer``
    shows the run's progress on the driver's console from its metrics.jsonl."""
    import ray

    from craftrl.config.loading import config_to_dict
    from craftrl.metrics import MetricsSink
    from craftrl.system import METRICS, on_home_node

    # on the driver's node, so metrics.jsonl and TensorBoard files land in the driver's run directory
    sink = ray.remote(MetricsSink).options(name=METRICS, num_cpus=0, **on_home_node()).remote(
        run_dir, config.logger_config, config_to_dict(config))
    ray.get(sink.ready.remote())  # surfaces a sink start-up error (e.g. wandb) here
    _METRICS_SINKS[:] = [sink]  # a non-detached named actor dies with its creator's last handle
    return sink
