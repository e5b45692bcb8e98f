"""How a run's actors are built and wired: which actors, on which node, and who finds whom.

- ``metrics``: started by the driver (:func:`start_metrics_sink`) on the home node; found by trainer rank 0 and
  by rollout workers that deliver videos.
- ``replay_buffer``, ``episode_statistics``, ``rollout_manager``: started by the driver
  (:func:`start_rollout_system`) on the home node; the manager finds the first two, the trainer all three.
- rollout workers: started by the rollout manager, on nodes with ``rollout_config.resources_per_worker``; the
  manager hands each the replay buffer and episode statistics.
- reader actors: started by each train worker (:class:`craftrl.replay.reader.ReaderPool`) on the home node, beside
  the buffer whose store they read.
- train workers: started by Ray Train (:func:`craftrl.train.trainer.run_trainer`), on nodes with
  ``train_config.resources_per_worker``.

The **home node** is the node of the driver that started the run. The four named actors are pinned there with a
hard node affinity: Ray would otherwise place each wherever it found room (they ask for no CPU), and the replay
store, ``metrics.jsonl``, TensorBoard files and checkpoints would land on whichever node that happened to be.
Rollout workers and train workers go where their ``resources_per_worker`` sends them; rollout workers elsewhere
send their encoded fragments to the buffer through Ray's object store (:mod:`craftrl.replay.client`).

The named actors find each other by name (:func:`connect`), not through handles passed at creation: Ray
restarts each of them when its process dies, and cannot promise a restarted actor the handles its creation
received (ray#53727). This module is the one place that looks a name up. The rollout side's three actors share
one lifetime: detached with ``detach_rollout_manager`` (they outlive the driver, as in MineStudio), otherwise tied
to it. Starting replaces a previous run's actors of the same names: MineStudio reused a manager but crashed on the
replay buffer that was still registered, and left the old env processes running.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Callable

from craftrl.config.loading import config_to_dict
from craftrl.config.schema import OnlineConfig
from craftrl.placement import on_home_node

REPLAY_BUFFER = "replay_buffer"
ROLLOUT_MANAGER = "rollout_manager"
EPISODE_STATISTICS = "episode_statistics"
METRICS = "metrics"
REPLAY_FINAL_S = 10.0  # the replay buffer's final flush and accounting, even after a slow manager stop
logger = logging.getLogger(__name__)

# A named actor that is not detached is destroyed when its creator drops the last handle, even while other
# actors still use it through handles they looked up. The driver keeps its handles here, by name, until it stops them.
_STARTED: dict[str, Any] = {}


def find(name: str) -> Any:
    """The handle of the named actor, or None when it is not running."""
    import ray

    try:
        return ray.get_actor(name)
    except ValueError:
        return None


@dataclass
class SystemActors:
    """Handles of a run's named actors; None for one that is not running."""

    manager: Any = None
    replay: Any = None
    statistics: Any = None
    metrics: Any = None


def connect() -> SystemActors:
    """Look up the run's named actors: how the manager, the rollout workers and the trainer find them."""
    return SystemActors(manager=find(ROLLOUT_MANAGER), replay=find(REPLAY_BUFFER),
                        statistics=find(EPISODE_STATISTICS), metrics=find(METRICS))


def start_metrics_sink(run_dir: str, config: OnlineConfig) -> Any:
    """Start the named ``metrics`` actor every component logs to (metrics.jsonl, TensorBoard, wandb)."""
    import ray

    from craftrl.metrics import MetricsSink, wandb_environment

    options: dict[str, Any] = {"name": METRICS, "num_cpus": 0, **on_home_node()}
    forwarded = wandb_environment() if config.logger_config.project else {}
    if forwarded:  # wandb runs in the actor: it gets the driver's wandb settings, wherever Ray started it
        options["runtime_env"] = {"env_vars": forwarded}
    sink = ray.remote(MetricsSink).options(**options).remote(run_dir, config.logger_config, config_to_dict(config))
    ray.get(sink.ready.remote())  # surfaces a sink start-up error (e.g. wandb) here
    _STARTED[METRICS] = sink
    return sink


