"""Trainer side: turn sampled chunk descriptors into fragments, reading the LMDB store directly.

:class:`ChunkReader` reads in the calling process. :class:`ReaderPool` spreads reads over ``num_readers``
Ray actors (``num_cpus_per_reader`` each, on the store's node; one pool per train worker) and keeps the batch
being read plus ``prefetch_batches`` more in flight, ``(1 + prefetch_batches) * chunks_per_batch`` chunk reads,
as MineStudio's loader pool does; with ``num_readers=0`` it reads in the calling process (local mode, tests).
Results come back in descriptor order, so a batch's composition does not depend on which reader finished first.

A chunk with an unreadable or missing record is not fatal: its :class:`ReadResult` carries the error and no
fragments, and the pool tells the buffer (``report_corrupt``) so the chunk is never sampled again.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

from craftrl.replay.codec import CorruptRecordError, decode_fragment
from craftrl.replay.index import ChunkDescriptor
from craftrl.replay.store import FragmentStore, MissingRecordError, StoreLayout
from craftrl.rollout.fragment import Fragment
from craftrl.placement import on_node


@dataclass
class ReadResult:
    descriptor: ChunkDescriptor
    fragments: list[Fragment]  # ordered by index; empty when ``error`` is set
    error: str | None = None
    bad_fragment_id: int | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


class ChunkReader:
    """Reads chunks from the store in this process."""

    def __init__(self, layout: StoreLayout) -> None:
        self._store = FragmentStore(layout)

    def read(self, descriptor: ChunkDescriptor) -> ReadResult:
        fragments = []
        for fragment_id in descriptor.fragment_ids:
            try:
                fragments.append(decode_fragment(self._store.get(fragment_id)))
            except (CorruptRecordError, MissingRecordError) as error:
                message = f"chunk {descriptor.chunk_id} of {descriptor.env_id}: fragment {fragment_id}: {error}"
                return ReadResult(descriptor, [], message, fragment_id)
        return ReadResult(descriptor, fragments)

    def close(self) -> None:
        self._store.close()


class ReaderPool:
    """Parallel, prefetching chunk reads for the trainer."""

    def __init__(self, buffer: Any, num_readers: int = 2, num_cpus_per_reader: float = 1.0,
                 prefetch_batches: int = 1, chunks_per_batch: int = 1, layout: StoreLayout | None = None) -> None:
        if not isinstance(num_readers, int) or num_readers < 0:
            raise ValueError(f"train_config.num_readers: expected an int >= 0, got {num_readers!r}")
        if not isinstance(prefetch_batches, int) or prefetch_batches < 0:
            raise ValueError(f"train_config.prefetch_batches: expected an int >= 0, got {prefetch_batches!r}")
        import ray

        self._ray = ray
        self._buffer = buffer
        layout = layout if layout is not None else ray.get(buffer.layout.remote())
        self._local = ChunkReader(layout) if num_readers == 0 else None
        # reader actors read the store, so they run on its node whatever node the trainer is on
        placement = on_node(layout.node_id) if layout.node_id is not None else {}
        remote_reader = ray.remote(ChunkReader)
        self._readers = [remote_reader.options(num_cpus=num_cpus_per_reader, **placement).remote(layout)
                         for _ in range(num_readers)]
        self.max_in_flight = max(1, chunks_per_batch) * (1 + prefetch_batches)
        self.failed_reads = 0

    def read(self, descriptors: Sequence[ChunkDescriptor]) -> Iterator[ReadResult]:
        """Yield one result per descriptor, in order, reading ahead up to the prefetch window."""
        pending: deque = deque()
        queue = iter(enumerate(descriptors))
        for position, descriptor in queue:
            pending.append(self._submit(position, descriptor))
            if len(pending) >= self.max_in_flight:
                break
        while pending:
            result = self._resolve(pending.popleft())
            next_item = next(queue, None)
            if next_item is not None:
                pending.append(self._submit(*next_item))
            if not result.ok:
                self.failed_reads += 1
                # Waited for (rare): once the trainer sees the failure, the chunk can no longer be sampled.
                self._ray.get(self._buffer.report_corrupt.remote([result.bad_fragment_id]))
            yield result

    def _submit(self, position: int, descriptor: ChunkDescriptor) -> Any:
        if self._local is not None:
            return self._local.read(descriptor)
        return self._readers[position % len(self._readers)].read.remote(descriptor)

    def _resolve(self, handle: Any) -> ReadResult:
        return handle if isinstance(handle, ReadResult) else self._ray.get(handle)

    def close(self) -> None:
        for reader in self._readers:
            self._ray.kill(reader)
        self._readers = []
        if self._local is not None:
            self._local.close()
