"""The Crafter-score setting (P6) on 2 CPU cores: the full game (``crafter/score``) with Moon et al.'s PPO
settings (``craftrl.configs.crafter_resnet``) and a wide tile-encoder policy that a CPU can train.

The benchmark protocol of the Crafter paper is 1M env steps; ``bench/crafter_score.py`` stops the run there
and scores every episode that finished within them from the run's ``episodes.jsonl``. This config scored
13.0 % (3 seeds, on 2 cores of an AMD EPYC in bf16 and of an Intel Xeon without AMX in float32 alike,
26 and 35-42 minutes each; the Crafter paper's PPO 4.6 %, Moon et al.'s 15.6 %).

* **Policy**: feed-forward; the tile encoder (one convolution per 7-pixel tile, then one over each tile's
  neighbours) at 64 + 128 channels, 256 features, then the 1024-wide layer both heads read, with Moon et al.'s
  norms (``encoder_norm``; with a rollout paced one iteration ahead, 12.2 % with them and 11.6 % without,
  lower on each of the 3 seeds). 3.0 M parameters but ~10 M multiply-adds per frame, 1/50 of their Impala
  CNN's, so 2 cores train it through 1M env steps in under half an hour. Width is what lifts the score: the
  cows default's tile policy (16 + 16 channels, LSTM 128) scored 6.9 % with the same discount and lambda, and a
  quarter-width Impala CNN with Moon et al.'s norms scored like it; 96 + 192 channels scored like 64 + 128 at
  440k env steps for 1.6x the learner's time (bench/notes/crafter_score.md).
* **Updates and credit**: ``crafter_resnet``'s: 4096 env steps per iteration, 3 epochs of 8 minibatches of 512
  shuffled single steps, lr 3e-4, a normalised value, discount 0.95, GAE lambda 0.65.
* **Rollout**: 16 envs in two groups of 8, in lock-step with the learner (``synchronous_sampling``): each env
  cuts 2 of the iteration's 32 fragments with one policy version, then waits for the next, so every iteration
  trains on data of the version it updates, as Moon et al.'s PPO does, and every env step the score counts
  is one the learner trained on. On 2 cores this costs no throughput (the learner, alone on the cores, takes
  3.6 s per iteration instead of 7.3 s beside the envs) and scores higher than a rollout paced one iteration
  ahead: 13.0 % against 12.2 % at 1M env steps (3 seeds each, higher on each seed).
* **Learner threads**: 2 (``num_cpus_per_worker``; the learner runs in the driver, outside Ray's accounting).
  In lock-step the envs wait while the learner computes, so both cores are free for it: on an Intel Xeon
  without AMX its compute went from 8.4 to 5.2 s per iteration and the run from 335 to 459 env steps/s.
* **Learner precision** (``cpu_bf16`` 'auto', timed on the first iteration): bf16 halved the learner's time on
  an AMD EPYC with avx512_bf16 (3.5 against 6.5 s per iteration) and on an Intel Xeon with AMX (2.7 against
  5.5 s on 2 threads; 1M env steps in 24-27 minutes); on an Intel Xeon with avx512_bf16 and no AMX it took 11.7 s
  against float32's 9.0 s. The score was the same in either precision.
"""

import copy

from craftrl.configs import crafter_resnet as _moon_et_al

env_generator = _moon_et_al.env_generator


def policy_generator():
    from craftrl.policies import default_policy_generator

    return default_policy_generator(encoder="tiles", channels=(64, 128), encoder_features=256, hidden_size=1024,
                                    recurrent="none", encoder_norm=True)


online_dict = copy.deepcopy(_moon_et_al.online_dict)
online_dict["rollout_config"].update({
    "num_gpus_per_worker": 0.0,
    "synchronous_sampling": True,
    "worker_config": {"num_envs": 16, "batch_size": 8, "envs_per_process": 0},
})
online_dict["train_config"].update({"num_gpus_per_worker": 0.0, "num_cpus_per_worker": 2, "cpu_bf16": "auto"})
online_dict["logger_config"]["name"] = "crafter-score"
