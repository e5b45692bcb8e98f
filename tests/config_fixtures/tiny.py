"""A config that trains end to end in seconds: scripted env processes and a tiny recurrent CNN.

``craftrl train tests/config_fixtures/tiny.py`` runs it; tests that build a run in process take ``tiny_online``.
"""

import copy
import functools
from pathlib import Path
from typing import Any

from craftrl.testing.scripted_env import ScriptedEnv
from craftrl.policies import default_policy_generator

TINY_POLICY = dict(num_actions=2, image_shape=(8, 8, 3), hidden_size=16, channels=(4, 4, 4))
env_generator = functools.partial(ScriptedEnv, episode_length=6)
policy_generator = functools.partial(default_policy_generator, **TINY_POLICY)

online_dict = {
    "detach_rollout_manager": False,
    "rollout_config": {
        "num_rollout_workers": 1,
        "num_cpus_per_worker": 0,
        "fragment_length": 8,
        "worker_config": {"num_envs": 2, "batch_size": 2},
        "replay_buffer_config": {"max_chunks": 32, "max_staleness": 3,
                                 "database_config": {"num_shards": 1, "max_fragment_bytes": 1 << 20}},
    },
    "train_config": {"num_iterations": 2, "batch_size_per_gpu": 2, "batches_per_iteration": 2, "context_length": 4,
                     "save_interval": 1, "keep_interval": 0, "num_readers": 1},
    "logger_config": {"name": "tiny", "console_interval": 0},
}


def _merge(into: dict[str, Any], changes: dict[str, Any]) -> None:
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value


def tiny_online(tmp_path: Path | None = None, **changes: Any) -> dict[str, Any]:
    """A copy of ``online_dict`` with every output path under ``tmp_path`` (when given) and ``changes`` merged in,
    section by section: ``tiny_online(tmp_path, train_config={"num_iterations": 5})``."""
    online = copy.deepcopy(online_dict)
    if tmp_path is not None:
        _merge(online, {"rollout_config": {"worker_config": {"video_output_dir": str(tmp_path / "videos")},
                                           "replay_buffer_config": {"database_config": {"path": str(tmp_path / "replay")}}},
                        "train_config": {"save_path": str(tmp_path / "checkpoints")}})
    _merge(online, changes)
    return online
