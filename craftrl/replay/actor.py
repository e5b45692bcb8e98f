"""The named Ray actor that owns the buffer's index: a thin async shell around :class:`ReplayIndex`.

Rollout workers on the store's node put records into the LMDB store themselves and send only
:class:`FragmentMeta`; workers on other nodes send the encoded records along (``write_fragments``), which the actor
stores on a background thread before registering them. Readers get :class:`ChunkDescriptor` ids and read the store
themselves. The actor does the bookkeeping, waits for enough fresh chunks, and deletes records that nobody will
read again, also on a background thread, so the event loop never blocks on disk (MineStudio deleted
synchronously in ``__del__``).

At start it clears the store at ``database_config.path`` (see :mod:`craftrl.replay.store` for why). When its
process dies (killed, out of memory) Ray restarts it (``max_restarts=-1``) and retries the calls it had not
answered (``max_task_retries=-1``); the restarted actor keeps the store and rebuilds its index from the
journal (:mod:`craftrl.replay.journal`), so rollout workers and the trainer only notice a pause, and the restart is
counted in ``replay/restarts`` and logged.

Pacing (``max_unsampled_chunks`` n > 0): a registration's fragments are taken only while fewer than n chunks
await their first sample, and the call is answered once all are taken. A rollout worker sends its next
registration only after the previous one is answered, so its send queue fills and it stops stepping envs: the rollout
runs about one iteration ahead of a slower trainer instead of making experience that goes stale unused.
:meth:`release_workers` ends the pacing when the run stops, so workers can deliver what they hold.
"""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Sequence

from craftrl.replay.config import BufferSettings
from craftrl.replay.disk_guard import DiskGuard
from craftrl.replay.journal import JournaledIndex
from craftrl.replay.index import ReplayIndex, ChunkDescriptor, FragmentMeta
from craftrl.replay.store import FragmentStore, ReplayStoreError, StoreLayout, create_store, read_layout
from craftrl.placement import current_node_id, restarted_by_ray
from craftrl.system import find
logger = logging.getLogger(__name__)


