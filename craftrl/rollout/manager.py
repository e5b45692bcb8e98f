"""Ray actor body of the rollout manager: creates, watches and feeds the rollout workers.

The manager checks its workers every ``health_interval`` seconds and recreates a dead or broken one
(counted), handing it the latest weights so it does not act with stale ones. A check asks every worker at once
and waits for the answers until one deadline, so workers that cannot answer (a dead node's) cost it one timeout
however many they are. A worker that merely answers slowly (a loaded machine) is replaced only after
``MAX_MISSED_STATUS`` unanswered checks in a row. A worker position whose fresh workers break ``MAX_FAILED_STARTS``
times in a row before cutting a single fragment is given up (a broken env or policy generator would otherwise be
retried forever): its error is reported by ``fatal_error`` once no worker is left, and the trainer stops with it.

A new worker that has not answered yet while the cluster has nothing free of what it asks for (its node died, say)
is not failing to start but waiting to be placed: its position waits (``rollout/workers_waiting_for_node``) and Ray
starts it as soon as a node with those resources joins. What workers on a dead node had cut but not sent is counted
as ``fragments_lost_with_dead_nodes``. Every worker the manager replaces is named anew, and the sink refuses the
old one's fragments from then on (``retire_worker``): a node cut off from the network is dead to Ray while its
worker runs on, and delivers what it held when the network comes back. Under synchronous sampling the envs of
the workers that do run then cut a larger share of each iteration (``rollout/fragments_per_env_per_version``), so
the learner is never left waiting for a worker that is not there; a replaced worker cuts its whole share for the
version it starts with. The manager's status, which every training iteration's record asks for, does not ask
the positions waiting for a node or given up either, nor a worker that missed the last health check: it would only
wait out its timeout on them.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from typing import Any, Callable

from craftrl.config.validate import build_config
from craftrl.rollout.loop import worker_prefix
from craftrl.rollout.sinks import ReplayBufferSink
from craftrl.rollout.worker import RolloutWorker, undelivered
from craftrl.placement import actor_placed, current_node_id, restarted_by_ray
from craftrl.system import connect

logger = logging.getLogger(__name__)
MAX_MISSED_STATUS = 3
MAX_FAILED_STARTS = 3
CUMULATIVE_KEYS = ("env_steps", "fragments_emitted", "fragments_sent", "fragments_discarded_stale", "restarts",
                   "emit_wait_s", "weights_wait_s", "inference_s", "env_wait_s", "elapsed_s", "forward_passes")


class RolloutManager:
    """Body of the named rollout manager actor: creates, watches and feeds the rollout workers."""

    def __init__(self, env_generator: Callable[[], Any], policy_generator: Callable[[], Any],
                 config: dict[str, Any], fragment_sink: Any = None, health_interval: float = 2.0):
        """``fragment_sink`` None: the run's replay buffer. It and the episode statistics are found through
        :func:`craftrl.system.connect` (the module says why by name)."""
        self.online = build_config(config)
        self.config = config
        self.env_generator = env_generator
        self.policy_generator = policy_generator
        actors = connect()
        self.sink = fragment_sink if fragment_sink is not None else ReplayBufferSink(actors.replay)
        self.statistics = actors.statistics
        self.health_interval = health_interval
        self.workers: list[Any] = []
        self.worker_names: dict[int, str] = {}  # worker position -> the name of its current worker
        self.recreated = 0
        # (node, fragments cut but not sent) of each worker that died, from its last status; split by whether its
        # node died when the accounting is read, since a node's death reaches Ray's GCS seconds after its actors'
        self.unsent_by_dead_workers: list[tuple[str | None, float]] = []
        self.dropped_by_replaced = 0.0  # cut but not delivered by broken workers stopped before replacement
        self.latest_weights: tuple[int, list[Any]] | None = None
        self.last_status: list[dict[str, Any]] = []
        self.missed: dict[int, int] = {}
        self.failed_starts: dict[int, int] = {}  # worker position -> fresh workers in a row that broke unproductive
        self.given_up: dict[int, str] = {}  # worker position -> the error that made the manager give up
        self.waiting_for_node: dict[int, Any] = {}  # worker position -> its first unanswered status call
        self.answered: set[int] = set()  # positions whose current worker has answered a status call
        self.share_sent: int | None = None  # synchronous sampling: the per-env share every worker was last told
        self.retired = dict.fromkeys(CUMULATIVE_KEYS, 0.0)  # counters of replaced workers, so totals never drop
        self._started = time.monotonic()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._monitor: threading.Thread | None = None
        # Ray restarted this manager after its process died: its workers died with it (Ray ends the actors a
        # dead owner created), so it starts new ones; they act with the policy's initial weights until the
        # trainer publishes its next version, and the rollout counters start over.
        self.restarted = restarted_by_ray()
        if self.restarted:
            logger.warning("rollout manager restarted by Ray: starting %d new rollout workers",
                           self.online.rollout_config.num_rollout_workers)
            self.start()

    def start(self) -> int:
        if self.workers:  # started already (a start call Ray retried after a restart that started them)
            return len(self.workers)
        rollout = self.online.rollout_config
        if rollout.synchronous_sampling:
            self.share_sent = self.online.fragments_per_env_per_version()  # what new workers start with
        self.workers = [self._create_worker(i) for i in range(rollout.num_rollout_workers)]
        self._monitor = threading.Thread(target=self._watch, name="health", daemon=True)
        self._monitor.start()
        return len(self.workers)

    def update_weights(self, version: int, refs: list[Any]) -> None:
        """Keep ``(version, refs)`` as the newest weights and offer them to every worker without waiting for them
        to load it (refs in a list, which Ray hands over unresolved)."""
        with self._lock:
            self.latest_weights = (int(version), list(refs))
            workers = list(self.workers)
        for worker in workers:
            worker.update_weights.remote(int(version), list(refs))

    def request_video(self, iteration: int, version: int) -> None:
        """Ask one running worker, in turn by iteration, to record its next episode (a position waiting for a node or
        given up would record it late or never)."""
        with self._lock:
            absent = self._absent_positions()
            running = [worker for index, worker in enumerate(self.workers) if index not in absent]
        if running:
            running[iteration % len(running)].request_video.remote({"iteration": iteration, "version": version})

    def status(self, fresh: bool = True) -> dict[str, Any]:
        """Rollout totals; ``fresh`` asks the workers now (a slow one contributes its last known status)."""
        if fresh:
            self._refresh_statuses()
        statuses = [s for s in self.last_status if s]
        totals = {key: self.retired[key] + sum(s.get(key, 0.0) for s in statuses) for key in CUMULATIVE_KEYS}
        elapsed = time.monotonic() - self._started
        latest = self.latest_weights[0] if self.latest_weights else -1
        return {
            "rollout/env_steps": float(totals["env_steps"]),
            "rollout/sps": totals["env_steps"] / elapsed if elapsed > 0 else 0.0,
            "rollout/queue_fill": float(sum(s.get("queue_fill", 0) for s in statuses)),
            "rollout/env_processes": float(sum(s.get("env_processes", 0) for s in statuses)),
            "rollout/env_restarts": float(totals["restarts"]),
            "rollout/workers_recreated": float(self.recreated),
            "rollout/workers_given_up": float(len(self.given_up)),
            "rollout/workers_waiting_for_node": float(len(self.waiting_for_node)),
            "rollout/manager_restarted": float(self.restarted),
            "rollout/weights_behind_max": float(max((latest - s.get("version", -1) for s in statuses), default=0)),
            "rollout/weights_fetch_s_max": float(max((s.get("weights_last_fetch_s", 0) for s in statuses), default=0)),
            "rollout/weights_shard_s_max": float(max((s.get("weights_last_shard_s", 0) for s in statuses), default=0)),
            "rollout/emit_wait_s": float(totals["emit_wait_s"]),
            "rollout/weights_wait_s": float(totals["weights_wait_s"]),
            "rollout/inference_s": float(totals["inference_s"]),
            "rollout/env_wait_s": float(totals["env_wait_s"]),
            # envs per forward pass, on average: batch_size when envs answer together, less when they drift apart
            "rollout/mean_group_size": totals["env_steps"] / max(totals["forward_passes"], 1.0),
            # worker-seconds of the rollout loops: the whole of which the three times above are parts
            "rollout/loop_s": float(totals["elapsed_s"]),
            "rollout/fragments_emitted": float(totals["fragments_emitted"]),
            "rollout/fragments_sent": float(totals["fragments_sent"]),
            "rollout/fragments_discarded_stale": float(totals["fragments_discarded_stale"]),
            "rollout/fragments_per_env_per_version": float(self.share_sent or 0),
        }

    def _refresh_statuses(self, timeout: float = 5.0) -> None:
        import ray

        workers, statuses = self._workers_and_statuses()
        # asking these would only wait out the timeout: positions waiting for a node or given up, and workers that
        # did not answer the last health check (a hung node's), until they answer one again
        silent = self._absent_positions() | {i for i, n in list(self.missed.items()) if n}
        refs = {index: worker.status.remote() for index, worker in enumerate(workers) if index not in silent}
        ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=timeout)
        for index, ref in refs.items():
            if ref in ready:
                try:
                    statuses[index] = ray.get(ref)
                except ray.exceptions.RayActorError:
                    pass  # the health thread replaces it
        self.last_status = statuses

    def _absent_positions(self) -> set[int]:
        """Positions without a running worker: waiting for a node, or given up."""
        return set(self.waiting_for_node) | set(self.given_up)

    def _workers_and_statuses(self) -> tuple[list[Any], list[dict[str, Any]]]:
        """The current workers and their last known statuses, one entry per worker ({} when none yet)."""
        with self._lock:
            workers = list(self.workers)
        statuses = list(self.last_status) + [{}] * (len(workers) - len(self.last_status))
        return workers, statuses

    def fatal_error(self) -> str | None:
        """Why no rollout worker can run any more, or None while at least one can."""
        if self.workers and len(self.given_up) == len(self.workers):
            return f"every rollout worker failed {MAX_FAILED_STARTS} times in a row; last error: " + \
                self.given_up[max(self.given_up)].strip().splitlines()[-1]
        return None

    def worker_handles(self) -> list[Any]:
        return list(self.workers)

    def shutdown(self, timeout: float = 60.0) -> dict[str, float]:
        """Stop every worker (each delivers what it already cut), then kill them; returns the rollout accounting.

        ``fragments_emitted == fragments_sent + fragments_discarded_stale + fragments_dropped +
        fragments_unsent_by_replaced_workers + fragments_lost_with_dead_nodes``: the last two are what dead workers
        had cut but not sent at their last status answer, on nodes that are still alive and on nodes that died.
        """
        import ray

        started = time.monotonic()
        self._stop.set()
        if self._monitor is not None:
            # no replacement may start while the workers are being stopped (one may be mid-replacement)
            self._monitor.join(timeout=min(30.0, timeout / 3))
        timeout = max(timeout - (time.monotonic() - started), 1.0)
        workers, statuses = self._workers_and_statuses()
        # Positions given up on were retired (counted) already; their dead workers have nothing left to say, and a
        # worker still waiting for a node never started.
        gone = self._absent_positions()
        for index in self.waiting_for_node:
            ray.kill(workers[index], no_restart=True)  # so it does not start when a node joins after the run
        workers = [w for i, w in enumerate(workers) if i not in gone]
        statuses = [s for i, s in enumerate(statuses) if i not in gone]
        # a worker's stop is its loop's join (<= 10 s) + the drain + thread joins: the drain gets what is left
        refs = [worker.stop.remote(drain_timeout=min(30.0, max(timeout - 20.0, 1.0))) for worker in workers]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout)
        finals, unclean = [], []
        for ref, last in zip(refs, statuses):
            final = dict(last)  # a worker that does not answer is counted from its last status
            try:
                final = ray.get(ref) if ref in ready else final
            except Exception as error:
                unclean.append(f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}")
            if ref not in ready:
                unclean.append(f"no answer to stop in {timeout:.0f} s")
            finals.append(final)
        if unclean:
            logger.warning("rollout workers that did not stop cleanly: %s", unclean)
        for worker in workers:
            ray.kill(worker, no_restart=True)
        self.workers = []
        keys = ("fragments_emitted", "fragments_sent", "fragments_discarded_stale", "env_steps", "restarts")
        totals = {key: self.retired[key] + sum(float(f.get(key, 0.0)) for f in finals) for key in keys}
        totals["fragments_dropped"] = self.dropped_by_replaced + float(sum(f.get("fragments_dropped", 0)
                                                                           for f in finals))
        live = self._live_nodes()
        totals["fragments_unsent_by_replaced_workers"] = sum(n for node, n in self.unsent_by_dead_workers
                                                             if node is None or node in live)
        totals["fragments_lost_with_dead_nodes"] = sum(n for node, n in self.unsent_by_dead_workers
                                                       if node is not None and node not in live)
        totals["workers_recreated"] = float(self.recreated)
        totals["workers_stopped_uncleanly"] = float(len(unclean))
        return totals

    # ------------------------------------------------------------------ internals

    def _create_worker(self, index: int) -> Any:
        import ray

        rollout = self.online.rollout_config
        actor = ray.remote(RolloutWorker).options(
            num_cpus=rollout.num_cpus_per_worker, num_gpus=rollout.num_gpus_per_worker, max_concurrency=4,
            resources=dict(rollout.resources_per_worker or {}), name=None)
        seed = self.online.seed * 1000 + index + 1000 * self.recreated
        # a name no earlier worker had, even before Ray restarted this manager: the sink refuses replaced workers'
        # fragments by the names' prefixes of their env ids, and the replay buffer outlives a restarted manager
        self.worker_names[index] = f"w{index}-{uuid.uuid4().hex[:6]}"
        return actor.remote(self.worker_names[index], self.env_generator, self.policy_generator, self.config,
                            self.sink, self.statistics, seed, self.latest_weights, home_node=current_node_id())

    def _watch(self) -> None:
        import ray

        while not self._stop.wait(self.health_interval):
            workers, statuses = self._workers_and_statuses()
            calls: dict[int, Any] = {}
            for index, worker in enumerate(workers):
                if index in self.waiting_for_node:
                    started, _ = ray.wait([self.waiting_for_node[index]], timeout=0)
                    if not started:
                        continue  # Ray starts it once a node with its resources joins
                    del self.waiting_for_node[index]
                    logger.warning("rollout worker %d started on a node that joined", index)
                calls[index] = worker.status.remote()
            # one deadline for all: workers that cannot answer (a dead node's) cost one timeout, not one each
            timeout = max(10.0, self.health_interval * 5)
            answered, _ = ray.wait(list(calls.values()), num_returns=len(calls), timeout=timeout)
            newly_waiting: dict[int, Any] = {}  # recorded at once, so the status never shows half a check's
            for index, call in calls.items():
                worker = workers[index]
                if call in answered:
                    try:
                        status = ray.get(call)
                    except ray.exceptions.RayActorError as error:
                        status = {"error": type(error).__name__, "alive": False}
                else:
                    if index not in self.answered and not self._resources_free():
                        newly_waiting[index] = call
                        logger.warning("rollout worker %d waits for a node: the cluster has no %s free", index,
                                       self._worker_resources())
                        continue
                    self.missed[index] = self.missed.get(index, 0) + 1
                    if self.missed[index] < MAX_MISSED_STATUS:
                        continue  # slow, not dead: keep its last status
                    status = {"error": f"no status answer in {MAX_MISSED_STATUS} checks", "alive": False}
                self.missed[index] = 0
                if index in self.given_up:
                    continue
                if status.get("error") or not status.get("alive", True):
                    productive = max(status.get("fragments_emitted", 0), statuses[index].get("fragments_emitted", 0))
                    self.failed_starts[index] = 0 if productive else self.failed_starts.get(index, 0) + 1
                    if self.failed_starts[index] >= MAX_FAILED_STARTS:
                        self.given_up[index] = str(status.get("error"))
                        logger.error("rollout worker %d failed %d times in a row before producing anything; giving "
                                     "up on it: %s", index, MAX_FAILED_STARTS, status.get("error"))
                        self._retire(index, worker, status if "fragments_emitted" in status else statuses[index])
                        statuses[index] = {}
                        continue
                    logger.warning("rollout worker %d is broken (%s); recreating it", index, status.get("error"))
                    self._replace(index, worker, status if "fragments_emitted" in status else statuses[index])
                    statuses[index] = {}
                    continue
                statuses[index] = status
                self.answered.add(index)
            self.waiting_for_node.update(newly_waiting)
            self.last_status = statuses
            self._share_iterations()

    def _share_iterations(self) -> None:
        """Synchronous sampling: split each iteration over the workers that run, not over those waiting for a
        node or given up (rounded up; a surplus is trained one version later)."""
        if not self.online.rollout_config.synchronous_sampling:
            return
        workers, _ = self._workers_and_statuses()
        # a worker still in its constructor on a full cluster is placed, and will cut its share
        missing = {i for i in self.waiting_for_node if not actor_placed(workers[i])} | set(self.given_up)
        share = self.online.fragments_per_env_per_version(len(workers) - len(missing))  # counts at least 1 worker
        if share == self.share_sent:
            return
        logger.warning("synchronous sampling: %d of %d rollout workers run; each env now cuts %d fragments per "
                       "version", len(workers) - len(missing), len(workers), share)
        for index, worker in enumerate(workers):
            if index not in self.given_up:
                worker.set_fragments_per_version.remote(share)
        self.share_sent = share

    def _replace(self, index: int, worker: Any, last_status: dict[str, Any]) -> None:
        """Retire ``worker`` and start a new one in its position, keeping the run's counters whole.

        A broken worker whose process still answers is stopped first: it delivers what it already cut and
        its final counters are exact. Only a dead one is counted from its last status, and what it had cut
        but not sent then is booked in ``unsent_by_dead_workers``.
        """
        self._retire(index, worker, last_status)
        self.answered.discard(index)
        with self._lock:
            self.recreated += 1
            self.workers[index] = self._create_worker(index)
            if self.share_sent is not None:  # it starts with the share of all workers running
                self.workers[index].set_fragments_per_version.remote(self.share_sent)

    def _worker_resources(self) -> dict[str, float]:
        rollout = self.online.rollout_config
        need = {"CPU": rollout.num_cpus_per_worker, "GPU": rollout.num_gpus_per_worker,
                **(rollout.resources_per_worker or {})}
        return {name: amount for name, amount in need.items() if amount > 0}

    def _resources_free(self) -> bool:
        """Whether the cluster has the resources a rollout worker asks for free (a new one could be placed)."""
        import ray

        free = ray.available_resources()
        return all(free.get(name, 0.0) >= amount for name, amount in self._worker_resources().items())

    @staticmethod
    def _live_nodes() -> set[str]:
        import ray

        return {node["NodeID"] for node in ray.nodes() if node["Alive"]}

    def _retire(self, index: int, worker: Any, last_status: dict[str, Any]) -> None:
        """Stop (or count from ``last_status`` when it is dead) and kill the ``worker`` at position ``index``, adding
        its counters to the run's, then have the sink refuse whatever it still sends. A worker on a node cut off from
        the network is dead to Ray, but runs on and delivers what it held once the network is back (until its
        node learns it was given up and stops, seconds later), beside its replacement; what it had not sent at
        its last status is booked as lost already."""
        import ray

        try:
            final = ray.get(worker.stop.remote(drain_timeout=10.0), timeout=30)
            self.dropped_by_replaced += float(final.get("fragments_dropped", 0))
        except Exception:
            final = last_status
            unsent = max(0.0, undelivered(final))
            self.unsent_by_dead_workers.append((final.get("node"), unsent))
        try:
            ray.kill(worker, no_restart=True)
        except Exception:
            pass
        try:
            self.sink.retire_worker(worker_prefix(self.worker_names[index]))
        except Exception as error:
            logger.warning("rollout worker %d: the sink could not be told to refuse its fragments from now on: %s",
                           index, error)
        with self._lock:
            for key in CUMULATIVE_KEYS:
                self.retired[key] += float(final.get(key, 0.0))
