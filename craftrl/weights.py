"""Policy weights from the learner to every rollout worker: publish a version, each worker loads the newest.

* :class:`WeightPublisher` (the trainer's rank 0) puts each version into Ray's object store **once** and hands
  ``(version, ref)`` to the rollout manager, which offers it to every worker and keeps it for the workers it
  creates later, so a recreated worker starts from the newest weights through the same path.
* :class:`NewestWeights` (inside each worker) takes offers without blocking and loads them on a thread of its own:
  a worker that is behind fetches only the newest version and never a superseded one, and no actor method waits
  on a fetch (a 1 GB VPT-2x state dict takes seconds to cross a network; the manager's health checks must not).
  A fetch is never given up while it may still arrive: a newer version is fetched *beside* one that is overdue
  (on its way for longer than twice the last fetch took), and whichever arrives first is applied. Ray pulls an
  object from any node holding a copy, and a pull from a node cut off from the network took 10.2 s before Ray
  tried another copy: the newer version, pulled from elsewhere, overtakes it. Over a slow link, where every
  version takes longer to arrive than the learner takes to publish the next, the older fetch arrives first and
  is applied; a worker that gave up each fetch for the next version loaded none there (bench/notes/cluster.md).

When a newer version is published, nothing holds the older object any more and Ray frees it. With
``rollout_config.weights_dtype: float16`` the parameters travel in half precision (half the bytes; buffers stay
float32), which moves the rollout's log-probs by far less than :data:`HALF_PRECISION_LOGP_TOLERANCE` (measured
at most 3e-4 on the default config's policy with a peaked action head, 5e-5 on VPT-2x). Tensors travel as
numpy arrays where numpy has their dtype: Ray then hands every process on a node a view of the node's one copy in
the object store instead of unpickling a copy per process (a VPT-2x version is 1 GB), and ``load_state_dict``
copies them into the policy.
"""

from __future__ import annotations

import threading
import time
import warnings
from typing import Any, Callable, Iterable, Mapping

import numpy as np
import torch

StateDict = dict[str, torch.Tensor]
Fetches = dict[int, tuple[Any, float]]  # version -> (its ObjectRef or a state dict here, when its fetch began)
HALF_PRECISION_LOGP_TOLERANCE = 1e-3  # largest |log-prob change| float16 parameters may cause (tests/rollout)
RAY_DEFAULT_PULL_TIMEOUT_MS = 10_000
FETCH_POLL_S = 0.5  # how often the loader looks at its fetches on their way, and the least patience for one


