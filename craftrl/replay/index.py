"""What the replay buffer keeps, samples and forgets: pure bookkeeping over fragment ids, no I/O, no Ray.

Rules (each one tested in tests/replay/test_index_properties.py):

* A chunk is ``fragments_per_chunk`` fragments of one ``env_id`` with consecutive ``index``. A fragment that
  does not continue the env's open partial chunk breaks it (the partial is dropped, reason ``gap``), so a
  chunk never spans a hole in time.
* Capacity: at most ``max_chunks`` chunks; admitting one more evicts the oldest admitted chunk (FIFO,
  reason ``capacity``), whatever its use count.
* Reuse: a chunk is handed out by at most ``max_reuse`` sample calls, then retired (reason ``reuse``).
* Staleness: a chunk's version is the oldest policy version in it (``Fragment.min_version``). A chunk more than
  ``max_staleness`` versions behind the trainer is never sampled: every chunk is checked at sample time and at
  each version update, not only the head of the queue (MineStudio's head-only pruning let stale chunks behind a
  fresh head be trained on). Stale fragments are refused on arrival (``stale_on_arrival``), and a repeated or
  backwards ``index`` of an env is refused (``out_of_order``).
* Fencing: after ``retire_worker(prefix)``, every fragment whose ``env_id`` starts with ``prefix`` is refused
  (``from_retired_worker``). A rollout worker the manager gave up for dead (its node cut off from the network,
  say) may still deliver what it held once it reaches the buffer again; its replacement already writes, and
  the manager has booked that worker's undelivered fragments as lost.
* Accounting: every fragment ever added is, at any time, in exactly one place: in a chunk, in an open partial
  chunk, or removed for one reason. ``accounting()["unaccounted"]`` is always 0.
* Deletion on disk is deferred for chunks that were sampled: their records stay readable until
  ``read_grace_samples`` further sample calls have been made, so a trainer still reading (or prefetching)
  what it sampled never finds a hole. ``take_deletable()`` hands out the ids whose records may now go.
* Sampling is uniform without replacement among fresh chunks, from a generator seeded once: the same seed and
  the same sequence of calls give the same samples.
* Pacing: with ``max_unsampled_chunks`` n > 0, :meth:`rollout_ahead` is True while n or more live chunks wait
  for their first sample; the buffer actor then holds the rollout workers (the rule is here, the waiting there).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Iterable

import numpy as np

from craftrl.replay.config import BufferSettings


def too_stale(min_version: int, trainer_version: int, max_staleness: int) -> bool:
    """Whether data whose oldest step was acted by ``min_version`` may never be sampled by a trainer at
    ``trainer_version``: the staleness rule, applied by the buffer and, ahead of sending, by rollout workers."""
    return trainer_version - min_version > max_staleness


REJECT_REASONS = ("stale_on_arrival", "out_of_order", "gap", "from_retired_worker")
EVICT_REASONS = ("capacity", "stale", "reuse", "corrupt")
REMOVAL_REASONS = REJECT_REASONS + EVICT_REASONS


@dataclass(frozen=True)
class FragmentMeta:
    """What the buffer needs to know about a stored fragment; the payload stays in the store."""

    fragment_id: int
    env_id: str
    index: int
    min_version: int
    raw_nbytes: int = 0
    stored_nbytes: int = 0


@dataclass(frozen=True)
class ChunkDescriptor:
    """One sampled chunk: what a reader needs to load it and what GAE needs to chain its fragments.

    ``fragment_ids``, ``indices`` and ``versions`` (each fragment's ``min_version``) are parallel and ordered by
    ``index``; the indices are consecutive. ``use_count`` counts this sample; ``staleness`` is the trainer
    version minus the chunk's version when it was sampled.
    """

    chunk_id: int
    env_id: str
    fragment_ids: tuple[int, ...]
    indices: tuple[int, ...]
    versions: tuple[int, ...]
    use_count: int
    staleness: int


@dataclass
class _Chunk:
    chunk_id: int
    fragments: tuple[FragmentMeta, ...]
    version: int
    uses: int = 0
    last_sampled_call: int = -1


@dataclass
class _Window:
    """Statistics since the last report."""

    sampled_staleness: list[int] = field(default_factory=list)
    sampled_use_count: list[int] = field(default_factory=list)
    uses_at_removal: list[int] = field(default_factory=list)
    fragments_added: int = 0


class ReplayIndex:
    """The replay buffer's state machine; see the module docstring for the rules it enforces."""

    def __init__(self, max_chunks: int, max_reuse: int = 2, max_staleness: int = 2, fragments_per_chunk: int = 1,
                 fragments_per_report: int = 40, seed: int = 0, read_grace_samples: int = 2,
                 max_unsampled_chunks: int = 0) -> None:
        settings = BufferSettings(max_chunks=max_chunks, max_reuse=max_reuse, max_staleness=max_staleness,
                                  fragments_per_chunk=fragments_per_chunk,
                                  fragments_per_report=fragments_per_report, seed=seed,
                                  read_grace_samples=read_grace_samples,
                                  max_unsampled_chunks=max_unsampled_chunks)  # validates every limit
        self.settings = settings
        self._rng = np.random.Generator(np.random.PCG64(seed))
        self._version = 0
        self._chunks: OrderedDict[int, _Chunk] = OrderedDict()
        self._chunk_of_fragment: dict[int, int] = {}
        self._open: dict[str, list[FragmentMeta]] = {}
        self._last_index: dict[str, int] = {}
        self._retired_workers: tuple[str, ...] = ()  # env id prefixes of workers refused from now on
        self._next_chunk_id = 0
        self._sample_calls = 0
        self._deletable: list[int] = []
        self._deferred: deque[tuple[int, list[int]]] = deque()
        self._added = 0
        self._removed = {reason: 0 for reason in REMOVAL_REASONS}
        self._chunks_sampled = 0
        self._window = _Window()

    @classmethod
    def from_settings(cls, settings: BufferSettings) -> "ReplayIndex":
        return cls(settings.max_chunks, settings.max_reuse, settings.max_staleness, settings.fragments_per_chunk,
                   settings.fragments_per_report, settings.seed, settings.read_grace_samples,
                   settings.max_unsampled_chunks)

    # ----------------------------------------------------------------------------------------------- queries
    @property
    def version(self) -> int:
        return self._version

    @property
    def num_chunks(self) -> int:
        return len(self._chunks)

    def chunk_ids(self) -> list[int]:
        """Live chunk ids, oldest admitted first (the FIFO eviction order)."""
        return list(self._chunks)

    def fresh_chunk_count(self) -> int:
        return sum(1 for chunk in self._chunks.values() if self._is_fresh(chunk))

    def unsampled_chunk_count(self) -> int:
        """Live chunks not sampled yet: the experience the rollout has made ahead of the trainer."""
        return sum(1 for chunk in self._chunks.values() if chunk.uses == 0)

    def rollout_ahead(self) -> bool:
        """True while rollout workers should wait: ``max_unsampled_chunks`` > 0 and that many chunks await a first
        sample."""
        limit = self.settings.max_unsampled_chunks
        return limit > 0 and self.unsampled_chunk_count() >= limit

    def _is_fresh(self, chunk: _Chunk) -> bool:
        return not too_stale(chunk.version, self._version, self.settings.max_staleness)

    # ----------------------------------------------------------------------------------------------- updates
    def add(self, meta: FragmentMeta) -> bool:
        """Take one stored fragment into account; return True when a metrics report is due."""
        if not isinstance(meta, FragmentMeta):
            raise TypeError(f"ReplayIndex.add: expected a FragmentMeta, got {type(meta).__name__}")
        self._added += 1
        self._window.fragments_added += 1
        report_due = self._added % self.settings.fragments_per_report == 0
        env_id = meta.env_id
        if self._retired_workers and env_id.startswith(self._retired_workers):
            self._reject([meta], "from_retired_worker")
            return report_due
        last = self._last_index.get(env_id)
        if last is not None and meta.index <= last:
            self._reject([meta], "out_of_order")
            return report_due
        self._last_index[env_id] = meta.index
        partial = self._open.get(env_id, [])
        stale = too_stale(meta.min_version, self._version, self.settings.max_staleness)
        if partial and (meta.index != partial[-1].index + 1 or stale):
            self._reject(self._open.pop(env_id), "gap")  # this partial chunk can never be completed
            partial = []
        if stale:
            self._reject([meta], "stale_on_arrival")
            return report_due
        partial.append(meta)
        if len(partial) < self.settings.fragments_per_chunk:
            self._open[env_id] = partial
            return report_due
        self._open.pop(env_id, None)
        self._admit(tuple(partial))
        return report_due

    def retire_worker(self, prefix: str) -> None:
        """Refuse, from now on, every fragment whose ``env_id`` starts with ``prefix`` (see Fencing)."""
        if not isinstance(prefix, str) or not prefix:
            raise ValueError(f"retire_worker: expected a non-empty env id prefix, got {prefix!r}")
        if prefix not in self._retired_workers:
            self._retired_workers += (prefix,)

    def _admit(self, fragments: tuple[FragmentMeta, ...]) -> None:
        while len(self._chunks) >= self.settings.max_chunks:
            self._remove_chunk(next(iter(self._chunks.values())), "capacity")
        chunk = _Chunk(self._next_chunk_id, fragments, min(f.min_version for f in fragments))
        self._next_chunk_id += 1
        self._chunks[chunk.chunk_id] = chunk
        for meta in fragments:
            self._chunk_of_fragment[meta.fragment_id] = chunk.chunk_id

    def update_version(self, version: int) -> None:
        """The trainer now trains policy ``version``; drop everything that can no longer be sampled."""
        if not isinstance(version, (int, np.integer)) or isinstance(version, bool) or version < self._version:
            raise ValueError(f"update_version: expected an int >= current version {self._version}, got {version!r}")
        self._version = int(version)
        self._evict_stale()
        for env_id in [e for e, partial in self._open.items()
                       if too_stale(min(f.min_version for f in partial), self._version, self.settings.max_staleness)]:
            self._reject(self._open.pop(env_id), "stale")

    def _evict_stale(self) -> None:
        for chunk in [c for c in self._chunks.values() if not self._is_fresh(c)]:
            self._remove_chunk(chunk, "stale")

    def sample(self, n_chunks: int) -> list[ChunkDescriptor] | None:
        """``n_chunks`` distinct fresh chunks, or None (nothing sampled, stale chunks evicted) while fewer exist."""
        if not isinstance(n_chunks, (int, np.integer)) or not 1 <= n_chunks <= self.settings.max_chunks:
            raise ValueError(f"sample: expected 1 <= n_chunks <= max_chunks={self.settings.max_chunks}, "
                             f"got {n_chunks!r}")
        self._evict_stale()
        eligible = [chunk for chunk in self._chunks.values() if self._is_fresh(chunk)]
        if len(eligible) < n_chunks:
            return None
        self._sample_calls += 1
        while self._deferred and self._deferred[0][0] <= self._sample_calls:
            self._deletable.extend(self._deferred.popleft()[1])
        picks = self._rng.choice(len(eligible), size=int(n_chunks), replace=False)
        descriptors = []
        for pick in picks:
            chunk = eligible[int(pick)]
            chunk.uses += 1
            chunk.last_sampled_call = self._sample_calls
            staleness = self._version - chunk.version
            descriptors.append(ChunkDescriptor(
                chunk.chunk_id, chunk.fragments[0].env_id, tuple(f.fragment_id for f in chunk.fragments),
                tuple(f.index for f in chunk.fragments), tuple(f.min_version for f in chunk.fragments),
                chunk.uses, staleness))
            self._window.sampled_staleness.append(staleness)
            self._window.sampled_use_count.append(chunk.uses)
            if chunk.uses >= self.settings.max_reuse:
                self._remove_chunk(chunk, "reuse")
        self._chunks_sampled += len(descriptors)
        return descriptors

    def remove_fragments(self, fragment_ids: Iterable[int], reason: str = "corrupt") -> int:
        """Evict the live chunks holding any of ``fragment_ids`` (e.g. unreadable records); return fragments removed."""
        if reason not in EVICT_REASONS:
            raise ValueError(f"remove_fragments: expected a reason in {EVICT_REASONS}, got {reason!r}")
        removed = 0
        for fragment_id in fragment_ids:
            chunk_id = self._chunk_of_fragment.get(int(fragment_id))
            if chunk_id is not None and chunk_id in self._chunks:
                chunk = self._chunks[chunk_id]
                removed += len(chunk.fragments)
                self._remove_chunk(chunk, reason)
        return removed

    def take_deletable(self) -> list[int]:
        """Fragment ids whose records nobody will read any more; the caller deletes them from the store."""
        ids, self._deletable = self._deletable, []
        return ids

    # ------------------------------------------------------------------------------------------- removal
    def _reject(self, fragments: list[FragmentMeta], reason: str) -> None:
        self._removed[reason] += len(fragments)
        self._deletable.extend(f.fragment_id for f in fragments)

    def _remove_chunk(self, chunk: _Chunk, reason: str) -> None:
        del self._chunks[chunk.chunk_id]
        ids = [f.fragment_id for f in chunk.fragments]
        for fragment_id in ids:
            self._chunk_of_fragment.pop(fragment_id, None)
        self._removed[reason] += len(ids)
        self._window.uses_at_removal.append(chunk.uses)
        if chunk.last_sampled_call < 0:
            self._deletable.extend(ids)
        else:
            release_at = chunk.last_sampled_call + self.settings.read_grace_samples
            if release_at <= self._sample_calls:
                self._deletable.extend(ids)
            else:
                # Calls only grow, so appending keeps the deque ordered by release call.
                self._deferred.append((release_at, ids))

    # ------------------------------------------------------------------------------------------- reports
    def accounting(self) -> dict[str, int]:
        """Where every added fragment is now; ``unaccounted`` must be 0."""
        in_chunks = sum(len(c.fragments) for c in self._chunks.values())
        in_open = sum(len(p) for p in self._open.values())
        counts = {"added": self._added, "in_chunks": in_chunks, "in_open_chunks": in_open}
        counts.update({f"removed_{reason}": n for reason, n in self._removed.items()})
        counts["unaccounted"] = self._added - in_chunks - in_open - sum(self._removed.values())
        counts["awaiting_delete"] = len(self._deletable) + sum(len(ids) for _, ids in self._deferred)
        return counts

    def metrics(self, reset_window: bool = True) -> dict[str, float]:
        """Gauges, cumulative counters and since-last-report statistics, under ``replay/`` names."""
        window = self._window
        out: dict[str, float] = {
            "replay/size_chunks": len(self._chunks),
            "replay/fresh_chunks": self.fresh_chunk_count(),
            "replay/unsampled_chunks": self.unsampled_chunk_count(),
            "replay/trainer_version": self._version,
            "replay/sample_calls": self._sample_calls,
            "replay/chunks_sampled": self._chunks_sampled,
            "replay/retired_workers": len(self._retired_workers),
            "replay/window_fragments_added": window.fragments_added,
        }
        out.update({f"replay/{name}": value for name, value in self.accounting().items()})
        out.update(_summary("replay/sampled_staleness", window.sampled_staleness))
        out.update(_summary("replay/sampled_use_count", window.sampled_use_count))
        out.update(_summary("replay/uses_at_removal", window.uses_at_removal))
        if reset_window:
            self._window = _Window()
        return out


def _summary(name: str, values: list[int]) -> dict[str, float]:
    if not values:
        return {}
    return {f"{name}_mean": float(np.mean(values)), f"{name}_max": float(np.max(values))}
