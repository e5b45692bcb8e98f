"""Starting the rollout side of a run: replay buffer, episode statistics and the rollout manager.

All three are named actors on the driver's node (:mod:`craftrl.system`), so the trainer (and a user's shell) can
find them. They share one lifetime: detached when ``detach_rollout_manager`` (they outlive the driver), otherwise
tied to it. Ray restarts each of them when its process dies (the replay buffer recovers its index from its journal;
the manager starts new workers; the statistics start over), so the run goes on. Starting replaces any previous
run's actors of the same names, deliberately: MineStudio reused a manager but crashed on the replay buffer that was
still registered, and left the old env processes running.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Callable

from craftrl.config.loading import config_to_dict
from craftrl.config.schema import OnlineConfig
from craftrl.replay.actor import start_replay_buffer
from craftrl.replay.config import buffer_settings_from
from craftrl.rollout.manager import RolloutManager
from craftrl.rollout.episode_stats import EpisodeStatistics
from craftrl.system import EPISODE_STATISTICS, REPLAY_BUFFER, ROLLOUT_MANAGER, find, on_home_node

# A named actor that is not detached is destroyed when its creator drops the last handle, even while
# other actors still use it through handles nested in their arguments. The driver keeps them here.
_LIVE: list["RolloutHandles"] = []

REPLAY_FINAL_S = 10.0  # the replay buffer's final flush and accounting, even after a slow manager stop
logger = logging.getLogger(__name__)


@dataclass
class RolloutHandles:
    manager: Any
    replay: Any
    statistics: Any


def stop_rollout_system(timeout: float = 75.0) -> dict[str, float] | None:
    """Stop and remove the named rollout actors if they exist (their env processes die with them).

    Workers stop first and deliver the fragments they already cut, so the replay buffer's final accounting
    covers everything. Returns the run's fragment accounting (rollout and replay counters together, plus
    ``stop/<actor>_s``: how long each actor took to stop), or None when no rollout system was running.

    ``timeout`` bounds the whole stop, not each actor: a user who pressed Ctrl-C waits for all of them
    together, and an actor that does not answer in its share is killed all the same.
    """
    import ray

    accounting: dict[str, float] = {}
    deadline = time.monotonic() + timeout
    handles = {name: find(name) for name in (ROLLOUT_MANAGER, EPISODE_STATISTICS, REPLAY_BUFFER)}
    handles = {name: handle for name, handle in handles.items() if handle is not None}
    if REPLAY_BUFFER in handles:  # paced writers are answered from now on, so workers can deliver what they hold
        try:
            ray.get(handles[REPLAY_BUFFER].release_writers.remote(), timeout=REPLAY_FINAL_S)
        except Exception as error:
            logger.warning("the replay buffer did not release its writers: %s", error)
    for name, handle in handles.items():
        started = time.monotonic()
        # the replay buffer's last flush and accounting always get a few seconds, whatever the manager took
        remaining = max(deadline - started, REPLAY_FINAL_S if name == REPLAY_BUFFER else 1.0)
        try:
            if name == ROLLOUT_MANAGER:
                # workers get the manager's share minus the time to collect their answers
                totals = ray.get(handle.shutdown.remote(timeout=max(remaining - 10.0, 1.0)), timeout=remaining)
                accounting.update({f"rollout/{key}": value for key, value in totals.items()})
            elif name == REPLAY_BUFFER:
                ray.get(handle.flush_deletes.remote(), timeout=remaining)
                accounting.update({f"replay/{k}": float(v) for k, v in ray.get(handle.accounting.remote(),
                                                                               timeout=remaining).items()})
        except Exception as error:  # a broken actor is killed all the same
            logger.warning("%s did not shut down cleanly: %s", name, error)
        ray.kill(handle, no_restart=True)
        accounting[f"stop/{name}_s"] = time.monotonic() - started
    # Only now: the driver's own handles are what keep non-detached actors alive (one looked up by name
    # does not), and a manager killed by dropping them never stops its workers -- nor counts their fragments.
    _LIVE.clear()
    if accounting:
        logger.info("fragment accounting: %s", format_accounting(accounting))
    return accounting if handles else None


def format_stop_times(accounting: dict[str, float]) -> str:
    """``rollout_manager 3.1 s, episode_statistics 0.0 s, replay_buffer 0.4 s``: where a stop spent its time."""
    return ", ".join(f"{key[len('stop/'):-len('_s')]} {value:.1f} s" for key, value in accounting.items()
                     if key.startswith("stop/"))


def format_accounting(counts: dict[str, float]) -> str:
    """One line a person can check: where every fragment the rollout workers cut ended up."""
    def get(key: str) -> int:
        return int(counts.get(key, 0))

    removed = {key.removeprefix("replay/removed_"): int(value) for key, value in counts.items()
               if key.startswith("replay/removed_") and value}
    return (f"emitted {get('rollout/fragments_emitted')} = sent {get('rollout/fragments_sent')} + discarded as "
            f"stale {get('rollout/fragments_discarded_stale')} + dropped at stop "
            f"{get('rollout/fragments_dropped')} + unsent by replaced workers "
            f"{get('rollout/fragments_unsent_by_replaced_workers')} + lost with dead nodes "
            f"{get('rollout/fragments_lost_with_dead_nodes')}; replay registered {get('replay/added')} "
            f"(+{get('replay/duplicate_registrations')} repeats ignored) = in chunks {get('replay/in_chunks')} + "
            f"in open chunks {get('replay/in_open_chunks')} + removed {removed}; unaccounted "
            f"{get('replay/unaccounted')}; buffer restarts {get('replay/restarts')}")


def start_rollout_system(policy_generator: Callable[[], Any], env_generator: Callable[[], Any],
                         config: OnlineConfig) -> RolloutHandles:
    import ray

    stop_rollout_system()
    lifetime = "detached" if config.detach_rollout_manager else None
    buffer_cfg = config.rollout_config.replay_buffer_config
    home = on_home_node()
    replay = start_replay_buffer(buffer_settings_from(buffer_cfg, seed=config.seed), name=REPLAY_BUFFER,
                                 lifetime=lifetime, **home)
    moving_window = config.rollout_config.episode_statistics_config.moving_window
    restart = {"max_restarts": -1, "max_task_retries": -1}
    statistics = ray.remote(EpisodeStatistics).options(name=EPISODE_STATISTICS, num_cpus=0, lifetime=lifetime,
                                                       **restart, **home).remote(moving_window)
    manager = ray.remote(RolloutManager).options(name=ROLLOUT_MANAGER, num_cpus=0, max_concurrency=8,
                                                 lifetime=lifetime, **restart, **home).remote(
        env_generator, policy_generator, config_to_dict(config))
    ray.get(manager.start.remote())
    handles = RolloutHandles(manager, replay, statistics)
    _LIVE.append(handles)
    return handles
