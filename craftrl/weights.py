"""Policy weights from the learner to every rollout worker: publish a version, each worker loads the newest.

* :class:`WeightPublisher` (the trainer's rank 0) puts each version into Ray's object store **once**, in shards
  (:func:`shard_size`), and hands ``(version, refs)`` to the rollout manager, which offers them to every worker
  and keeps the newest for a recreated worker, so it starts from the newest weights.
* :class:`NewestWeights` (inside each worker) takes offers without blocking and loads them on a thread of its own:
  a worker that is behind fetches only the newest version and never a superseded one, and no actor method waits
  on a fetch (a VPT-2x state dict is 1 GB and takes seconds to cross a network; the manager's health checks must
  not).
  A fetch is never given up while it may still arrive: a newer version is fetched *beside* one that is overdue
  (on its way for longer than twice the last fetch took), and whichever arrives first is applied. Ray pulls an
  object from any node holding a copy, and a pull from a node cut off from the network waits out a timeout
  before Ray tries another copy: the newer version, pulled from elsewhere, overtakes it. Over a slow link, where every
  version takes longer to arrive than the learner takes to publish the next, the older fetch arrives first and
  is applied; a worker that gave up each fetch for the next version loaded none there (bench/notes/cluster.md).

Why shards: Ray asks a node again for an object that has not arrived after ``object_manager_pull_timeout_ms``
(10 s by default), and the node then sends the whole object again from its first chunk, beside the copy still on its
way. Over a slow link a large object passes that timeout, and every version after it shares the link with
those repeated copies and passes it too, so the link carries a fraction of its rate (bench/slow_link.py). A shard
crosses such a link within the timeout, so none is ever asked for again; the loader fetches a version's shards one
after another, and the version arrives with its last shard. On a link too slow for even one shard within the
timeout, the driver prints the one setting that stops the resending (:func:`pull_retry_advice`).

When a newer version is published, nothing holds the older objects any more and Ray frees them. With
``rollout_config.weights_dtype: float16`` the parameters travel in half precision (half the bytes; buffers stay
float32), which moves the rollout's log-probs by less than :data:`HALF_PRECISION_LOGP_TOLERANCE` (tested on the
default config's policy with a peaked action head, and on VPT-2x). Tensors travel as
numpy arrays where numpy has their dtype: Ray then hands every process on a node a view of the node's one copy in
the object store instead of unpickling a copy per process (a VPT-2x version is 1 GB), and ``load_state_dict``
copies them into the policy.
"""

from __future__ import annotations

import threading
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

import numpy as np
import torch

StateDict = dict[str, torch.Tensor]
Shard = dict[str, Any]  # name -> a whole tensor (an array where numpy has its dtype) or a TensorPiece of one
SHARD_BYTES = 4 << 20  # the smallest shard: below Ray's 5-MiB transfer chunk, within its pull timeout on slow links
SHARDS_PER_VERSION = 16  # at most, for versions above 64 MiB: each object costs Ray a pull of its own
HALF_PRECISION_LOGP_TOLERANCE = 1e-3  # largest |log-prob change| float16 parameters may cause (tests/rollout)
RAY_DEFAULT_PULL_TIMEOUT_MS = 10_000
FETCH_POLL_S = 0.5  # how often the loader looks at its fetches on their way, and the least patience for one


class WeightPublisher:
    """Rank 0 of the trainer: one object-store copy per version, offered to the rollout manager."""

    def __init__(self, manager: Any, half_precision: Iterable[str] = (), shard_bytes: int | None = None) -> None:
        """``half_precision``: names of the float32 tensors to send as float16 (the policy's parameters when
        ``rollout_config.weights_dtype`` is ``float16``); ``shard_bytes``: the most bytes one object of a version
        holds (default :func:`shard_size` of the version)."""
        self._manager = manager
        self._half = frozenset(half_precision)
        self._shard_bytes = shard_bytes
        self.latest: tuple[int, list[Any]] | None = None  # (version, refs): keeps the newest objects alive

    def publish(self, version: int, state_dict: StateDict) -> float:
        """Put ``state_dict`` (moved to the CPU) into the object store and offer it; returns the seconds it took.

        The offer is not awaited: workers load it while the learner goes on."""
        import ray

        started = time.monotonic()
        published = publishable(state_dict, self._half)
        refs = [ray.put(shard) for shard in sharded(published, self._shard_bytes or shard_size(bytes_in(published)))]
        self.latest = (int(version), refs)
        if self._manager is not None:  # refs in a list: Ray must not resolve them in the manager
            self._manager.update_weights.remote(int(version), refs)
        return time.monotonic() - started


