"""Where a rollout worker's sender thread delivers fragments.

A sink is built in the manager, pickled into the worker actor, and ``open``-ed inside the sender thread
(an LMDB writer holds handles that cannot be pickled or shared across threads). ``send`` takes the fragments
that were waiting together in the worker's send queue, oldest first, so a sink can deliver them in one call.
``retire_worker`` is the manager's: once it has replaced a worker, the sink refuses what that worker still
sends (fragments whose env id starts with the worker's prefix, ``craftrl.rollout.loop.worker_prefix``).
"""

from __future__ import annotations

from typing import Any, Protocol

from craftrl.rollout.fragment import Fragment


class FragmentSink(Protocol):
    def open(self) -> None: ...
    def send(self, fragments: list[Fragment]) -> None: ...
    def close(self) -> None: ...
    def retire_worker(self, prefix: str) -> None: ...


class ActorSink:
    """Any actor with ``add_fragment(fragment)`` and ``retire_worker(prefix)`` methods; an ``add_fragment`` call
    is awaited (that is the backpressure)."""

    def __init__(self, handle: Any):
        self.handle = handle

    def open(self) -> None:
        pass

    def send(self, fragments: list[Fragment]) -> None:
        import ray

        for fragment in fragments:
            ray.get(self.handle.add_fragment.remote(fragment))

    def close(self) -> None:
        pass

    def retire_worker(self, prefix: str) -> None:
        import ray

        ray.get(self.handle.retire_worker.remote(prefix), timeout=30)


class ReplayBufferSink:
    """The replay buffer: on the store's node the record goes straight into LMDB and only metadata to the actor;
    elsewhere the records travel to the actor through Ray's object store (see ``craftrl.replay.client``)."""

    def __init__(self, buffer_handle: Any):
        self.buffer = buffer_handle
        self._writer = None

    def open(self) -> None:
        from craftrl.replay.client import ReplayWriter

        self._writer = ReplayWriter(self.buffer)

    def send(self, fragments: list[Fragment]) -> None:
        if self._writer is None:
            self.open()
        self._writer.add_fragments(fragments)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.flush()
            self._writer.close()
            self._writer = None

    def retire_worker(self, prefix: str) -> None:
        import ray

        ray.get(self.buffer.retire_worker.remote(prefix), timeout=30)

    def __getstate__(self) -> dict[str, Any]:
        return {"buffer": self.buffer, "_writer": None}
