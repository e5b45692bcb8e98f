"""Rollout-worker side: encode a fragment, put it into the store, register it with the buffer actor.

Fragments are encoded (compressed) in the worker's own process, so compression runs in parallel across workers. A
``ReplayWriter`` on the store's node then puts the record into LMDB itself and sends the buffer actor only metadata. One
on any other node cannot open the store (LMDB is one machine's): it sends the records with the registration,
through Ray's object store, and the buffer actor writes them (``write_fragments``), so each fragment crosses the
network once. Either way a registration is sent without waiting for its answer, but only once fewer than
``max_in_flight`` are unanswered. Keep the default of 1: Ray does not promise that an async actor runs calls in
submission order, and fragments of one env must arrive in index order (a reordered pair would be refused as
``out_of_order``). ``add_fragments`` registers a batch in one call, in list order: the envs of a rollout group
start together, so their fragments end on the same step, and one call for all of them spares the buffer actor most
of its per-call cost (Ray's, not its own work). A paced buffer (``max_unsampled_chunks``) holds the answer while
the trainer is behind, so the next ``add_fragments`` waits, and with it the worker that calls it.

When the buffer actor dies, Ray restarts it and retries the registration; should the call still fail, the
``ReplayWriter`` re-sends the *same* registration (same fragment id, record already stored) until ``retry_timeout_s``:
the buffer ignores a repeat, so a retry can neither lose a fragment nor count it twice.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections import deque
from typing import Any

from craftrl.replay.codec import encode_fragment
from craftrl.replay.index import FragmentMeta
from craftrl.replay.store import FragmentStore, StoreLayout
from craftrl.rollout.fragment import Fragment
from craftrl.placement import current_node_id

logger = logging.getLogger(__name__)


class ReplayWriter:
    """One per rollout worker process. Not thread-safe; not picklable (open LMDB handles).

    ``direct``: write into the store from this process; None decides by node (direct on the store's node).
    """

    def __init__(self, buffer: Any, layout: StoreLayout | None = None, max_in_flight: int = 1,
                 retry_timeout_s: float = 600.0, direct: bool | None = None) -> None:
        if not isinstance(max_in_flight, int) or max_in_flight < 1:
            raise ValueError(f"ReplayWriter.max_in_flight: expected an int >= 1, got {max_in_flight!r}")
        import ray

        self._ray = ray
        self._buffer = buffer
        self._layout = layout if layout is not None else ray.get(buffer.layout.remote())
        if direct is None:
            direct = self._layout.node_id is None or self._layout.node_id == current_node_id()
        self.direct = direct
        self._store = FragmentStore(self._layout) if direct else None
        self._in_flight: deque[tuple[Any, tuple]] = deque()  # (call, the arguments to send it again with)
        self._max_in_flight = max_in_flight
        self._retry_timeout_s = retry_timeout_s
        self.registration_retries = 0

    def add_fragment(self, fragment: Fragment) -> FragmentMeta:
        """Validate, store and register ``fragment``; the buffer decides later whether it is kept."""
        return self.add_fragments([fragment])[0]

    def add_fragments(self, fragments: list[Fragment]) -> list[FragmentMeta]:
        """Validate and store every fragment, then register them all in one call, in this order."""
        for fragment in fragments:
            fragment.validate()
        records = [encode_fragment(fragment, self._layout.compression_level) for fragment in fragments]
        if not records:
            return []
        if self.direct:
            metas = [self._meta(fragment, self._put(record), record) for fragment, record in zip(fragments, records)]
            arguments: tuple = (metas,)
        else:
            # the buffer actor stores them; a colliding id (2**-64 per pair) would be taken for a repeat there
            metas = [self._meta(fragment, secrets.randbits(64), record) for fragment, record in zip(fragments, records)]
            arguments = (metas, records)
        while len(self._in_flight) >= self._max_in_flight:
            self._settle_oldest()
        self._in_flight.append((self._send(arguments), arguments))
        return metas

    def _send(self, arguments: tuple) -> Any:
        method = self._buffer.add_fragments if len(arguments) == 1 else self._buffer.write_fragments
        return method.remote(*arguments)

    def _put(self, record: bytes) -> int:
        fragment_id = secrets.randbits(64)
        while not self._store.put(fragment_id, record, overwrite=False):  # a 2**-64 collision: draw again
            fragment_id = secrets.randbits(64)
        return fragment_id

    @staticmethod
    def _meta(fragment: Fragment, fragment_id: int, record: bytes) -> FragmentMeta:
        return FragmentMeta(fragment_id, fragment.env_id, int(fragment.index), fragment.min_version,
                            fragment.raw_nbytes(), len(record))

    def flush(self) -> None:
        """Wait until the buffer has registered everything added so far."""
        while self._in_flight:
            self._settle_oldest()

    def _settle_oldest(self) -> None:
        """Wait for the oldest registration; re-send it while the buffer is restarting."""
        call, arguments = self._in_flight[0]
        give_up_at = time.monotonic() + self._retry_timeout_s
        while True:
            try:
                self._ray.get(call)
                break
            except self._ray.exceptions.RayActorError as error:
                if time.monotonic() > give_up_at:
                    raise
                self.registration_retries += 1
                logger.warning("replay buffer unavailable (%s); registering %d fragments again", type(error).__name__,
                               len(arguments[0]))
                time.sleep(0.5)
                call = self._send(arguments)
        self._in_flight.popleft()

    def close(self) -> None:
        self.flush()
        if self._store is not None:
            self._store.close()
