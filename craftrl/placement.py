"""Where an actor runs: the node of this process, options that pin an actor to a node, and what Ray says of one."""

from __future__ import annotations

from typing import Any


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
