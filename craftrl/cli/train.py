"""``craftrl train``: run directory, Ray, rollout manager, trainer -- in that order."""

from __future__ import annotations

import sys

from craftrl.config.loading import LoadedConfig
from craftrl.ray_bootstrap import ClusterResourceError, ray_init
from craftrl.run_dir import RunDirectory


def train_command(loaded: LoadedConfig) -> int:
    from craftrl import api
    from craftrl.cli.main import EXIT_BAD_INPUT, EXIT_NOT_AVAILABLE

    config = loaded.online
    run_dir = RunDirectory.create(config.output_root, config.logger_config.name)
    config = run_dir.resolve_config_paths(config)
    run_dir.save_config(config, loaded.source_text, loaded.origin)
    print(f"craftrl: run directory {run_dir.root}")
    try:
        ray_init(config)
    except ClusterResourceError as error:
        print(f"craftrl: error: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        api.start_rolloutmanager(loaded.policy_generator, loaded.env_generator, config)
        api.start_trainer(loaded.policy_generator, loaded.env_generator, config, whole_config=loaded.source_text)
    except NotImplementedError as error:
        print(f"craftrl: {error}; the run directory holds the resolved config", file=sys.stderr)
        return EXIT_NOT_AVAILABLE
    finally:
        import ray

        from craftrl.rollout.start import stop_rollout_system

        if ray.is_initialized():
            stop_rollout_system()  # detached actors would otherwise outlive the run on a cluster
        ray.shutdown()
    print(f"craftrl: done; results in {run_dir.root}")
    return 0
