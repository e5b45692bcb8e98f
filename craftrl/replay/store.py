"""Sharded LMDB storage of encoded fragment records, keyed by a 64-bit fragment id.

Several processes open the same store: rollout workers write, the buffer actor deletes, trainer readers read.
LMDB allows that on one machine (one writer per shard at a time, readers never block). It does not work across
machines, over a network file system or otherwise, so the store belongs to one Ray node: its manifest records
that node, :func:`create_store` refuses a network file system, and opening the store from a process on another
node is an error naming ``database_config.path``. Processes elsewhere reach the store through the buffer actor
(:mod:`craftrl.replay.client`).

What happens to an existing store: :func:`create_store` is called once per run by the buffer actor and
*clears* it, because the index of chunks, reuse counts and versions belongs to one run (the actor journals it
beside the shards only to survive its own restarts within the run); records from an earlier run could never
be sampled and would only leak disk. To protect user data it refuses to clear
a non-empty directory that lacks the store's manifest file. :meth:`FragmentStore.open` (writers, readers,
tests) opens an existing store as it is and never clears anything.

Durability is traded for speed (``sync=False``): an OS crash may lose the last writes, which does not matter
for a store that is rebuilt from scratch at every start.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import lmdb

from craftrl.replay.disk_guard import FIRST_CHECK_AFTER
from craftrl.placement import current_node_id

MANIFEST = "craftrl-replay-store.json"
INDEX_FILE_PREFIX = "index-"  # the buffer actor's journal and snapshot (craftrl.replay.journal)
_MIB = 1 << 20
# Sparse map: address space costs nothing, so the map gets twice the expected bytes to absorb fragments that
# compress worse than ``max_fragment_bytes`` and uneven sharding, without failing the run.
_MAP_SLACK = 2.0


class ReplayStoreError(RuntimeError):
    """The store cannot be created, opened or written (disk too small, map full, foreign directory)."""


class MissingRecordError(LookupError):
    """No record under this fragment id: it was deleted (evicted past its read grace) or never written."""


@dataclass(frozen=True)
class StoreLayout:
    """Everything another process needs to open the same store; small and picklable."""

    path: str
    num_shards: int
    map_size_per_shard: int
    compression_level: int = 3
    node_id: str | None = None  # the Ray node whose disk holds the store; None outside Ray (tests, tools)


def expected_store_bytes(max_fragments: int, max_fragment_bytes: int) -> int:
    return max_fragments * max_fragment_bytes


def create_store(path: str | os.PathLike, num_shards: int, max_fragments: int, max_fragment_bytes: int,
                 compression_level: int = 3, node_id: str | None = None) -> StoreLayout:
    """Clear any earlier store at ``path`` and lay out a fresh one sized for ``max_fragments`` records.

    The disk must have room for the first records the buffer writes before it projects the full store from their
    encoded sizes (:mod:`craftrl.replay.disk_guard`). ``node_id``: the Ray node creating it (the buffer actor's);
    only processes on that node may open it."""
    root = Path(path).expanduser().resolve()
    needed = expected_store_bytes(max_fragments, max_fragment_bytes)
    _clear_existing(root)
    root.mkdir(parents=True, exist_ok=True)
    network = network_filesystem(root)
    if network is not None:
        raise ReplayStoreError(
            f"database_config.path {root} is on a network file system ({network}); LMDB needs a disk local to the "
            f"replay buffer's node: choose a local directory")
    free = shutil.disk_usage(root).free
    first = min(max_fragments, FIRST_CHECK_AFTER)
    if first * max_fragment_bytes > free:
        raise ReplayStoreError(
            f"replay store at {root} needs {first * max_fragment_bytes / 2**30:.2f} GiB free to start ({first} "
            f"fragments x {max_fragment_bytes / _MIB:.2f} MiB max_fragment_bytes) but the disk has "
            f"{free / 2**30:.2f} GiB free; lower database_config.max_fragment_bytes or move database_config.path "
            f"to a bigger disk"
        )
    per_shard = math.ceil(_MAP_SLACK * needed / num_shards) + 16 * _MIB
    per_shard = -(-per_shard // os.sysconf("SC_PAGE_SIZE")) * os.sysconf("SC_PAGE_SIZE")
    layout = StoreLayout(str(root), num_shards, per_shard, compression_level, node_id)
    (root / MANIFEST).write_text(json.dumps(asdict(layout), indent=2))
    for shard in range(num_shards):
        lmdb.open(str(_shard_dir(root, shard)), map_size=per_shard, subdir=True).close()
    return layout


def read_layout(path: str | os.PathLike) -> StoreLayout:
    manifest = Path(path).expanduser().resolve() / MANIFEST
    if not manifest.is_file():
        raise ReplayStoreError(f"{manifest.parent} is not a replay store: {MANIFEST} is missing")
    return StoreLayout(**json.loads(manifest.read_text()))


# File systems whose files other machines can open too: LMDB's locks and shared memory map do not reach them.
NETWORK_FILESYSTEMS = frozenset({"nfs", "nfs4", "cifs", "smb3", "smbfs", "9p", "afs", "ceph", "glusterfs",
                                 "fuse.glusterfs", "fuse.sshfs", "fuse.s3fs", "fuse.gcsfuse", "fuse.cephfs",
                                 "lustre", "gpfs", "beegfs", "ocfs2", "gfs2", "virtiofs"})


def network_filesystem(path: str | os.PathLike, mounts: str | None = None) -> str | None:
    """The file system type under ``path`` when it is a network one (``mounts``: /proc/mounts' text), else None."""
    if mounts is None:
        try:
            mounts = Path("/proc/mounts").read_text()
        except OSError:  # not Linux: nothing to check against
            return None
    target, best, kind = str(Path(path).resolve()), "", None
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) < 3:
            continue
        mount_point = fields[1].replace("\\040", " ")
        inside = target == mount_point or target.startswith(mount_point.rstrip("/") + "/")
        if inside and len(mount_point) >= len(best):
            best, kind = mount_point, fields[2]
    return kind if kind in NETWORK_FILESYSTEMS else None


def _shard_dir(root: Path, shard: int) -> Path:
    return root / f"shard-{shard:03d}"


def _clear_existing(root: Path) -> None:
    if not root.exists():
        return
    if not root.is_dir():
        raise ReplayStoreError(f"replay store path {root} exists and is not a directory")
    if not any(root.iterdir()):
        return
    if not (root / MANIFEST).is_file():
        raise ReplayStoreError(
            f"replay store path {root} is a non-empty directory without {MANIFEST}; refusing to clear what "
            f"may be someone else's data: choose an empty or new database_config.path"
        )
    for child in root.iterdir():
        if child.name == MANIFEST or child.name.startswith(INDEX_FILE_PREFIX) or (
                child.is_dir() and child.name.startswith("shard-")):
            shutil.rmtree(child) if child.is_dir() else child.unlink()
    leftovers = [c.name for c in root.iterdir()]
    if leftovers:
        raise ReplayStoreError(f"replay store path {root} holds unexpected files {leftovers}; not clearing them")


def _key(fragment_id: int) -> bytes:
    return fragment_id.to_bytes(8, "big")


# py-lmdb refuses to open one environment twice in a process, and a process may hold a writer and a reader
# (local mode), so environments are shared per process and closed with their last user.
_SHARED_ENVS: dict[str, list] = {}  # shard dir -> [environment, users]


def _acquire_env(directory: Path, map_size: int) -> lmdb.Environment:
    key = str(directory)
    if key not in _SHARED_ENVS:
        env = lmdb.open(key, map_size=map_size, subdir=True, create=False, sync=False, metasync=False,
                        readahead=False, max_readers=1024, max_spare_txns=4)
        _SHARED_ENVS[key] = [env, 0]
    _SHARED_ENVS[key][1] += 1
    return _SHARED_ENVS[key][0]


def _release_env(env: lmdb.Environment) -> None:
    for key, entry in list(_SHARED_ENVS.items()):
        if entry[0] is env:
            entry[1] -= 1
            if entry[1] == 0:
                del _SHARED_ENVS[key]
                env.close()
            return


class FragmentStore:
    """Handle on every shard of a store, for one process (reopen in each process; never pickle it)."""

    def __init__(self, layout: StoreLayout) -> None:
        self.layout = layout
        root = Path(layout.path)
        here = current_node_id()
        if layout.node_id is not None and here is not None and here != layout.node_id:
            raise ReplayStoreError(
                f"database_config.path {root}: the replay store is on Ray node {layout.node_id[:8]}, and this "
                f"process runs on node {here[:8]}; LMDB cannot be shared between machines, so only processes on "
                f"the store's node open it (others send fragments through the replay buffer actor)")
        self._envs: list[lmdb.Environment] = []
        try:
            for shard in range(layout.num_shards):
                self._envs.append(_acquire_env(_shard_dir(root, shard), layout.map_size_per_shard))
        except lmdb.Error as error:
            self.close()
            raise ReplayStoreError(f"cannot open replay store at {root}: {error}") from error

    @classmethod
    def open(cls, path: str | os.PathLike) -> "FragmentStore":
        """Open an existing store as it is (nothing is cleared)."""
        return cls(read_layout(path))

    def _env(self, fragment_id: int) -> lmdb.Environment:
        return self._envs[fragment_id % len(self._envs)]

    def put(self, fragment_id: int, record: bytes, overwrite: bool = True) -> bool:
        """Store ``record``; with ``overwrite=False`` keep an existing record and return False."""
        try:
            with self._env(fragment_id).begin(write=True) as txn:
                return txn.put(_key(fragment_id), record, overwrite=overwrite)
        except lmdb.MapFullError as error:
            raise self._map_full(f"shard for fragment {fragment_id}") from error
        except lmdb.Error as error:
            raise ReplayStoreError(f"cannot write fragment {fragment_id} to {self.layout.path}: {error}") from error

    def put_new(self, records: Sequence[tuple[int, bytes]]) -> int:
        """Store each ``(fragment_id, record)`` whose id is not there yet, one transaction per shard; return how
        many were new. An id already present is a repeated write of the same record (a retried call)."""
        written = 0
        for shard, items in self._by_shard(records, key=lambda item: item[0]).items():
            try:
                with self._envs[shard].begin(write=True) as txn:
                    written += sum(bool(txn.put(_key(i), record, overwrite=False)) for i, record in items)
            except lmdb.MapFullError as error:
                raise self._map_full(f"shard {shard}") from error
        return written

    def get(self, fragment_id: int) -> bytes:
        with self._env(fragment_id).begin() as txn:
            record = txn.get(_key(fragment_id))
        if record is None:
            raise MissingRecordError(f"fragment {fragment_id} is not in the replay store at {self.layout.path}")
        return record

    def delete_many(self, fragment_ids: Iterable[int]) -> int:
        """Delete the records that exist; return how many were deleted. One transaction per shard."""
        deleted = 0
        for shard, ids in self._by_shard(fragment_ids, key=lambda fragment_id: fragment_id).items():
            with self._envs[shard].begin(write=True) as txn:
                deleted += sum(bool(txn.delete(_key(i))) for i in ids)
        return deleted

    def _by_shard(self, items: Iterable[Any], key: Callable[[Any], int]) -> dict[int, list[Any]]:
        """``items`` grouped by the shard of their fragment id ``key(item)``, each group in the given order."""
        groups: dict[int, list[Any]] = {}
        for item in items:
            groups.setdefault(key(item) % len(self._envs), []).append(item)
        return groups

    def _map_full(self, where: str) -> ReplayStoreError:
        return ReplayStoreError(
            f"replay store {where} is full ({self.layout.map_size_per_shard} bytes): fragments encode larger than "
            f"database_config.max_fragment_bytes assumed; raise it")

    def count(self) -> int:
        return sum(env.stat()["entries"] for env in self._envs)

    def ids(self) -> list[int]:
        found = []
        for env in self._envs:
            with env.begin() as txn:
                found.extend(int.from_bytes(key, "big") for key in txn.cursor().iternext(values=False))
        return found

    def close(self) -> None:
        for env in self._envs:
            _release_env(env)
        self._envs = []

    def __enter__(self) -> "FragmentStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