class NewestWeights:
    """A worker's side: ``offer`` returns at once; a loader thread fetches the newest offer and ``apply``-s it.

    ``apply(version, state_dict)`` runs on the loader thread; versions arrive in increasing order, and an offer
    that is not newer than every earlier one is ignored.
    """

    def __init__(self, apply: Callable[[int, StateDict], None], name: str = "weights-loader") -> None:
        self._apply = apply
        self._offered: tuple[int, list[Any]] | None = None
        self._newest_offered = -1
        self._changed = threading.Condition()
        self._closed = False
        self.applied_version = -1
        self.fetches = 0  # versions fetched and applied
        self.fetches_overtaken = 0  # fetches left on their way: a newer version fetched beside arrived first
        self.fetch_seconds = 0.0  # from the start of each applied version's fetch to its load, summed
        self.last_fetch_seconds: float | None = None  # None until the first version is applied
        self.last_slowest_shard_seconds = 0.0  # the applied version's slowest shard, from asked to here
        self.error: str | None = None
        self._applied_arrays: StateDict | None = None  # see _load_newest
        self._thread = threading.Thread(target=self._load_forever, name=name, daemon=True)
        self._thread.start()

    def offer(self, version: int, refs: list[Any]) -> None:
        """``refs``: the version's shards, as ObjectRefs or as dicts already in this process."""
        with self._changed:
            if version > self._newest_offered:
                self._newest_offered = int(version)
                self._offered = (int(version), refs)
                self._changed.notify()

    @property
    def newest_offered(self) -> int:
        """The newest version offered so far (-1 before any): the trainer's version is at least this."""
        return self._newest_offered

    def wait_for(self, version: int, timeout: float) -> bool:
        """Block until ``version`` (or a newer one) is applied; for tests and benchmarks."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while self.applied_version < version:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._changed.wait(remaining)
        return True

    def close(self) -> None:
        with self._changed:
            self._closed = True
            self._changed.notify_all()
        self._thread.join(timeout=5)

    def _load_forever(self) -> None:
        on_the_way: Fetches = {}
        while True:
            with self._changed:
                while not on_the_way and self._offered is None and not self._closed:
                    self._changed.wait()
                if self._closed:
                    return
                offered = None
                if self._offered is not None and self._may_fetch_another(on_the_way):
                    offered, self._offered = self._offered, None
            if offered is not None:
                self._start_fetch(on_the_way, *offered)
            if not on_the_way:
                continue
            try:
                arrived = _arrived(on_the_way)
            except Exception as error:  # Ray could not tell: fetch the next version offered from scratch
                self.error = f"waiting for weights versions {sorted(on_the_way)}: {type(error).__name__}: {error}"
                on_the_way = {}
                continue
            if arrived:
                on_the_way = self._load_newest(on_the_way, arrived)

    def _start_fetch(self, on_the_way: Fetches, version: int, refs: list[Any]) -> None:
        """Put ``version`` on its way, unless it is not newer than what is applied or on its way."""
        if version > self.applied_version and all(version > fetching for fetching in on_the_way):
            on_the_way[int(version)] = Fetch(list(refs), time.monotonic())

    def _may_fetch_another(self, on_the_way: Fetches) -> bool:
        """At most two fetches at a time: a second one only beside a fetch on its way for longer than twice the
        last fetch and load took (``FETCH_POLL_S`` at least), and never before one fetch has shown what the link
        takes (a first fetch across a slow link would otherwise share it with a second)."""
        if not on_the_way:
            return True
        if len(on_the_way) > 1 or self.last_fetch_seconds is None:
            return False
        (fetch,) = on_the_way.values()
        return time.monotonic() - fetch.started > max(FETCH_POLL_S, 2.0 * self.last_fetch_seconds)

    def _load_newest(self, on_the_way: Fetches, arrived: list[int]) -> Fetches:
        """Apply the newest of the ``arrived`` versions; returns the fetches on their way for newer ones.

        No reference to the applied version outlives the call: it would keep the learner's copy in the object store
        while the next versions are published, which slows each ``ray.put`` of a large version several times
        (``bench/weight_broadcast.py``). Its arrays, views of this node's copy, are kept until the next version is
        applied: freeing that copy as soon as it was loaded made later versions arrive late there
        (bench/notes/code_figures.md)."""
        import ray

        version = max(arrived)
        self.fetches_overtaken += sum(1 for older in on_the_way if older < version and older not in arrived)
        fetch = on_the_way[version]
        try:
            shards = fetch.refs if fetch.local else ray.get(fetch.refs)
            state_dict = received(shards)
            self._apply(version, state_dict)
            self._applied_arrays = state_dict
        except Exception as error:  # a version that cannot be loaded: keep acting with the last one
            self.error = f"loading weights version {version}: {type(error).__name__}: {error}"
        else:
            took = time.monotonic() - fetch.started
            self.fetches += 1
            self.fetch_seconds += took
            self.last_fetch_seconds = took
            self.last_slowest_shard_seconds = fetch.slowest_shard_s
            with self._changed:
                self.applied_version = max(self.applied_version, version)
                self._changed.notify_all()
        return {later: fetch for later, fetch in on_the_way.items() if later > version}


@dataclass
class Fetch:
    """One version on its way to this node: its shards (ObjectRefs, or dicts already in this process), when its
    fetch began, and how many of its shards, in order, are in this node's object store."""

    refs: list[Any]
    started: float
    shards_here: int = 0
    next_asked: float = field(init=False)  # when Ray was first asked for the next shard
    slowest_shard_s: float = 0.0

    def __post_init__(self) -> None:
        self.next_asked = self.started

    @property
    def local(self) -> bool:
        return isinstance(self.refs[0], dict)

    @property
    def complete(self) -> bool:
        return self.local or self.shards_here == len(self.refs)


