"""A replay index that survives the death of its process: :class:`ReplayIndex` plus a journal of calls.

Why a journal of *calls* rather than snapshots of state: :class:`ReplayIndex` is deterministic (one seeded
generator, no clocks), so replaying the same calls in the same order on a fresh index rebuilds exactly the
same chunks, use counts, versions, deferred deletions, random state and accounting counters. Each call costs
one short append (tens of bytes); a full snapshot replaces the journal every ``compact_every`` entries so
that replay at restart stays short.

Each entry is appended *after* the call took effect and before the caller gets its answer. A process killed
between the two loses nothing: Ray retries the unanswered call (the buffer actor runs with
``max_task_retries=-1``). A call that was journaled but whose answer was lost arrives twice; registrations
are therefore idempotent by fragment id (the repeat is counted as ``duplicate_registrations`` and otherwise
ignored). Appends are flushed to the OS, not fsync-ed: the failure this guards against is a killed process,
not a lost machine, and the store itself is not durable against that either (see ``store``).

Files, beside the store's shards: ``index-snapshot.pkl`` (the index pickled, with the journal generation it
precedes) and ``index-journal-<generation>.bin`` (pickled entries, one after another).
"""

from __future__ import annotations

import os
import pickle
from collections import deque
from pathlib import Path
from typing import Any, BinaryIO, Iterable, Sequence

from craftrl.replay.index import ReplayIndex, ChunkDescriptor, FragmentMeta
from craftrl.replay.store import INDEX_FILE_PREFIX, ReplayStoreError

SNAPSHOT_NAME = f"{INDEX_FILE_PREFIX}snapshot.pkl"
JOURNAL_PREFIX = f"{INDEX_FILE_PREFIX}journal-"
# Registrations are deduplicated against this many most recent fragment ids; a repeat only ever comes from
# a retried call, which is at most a few registrations behind.
RECENT_IDS = 100_000


