"""Crafter, the embedded default environment: ``CrafterSim`` plus MineStudio-style callbacks."""

from craftrl.envs.crafter.callbacks import (
    CrafterCallback,
    GiveItemsCallback,
    JudgeResetCallback,
    MaskActionsCallback,
    RewardsCallback,
    SummonMobsCallback,
)
from craftrl.envs.crafter.sim import CrafterSim
from craftrl.envs.crafter.tasks import make_cows, make_score

__all__ = [
    "CrafterCallback",
    "CrafterSim",
    "GiveItemsCallback",
    "JudgeResetCallback",
    "MaskActionsCallback",
    "RewardsCallback",
    "SummonMobsCallback",
    "make_cows",
    "make_score",
]
