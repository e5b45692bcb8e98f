"""Environments: the env contract, supervised env processes (``EnvPool``), Crafter tasks, Minecraft adapter.

Importing this package imports no game; ``make("crafter/cows")`` imports Crafter on first use.
"""

from craftrl.envs.contract import ContractError, Env, check_reset_result, check_step_result
from craftrl.envs.pool import EnvPool, EnvPoolError, EnvResult, EpisodeSummary
from craftrl.envs.registry import env_generator, make, register, registered

__all__ = [
    "ContractError",
    "Env",
    "EnvPool",
    "EnvPoolError",
    "EnvResult",
    "EpisodeSummary",
    "check_reset_result",
    "check_step_result",
    "env_generator",
    "make",
    "register",
    "registered",
]
