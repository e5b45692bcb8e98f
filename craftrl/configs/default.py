"""The default task: Crafter "kill cows" with a small feed-forward tile CNN, sized for a 2-core laptop.

The same three names a MineStudio config module exports. Keys left out of ``online_dict`` take the schema
defaults (docs/config.md). Why each choice, in short (the measurements: bench/notes/default_config.md):

* **Policy**: a tile-aligned encoder (16 + 16 channels; Crafter draws 7-pixel tiles, and a first convolution
  with kernel = stride = 7 sees one tile per position) and a dense layer of 128, feed-forward, 0.19 M
  parameters. A policy 4x that size learned no faster per env step, and its inference and learner passes took
  CPU the envs needed.
* **Lock-step collection** (``synchronous_sampling``): each env cuts 2 of an iteration's 32 fragments with one
  policy version and waits for the next, so every update trains on the policy it updates. With the
  feed-forward policy and single-step minibatches below (and ``target_kl`` 0.02 in place of the entropy
  target), 3 cows per episode came after a median 85k env steps (3 seeds), where the same policy collected
  asynchronously took 113k and the LSTM policy it replaced 116k in lock-step and 139k asynchronously, in about
  the same seconds.
* **Updates**: 1024 env steps per iteration (32 fragments of 32 steps), 6 epochs, each fragment used once. The
  first 30 iterations take whole-batch steps, which find the first cows soonest while rewards are rare; then
  single steps shuffled into 8 minibatches, which keep the entropy up and climb past where whole-batch runs
  level off. lr 5e-4 suits the 48 small steps an iteration then takes. Six epochs reached 3 cows per episode
  after a median 56k env steps over 12 seeds where four took 63k on the same seeds (8 epochs no fewer), in
  about 8 % more seconds: the learner holds the lock-stepped envs longer.
* **Entropy held at 1.5 nats** (``target_entropy``; ln 17 = 2.83 is uniform): no bonus while the policy is more
  random than that, so the first kills are not pulled back, and a bonus that grows once it is less random, so
  it does not collapse onto pressing `do` where it stands. With that guard every iteration takes all its
  epochs (no ``target_kl``): 3 cows per episode after a median 65k env steps over 9 seeds, where the same
  config with ``target_kl`` 0.02 and a fixed bonus of 0.01 took 85k over 12.
* **Learner precision** (``cpu_bf16`` 'auto'): the first iteration times a forward + backward pass in float32
  and in bfloat16 and keeps the faster, since the lock-stepped envs wait for the learner. Which is faster
  depends on the CPU, not only on its instruction set: on an AMD EPYC with avx512_bf16 bf16 halved the
  learner's time (bench/notes/crafter_score.md), on an Intel Xeon with avx512_bf16 and no AMX float32 is
  faster (0.42 against 0.59 s per iteration on the 2 threads below, BENCHMARKS.md).
* **Learner threads**: 2 (``num_cpus_per_worker``; in the driver, outside Ray's accounting). In lock-step
  the envs wait while the learner computes, so both cores are free for it: its compute took 0.38-0.41 instead
  of 0.54-0.56 s per iteration on an Intel Xeon without AMX, 11 % more env steps/s end to end.
* **Envs**: 16, acting in two groups of 8 so that inference on one overlaps stepping of the other;
  ``envs_per_process`` 0 puts about one env process on each core (two of 8 envs on 2 cores), so a group costs
  one pipe round trip instead of 8. A send queue of 16 keeps the worker from waiting when a group's fragments
  end together.
* **Replay reads** in the learner's own process (``num_readers`` 0): reader actors cost about a tenth of 2
  cores. A train worker on another node than the store reads through one reader actor instead.
* **Credit**: GAE lambda 0.8; the first kills teach sooner what led to them (no aggregate was worse than 0.95).
* **Storage**: zstd level 1, half the CPU of level 3 for 8 % more bytes in a short FIFO replay.
* **Sparse reward** (+1 per cow): values in return units (``use_normalized_vf`` off) and an advantage std floor
  of 0.1, so iterations without reward do not turn value noise into policy updates (docs/training.md).
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
