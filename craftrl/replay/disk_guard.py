"""Whether the replay store will fit on its disk once full, judged from the encoded sizes actually written.

``database_config.max_fragment_bytes`` is a bound (it sizes the sparse LMDB map, which costs no disk), and the
bound ``craftrl train`` derives is the raw size: frames compress several times over, so a free-disk check at that
size would refuse MineStudio's quick-start (4800 chunks of 128x128 fragments) on any ordinary disk. Instead the
buffer projects the full store from the mean encoded size of the fragments written so far, first after
``FIRST_CHECK_AFTER`` fragments and again each time their count doubles, and stops the run with one line when the
disk cannot hold it: within seconds of the start rather than when the disk fills hours later.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Callable, Iterable

FIRST_CHECK_AFTER = 64  # fragments written before the first projection: enough for a stable mean
STORE_OVERHEAD = 1.1  # LMDB's pages, B-tree and free pages around the records
_GIB = 1 << 30


def store_disk_bytes(path: str | Path) -> int:
    """Bytes the store's files take on disk now (allocated blocks: the map file is sparse)."""
    return sum(file.stat().st_blocks * 512 for file in Path(path).rglob("*.mdb"))


class DiskGuard:
    """Projects the full store's size from the fragments written so far; :attr:`error` says when it will not fit."""

    def __init__(self, path: str | Path, max_live_fragments: int, *,
                 free_bytes: Callable[[], int] | None = None, used_bytes: Callable[[], int] | None = None):
        self.path = str(path)
        self.max_live_fragments = max_live_fragments
        self._free = free_bytes or (lambda: shutil.disk_usage(self.path).free)
        self._used = used_bytes or (lambda: store_disk_bytes(self.path))
        self.fragments = 0
        self.encoded_bytes = 0
        self.next_check = FIRST_CHECK_AFTER
        self.error: str | None = None

    def written(self, encoded_sizes: Iterable[int]) -> bool:
        """Count fragments just written (their encoded sizes) and project once a check is due; True when this
        projection is the one that found the full store will not fit (:attr:`error` holds why)."""
        for size in encoded_sizes:
            self.fragments += 1
            self.encoded_bytes += size
        if self.error is not None or self.fragments < self.next_check:
            return False
        self.next_check = 2 * self.fragments
        self.error = self.check()
        return self.error is not None

    def check(self) -> str | None:
        """None when the full store fits beside what the disk holds now, else the one-line reason."""
        mean = self.encoded_bytes / max(self.fragments, 1)
        needed = mean * self.max_live_fragments * STORE_OVERHEAD
        available = self._free() + self._used()  # the store's own files count: they are part of the need
        if needed <= available:
            return None
        return (f"replay store at {self.path} will need about {needed / _GIB:.1f} GiB when full "
                f"({self.max_live_fragments} fragments of {mean / (1 << 20):.2f} MiB, the mean encoded size of the "
                f"{self.fragments} written so far) but its disk has {available / _GIB:.1f} GiB for it: lower "
                f"replay_buffer_config.max_chunks or move database_config.path to a bigger disk")
