"""The registered Crafter tasks."""

from __future__ import annotations

from craftrl.envs.crafter.callbacks import JudgeResetCallback, RewardsCallback, SummonMobsCallback
from craftrl.envs.crafter.sim import CrafterSim


def make_cows(obs_size: tuple[int, int] = (64, 64), seed: int | None = None, num_cows: int = 10,
              cow_range: int = 5, time_limit: int = 600, max_reward_times: int = 30,
              extra_callbacks: tuple = (), semantic_map: bool = False) -> CrafterSim:
    """The MineStudio quick-start task on Crafter: kill as many of the summoned cows as possible.

    10 cows within ±5 tiles at reset, +1 per increase of ``eat_cow`` (every kill, not just the first),
    600-step cap reported as truncation, Crafter's deaths kept as termination, 64×64 observations.
    """
    return CrafterSim(
        obs_size=obs_size,
        seed=seed,
        semantic_map=semantic_map,
        task_metrics=("cows_killed",),
        callbacks=[
            SummonMobsCallback([{"name": "cow", "number": num_cows,
                                 "range_x": [-cow_range, cow_range], "range_z": [-cow_range, cow_range]}]),
            RewardsCallback([{"event": "kill_entity", "objects": ["cow"], "reward": 1.0,
                              "identity": "kill_cow", "max_reward_times": max_reward_times}]),
            JudgeResetCallback(time_limit),
            *extra_callbacks,
        ],
    )


def make_score(obs_size: tuple[int, int] = (64, 64), seed: int | None = None, length: int = 10000,
               semantic_map: bool = False) -> CrafterSim:
    """The full Crafter game with Crafter's own reward (the Crafter-score benchmark setting).

    ``info["achievements"]`` holds the per-episode counters; an achievement counts as unlocked in an
    episode when its counter in the final step's info is above zero.
    """
    return CrafterSim(obs_size=obs_size, seed=seed, length=length, semantic_map=semantic_map)


