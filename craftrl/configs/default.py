"""The default task: Crafter "kill cows" with the default recurrent CNN, sized for a 2-core laptop.

The same three names a MineStudio config module exports. Keys left out of ``online_dict`` take the schema
defaults (docs/config.md). Choices, each measured on 2 cores (BENCHMARKS.md, "Learning on the default task"):

* a tile-aligned encoder with 16 + 16 channels and an LSTM of 128 (0.32 M parameters): Crafter draws its frame
  in 7-pixel tiles, and a first convolution with kernel = stride = 7 sees one tile per position
  (docs/policies.md). It replaced the same encoder at 32 + 32 channels with an LSTM of 256 (1.27 M), whose
  learner pass costs 2.5x more and whose inference costs 2.2x more; on a 2-core CPU without bf16 that CPU goes
  back to the envs: 391-453 against 301-342 env steps/s end to end, and 3 cows per episode after 273-463 s
  (median 313 s, seeds 0-3) where the larger policy took 296-423 s on 2 of 4 seeds and did not get there within
  9 minutes on the other 2 (bench/notes/learning.md, ninth and tenth sessions). Env steps to 3 cows stayed
  within the larger policy's spread (121-181k). Its 20-minute runs there at lambda 0.95 (seeds 0-2): 3 cows
  after 364-387 s, 6.5-7.4 cows at 10 minutes and 8.0-8.3 at 20, 414-416 env steps/s;
* whole-batch PPO updates first, then small ones: 1024 env steps per iteration (32 fragments x 32 steps),
  4 epochs, each fragment used in one iteration only (``max_reuse`` 1). For the first 30 iterations each epoch
  is one optimiser step over all 1024 steps, which finds the first cows soonest while rewards are rare; after
  them the fragments are cut into 16-step sequences shuffled into 8 minibatches (up to 32 steps per
  iteration), which keeps the policy's entropy up and climbs past the 1.5-2 cows per episode where whole-batch
  runs level off. With ``target_kl`` bounding each iteration the switch no longer costs the stall it did, and
  30 iterations instead of 60 reached 3 cows after 118k / 113k env steps on a first A/B pair (60: 145k / 167k);
  over all 15 runs of this learning config the median is 155k (113-215k), so the gain over 60 is not
  established. With the larger policy on a faster machine with bf16: one env per process, 3 cows after
  194-300 s in 20-minute runs (3 seeds) and 9.55-10.1 cows at 20 minutes (median over 5 seeds 231 s); with the
  envs per process below, 183-259 s, median 209 s over the same 5 seeds;
* lr 5e-4 (with 32 small steps per iteration the KL per iteration is already 0.02-0.05);
* the learner's passes in bfloat16 (``cpu_bf16``) where the CPU has native bf16 instructions, float32 elsewhere
  (1.3x less learner compute per iteration, CPU that goes back to the envs on 2 cores), and ``target_kl`` 0.02,
  which ends an iteration's epochs once the policy has moved a KL of 0.03 (in the minibatch phase it otherwise
  moved 0.03-0.06 per iteration, with clip fractions of 0.3-0.45). Together, seeds 0 / 1: 3 cows per episode
  after 227 / 252 s and 7.5 / 8.7 cows at 10 minutes, against 292 / 261 s and 6.6 / 5.85 without them, on the
  same machine (the larger policy, on the faster machine; bench/notes/learning.md);
* 16 envs stepped in two groups of 8, so inference on one group overlaps stepping of the other, with
  ``envs_per_process`` 0: the worker puts about one env process on each core (on 2 cores, two processes of
  8 envs, one per group), so a group costs one pipe round trip instead of 8 -- each round trip costs about
  as much CPU as a Crafter step (bench/results/env_throughput.md). On a larger machine the same config gives
  each env its own process. Against 8 envs in groups of 4 (the default until the twelfth session): the
  sampler alone ran 0.67 of the raw env speed instead of 0.52 (``bench/sampler.py``), and inference cost less
  per step. With 64-step fragments, 16 envs ran 457-474 env steps/s end to end against 375-381 for 8 envs in
  the same session, but their data was staler (a fragment took twice as long to fill) and 3 cows took
  143-168k env steps (4 seeds) against 106-149k: 309-355 s against 283-391 s. Fragments of 32 steps (32 per
  iteration, ``context_length`` 32) keep each fragment's fill time that of 8 envs, and a send queue of 16
  (one per env) stops the worker waiting on its sender when a group's 8 fragments end together:
  519-667 env steps/s and 3 cows after 200 / 222 / 261 / 289 / 323 / 338 s over 6 runs (median 275 s;
  120-162k env steps, median 137k), 7.3-8.65 cows at 10 minutes and 9.7 at 20 in one 20-minute run
  (bench/notes/learning.md, twelfth session);
* the learner reads its fragments from the replay store in its own process (``num_readers`` 0) rather than
  through two reader actors, whose processes and Ray object transfers cost about 0.1 of the 2 cores: in two
  A/B runs (seeds 0 / 1) replay and readers went from 0.135 to 0.062 cores and Ray's own processes from 0.105
  to 0.072, and the runs reached 596 / 642 env steps/s and 3 cows after 212 / 207 s, against 522 / 601 env
  steps/s and 236 / 277 s with reader actors (bench/notes/learning.md, thirteenth session). A train worker on
  another node than the replay buffer reads through one reader actor instead, so the config runs unchanged
  on a cluster;
* GAE lambda 0.8 instead of 0.95: with a shorter credit horizon the first kills teach sooner what led to them. On
  the slow machine (bench/notes/learning.md, eleventh session) 7 runs reached 2 cows after a median 90k env steps
  and 3 cows after 120-236k (median 139k, 345 s), 8.2 / 8.8 / 5.05 / 8.5 cows at 10 minutes and, in the one
  20-minute run, 10.1 at 20, where the 9 runs at 0.95 took 121k to more than 237k (median 148k), and its three
  20-minute runs stood at 6.5-7.4 at 10 minutes and 8.0-8.3 at 20. Not a significant difference over so few runs,
  but no aggregate was worse. Low lambdas had levelled off at 1.5-2 cows under whole-batch updates (third
  session); with the minibatch phase and ``target_kl`` they kept climbing (lambda 0.65, two runs: 3 cows after
  117k and 137k);
* zstd level 1 for stored fragments instead of 3: on fragments of a training run of this task, level 3 took
  2.6 ms per 32-step fragment for 23 % of the raw bytes, level 1 1.4 ms for 25 % (they compress less well
  than the 256-step random-action fragments of ``bench/replay_bytes.py``, 9 % at level 3). The rollout worker
  encodes every fragment and the replay is a short FIFO, so its CPU matters more than 8 % more bytes;
* for a sparse +1-per-cow reward: raw-return values (``use_normalized_vf`` off) and an advantage std floor of 0.1,
  so iterations without any reward do not turn value noise into policy updates (docs/training.md, "Sparse rewards").
"""


