"""MineStudio-compatible entry points, named and called as in MineStudio's online module.

A MineStudio launcher ends with::

    start_rolloutmanager(policy_generator, env_generator, online_cfg, address="localhost:9899")
    start_trainer(policy_generator, env_generator, online_cfg, whole_config)

and the same lines run with ``from craftrl import start_rolloutmanager, start_trainer``. ``online_cfg`` may be a
plain dict, an OmegaConf ``DictConfig`` or an ``OnlineConfig``; a generator may be a ``functools.partial`` that
binds its arguments (ROCKET-3 binds a checkpoint path).

Bad input -- the config, a generator that still needs an argument, a cluster that cannot be reached or is too
small for the config, a module of the user's that a node cannot import -- prints one ``craftrl: error:`` line
per problem on stderr and exits with status 2 (``SystemExit``), before any env process starts, as ``craftrl
train`` does: a launcher gets the CLI's behaviour without a try block of its own.
"""

from __future__ import annotations

import contextlib
import functools
import sys
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

from craftrl.config.loading import check_generator
from craftrl.config.schema import OnlineConfig
from craftrl.config.validate import ConfigError, build_config


@contextlib.contextmanager
def _bad_input_exits() -> Iterator[None]:
    """Bad input ends the process with one line per problem and status 2, never a traceback."""
    from craftrl.cli.main import EXIT_BAD_INPUT, one_line
    from craftrl.ray_bootstrap import ClusterResourceError

    try:
        yield
    except ConfigError as error:
        for problem in error.problems:
            print(f"craftrl: error: {one_line(problem)}", file=sys.stderr)
        raise SystemExit(EXIT_BAD_INPUT) from None
    except ClusterResourceError as error:
        print(f"craftrl: error: {one_line(str(error))}", file=sys.stderr)
        raise SystemExit(EXIT_BAD_INPUT) from None


def _validated(policy_generator: Callable[[], Any], env_generator: Callable[[], Any],
               online_cfg: Mapping[str, Any] | OnlineConfig) -> OnlineConfig:
    """The config with its output paths absolute: relative ones resolve against the caller's directory, not each
    actor's (MineStudio's trap). Each must be a directory this process can make and write into."""
    from craftrl.run_dir import RunDirectory, output_paths, unwritable_output_paths

    check_generator("policy_generator", policy_generator, where="start arguments")
    check_generator("env_generator", env_generator, where="start arguments")
    config = online_cfg if isinstance(online_cfg, OnlineConfig) else build_config(online_cfg)
    config = RunDirectory(Path.cwd()).resolve_config_paths(config)
    problems = unwritable_output_paths(output_paths(config))
    if problems:
        raise ConfigError(problems)
    return config


def _launcher_directory() -> str:
    """Where a launcher imports its own modules from: its script's directory (Python puts it on the import path),
    or the working directory for ``python -m`` and interactive sessions."""
    main = sys.modules.get("__main__")
    script = getattr(main, "__file__", None)
    ran_as_script = script is not None and getattr(main, "__spec__", None) is None
    return str(Path(script).resolve().parent if ran_as_script else Path.cwd())


def start_rolloutmanager(policy_generator: Callable[[], Any], env_generator: Callable[[], Any],
                         online_cfg: Mapping[str, Any] | OnlineConfig, address: str | None = None) -> Any:
    """Start the named ``rollout_manager`` actor with its workers, the replay buffer and episode statistics.

    ``address`` is the Ray cluster to join, as in MineStudio (``"localhost:9899"``, ``"auto"``; not a Ray Client
    ``ray://`` address); None joins ``ray_config.address`` if set, else starts a local Ray sized to the config.
    A Ray this process already joined is used as it is. Before any worker starts, every other node that can host
    a worker is asked whether it can import the user's modules the generators need (docs/cluster.md).

    Replaces the actors of a previous start. Returns the manager's actor handle; workers start producing
    fragments right away.
    """
    import ray

    from craftrl.config.generator_modules import problems_on_cluster
    from craftrl.ray_bootstrap import ray_init
    from craftrl.system import start_rollout_system

    with _bad_input_exits():
        config = _validated(policy_generator, env_generator, online_cfg)
        joined_here = not ray.is_initialized()
        if joined_here:
            ray_init(config, address=address)
        problems = problems_on_cluster(env_generator, policy_generator, config)
        if problems:
            if joined_here:
                ray.shutdown()
            raise ConfigError(problems)
    return start_rollout_system(policy_generator, env_generator, config).manager


def start_trainer(policy_generator: Callable[[], Any], env_generator: Callable[[], Any],
                  online_cfg: Mapping[str, Any] | OnlineConfig, whole_config: str | None = None, *,
                  run_dir: str | None = None, task_metrics: Sequence[str] = (),
                  policy_shapes: Mapping[str, tuple[int, ...]] | None = None) -> Any:
    """Run the PPO trainer until ``train_config.num_iterations``; blocks like MineStudio's ``fit()``.

    Needs the rollout side (``start_rolloutmanager``) running. ``whole_config`` is the config file's text,
    saved in the run directory. Metrics go to the run's ``metrics`` actor; without one (a plain API call),
    a run directory is created under ``output_root``. Progress shows on this process's console while it runs
    (``craftrl.progress``), with the episode means of ``task_metrics`` (``craftrl train`` passes the env's
    declared ones). ``policy_shapes``: the tensors of the policy the driver built (``craftrl train``'s preflight),
    which each train worker's must match. Returns Ray Train's ``Result``.
    """
    import ray

    from craftrl.config.loading import config_to_dict
    from craftrl.progress import ProgressDisplay
    from craftrl.ray_bootstrap import ray_init
    from craftrl.run_dir import RunDirectory
    from craftrl.system import METRICS, find, start_metrics_sink
    from craftrl.train.trainer import run_trainer
    from craftrl.weights import pull_retry_advice, ray_pull_timeout_ms

    with _bad_input_exits():
        config = _validated(policy_generator, env_generator, online_cfg)
        if whole_config is not None and not isinstance(whole_config, str):
            raise ConfigError([f"start_trainer: whole_config: expected the config source text (str) or None, "
                               f"got {type(whole_config).__name__}"])
        if not ray.is_initialized():
            ray_init(config)
    if run_dir is None:
        directory = RunDirectory.create(config.output_root, config.logger_config.name)
        directory.save_config(config, whole_config or "", "config.py", code_dir=_launcher_directory())
        run_dir = str(directory.root)
    if find(METRICS) is None:
        start_metrics_sink(run_dir, config)
    slow_pulls = functools.partial(pull_retry_advice, pull_timeout_ms=ray_pull_timeout_ms())
    with ProgressDisplay(Path(run_dir) / "metrics.jsonl", config.train_config.num_iterations,
                         config.logger_config.console_interval, advice=(slow_pulls,), task_metrics=task_metrics):
        return run_trainer(policy_generator, config_to_dict(config), storage_path=str(Path(run_dir) / "ray_train"),
                           policy_shapes=policy_shapes)
