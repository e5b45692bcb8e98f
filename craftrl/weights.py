"""Policy weights from the learner to every rollout worker: publish a version, each worker loads the newest.

* :class:`WeightPublisher` (the trainer's rank 0) puts each version into Ray's object store **once** and hands
  ``(version, ref)`` to the rollout manager, which offers it to every worker and keeps it for the workers it
  creates later, so a recreated worker starts from the newest weights through the same path.
* :class:`NewestWeights` (inside each worker) takes offers without blocking and loads them on a thread of its own:
  a worker that is behind fetches only the newest version and never a superseded one, and no actor method waits
  on a fetch (a 1 GB VPT-2x state dict takes seconds to cross a network; the manager's health checks must not).
  A fetch still on its way when a newer version is offered is dropped for the newer one: Ray pulls an object
  from any node holding a copy, and a pull from a node cut off from the network took 10.2 s before Ray tried
  another copy, while a worker that kept waiting acted with old weights (every fragment it cut for 10-25 s
  arrived stale in a partition test; bench/notes/cluster.md).

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
from typing import Any, Callable, Iterable

import numpy as np
import torch

StateDict = dict[str, torch.Tensor]
HALF_PRECISION_LOGP_TOLERANCE = 1e-3  # largest |log-prob change| float16 parameters may cause (tests/rollout)
FETCH_POLL_S = 0.5  # how often a fetch still on its way looks for a newer version to fetch instead


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

    ``apply(version, state_dict)`` runs on the loader thread; offers older than what was applied are ignored.
    """

    def __init__(self, apply: Callable[[int, StateDict], None], name: str = "weights-loader") -> None:
        self._apply = apply
        self._offered: tuple[int, list[Any]] | None = None
        self._changed = threading.Condition()
        self._closed = False
        self.applied_version = -1
        self.fetches = 0  # versions actually fetched from the object store
        self.fetches_dropped = 0  # fetches given up on for a newer version offered while they were on their way
        self.fetching = -1  # the version being fetched, or the last one
        self.fetch_seconds = 0.0
        self.error: str | None = None
        self._thread = threading.Thread(target=self._load_forever, name=name, daemon=True)
        self._thread.start()

    def offer(self, version: int, refs: list[Any]) -> None:
        """``refs``: ``[ObjectRef]`` (or ``[state_dict]`` already in this process)."""
        with self._changed:
            if version > self.applied_version and (self._offered is None or version > self._offered[0]):
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
        while True:
            with self._changed:
                while self._offered is None and not self._closed:
                    self._changed.wait()
                if self._closed:
                    return
                version, refs = self._offered
                self._offered = None
            started = time.monotonic()
            self.fetching = version
            try:
                fetched = self._fetch_newest(version, refs)
                if fetched is None:
                    return  # closed while fetching
                version, state_dict = fetched
                self.fetches += 1
                self._apply(version, state_dict)
            except Exception as error:  # a version that cannot be loaded: keep acting with the last one
                self.error = f"loading weights version {self.fetching}: {type(error).__name__}: {error}"
                continue
            finally:
                self.fetch_seconds += time.monotonic() - started
            with self._changed:
                self.applied_version = max(self.applied_version, version)
                self._changed.notify_all()

    def _fetch_newest(self, version: int, refs: list[Any]) -> tuple[int, StateDict] | None:
        """``version``'s state dict, or that of a newer version offered while it was still on its way (taken
        from the offers like any other); None once closed."""
        import ray

        while not isinstance(refs[0], dict):
            ready, _ = ray.wait([refs[0]], timeout=FETCH_POLL_S)
            if ready:
                return version, received(ray.get(refs[0]))
            with self._changed:
                if self._closed:
                    return None
                if self._offered is not None and self._offered[0] > version:
                    version, refs = self._offered
                    self._offered = None
                    self.fetches_dropped += 1
                    self.fetching = version
        return version, received(refs[0])


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