Fetches = dict[int, Fetch]


def _arrived(on_the_way: Fetches) -> list[int]:
    """The versions among ``on_the_way`` whose every shard is in this process or in this node's object store.

    Each fetch asks Ray for its next shard only, so a slow link carries one shard per version at a time; this waits
    up to ``FETCH_POLL_S`` for one of them to arrive."""
    import ray

    complete = [version for version, fetch in on_the_way.items() if fetch.complete]
    if complete:
        return complete
    next_shards = {fetch.refs[fetch.shards_here]: fetch for fetch in on_the_way.values()}
    if not ray.wait(list(next_shards), num_returns=1, timeout=FETCH_POLL_S)[0]:
        return []
    here, _ = ray.wait(list(next_shards), num_returns=len(next_shards), timeout=0)
    now = time.monotonic()
    for ref in here:
        fetch = next_shards[ref]
        fetch.shards_here += 1
        fetch.slowest_shard_s = max(fetch.slowest_shard_s, now - fetch.next_asked)
        fetch.next_asked = now
    return [version for version, fetch in on_the_way.items() if fetch.complete]


def pull_retry_advice(record: Mapping[str, Any], pull_timeout_ms: int) -> str | None:
    """The console line for a run in which one shard of a version took a rollout worker longer to fetch than Ray's
    ``object_manager_pull_timeout_ms``, after which Ray sends it again and every later version arrives at a fraction
    of the link's rate (bench/slow_link.py with whole versions). None for a record that does not call for it."""
    shard_s = record.get("rollout/weights_shard_s_max")
    if not isinstance(shard_s, (int, float)) or shard_s * 1000 <= pull_timeout_ms:
        return None
    return (f"craftrl: a rollout worker took {shard_s:.1f} s to fetch one shard of a policy version, longer than Ray's "
            f"object_manager_pull_timeout_ms ({pull_timeout_ms} ms), after which Ray sends it again and a slow link "
            "carries it at a fraction of its rate; start the cluster's head with a longer one: ray start --head "
            "--system-config '{\"object_manager_pull_timeout_ms\": 60000}' (docs/cluster.md)")


def ray_pull_timeout_ms() -> int:
    """``object_manager_pull_timeout_ms`` of the cluster this process is connected to (the head's setting, which
    every process of the cluster has), or Ray's default where Ray cannot tell."""
    import ray

    try:
        return int(ray._config.object_manager_pull_timeout_ms())
    except Exception:  # a private API: its absence must not stop a run
        return RAY_DEFAULT_PULL_TIMEOUT_MS


