"""The default task: Crafter "kill cows" with the default recurrent CNN, sized for a 2-core laptop.

The same three names a MineStudio config module exports. Keys left out of ``online_dict`` take the schema
defaults (docs/config.md). About 2k env steps per iteration; on 2 cores an iteration took ~25 s, so 120
iterations take about 50 minutes (BENCHMARKS.md, "Learning on the default task").
"""


def env_generator():
    from craftrl.envs import make

    return make("crafter/cows")


def policy_generator():
    from craftrl.policies import default_policy_generator

    return default_policy_generator()


online_dict = {
    "detach_rollout_manager": False,
    "rollout_config": {
        "fragment_length": 128,
        "to_send_queue_size": 4,
        "worker_config": {"num_envs": 4, "batch_size": 2},
    },
    "train_config": {
        "num_iterations": 120,
        "batch_size_per_gpu": 8,
        "batches_per_iteration": 2,
        "epochs_per_iteration": 2,
        "save_interval": 20,
        "keep_interval": 0,
        "record_video_interval": 40,
    },
    "logger_config": {"name": "crafter-cows"},
}