def env_generator():
    from craftrl.envs import make

    return make("crafter/cows")


def policy_generator():
    from craftrl.policies import default_policy_generator

    return default_policy_generator(encoder="tiles", channels=(16, 16), hidden_size=128, recurrent="lstm")


online_dict = {
    "detach_rollout_manager": False,
    "rollout_config": {
        "fragment_length": 32,
        "to_send_queue_size": 16,
        "worker_config": {"num_envs": 16, "batch_size": 8, "envs_per_process": 0},
        "replay_buffer_config": {"max_reuse": 1, "max_staleness": 2,
                                 "database_config": {"compression_level": 1}},
    },
    "train_config": {
        "num_iterations": 400,
        "learning_rate": 5e-4,
        "batch_size_per_gpu": 4,
        "batches_per_iteration": 8,
        "minibatch_window": 16,
        "whole_batch_iterations": 30,
        "gae_lambda": 0.8,
        "epochs_per_iteration": 4,
        "context_length": 32,
        "use_normalized_vf": False,
        "advantage_std_floor": 0.1,
        "cpu_bf16": True,
        "num_readers": 0,
        "target_kl": 0.02,
        "save_interval": 50,
        "keep_interval": 0,
        "record_video_interval": 100,
    },
    "logger_config": {"name": "crafter-cows"},
}
