"""The Crafter-score setting: the full game (``crafter/score``) with the default task's policy and PPO settings
(but for their minibatching and learning rate, see below).

The benchmark protocol of the Crafter paper is 1M env steps; ``bench/crafter_score.py`` stops the run there
and scores every episode that finished within them from the run's ``episodes.jsonl``. Crafter's own reward
(+1 per first unlock, ±0.1 per health point) is sparse like the cows task's, so the same sparse-reward
settings apply (docs/training.md, "Sparse rewards").
"""

import copy

from craftrl.configs.default import online_dict as _default_online_dict
from craftrl.configs.default import policy_generator  # noqa: F401  (a config module exports all three names)


def env_generator():
    from craftrl.envs import make

    return make("crafter/score")


online_dict = copy.deepcopy(_default_online_dict)
online_dict["train_config"]["num_iterations"] = 1000  # ~1M env steps at 1024 per iteration
# The minibatching and learning rate that scored 5.3 % (BENCHMARKS.md, P6): 8 minibatches of 2 fragments at
# lr 5e-4. The cows default moved to one whole-batch minibatch and lr 7e-4 afterwards; neither has been measured
# on the full game, so the score stays reproducible with the settings that produced it.
online_dict["train_config"]["learning_rate"] = 5e-4
online_dict["train_config"]["batch_size_per_gpu"] = 2
online_dict["train_config"]["batches_per_iteration"] = 8
online_dict["train_config"]["record_video_interval"] = 250
online_dict["logger_config"]["name"] = "crafter-score"
