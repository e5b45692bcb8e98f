"""``craftrl train``: run directory, Ray, metrics, rollout side, trainer -- in that order."""

from __future__ import annotations

import signal
import sys

from craftrl.config.loading import LoadedConfig
from craftrl.ray_bootstrap import ClusterResourceError, ray_init
from craftrl.run_dir import RunDirectory


def train_command(loaded: LoadedConfig) -> int:
    import ray

    from craftrl import api
    from craftrl.cli.main import EXIT_BAD_INPUT, EXIT_INTERRUPTED
    from craftrl.rollout.start import stop_rollout_system
    from craftrl.train.checkpoint import list_checkpoints
    from craftrl.train.trainer import stop_on_sigterm

    config = loaded.online
    run_dir = RunDirectory.create(config.output_root, config.logger_config.name)
    config = run_dir.resolve_config_paths(config)
    run_dir.save_config(config, loaded.source_text, loaded.origin)
    print(f"craftrl: run directory {run_dir.root}", flush=True)
    try:
        ray_init(config)
    except ClusterResourceError as error:
        print(f"craftrl: error: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    sink = None
    interrupted = False
    stop_on_sigterm()
    try:
        sink = api.start_metrics_sink(str(run_dir.root), config)
        api.start_rolloutmanager(loaded.policy_generator, loaded.env_generator, config)
        api.start_trainer(loaded.policy_generator, loaded.env_generator, config, whole_config=loaded.source_text,
                          run_dir=str(run_dir.root))
    except KeyboardInterrupt:
        interrupted = True
        print("craftrl: interrupted; stopping rollout workers and env processes", file=sys.stderr, flush=True)
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        if ray.is_initialized():
            stop_rollout_system()  # detached actors would otherwise outlive the run on a cluster
            if sink is not None:
                ray.get(sink.close.remote())
        ray.shutdown()
    checkpoints = list_checkpoints(config.train_config.save_path)
    print(f"craftrl: {'stopped' if interrupted else 'done'}. run directory: {run_dir.root}")
    try:
        from craftrl.cli.plot import plot_runs

        print(f"craftrl:   learning curve: {plot_runs([run_dir.root], run_dir.root / 'curve.png')}")
    except Exception as error:  # a plot is a convenience; the run's results are already on disk
        print(f"craftrl:   no learning curve ({error})")
    print(f"craftrl:   metrics: {run_dir.metrics_path} (tensorboard --logdir {run_dir.tensorboard_dir})")
    if checkpoints:
        print(f"craftrl:   latest checkpoint: {checkpoints[-1][1]}")
    print(f"craftrl:   videos: {config.rollout_config.worker_config.video_output_dir}")
    return EXIT_INTERRUPTED if interrupted else 0