class WeightPublisher:
    """Rank 0 of the trainer: one object-store copy per version, offered to the rollout manager."""

    def __init__(self, manager: Any, half_precision: Iterable[str] = ()) -> None:
        """``half_precision``: names of the float32 tensors to send as float16 (the policy's parameters when
        ``rollout_config.weights_dtype`` is ``float16``)."""
        self._manager = manager
        self._half = frozenset(half_precision)
        self.latest: tuple[int, Any] | None = None  # (version, ref): keeps the newest object alive

    def publish(self, version: int, state_dict: StateDict) -> float:
        """Put ``state_dict`` (moved to the CPU) into the object store and offer it; returns the seconds it took.

        The offer is not awaited: workers load it while the learner goes on."""
        import ray

        started = time.monotonic()
        ref = ray.put(publishable(state_dict, self._half))
        self.latest = (int(version), ref)
        if self._manager is not None:
            self._manager.update_weights.remote(int(version), [ref])  # wrapped: Ray must not resolve it here
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
        self.error: str | None = None
        self._applied_arrays: StateDict | None = None  # see _load_newest
        self._thread = threading.Thread(target=self._load_forever, name=name, daemon=True)
        self._thread.start()

    def offer(self, version: int, refs: list[Any]) -> None:
        """``refs``: ``[ObjectRef]`` (or ``[state_dict]`` already in this process)."""
        with self._changed:
            if version > self._newest_offered:
                self._newest_offered = int(version)
                self._offered = (int(version), refs)
                self._changed.notify()

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
                if self._offered is not None and self._may_fetch_another(on_the_way):
                    version, refs = self._offered
                    self._offered = None
                    on_the_way[version] = (refs[0], time.monotonic())
            try:
                arrived = _arrived(on_the_way)
            except Exception as error:  # Ray could not tell: fetch the next version offered from scratch
                self.error = f"waiting for weights versions {sorted(on_the_way)}: {type(error).__name__}: {error}"
                on_the_way = {}
                continue
            if arrived:
                on_the_way = self._load_newest(on_the_way, arrived)

    def _may_fetch_another(self, on_the_way: Fetches) -> bool:
        """At most two fetches at a time: a second one only beside a fetch on its way for longer than twice the
        last fetch and load took (``FETCH_POLL_S`` at least), and never before one fetch has shown what the link
        takes (a first fetch across a slow link would otherwise share it with a second)."""
        if not on_the_way:
            return True
        if len(on_the_way) > 1 or self.last_fetch_seconds is None:
            return False
        ((_, started),) = on_the_way.values()
        return time.monotonic() - started > max(FETCH_POLL_S, 2.0 * self.last_fetch_seconds)

    def _load_newest(self, on_the_way: Fetches, arrived: list[int]) -> Fetches:
        """Apply the newest of the ``arrived`` versions; returns the fetches on their way for newer ones.

        No reference to the applied version outlives the call: it would keep the learner's copy in the object store
        while the next versions are published (``ray.put`` of a 1 GB version then took 0.9 s instead of 0.1 s in
        ``bench/weight_broadcast.py``). Its arrays, views of this node's copy, are kept until the next version is
        applied: freeing that copy as soon as it was loaded made one later version in four arrive ~1 s late there
        (median 2.3 s against 1.8 s over 2 nodes)."""
        import ray

        version = max(arrived)
        self.fetches_overtaken += sum(1 for older in on_the_way if older < version and older not in arrived)
        fetched, started = on_the_way[version]
        try:
            state_dict = received(fetched if isinstance(fetched, dict) else ray.get(fetched))
            self._apply(version, state_dict)
            self._applied_arrays = state_dict
        except Exception as error:  # a version that cannot be loaded: keep acting with the last one
            self.error = f"loading weights version {version}: {type(error).__name__}: {error}"
        else:
            took = time.monotonic() - started
            self.fetches += 1
            self.fetch_seconds += took
            self.last_fetch_seconds = took
            with self._changed:
                self.applied_version = max(self.applied_version, version)
                self._changed.notify_all()
        return {later: fetch for later, fetch in on_the_way.items() if later > version}


def _arrived(on_the_way: Fetches) -> list[int]:
    """The versions among ``on_the_way`` that are in this process (a state dict) or in this node's object store,
    waiting up to ``FETCH_POLL_S`` for one to arrive."""
    import ray

    local = [version for version, (fetched, _) in on_the_way.items() if isinstance(fetched, dict)]
    if local:
        return local
    versions = {fetched: version for version, (fetched, _) in on_the_way.items()}
    if not ray.wait(list(versions), num_returns=1, timeout=FETCH_POLL_S)[0]:
        return []
    arrived, _ = ray.wait(list(versions), num_returns=len(versions), timeout=0)
    return [versions[ref] for ref in arrived]


def pull_retry_advice(record: Mapping[str, Any], pull_timeout_ms: int) -> str | None:
    """The console line for a run in which a rollout worker took longer to fetch a version than Ray's
    ``object_manager_pull_timeout_ms``, after which Ray asks for the object again: from then on, over a 20 Mbit/s
    link, every later version arrived at a half to a third of the link's rate, and at its rate with the setting at
    60000 (bench/slow_link.py). None for a record that does not call for it."""
    fetch_s = record.get("rollout/weights_fetch_s_max")
    if not isinstance(fetch_s, (int, float)) or fetch_s * 1000 <= pull_timeout_ms:
        return None
    return (f"craftrl: a rollout worker took {fetch_s:.1f} s to fetch a policy version, longer than Ray's "
            f"object_manager_pull_timeout_ms ({pull_timeout_ms} ms), after which Ray asks for it again and a slow link "
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


def received(state_dict: dict[str, Any]) -> StateDict:
    """The tensors a worker loads from what :func:`publishable` put into the object store, without copying. The
    arrays are read-only views of the object store, which torch warns about; nothing writes to them
    (``load_state_dict`` copies from them, into the policy's own dtype)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return {name: torch.from_numpy(value) if isinstance(value, np.ndarray) else value
                for name, value in state_dict.items()}
