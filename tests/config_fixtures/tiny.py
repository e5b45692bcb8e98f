"""A config that trains end to end in seconds: scripted env processes and a tiny recurrent CNN."""

import functools

from craftrl.envs.testing import ScriptedEnv
from craftrl.policies import default_policy_generator

env_generator = functools.partial(ScriptedEnv, episode_length=6)
policy_generator = functools.partial(default_policy_generator, num_actions=2, image_shape=(8, 8, 3),
                                     hidden_size=16, channels=(4, 4, 4))

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
