"""The Crafter score on 2 CPU cores: the full game (``crafter/score``) with Moon et al.'s PPO settings
(``craftrl.configs.crafter_resnet``) and a wide tile-encoder policy that a CPU can train through 1M env steps.

``bench/crafter_score.py`` runs it for the Crafter paper's 1M env steps and scores every episode that finished
within them. Each choice and why; the measurements behind them are in bench/notes/crafter_score.md.

* **Policy**: feed-forward; the tile encoder at 64 + 128 channels, 256 features, a 1024-wide layer both heads read,
  with Moon et al.'s norms (``encoder_norm``). It costs a fiftieth of their Impala CNN's multiply-adds per frame,
  and width is what lifted the score: the cows default's narrow tile policy scored about half, while wider tiles
  still (96 + 192), a pixel-level convolution before the tiles or an LSTM core scored lower per env step, at about half
  the speed or less.
* **Updates and credit**: ``crafter_resnet``'s: 4096 env steps per iteration, 3 epochs of 8 minibatches of 512
  shuffled single steps, lr 3e-4, a normalised value, discount 0.95, GAE lambda 0.65.
* **Rollout**: 16 envs in two groups of 8, in lock-step with the learner (``synchronous_sampling``), as Moon et al.'s
  PPO collects: every env step the score counts is one the learner trained on, and on a few cores it costs no
  throughput, since the learner alone on the cores runs faster than beside the envs.
* **Learner threads**: 2 (``num_cpus_per_worker``): in lock-step the envs wait while the learner computes.
* **Learner precision** (``cpu_bf16`` 'auto', timed on the first iteration): bfloat16 is much faster on some CPUs
  and slower on others; the score was the same in either.
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