def publishable(state_dict: StateDict, half_precision: frozenset[str] = frozenset()) -> dict[str, Any]:
    """What goes into the object store: CPU arrays, float16 for the float32 tensors named in ``half_precision``."""
    def prepared(name: str, tensor: torch.Tensor) -> torch.Tensor:
        tensor = tensor.detach().cpu()
        return tensor.half() if name in half_precision and tensor.dtype == torch.float32 else tensor

    return {name: _shareable(prepared(name, tensor)) for name, tensor in state_dict.items()}


def _shareable(tensor: torch.Tensor) -> np.ndarray | torch.Tensor:
    """A numpy view of ``tensor`` where numpy has its dtype (bfloat16 has none: it stays a tensor)."""
    return tensor.numpy() if tensor.dtype != torch.bfloat16 else tensor


@dataclass
class TensorPiece:
    """A run of a tensor too large for one shard: the next of its elements in flat order; the shards of a version
    hold its pieces in order."""

    shape: tuple[int, ...]  # the whole tensor's
    values: Any  # a 1-D array (or a bfloat16 tensor)


def shard_size(version_bytes: int) -> int:
    """The most bytes per shard for a version of ``version_bytes``: :data:`SHARD_BYTES`, or a
    :data:`SHARDS_PER_VERSION`-th of the version where that is more: fewer, larger objects cost Ray fewer pulls
    (bench/notes/cluster.md)."""
    return max(SHARD_BYTES, -(-version_bytes // SHARDS_PER_VERSION))


def sharded(published: dict[str, Any], shard_bytes: int) -> list[Shard]:
    """``published`` (from :func:`publishable`) as shards in the tensors' order, each of at most ``shard_bytes``
    but for a tensor of up to twice that, which travels whole in a shard of its own (no copy to join it on arrival);
    a larger tensor fills the current shard with a flat piece and goes on in pieces in the next ones."""
    shards: list[Shard] = [{}]
    room = shard_bytes
    for name, value in published.items():  # numpy arrays and torch tensors alike have nbytes and itemsize
        itemsize, nbytes = value.itemsize, value.nbytes
        if room < nbytes <= 2 * shard_bytes:  # a tensor up to twice a shard travels whole, in a shard of its own
            shards.append({})
            room = max(shard_bytes, nbytes)
        if nbytes <= room:
            shards[-1][name] = value
            room -= nbytes
            continue
        flat = value.reshape(-1)
        start = 0
        while start < len(flat):
            if room < itemsize:
                shards.append({})
                room = shard_bytes
            piece = flat[start:start + max(1, room // itemsize)]
            if not isinstance(piece, np.ndarray):
                piece = piece.clone()  # a torch view would carry its whole storage into the object store
            shards[-1][name] = TensorPiece(tuple(value.shape), piece)
            start += len(piece)
            room -= len(piece) * itemsize
    return [shard for shard in shards if shard] or [{}]


def bytes_in(shard: Shard) -> int:
    """The bytes of the tensors and pieces in ``shard`` (or in a whole version from :func:`publishable`)."""
    return sum((value.values if isinstance(value, TensorPiece) else value).nbytes for value in shard.values())


def received(shards: list[Shard]) -> StateDict:
    """The tensors a worker loads from a version's shards (:func:`sharded`): whole tensors without a copy, a tensor
    that travelled in pieces joined into one. The arrays are read-only views of the object store, which torch warns
    about; nothing writes to them (``load_state_dict`` copies from them, into the policy's own dtype)."""
    whole: StateDict = {}
    pieces: dict[str, list[TensorPiece]] = {}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        for shard in shards:
            for name, value in shard.items():
                if isinstance(value, TensorPiece):
                    pieces.setdefault(name, []).append(value)
                else:
                    whole[name] = _tensor(value)
        for name, parts in pieces.items():
            whole[name] = torch.cat([_tensor(part.values) for part in parts]).view(parts[0].shape)
    return whole


def _tensor(value: Any) -> torch.Tensor:
    return torch.from_numpy(value) if isinstance(value, np.ndarray) else value
