"""Ray actor shell around ``RolloutLoop``: one rollout worker, its threads and its send queue.

Threads inside a worker actor (``max_concurrency`` lets Ray run its methods beside them):

* the rollout thread runs ``RolloutLoop.step`` forever;
* the sender thread drains the bounded send queue into the fragment sink (the replay buffer); when the
  sink is slow the queue fills and the rollout thread waits in ``put`` -- backpressure, never a drop. What the
  newest offered weights version already makes too stale to sample (``max_staleness``) is discarded before it
  is encoded or sent (``fragments_discarded_stale``): the buffer would refuse it on arrival, and a worker far
  behind the learner, behind a slow link, would spend the link and the buffer's time on it;
* the weights loader (:class:`craftrl.weights.NewestWeights`) fetches the newest offered weights and queues them
  for the loop, which swaps them between forward passes;
* Ray's method threads handle ``update_weights`` (an offer of a version, never a fetch), ``request_video``
  and ``status``.
"""

from __future__ import annotations

import dataclasses
import logging
import queue
import threading
import time
import traceback
from pathlib import Path
from typing import Any, Callable

import torch

from craftrl.config.schema import OnlineConfig
from craftrl.config.validate import build_config
from craftrl.replay.index import too_stale
from craftrl.rollout.fragment import Fragment
from craftrl.rollout.loop import EpisodeRecord, RolloutLoop
from craftrl.rollout.video import video_filename, write_mp4_in_background
from craftrl.placement import current_node_id
from craftrl.system import METRICS, find
from craftrl.weights import NewestWeights

logger = logging.getLogger(__name__)


def undelivered(status: dict[str, Any]) -> float:
    """Fragments a worker cut and neither sent nor discarded as stale, by its ``status``."""
    return float(status.get("fragments_emitted", 0)) - float(status.get("fragments_sent", 0)) - \
        float(status.get("fragments_discarded_stale", 0))


def rollout_device(num_gpus: float) -> torch.device:
    """The worker's GPU when it reserved one and CUDA exists, else the CPU (MineStudio hard-codes cuda)."""
    return torch.device("cuda") if num_gpus > 0 and torch.cuda.is_available() else torch.device("cpu")