class ReplayBufferActor:
    """Run as a Ray actor through :func:`start_replay_buffer`; every public method is called remotely."""

    def __init__(self, settings: BufferSettings) -> None:
        store = settings.store
        if restarted_by_ray():
            self._layout = read_layout(store.path)
            self._store = FragmentStore(self._layout)
            self._index = JournaledIndex.recover(self._layout.path)
            self._store.delete_many(self._index.take_deletable())
            counts = self._index.accounting()
            logger.warning("replay buffer restarted (restart %d): index rebuilt from its journal with %d chunks, "
                           "%d fragments registered so far; the store at %s was kept", counts["restarts"],
                           self._index.index.num_chunks, counts["added"], self._layout.path)
        else:
            self._layout = create_store(store.path, store.num_shards, settings.max_live_fragments,
                                        store.max_fragment_bytes, store.compression_level, current_node_id())
            self._store = FragmentStore(self._layout)
            self._index = JournaledIndex.create(ReplayIndex.from_settings(settings), self._layout.path)
        self._disk = DiskGuard(self._layout.path, settings.max_live_fragments)
        self._deleter = ThreadPoolExecutor(max_workers=1, thread_name_prefix="replay-delete")
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="replay-write")
        self.remote_records_written = 0
        self.remote_bytes_written = 0
        self._pending_deletes: set[asyncio.Future] = set()
        self._changed: asyncio.Condition | None = None  # created on the actor's event loop
        self._workers_released = False
        self.worker_wait_seconds = 0.0
        self._report_clock = time.monotonic()
        self._latest_report: dict[str, float] = {}
        self._reports = 0

    def _condition(self) -> asyncio.Condition:
        if self._changed is None:
            self._changed = asyncio.Condition()
        return self._changed

    async def layout(self) -> StoreLayout:
        """How rollout workers and readers open the store."""
        return self._layout

    async def node_id(self) -> str:
        """The Ray node this actor (and, in a single-node run, the store) is on."""
        import ray

        return ray.get_runtime_context().get_node_id()

    async def add_fragments(self, metas: Sequence[FragmentMeta]) -> None:
        """Register fragments whose records the caller has already put into the store.

        Paced (``max_unsampled_chunks`` n > 0), they are registered one at a time, each once fewer than n chunks
        await their first sample, and the call is answered when the last one is: the buffer then never holds
        more than n unsampled chunks, so a trainer that samples n per iteration leaves none of them to go stale.
        """
        if not self._pacing():
            self._register(metas)
            await self._notify()
            return
        for meta in metas:
            if self._workers_held():
                started = time.monotonic()
                async with self._condition():
                    await self._condition().wait_for(lambda: not self._workers_held())
                self.worker_wait_seconds += time.monotonic() - started
            self._register([meta])
            await self._notify()

    def _register(self, metas: Sequence[FragmentMeta]) -> None:
        report_due = self._index.add(metas)
        if self._disk.written(meta.stored_nbytes for meta in metas):
            logger.error("replay buffer: %s", self._disk.error)
        if report_due:
            self._report()
        self._delete_released()

    def _pacing(self) -> bool:
        return self._index.index.settings.max_unsampled_chunks > 0 and not self._workers_released

    def _workers_held(self) -> bool:
        return not self._workers_released and self._index.index.rollout_ahead()

    async def release_workers(self) -> None:
        """Answer every registration at once from now on (the run is stopping: nobody will sample any more)."""
        self._workers_released = True
        await self._notify()

    async def _notify(self) -> None:
        """Wake the calls waiting for a change: samplers for fresh chunks, paced rollout workers for sampled ones."""
        async with self._condition():
            self._condition().notify_all()

    async def write_fragments(self, metas: Sequence[FragmentMeta], records: Sequence[bytes]) -> None:
        """Store the records of a rollout worker on another node, then register them (``records[i]`` is ``metas[i]``'s).

        The records arrive through Ray's object store; the LMDB write runs on the write thread, so sampling and
        other registrations go on meanwhile. A retried call finds its records stored already and repeats nothing.
        """
        if len(metas) != len(records):
            raise ValueError(f"write_fragments: {len(metas)} registrations for {len(records)} records")
        items = [(meta.fragment_id, record) for meta, record in zip(metas, records)]
        written = await asyncio.get_running_loop().run_in_executor(self._writer, self._store.put_new, items)
        self.remote_records_written += written
        self.remote_bytes_written += sum(len(record) for record in records)
        await self.add_fragments(metas)

    async def sample_chunks(self, n_chunks: int, timeout_s: float = 600.0) -> list[ChunkDescriptor]:
        """``n_chunks`` distinct fresh chunks; wait for rollouts up to ``timeout_s``, then raise TimeoutError.
        Raises ``ReplayStoreError`` once the store is projected not to fit on its disk: the run stops then."""
        if self._disk.error is not None:
            raise ReplayStoreError(self._disk.error)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        condition = self._condition()
        async with condition:
            while True:
                descriptors = self._index.sample(n_chunks)
                self._delete_released()
                if descriptors is not None:
                    condition.notify_all()  # paced workers may go on
                    return descriptors
                remaining = deadline - loop.time()
                if remaining <= 0:
                    index = self._index.index
                    raise TimeoutError(
                        f"sample_chunks({n_chunks}): only {index.fresh_chunk_count()} fresh chunks after "
                        f"{timeout_s:.0f} s (buffer holds {index.num_chunks}, trainer version "
                        f"{index.version}); are rollout workers adding fragments?")
                try:
                    await asyncio.wait_for(condition.wait(), remaining)
                except asyncio.TimeoutError:
                    pass

    async def update_version(self, version: int) -> None:
        """The trainer's current policy version; chunks more than ``max_staleness`` behind are dropped."""
        self._index.update_version(version)
        self._delete_released()
        await self._notify()  # stale chunks left: paced workers may go on

    async def retire_worker(self, prefix: str) -> None:
        """Refuse every later fragment whose env id starts with ``prefix``: a rollout worker the manager replaced
        without hearing from it (its node cut off), which may still deliver once it reaches the buffer again."""
        self._index.retire_worker(prefix)

    async def report_corrupt(self, fragment_ids: Sequence[int]) -> int:
        """A reader could not decode these records: drop their chunks. Returns fragments removed."""
        removed = self._index.remove_fragments(fragment_ids, "corrupt")
        logger.warning("replay buffer: dropped %d fragments of chunks with unreadable records %s", removed,
                       list(fragment_ids))
        self._delete_released()
        await self._notify()
        return removed

    async def metrics(self) -> dict[str, float]:
        """Current metrics without restarting the report window."""
        return self._metrics(reset_window=False)

    async def latest_report(self) -> dict[str, float]:
        """The metrics of the last report (one every ``fragments_per_report`` added fragments)."""
        return dict(self._latest_report)

    async def accounting(self) -> dict[str, int]:
        """Where every added fragment is; after :meth:`flush_deletes`, ``store_records`` matches the rest."""
        counts = self._index.accounting()
        counts["store_records"] = self._store.count()
        return counts

    async def flush_deletes(self) -> None:
        """Wait for pending deletions; for tests and orderly shutdown."""
        while self._pending_deletes:
            await asyncio.gather(*list(self._pending_deletes))

    def _report(self) -> None:
        now = time.monotonic()
        metrics = self._metrics(reset_window=True)
        metrics["replay/fragments_per_second"] = metrics["replay/window_fragments_added"] / max(
            now - self._report_clock, 1e-9)
        self._report_clock = now
        self._latest_report = metrics
        self._reports += 1
        logger.info("replay buffer report %d: %s", self._reports, metrics)

    def _metrics(self, reset_window: bool) -> dict[str, float]:
        metrics = self._index.index.metrics(reset_window=reset_window)
        metrics["replay/restarts"] = float(self._index.restarts)
        metrics["replay/duplicate_registrations"] = float(self._index.duplicate_registrations)
        metrics["replay/remote_fragments_written"] = float(self.remote_records_written)
        metrics["replay/remote_bytes_written"] = float(self.remote_bytes_written)
        metrics["replay/worker_wait_s"] = self.worker_wait_seconds
        return metrics

    def _delete_released(self) -> None:
        fragment_ids = self._index.take_deletable()
        if not fragment_ids:
            return
        future = asyncio.get_running_loop().run_in_executor(self._deleter, self._store.delete_many, fragment_ids)
        self._pending_deletes.add(future)
        future.add_done_callback(self._delete_done)

    def _delete_done(self, future: asyncio.Future) -> None:
        self._pending_deletes.discard(future)
        if not future.cancelled() and future.exception() is not None:
            logger.error("replay buffer: deleting records failed: %s", future.exception())


def start_replay_buffer(settings: BufferSettings, name: str, num_cpus: float = 0.0, **options: Any):
    """Create the named buffer actor (it clears the store) and wait until it is ready; return its handle."""
    import ray

    if find(name) is not None:
        raise ValueError(f"a replay buffer actor named {name!r} already exists in this Ray namespace; connect to "
                         f"it or kill it before starting a new one")
    remote_class = ray.remote(ReplayBufferActor)
    options = {"max_restarts": -1, "max_task_retries": -1, **options}
    handle = remote_class.options(name=name, num_cpus=num_cpus, **options).remote(settings)
    ray.get(handle.layout.remote())  # surfaces a store error (disk too small, foreign directory) here
    return handle
