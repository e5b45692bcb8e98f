"""``craftrl train``: resume target, preflight, run directory, Ray, metrics, rollout side, trainer -- in that order."""

from __future__ import annotations

import dataclasses
import signal
import sys
import time
import uuid
from pathlib import Path

from craftrl.cli.preflight import Probe, check_resume, preflight
from craftrl.config.loading import LoadedConfig
from craftrl.config.schema import OnlineConfig
from craftrl.config.validate import ConfigError
from craftrl.policies.checks import PolicyContractError
from craftrl.ray_bootstrap import ClusterResourceError, ray_init, ray_logs_directory
from craftrl.replay.config import encoded_fragment_bound
from craftrl.replay.store import ReplayStoreError
from craftrl.rollout.loop import waits_more_than_computes
from craftrl.run_dir import ResumeTarget, RunDirectory, find_resume_target, output_paths, unwritable_output_paths
from craftrl.system import format_accounting, format_stop_times, start_metrics_sink, stop_rollout_system
from craftrl.train.checkpoint import CheckpointWriteError
from craftrl.train.trainer import RolloutFailedError

EXIT_RUN_FAILED = 1  # the run started but could not go on (bad input is 2, an interrupted run 130)


def train_command(loaded: LoadedConfig) -> int:
    import ray

    from craftrl import api
    from craftrl.cli.main import EXIT_BAD_INPUT, EXIT_INTERRUPTED
    from craftrl.train.checkpoint import list_checkpoints
    from craftrl.train.trainer import stop_on_sigterm

    config = loaded.online
    _check_output_paths(config)
    resume = _resume_target(config)  # before the preflight: it turns 'latest' or a run directory into a checkpoint
    if resume is not None:
        config = _with_resume_checkpoint(config, resume)
        loaded = dataclasses.replace(loaded, online=config)
    probe = preflight(loaded)  # env, policy, GPUs and an explicit resume path, before anything starts
    task_metrics = probe.task_metrics if probe else ()  # the env's declared ones: progress line and curve.png
    if probe is not None:
        config = _with_envs_per_process(_with_fragment_bound(config, probe.raw_fragment_bytes), probe)
        loaded = dataclasses.replace(loaded, online=config)
    # A run of its own on a shared cluster: its named actors in a namespace of its own, so that another run's
    # (MineStudio's names, the same in every run) neither replace them nor are replaced; and its rollout side tied
    # to this process, which stops it at the end, so a driver killed outright leaves none of it running there.
    config = dataclasses.replace(config, detach_rollout_manager=False)
    try:  # before the run directory: a cluster that is not there is bad input, which creates nothing
        ray_init(config, code_dir=loaded.code_dir,
                 namespace=f"craftrl-{config.logger_config.name}-{uuid.uuid4().hex[:8]}")
    except ClusterResourceError as error:
        print(f"craftrl: error: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    ray_logs = ray_logs_directory()  # Ray's, on this node: the run directory keeps none
    if resume is not None and resume.run_dir is not None:
        run_dir = resume.run_dir  # continue that run: metrics appended, same checkpoints/ and videos/
    else:
        run_dir = RunDirectory.create(config.output_root, config.logger_config.name)
    config = run_dir.resolve_config_paths(config)
    check_resume(config.train_config.resume, config.train_config.save_path)  # 'latest' needs the resolved save_path
    run_dir.save_config(config, loaded.source_text, loaded.origin, loaded.code_dir,
                        previous_until_iteration=resume.iteration if resume and resume.run_dir else None)
    print(f"craftrl: run directory {run_dir.root}", flush=True)
    if resume is not None:
        print(f"craftrl: resuming from {resume.checkpoint}", flush=True)
    sink = None
    interrupted = False
    failure = None
    accounting = None
    metrics_failures: list[str] = []
    stop_on_sigterm()
    try:
        sink = start_metrics_sink(str(run_dir.root), config)
        api.start_rolloutmanager(loaded.policy_generator, loaded.env_generator, config)
        api.start_trainer(loaded.policy_generator, loaded.env_generator, config, whole_config=loaded.source_text,
                          run_dir=str(run_dir.root), task_metrics=task_metrics,
                          policy_shapes=probe.policy_shapes if probe else None)
    except KeyboardInterrupt:
        interrupted = True
        print("craftrl: interrupted; stopping rollout workers and env processes", file=sys.stderr, flush=True)
    except Exception as error:
        failure = _run_failure(error)
        if failure is None:
            raise
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        stopping = time.monotonic()
        if ray.is_initialized():
            accounting = stop_rollout_system()  # detached actors would otherwise outlive the run on a cluster
            if sink is not None:
                metrics_failures = _close_metrics_sink(sink)
        metrics_closed = time.monotonic()
        ray.shutdown()
        if interrupted:  # how long the user waited, by stage: a stop that drags says where
            stop_times = format_stop_times(accounting or {})
            print(f"craftrl: stopped in {time.monotonic() - stopping:.1f} s ({stop_times}{', ' if stop_times else ''}"
                  f"ray shutdown {time.monotonic() - metrics_closed:.1f} s)", file=sys.stderr, flush=True)
    checkpoints = list_checkpoints(config.train_config.save_path)
    if failure is not None:
        print(f"craftrl: error: {failure} (worker logs: {ray_logs})", file=sys.stderr)
    print(f"craftrl: {'stopped' if interrupted else 'failed' if failure else 'done'}. "
          f"run directory: {run_dir.root}")
    if accounting:
        print(f"craftrl:   fragments: {format_accounting(accounting)}")
    try:
        from craftrl.cli.plot import plot_runs

        curve = plot_runs([run_dir.root], run_dir.root / "curve.png", task_metrics)
        print(f"craftrl:   learning curve: {curve}")
    except Exception as error:  # a plot is a convenience; the run's results are already on disk
        print(f"craftrl:   no learning curve ({error})")
    print(f"craftrl:   metrics: {run_dir.metrics_path} (tensorboard --logdir {run_dir.tensorboard_dir})")
    for stopped_file in metrics_failures:
        print(f"craftrl:   incomplete: {stopped_file}")
    if checkpoints:
        print(f"craftrl:   latest checkpoint: {checkpoints[-1][1]}")
    print(f"craftrl:   videos: {config.rollout_config.worker_config.video_output_dir}")
    if failure is not None:
        return EXIT_RUN_FAILED
    return EXIT_INTERRUPTED if interrupted else 0


def _check_output_paths(config: OnlineConfig) -> None:
    """Bad input if the run directory, or an output path given absolute, cannot be made and written (relative
    ones lie inside the run directory)."""
    paths = {"output_root": config.output_root,
             **{key: path for key, path in output_paths(config).items() if Path(path).expanduser().is_absolute()}}
    problems = unwritable_output_paths(paths)
    if problems:
        raise ConfigError(problems)


def _close_metrics_sink(sink) -> list[str]:
    """Flush and close metrics.jsonl/TensorBoard; a sink that does not answer is not waited on forever. Returns
    one line per file that stopped being written during the run."""
    import ray

    try:
        return ray.get(sink.close.remote(), timeout=30)
    except Exception as error:  # the files are line-buffered: at most the last line is lost
        print(f"craftrl: warning: the metrics sink did not close cleanly: {error}", file=sys.stderr)
        return []


# The errors that end a started run with a reason to show in one line, and the part of the system they name.
_RUN_FAILURES = {RolloutFailedError: "rollout", ReplayStoreError: "replay", PolicyContractError: "train",
                 CheckpointWriteError: "checkpoint"}


def _run_failure(error: BaseException) -> str | None:
    """``"<part>: <one-line reason>"`` when ``error`` is the trainer stopping for the rollout side (no worker can
    run), the replay store (its disk), a train worker's policy (another network than the driver's) or a
    checkpoint it could not write, else None.

    Ray Train may wrap the trainer's exception, so the exception chain, the train workers' own exceptions
    (``worker_failures``, where Ray Train keeps them whole) and the text are searched.
    """
    pending: list[BaseException] = [error]
    visited: set[int] = set()
    while pending:
        seen = pending.pop(0)
        if id(seen) in visited:
            continue
        visited.add(id(seen))
        for kind, part in _RUN_FAILURES.items():
            if isinstance(seen, kind):  # a Ray task's error keeps what was raised in ``cause``, without traceback
                reason = getattr(seen, "cause", None) or seen
                return f"{part}: " + str(reason).strip().splitlines()[0]
        pending += [cause for cause in (seen.__cause__ or seen.__context__,) if cause is not None]
        pending += [failure for failure in (getattr(seen, "worker_failures", None) or {}).values()
                    if isinstance(failure, BaseException)]
    text = str(error)
    for kind, part in _RUN_FAILURES.items():
        marker = f"{kind.__name__}: "
        if marker in text:
            return f"{part}: " + text.split(marker, 1)[1].strip().splitlines()[0]
    return None


def _with_envs_per_process(config: OnlineConfig, probe: Probe) -> OnlineConfig:
    """``envs_per_process: 0`` for an env whose step mostly waits: one env per process, so that none waits
    behind another's step or reset (:func:`craftrl.rollout.loop.waits_more_than_computes`)."""
    worker = config.rollout_config.worker_config
    if worker.envs_per_process != 0 or not waits_more_than_computes(probe.step_wall_s, probe.step_cpu_s):
        return config
    print(f"craftrl: the env's step waits more than it computes ({probe.step_wall_s * 1000:.1f} ms, "
          f"{probe.step_cpu_s * 1000:.1f} ms CPU): one env per process (worker_config.envs_per_process 0)",
          flush=True)
    rollout = dataclasses.replace(config.rollout_config,
                                  worker_config=dataclasses.replace(worker, envs_per_process=1))
    return dataclasses.replace(config, rollout_config=rollout)


def _with_fragment_bound(config: OnlineConfig, raw_fragment_bytes: int) -> OnlineConfig:
    """``config`` with ``database_config.max_fragment_bytes`` sized from the probed fragment, unless it is set."""
    buffer = config.rollout_config.replay_buffer_config
    if buffer.database_config.max_fragment_bytes is not None:
        return config
    database = dataclasses.replace(buffer.database_config,
                                   max_fragment_bytes=encoded_fragment_bound(raw_fragment_bytes))
    rollout = dataclasses.replace(config.rollout_config,
                                  replay_buffer_config=dataclasses.replace(buffer, database_config=database))
    return dataclasses.replace(config, rollout_config=rollout)


def _resume_target(config: OnlineConfig) -> ResumeTarget | None:
    """The checkpoint and run directory ``train_config.resume`` names; raises ``ConfigError`` if there is none."""
    resume = config.train_config.resume
    if not resume:
        return None
    return find_resume_target(resume, config.output_root, config.logger_config.name, config.train_config.save_path)


def _with_resume_checkpoint(config: OnlineConfig, resume: ResumeTarget) -> OnlineConfig:
    """``config`` with ``train_config.resume`` pinned to the resolved checkpoint directory (absolute).

    The trainer would otherwise resolve 'latest' again, against the save_path of the run directory it writes to.
    """
    train = dataclasses.replace(config.train_config, resume=str(resume.checkpoint))
    return dataclasses.replace(config, train_config=train)
