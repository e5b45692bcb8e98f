"""The default task: Crafter "kill cows" with the default recurrent CNN, sized for a 2-core laptop.

The same three names a MineStudio config module exports. Keys left out of ``online_dict`` take the schema
defaults (docs/config.md). The CNN is the default Impala network at half width (8/16/16 channels): on 2
cores its learner iteration takes ~9 s instead of ~23 s, less collected data goes stale, and on one seed each it
reached 1.8 cows per episode at 20 minutes against 0.8 (BENCHMARKS.md, "Learning on the default task").
About 2k env steps per iteration; 120 iterations take about 21 minutes on 2 cores.
"""


def env_generator():
    from craftrl.envs import make

    return make("crafter/cows")


def policy_generator():
    from craftrl.policies import default_policy_generator

    return default_policy_generator(channels=(8, 16, 16))


online_dict = {
    "detach_rollout_manager": False,
    "rollout_config": {
        "fragment_length": 128,
        "to_send_queue_size": 4,
        "worker_config": {"num_envs": 4, "batch_size": 2},
    },
    "train_config": {
        "num_iterations": 120,
        "learning_rate": 5e-4,
        "batch_size_per_gpu": 8,
        "batches_per_iteration": 2,
        "epochs_per_iteration": 2,
        "save_interval": 20,
        "keep_interval": 0,
        "record_video_interval": 40,
    },
    "logger_config": {"name": "crafter-cows"},
}