class JournaledIndex:
    """The buffer's bookkeeping with every state change written down; rebuilt by :meth:`recover`."""

    def __init__(self, index: ReplayIndex, root: str | os.PathLike, compact_every: int = 20_000) -> None:
        self.index = index
        self.root = Path(root)
        self.compact_every = compact_every
        self.duplicate_registrations = 0
        self.restarts = 0
        self._recent: deque[int] = deque()
        self._recent_set: set[int] = set()
        self._generation = 0
        self._entries = 0
        self._journal: BinaryIO | None = None
        self._replaying = False

    # ----------------------------------------------------------------------------------------- lifecycle
    @classmethod
    def create(cls, index: ReplayIndex, root: str | os.PathLike, compact_every: int = 20_000) -> "JournaledIndex":
        """Start an empty journal (the store was just cleared)."""
        journaled = cls(index, root, compact_every)
        journaled._write_snapshot()
        journaled._open_journal()
        return journaled

    @classmethod
    def recover(cls, root: str | os.PathLike, compact_every: int = 20_000) -> "JournaledIndex":
        """Rebuild the index a killed buffer process had: the last snapshot, then every journaled call."""
        root = Path(root)
        snapshot_path = root / SNAPSHOT_NAME
        if not snapshot_path.is_file():
            raise FileNotFoundError(f"cannot recover the replay index: {snapshot_path} is missing")
        with snapshot_path.open("rb") as file:
            saved = pickle.load(file)
        journaled = cls(saved["index"], root, compact_every)
        journaled.duplicate_registrations = saved["duplicate_registrations"]
        journaled.restarts = saved["restarts"]
        journaled._recent = deque(saved["recent_ids"])
        journaled._recent_set = set(journaled._recent)
        journaled._generation = saved["generation"]
        journaled._replay(root / f"{JOURNAL_PREFIX}{journaled._generation}.bin")
        journaled.restarts += 1
        journaled._compact()  # the replayed state becomes the next starting point; the old journal goes
        return journaled

    def close(self) -> None:
        if self._journal is not None:
            self._journal.close()
            self._journal = None

    # ----------------------------------------------------------------------------------------- the calls
    def add(self, metas: Sequence[FragmentMeta]) -> bool:
        """Register fragments (repeats ignored); True when a metrics report is due."""
        report_due = False
        for meta in metas:
            if meta.fragment_id in self._recent_set:
                self.duplicate_registrations += 1
                continue
            self._remember(meta.fragment_id)
            report_due |= self.index.add(meta)
        self._append(("add", tuple(metas)))
        return report_due

    def sample(self, n_chunks: int) -> list[ChunkDescriptor] | None:
        descriptors = self.index.sample(n_chunks)
        self._append(("sample", n_chunks))
        return descriptors

    def update_version(self, version: int) -> None:
        self.index.update_version(version)
        self._append(("version", version))

    def remove_fragments(self, fragment_ids: Iterable[int], reason: str) -> int:
        fragment_ids = tuple(int(i) for i in fragment_ids)
        removed = self.index.remove_fragments(fragment_ids, reason)
        self._append(("remove", fragment_ids, reason))
        return removed

    def retire_worker(self, prefix: str) -> None:
        self.index.retire_worker(prefix)
        self._append(("retire", prefix))

    def take_deletable(self) -> list[int]:
        # Which ids are deletable follows from the other calls; replaying takes them again and the store's
        # delete ignores records that are already gone, so this needs no entry of its own.
        return self.index.take_deletable()

    def accounting(self) -> dict[str, int]:
        counts = self.index.accounting()
        counts["duplicate_registrations"] = self.duplicate_registrations
        counts["restarts"] = self.restarts
        return counts

    # ----------------------------------------------------------------------------------------- internals
    def _remember(self, fragment_id: int) -> None:
        self._recent.append(fragment_id)
        self._recent_set.add(fragment_id)
        if len(self._recent) > RECENT_IDS:
            self._recent_set.discard(self._recent.popleft())

    def _replay(self, path: Path) -> None:
        if not path.is_file():
            return
        self._replaying = True
        try:
            with path.open("rb") as file:
                while True:
                    try:
                        entry = pickle.load(file)
                    except EOFError:
                        break
                    except (pickle.UnpicklingError, ValueError, IndexError):
                        break  # a torn last append: the call it recorded was never answered, so it is retried
                    self._apply(entry)
        finally:
            self._replaying = False

    def _apply(self, entry: tuple[Any, ...]) -> None:
        kind = entry[0]
        if kind == "add":
            self.add(entry[1])
        elif kind == "sample":
            self.sample(entry[1])
        elif kind == "version":
            self.update_version(entry[1])
        elif kind == "remove":
            self.remove_fragments(entry[1], entry[2])
        elif kind == "retire":
            self.retire_worker(entry[1])
        else:
            raise ValueError(f"replay journal: unknown entry {kind!r}")

    def _append(self, entry: tuple[Any, ...]) -> None:
        if self._replaying or self._journal is None:
            return
        try:
            self._journal.write(pickle.dumps(entry, protocol=pickle.HIGHEST_PROTOCOL))
            self._journal.flush()
            self._entries += 1
            if self._entries >= self.compact_every:
                self._compact()
        except OSError as error:  # a full disk: the run stops on it (cli/train.py), in one line naming the store
            reason = error.strerror or error
            raise ReplayStoreError(f"replay store at {self.root}: cannot write its journal ({reason}); free space on "
                                   "its disk or move database_config.path to a bigger one") from error

    def _compact(self) -> None:
        """Snapshot the state and start the next journal; the old one is deleted only after both exist."""
        old = self.root / f"{JOURNAL_PREFIX}{self._generation}.bin"
        self.close()
        self._generation += 1
        self._write_snapshot()
        self._open_journal()
        old.unlink(missing_ok=True)

    def _write_snapshot(self) -> None:
        state = {"index": self.index, "generation": self._generation, "recent_ids": list(self._recent),
                 "duplicate_registrations": self.duplicate_registrations, "restarts": self.restarts}
        temporary = self.root / f"{SNAPSHOT_NAME}.tmp"
        with temporary.open("wb") as file:
            pickle.dump(state, file, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(temporary, self.root / SNAPSHOT_NAME)

    def _open_journal(self) -> None:
        path = self.root / f"{JOURNAL_PREFIX}{self._generation}.bin"
        self._journal = path.open("ab")
        self._entries = 0
