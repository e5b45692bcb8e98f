"""The default task: Crafter "kill cows" with a small feed-forward tile CNN, sized for a 2-core laptop.

The three names a MineStudio config module exports; keys left out of ``online_dict`` take the schema defaults
(docs/config.md). Each choice and why; the measurements behind them are in bench/notes/default_config.md.

* **Policy**: a tile encoder (a first convolution with kernel = stride = 7 sees one of Crafter's 7-pixel tiles per
  position) of 16 + 16 channels and a dense layer of 128, feed-forward: a larger policy learned no faster per env
  step and took CPU the envs needed.
* **Lock-step collection** (``synchronous_sampling``): every update trains on the policy version it updates, which
  reached 3 cows per episode in fewer env steps than collecting ahead of the learner.
* **Updates**: 1024 env steps per iteration (32 fragments of 32 steps), 6 epochs, each fragment used once; the
  first 30 iterations take whole-batch steps, which find the first cows soonest while rewards are rare, then single
  steps shuffled into 8 minibatches, which keep learning past where whole-batch runs level off; lr 5e-4.
* **Entropy held at 1.5 nats** (``target_entropy``): no bonus while the policy is more random than that, so the
  first kills are not pulled back, and a growing one below it, so the policy does not collapse onto one action.
* **Learner precision** (``cpu_bf16`` 'auto'): the first iteration times float32 and bfloat16 and keeps the faster,
  since the lock-stepped envs wait for the learner and which is faster depends on the CPU.
* **Learner threads**: 2 (``num_cpus_per_worker``): in lock-step the envs wait while the learner computes, so both
  cores are free for it.
* **Envs**: 16 acting in two groups of 8, so inference on one group overlaps stepping of the other; about one env
  process per core (``envs_per_process`` 0), so a group costs one pipe round trip instead of 8.
* **Replay reads** in the learner's own process (``num_readers`` 0): reader actors would take CPU the envs need.
* **Credit**: GAE lambda 0.8: the first kills teach sooner what led to them.
* **Storage**: zstd level 1: half the CPU of level 3 for a few % more bytes in a short FIFO replay.
* **Sparse reward** (+1 per cow): values in return units (``use_normalized_vf`` off) and an advantage std floor of
  0.1, so iterations without reward do not turn value noise into policy updates (docs/training.md).
"""


def env_generator():
    from craftrl.envs import make

    return make("crafter/cows")


def policy_generator():
    from craftrl.policies import default_policy_generator

    return default_policy_generator(encoder="tiles", channels=(16, 16), hidden_size=128, recurrent="none")


online_dict = {
    "detach_rollout_manager": False,
    "rollout_config": {
        "fragment_length": 32,
        "to_send_queue_size": 16,
        "synchronous_sampling": True,
        "worker_config": {"num_envs": 16, "batch_size": 8, "envs_per_process": 0},
        "replay_buffer_config": {"max_reuse": 1, "max_staleness": 2,
                                 "database_config": {"compression_level": 1}},
    },
    "train_config": {
        "num_iterations": 400,
        "learning_rate": 5e-4,
        "batch_size_per_gpu": 4,
        "batches_per_iteration": 8,
        "minibatch_sequence_length": 1,
        "whole_batch_iterations": 30,
        "gae_lambda": 0.8,
        "epochs_per_iteration": 6,
        "use_normalized_vf": False,
        "advantage_std_floor": 0.1,
        "cpu_bf16": "auto",
        "num_cpus_per_worker": 2,
        "num_readers": 0,
        "target_entropy": 1.5,
        "save_interval": 50,
        "keep_interval": 0,
        "record_video_interval": 100,
    },
    "logger_config": {"name": "crafter-cows"},
}