class RolloutWorker:
    """Body of the rollout worker actor. ``fragment_sink`` is a ``FragmentSink`` (see ``sinks``)."""

    def __init__(self, worker_name: str, env_generator: Callable[[], Any], policy_generator: Callable[[], Any],
                 config: dict[str, Any], fragment_sink: Any, statistics: Any = None, seed: int | None = None,
                 weights: tuple[int, Any] | None = None, home_node: str | None = None):
        """``weights``: ``(version, refs)`` to act with from the first step."""
        online: OnlineConfig = build_config(config)
        rollout, worker_cfg = online.rollout_config, online.rollout_config.worker_config
        self.name = worker_name
        self.sink = fragment_sink
        self.statistics = statistics
        self.video_dir = Path(worker_cfg.video_output_dir)
        self.video_fps = worker_cfg.video_fps
        self.node = current_node_id()
        # the run directory is on the home node's disk: from elsewhere, videos travel to the metrics actor there
        self.videos_travel = home_node is not None and self.node is not None and self.node != home_node
        self.device = rollout_device(rollout.num_gpus_per_worker)
        if rollout.num_cpus_per_worker >= 1:
            torch.set_num_threads(int(rollout.num_cpus_per_worker))
        policy = policy_generator().to(self.device)
        self.send_queue: queue.Queue[Fragment] = queue.Queue(maxsize=rollout.to_send_queue_size)
        self._stop_rollout = threading.Event()  # stop stepping envs (the sender still delivers what is queued)
        self._stop = threading.Event()  # stop everything
        self.error: str | None = None
        self.max_staleness = rollout.replay_buffer_config.max_staleness
        self.sent = 0
        self.discarded_stale = 0
        self.send_failures = 0
        self.send_seconds = 0.0
        self.loop = RolloutLoop(
            env_generator, policy, num_envs=worker_cfg.num_envs, batch_size=worker_cfg.batch_size,
            envs_per_process=worker_cfg.envs_per_process, max_batch_wait=worker_cfg.max_batch_wait,
            fragment_length=rollout.fragment_length, emit=self._enqueue, on_episode=self._report_episode,
            on_video=self._write_video, discount=online.train_config.discount,
            step_timeout=worker_cfg.step_timeout, reset_timeout=worker_cfg.reset_timeout,
            restart_interval=worker_cfg.restart_interval, worker_name=worker_name, seed=seed,
            fragments_per_version=online.fragments_per_env_per_version() if rollout.synchronous_sampling else 0)
        self.weights = NewestWeights(self._load_weights)
        if weights is not None:  # a recreated worker acts with the newest weights from its first step
            self.update_weights(*weights)
            self.weights.wait_for(weights[0], timeout=300.0)
        self._threads = [threading.Thread(target=self._guard(self._rollout_forever), name="rollout", daemon=True),
                         threading.Thread(target=self._guard(self._send_forever), name="sender", daemon=True)]
        for thread in self._threads:
            thread.start()

    # ------------------------------------------------------------------ actor methods

    def update_weights(self, version: int, refs: list[Any]) -> int:
        """Offer ``version`` with its ``refs`` (``[ObjectRef]``, in a list so Ray does not resolve them); returns
        at once."""
        self.weights.offer(version, refs)
        return version

    def _load_weights(self, version: int, state_dict: dict[str, torch.Tensor]) -> None:
        self.loop.set_weights(version, {k: v.to(self.device) for k, v in state_dict.items()})

    def request_video(self, label: dict[str, Any]) -> None:
        self.loop.request_video(label)

    def set_fragments_per_version(self, count: int) -> None:
        self.loop.set_fragments_per_version(count)

    def status(self) -> dict[str, Any]:
        return {**self.loop.stats(), "name": self.name, "node": self.node, "queue_fill": self.send_queue.qsize(),
                "queue_size": self.send_queue.maxsize, "fragments_sent": self.sent,
                "fragments_discarded_stale": self.discarded_stale,
                "send_failures": self.send_failures, "send_s": self.send_seconds, "error": self.error,
                "weights_fetches": self.weights.fetches, "weights_fetch_s": self.weights.fetch_seconds,
                "weights_last_fetch_s": self.weights.last_fetch_seconds or 0.0,
                "weights_last_shard_s": self.weights.last_slowest_shard_seconds,
                "weights_error": self.weights.error,
                "alive": all(t.is_alive() for t in self._threads)}

    def stop(self, drain_timeout: float = 30.0) -> dict[str, Any]:
        """Stop stepping, deliver the fragments already cut, then stop; returns the final status.

        Delivering first is what lets a run's accounting close: every fragment this worker emitted was
        either sent, discarded as stale, or is counted in ``fragments_dropped`` (the sink stayed unreachable for
        ``drain_timeout``).
        """
        rollout_thread, sender_thread = self._threads
        self._stop_rollout.set()
        rollout_thread.join(timeout=10)
        deadline = time.monotonic() + drain_timeout
        while self.send_queue.unfinished_tasks and sender_thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=10)
        self.weights.close()
        self.loop.close()
        status = self.status()
        status["fragments_dropped"] = undelivered(status)
        return status

    # ------------------------------------------------------------------ threads

    def _guard(self, body: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                body()
            except Exception:
                self.error = traceback.format_exc(limit=8)
                logger.error("rollout worker %s: %s", self.name, self.error)
        return run

    def _rollout_forever(self) -> None:
        while not self._stop_rollout.is_set() and not self._stop.is_set():
            self.loop.step(timeout=1.0)

    def _enqueue(self, fragment: Fragment) -> None:
        while not self._stop.is_set():
            try:
                self.send_queue.put(fragment, timeout=0.5)
                return
            except queue.Full:
                continue

    def _send_forever(self) -> None:
        import ray

        self.sink.open()
        try:
            while not self._stop.is_set():
                try:
                    taken = [self.send_queue.get(timeout=0.5)]
                except queue.Empty:
                    continue
                taken += self._take_waiting()
                started = time.monotonic()
                batch = taken
                while not self._stop.is_set():
                    batch = self._without_stale(batch)  # checked again before each retry: versions move on
                    if not batch:
                        break
                    try:
                        self.sink.send(batch)
                        self.sent += len(batch)
                        break
                    except ray.exceptions.RayActorError:
                        self.send_failures += 1  # the sink is being recreated: keep the fragments, retry
                        time.sleep(1.0)
                for _ in taken:
                    self.send_queue.task_done()
                self.send_seconds += time.monotonic() - started
        finally:
            self.sink.close()

    def _without_stale(self, fragments: list[Fragment]) -> list[Fragment]:
        """``fragments`` less those the trainer, at least at the newest offered version, will never sample."""
        newest = self.weights.newest_offered
        fresh = [f for f in fragments if not too_stale(f.min_version, newest, self.max_staleness)]
        self.discarded_stale += len(fragments) - len(fresh)
        return fresh

    def _take_waiting(self) -> list[Fragment]:
        """The fragments already queued behind the one just taken (a group's envs end fragments together)."""
        waiting = []
        while len(waiting) < self.send_queue.maxsize:
            try:
                waiting.append(self.send_queue.get_nowait())
            except queue.Empty:
                break
        return waiting

    def _report_episode(self, record: EpisodeRecord) -> None:
        if self.statistics is not None:
            self.statistics.report.remote(dataclasses.asdict(record))  # fire and forget

    def _write_video(self, label: dict[str, Any], frames: list[Any]) -> None:
        deliver = self._deliver_video if self.videos_travel else None
        write_mp4_in_background(self.video_dir / video_filename(label, self.name), frames, self.video_fps, deliver)

    @staticmethod
    def _deliver_video(path: Path, data: bytes) -> None:
        sink = find(METRICS)
        if sink is not None:
            sink.save_file.remote(str(path), data)  # fire and forget, like every other metric