def start_rollout_system(policy_generator: Callable[[], Any], env_generator: Callable[[], Any],
                         config: OnlineConfig) -> SystemActors:
    """Start the replay buffer, the episode statistics and the rollout manager (which starts its workers), after
    stopping those of an earlier start."""
    import ray

    from craftrl.replay.actor import start_replay_buffer
    from craftrl.replay.config import buffer_settings_from
    from craftrl.rollout.episode_stats import EpisodeStatistics
    from craftrl.rollout.manager import RolloutManager

    stop_rollout_system()
    home = on_home_node()
    lifetime = "detached" if config.detach_rollout_manager else None
    restart = {"max_restarts": -1, "max_task_retries": -1}
    replay = start_replay_buffer(buffer_settings_from(config.rollout_config.replay_buffer_config, seed=config.seed),
                                 name=REPLAY_BUFFER, lifetime=lifetime, **home)
    statistics = ray.remote(EpisodeStatistics).options(name=EPISODE_STATISTICS, num_cpus=0, lifetime=lifetime,
                                                       **restart, **home).remote(
        config.rollout_config.episode_statistics_config.moving_window)
    manager = ray.remote(RolloutManager).options(name=ROLLOUT_MANAGER, num_cpus=0, max_concurrency=8,
                                                 lifetime=lifetime, **restart, **home).remote(
        env_generator, policy_generator, config_to_dict(config))
    ray.get(manager.start.remote())
    actors = SystemActors(manager=manager, replay=replay, statistics=statistics, metrics=find(METRICS))
    _STARTED.update({ROLLOUT_MANAGER: manager, REPLAY_BUFFER: replay, EPISODE_STATISTICS: statistics})
    return actors


def stop_rollout_system(timeout: float = 75.0) -> dict[str, float] | None:
    """Stop and remove the rollout side's named actors if they exist (their env processes die with them).

    Workers stop first and deliver the fragments they already cut, so the replay buffer's final accounting
    covers everything. Returns the run's fragment accounting (rollout and replay counters together, plus
    ``stop/<actor>_s``: how long each actor took to stop), or None when no rollout side was running.

    ``timeout`` bounds the whole stop, not each actor: a user who pressed Ctrl-C waits for all of them
    together, and an actor that does not answer in its share is killed all the same.
    """
    import ray

    accounting: dict[str, float] = {}
    deadline = time.monotonic() + timeout
    handles = {name: find(name) for name in (ROLLOUT_MANAGER, EPISODE_STATISTICS, REPLAY_BUFFER)}
    handles = {name: handle for name, handle in handles.items() if handle is not None}
    replay_died = False  # named once, in one line: the run's own error line says why, when it stopped for it
    if REPLAY_BUFFER in handles:  # paced workers are answered from now on, so they can deliver what they hold
        try:
            ray.get(handles[REPLAY_BUFFER].release_workers.remote(), timeout=REPLAY_FINAL_S)
        except ray.exceptions.ActorDiedError as error:  # for good: one restarting (unavailable) gets its flush
            replay_died = True
            logger.warning("%s had died: %s", REPLAY_BUFFER, _last_line(error))
        except Exception as error:
            logger.warning("the replay buffer did not release its paced rollout workers: %s", _last_line(error))
    for name, handle in handles.items():
        started = time.monotonic()
        if name == REPLAY_BUFFER and replay_died:
            ray.kill(handle, no_restart=True)
            continue
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
            logger.warning("%s did not shut down cleanly: %s", name, _last_line(error))
        ray.kill(handle, no_restart=True)
        accounting[f"stop/{name}_s"] = time.monotonic() - started
    # Only now: the driver's own handles are what keep non-detached actors alive (one looked up by name
    # does not), and a manager killed by dropping them never stops its workers -- nor counts their fragments.
    for name in (ROLLOUT_MANAGER, EPISODE_STATISTICS, REPLAY_BUFFER):
        _STARTED.pop(name, None)
    if accounting:
        logger.info("fragment accounting: %s", format_accounting(accounting))
    return accounting if handles else None


def _last_line(error: BaseException) -> str:
    """An actor's error in one line: Ray's text for a dead actor ends with the exception that killed it."""
    lines = [line for line in str(error).splitlines() if line.strip()]
    return lines[-1].strip() if lines else type(error).__name__


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
