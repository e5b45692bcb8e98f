"""MineStudio's quick start ("kill cows"), on Crafter, with craftrl.

MineStudio's structure: an env built from callbacks (cows summoned near the player, +1 per kill, a wooden sword
to start with, 600-step episodes), a policy generator and an ``online_dict`` that writes out MineStudio's keys.
The values, and the keys craftrl adds, are ``craftrl.configs.default``'s, which learn this sparse reward on a
2-core laptop in minutes; the schema's defaults follow MineStudio's, set for Minecraft on GPU machines
(bench/notes/default_config.md, "A config that leaves the learning settings out"). Run it either way:

    craftrl train examples/kill_cows.py            # the CLI: run directory, progress line, curve at the end
    python examples/kill_cows.py                   # the MineStudio way: start_rolloutmanager + start_trainer
"""


def policy_generator():
    from craftrl.policies import default_policy_generator

    return default_policy_generator(encoder="tiles", channels=(16, 16), hidden_size=128, recurrent="none")


def env_generator():
    from craftrl.envs.crafter import (CrafterSim, GiveItemsCallback, JudgeResetCallback, RewardsCallback,
                                      SummonMobsCallback)

    return CrafterSim(
        obs_size=(64, 64),
        callbacks=[
            SummonMobsCallback([{"name": "cow", "number": 10, "range_x": [-5, 5], "range_z": [-5, 5]}]),
            RewardsCallback([{
                "event": "kill_entity",
                "objects": ["cow"],
                "reward": 1.0,
                "identity": "kill_cow",
                "max_reward_times": 30,
            }]),
            GiveItemsCallback(commands=["/give @p minecraft:wood_sword 1"]),
            JudgeResetCallback(600),
        ],
        task_metrics=("cows_killed",),  # the progress line shows it after the return
    )


online_dict = {
    "trainer_name": "PPOTrainer",
    "detach_rollout_manager": False,
    "rollout_config": {
        "num_rollout_workers": 1,
        "num_gpus_per_worker": 0.0,
        "num_cpus_per_worker": 1,
        "fragment_length": 32,
        "to_send_queue_size": 16,
        "synchronous_sampling": True,  # craftrl: each update trains on the version it updates
        "worker_config": {
            "num_envs": 16,
            "batch_size": 8,
            "envs_per_process": 0,  # craftrl: about one env process per core
            "restart_interval": None,
            "video_fps": 20,
            "video_output_dir": "videos",
        },
        "replay_buffer_config": {
            "max_chunks": 512,
            "max_reuse": 1,
            "max_staleness": 2,
            "fragments_per_report": 40,
            "fragments_per_chunk": 1,
            "database_config": {"path": "replay_buffer", "num_shards": 8, "compression_level": 1},
        },
        "episode_statistics_config": {},
    },
    "train_config": {
        "num_workers": 0,
        "num_gpus_per_worker": 0.0,
        "num_cpus_per_worker": 2,  # craftrl: the learner's torch threads
        "num_iterations": 300,
        "vf_warmup": 0,
        "learning_rate": 5e-4,
        "anneal_lr_linearly": False,
        "weight_decay": 0.0,
        "adam_eps": 1e-5,
        "batch_size_per_gpu": 4,
        "batches_per_iteration": 8,
        "gradient_accumulation": 1,
        "epochs_per_iteration": 6,
        "minibatch_sequence_length": 1,  # craftrl: shuffled single steps for a feed-forward policy
        "whole_batch_iterations": 30,  # craftrl: whole-batch steps while kills are rare
        "context_length": 64,
        "discount": 0.99,
        "gae_lambda": 0.8,
        "ppo_clip": 0.2,
        "clip_vloss": False,
        "max_grad_norm": 0.5,
        "zero_initial_vf": True,
        "ppo_policy_coef": 1.0,
        "ppo_vf_coef": 0.5,
        "kl_divergence_coef_rho": 0.0,
        "entropy_bonus_coef": 0.01,
        "target_entropy": 1.5,  # craftrl: the bonus's weight adapts to hold this entropy
        "coef_rho_decay": 0.9995,
        "log_ratio_range": 50,
        "normalize_advantage_full_batch": True,
        "use_normalized_vf": False,  # a sparse reward: values in return units
        "advantage_std_floor": 0.1,  # craftrl: iterations without reward do not amplify value noise
        "cpu_bf16": "auto",  # craftrl: the faster learner precision on this CPU
        "num_readers": 0,
        "num_cpus_per_reader": 0.0,
        "prefetch_batches": 2,
        "save_interval": 50,
        "keep_interval": 0,
        "record_video_interval": 100,
        "enable_ref_update": False,
        "resume": None,
        "resume_optimizer": True,
        "save_path": "checkpoints",
    },
    "logger_config": {"name": "kill_cows"},
}


if __name__ == "__main__":
    from omegaconf import OmegaConf

    from craftrl import start_rolloutmanager, start_trainer

    online_cfg = OmegaConf.create(online_dict)
    start_rolloutmanager(policy_generator, env_generator, online_cfg)
    start_trainer(policy_generator, env_generator, online_cfg, whole_config=open(__file__).read())
