"""MineStudio's quick start, verbatim in structure: VPT kills cows in real Minecraft (MinecraftSim).

For machines where ``minestudio`` and its Minecraft engine are installed (they cannot be on craftrl's CI
machines: the engine is a download). Without them the first env start fails with one message listing what
is missing; nothing is downloaded. Point VPT_MODEL / VPT_WEIGHTS at OpenAI's files.

    VPT_MODEL=pretrained/foundation-model-2x.model VPT_WEIGHTS=pretrained/bc-from-early-game-2x.weights \
        craftrl train examples/minecraft_kill_cows.py
"""

import os

# Read here, when the driver loads this file, and made absolute: the paths travel with policy_generator to every
# worker, whose own environment and working directory (on another node, those of its `ray start`) differ
# (docs/cluster.md).
VPT_MODEL = os.path.abspath(os.environ.get("VPT_MODEL", "pretrained/foundation-model-2x.model"))
VPT_WEIGHTS = os.path.abspath(os.environ.get("VPT_WEIGHTS", "pretrained/bc-from-early-game-2x.weights"))


def policy_generator():
    from craftrl.policies.vpt import load_vpt_policy

    return load_vpt_policy(VPT_MODEL, VPT_WEIGHTS)


def env_generator():
    from craftrl.envs.minecraft import check_minecraft_available, make_minecraft_sim

    check_minecraft_available()  # one clear error, before importing anything from minestudio
    from minestudio.simulator.callbacks import (CommandsCallback, FastResetCallback, JudgeResetCallback,
                                                MaskActionsCallback, RewardsCallback, SummonMobsCallback)

    return make_minecraft_sim(
        time_limit=600,
        obs_size=(128, 128),
        preferred_spawn_biome="plains",
        action_type="agent",
        timestep_limit=1000,
        callbacks=[
            SummonMobsCallback([{"name": "cow", "number": 10, "range_x": [-5, 5], "range_z": [-5, 5]}]),
            MaskActionsCallback(inventory=0),
            RewardsCallback([{"event": "kill_entity", "objects": ["cow"], "reward": 1.0,
                              "identity": "kill_cow", "max_reward_times": 30}]),
            CommandsCallback(commands=["/give @p minecraft:iron_sword 1", "/give @p minecraft:diamond 64",
                                       "/effect @p 5 9999 255 true"]),
            FastResetCallback(biomes=["plains"], random_tp_range=1000),
            JudgeResetCallback(600),
        ],
    )


online_dict = {  # MineStudio's quick-start values (2 GPU rollout workers, 2 GPU trainers)
    "trainer_name": "PPOTrainer",
    "detach_rollout_manager": True,
    "rollout_config": {
        "num_rollout_workers": 2, "num_gpus_per_worker": 1.0, "num_cpus_per_worker": 1, "fragment_length": 256,
        "to_send_queue_size": 6,
        "worker_config": {"num_envs": 12, "batch_size": 6, "restart_interval": 3600, "video_fps": 20,
                          "video_output_dir": "output/videos", "step_timeout": 120, "reset_timeout": 600},
        "replay_buffer_config": {"max_chunks": 4800, "max_reuse": 2, "max_staleness": 2, "fragments_per_report": 40,
                                 "fragments_per_chunk": 1,
                                 "database_config": {"path": "output/replay_buffer_cache", "num_shards": 8,
                                                     "max_fragment_bytes": 4 << 20}},
        "episode_statistics_config": {},
    },
    "train_config": {
        "num_workers": 2, "num_gpus_per_worker": 1.0, "num_iterations": 4000, "vf_warmup": 0,
        "learning_rate": 0.00002, "anneal_lr_linearly": False, "weight_decay": 0.04, "adam_eps": 1e-8,
        "batch_size_per_gpu": 1, "batches_per_iteration": 200, "gradient_accumulation": 10,
        "epochs_per_iteration": 1, "context_length": 64, "discount": 0.999, "gae_lambda": 0.95, "ppo_clip": 0.2,
        "clip_vloss": False, "max_grad_norm": 5, "zero_initial_vf": True, "ppo_policy_coef": 1.0,
        "ppo_vf_coef": 0.5, "kl_divergence_coef_rho": 0.2, "entropy_bonus_coef": 0.0, "coef_rho_decay": 0.9995,
        "log_ratio_range": 50, "normalize_advantage_full_batch": True, "use_normalized_vf": True,
        "num_readers": 4, "num_cpus_per_reader": 0.1, "prefetch_batches": 2, "save_interval": 10,
        "keep_interval": 40, "record_video_interval": 2, "resume": None, "resume_optimizer": True,
        "save_path": "output", "use_amp": True,
    },
    "logger_config": {"project": "minestudio_online", "name": "bow_cow"},
}
