"""The run's system actors: their names, the node they run on, and how any process finds them.

A run has four named actors besides its rollout workers and train workers: the replay buffer (with its reader
actors), the rollout manager, the episode statistics and the metrics sink. They all run on the **home node**,
the node of the driver that started the run, pinned there with a hard node affinity. Ray would otherwise place
each wherever it found room (they ask for no CPU), and then the replay store, ``metrics.jsonl``, TensorBoard
files and checkpoints would land on the disk of whichever node that happened to be. Pinned, they are on the
driver's disk on any cluster; only rollout workers and train workers go where ``resources_per_worker`` sends them.

The replay store is written and read on the home node only: rollout workers elsewhere send their encoded
fragments through Ray's object store (:mod:`craftrl.replay.client`), and reader actors run beside the buffer.
"""

from __future__ import annotations

from typing import Any

REPLAY_BUFFER = "replay_buffer"
ROLLOUT_MANAGER = "rollout_manager"
EPISODE_STATISTICS = "episode_statistics"
METRICS = "metrics"
SYSTEM_ACTORS = (ROLLOUT_MANAGER, EPISODE_STATISTICS, REPLAY_BUFFER, METRICS)


def current_node_id() -> str | None:
    """The Ray node this process runs on, or None outside Ray."""
    import ray

    return ray.get_runtime_context().get_node_id() if ray.is_initialized() else None


def on_node(node_id: str) -> dict[str, Any]:
    """Actor options that start it on ``node_id`` and nowhere else (it fails rather than move elsewhere)."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return {"scheduling_strategy": NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)}


def on_home_node() -> dict[str, Any]:
    """Actor options for a system actor started by the driver: pinned to the driver's node."""
    node_id = current_node_id()
    if node_id is None:
        raise RuntimeError("system actors are started from a process connected to Ray (ray.init first)")
    return on_node(node_id)


def restarted_by_ray() -> bool:
    """True in an actor process Ray started to replace a dead one (False outside Ray, e.g. in tests)."""
    import warnings

    import ray

    if not ray.is_initialized():
        return False
    with warnings.catch_warnings():  # Ray's own property reads its deprecated ``actor_id``: not ours to show
        warnings.simplefilter("ignore", DeprecationWarning)
        return bool(ray.get_runtime_context().was_current_actor_reconstructed)


def actor_placed(handle: Any) -> bool | None:
    """Whether Ray has given the actor a worker process on a node (its constructor may still run); None where
    Ray does not say. Read from the GCS actor table, which needs no dashboard (Ray's state API does)."""
    try:
        from ray._private.state import state

        entry = state.actor_table(handle._actor_id.hex())
        return bool(entry["Address"]["Port"])
    except Exception:
        return None


def find(name: str) -> Any:
    """The handle of the named system actor, or None when it is not running."""
    import ray

    try:
        return ray.get_actor(name)
    except ValueError:
        return None
