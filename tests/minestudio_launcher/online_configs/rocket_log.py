"""ROCKET-3's ``online_configs/rocket_log.py`` ``online_dict`` with Crafter in place of MinecraftSim and craftrl's
default policy in place of theirs. Its values are theirs except where a 2-core CPU machine needs less, each marked
``# theirs: ...``: the GPU keys (0 here), the counts that size one iteration, and the env's episode length."""

online_dict = {
    "trainer_name": "PPOTrainer",
    "detach_rollout_manager": True,
    "rollout_config": {
        "num_rollout_workers": 2,
        "num_gpus_per_worker": 0.0,  # theirs: 1.0
        "num_cpus_per_worker": 1,
        "fragment_length": 128,
        "to_send_queue_size": 8,
        "worker_config": {
            "num_envs": 4,  # theirs: 16
            "batch_size": 4,  # theirs: 8
            "restart_interval": 3600,
            "video_fps": 20,
            "video_output_dir": "output/videos",
        },
        "replay_buffer_config": {
            "max_chunks": 4800,
            "max_reuse": 2,
            "max_staleness": 2,
            "fragments_per_report": 40,
            "fragments_per_chunk": 1,
            "database_config": {
                "path": "output/replay_buffer_cache",
                "num_shards": 8,
            },
        },
        "episode_statistics_config": {},
    },
    "train_config": {
        "num_workers": 2,  # theirs: 6 (one per GPU)
        "num_gpus_per_worker": 0.0,  # theirs: 1.0
        "num_iterations": 4,  # theirs: 4000
        "vf_warmup": 0,
        "learning_rate": 0.00002,
        "anneal_lr_linearly": False,
        "weight_decay": 0.04,
        "adam_eps": 1e-8,
        "batch_size_per_gpu": 1,
        "batches_per_iteration": 5,  # theirs: 100
        "gradient_accumulation": 5,
        "epochs_per_iteration": 1,
        "context_length": 64,
        "discount": 0.999,
        "gae_lambda": 0.95,
        "ppo_clip": 0.2,
        "clip_vloss": False,
        "max_grad_norm": 5,
        "zero_initial_vf": True,
        "ppo_policy_coef": 1.0,
        "ppo_vf_coef": 0.5,
        "kl_divergence_coef_rho": 0.2,
        "entropy_bonus_coef": 0.0,
        "coef_rho_decay": 0.9995,
        "log_ratio_range": 50,
        "normalize_advantage_full_batch": True,
        "use_normalized_vf": True,
        "num_readers": 4,
        "num_cpus_per_reader": 0.1,
        "prefetch_batches": 4,
        "save_interval": 10,
        "keep_interval": 40,
        "record_video_interval": 1,
        "enable_ref_update": True,
        "resume": None,
        "resume_optimizer": True,
        "save_path": "output",
    },
    "logger_config": {"project": "minestudio_online", "name": "rocket_log"},
}


def env_generator():
    from craftrl.envs.crafter import CrafterSim, JudgeResetCallback, RewardsCallback, SummonMobsCallback

    from crafter_callbacks import ImportedHereCallback

    return CrafterSim(
        obs_size=(64, 64),
        callbacks=[
            SummonMobsCallback([{"name": "cow", "number": 4, "range_x": [-5, 5], "range_z": [-5, 5]}]),
            RewardsCallback([{"event": "kill_entity", "objects": ["cow"], "reward": 1.0, "identity": "kill_cow",
                              "max_reward_times": 30}]),
            JudgeResetCallback(60),  # theirs: 500 (episodes short enough that every iteration's video is recorded)
            ImportedHereCallback(),
        ],
    )


def policy_generator(checkpoint_path: str):
    import torch

    from craftrl.policies import default_policy_generator

    policy = default_policy_generator(num_actions=17, image_shape=(64, 64, 3))
    policy.load_state_dict(torch.load(checkpoint_path, map_location="cpu"))
    return policy
