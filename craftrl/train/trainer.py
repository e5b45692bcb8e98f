"""The PPO trainer on Ray Train: one long ``TorchTrainer.fit()`` whose workers loop over iterations.

Per iteration, on every rank:

1. sample ``batch_size_per_gpu * batches_per_iteration / fragments_per_chunk`` chunks from the replay buffer
   and read them through the reader pool (records come straight from LMDB, not through the buffer actor);
2. agree with the other ranks on how many fragments to use (a chunk that failed to read must not leave the
   ranks with different batch counts, which would hang DDP), then ``PPOLearner.iteration``;
3. rank 0: publish the new weights (:mod:`craftrl.weights`, not awaited), tell the buffer the new version,
   request a video when due, log metrics, save a checkpoint when due.

One ``fit()`` per run because starting Ray Train takes seconds; ``num_workers=0`` is Ray
Train's local mode, which runs this same loop in the driver process.
"""

from __future__ import annotations

import logging
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Mapping

import torch

from craftrl.config.loading import config_to_yaml
from craftrl.config.validate import build_config
from craftrl.metrics import MetricsClient, collect_statistics
from craftrl.policies.checks import GENERATORS_RUN_ON_NODES, PolicyContractError, weight_mismatch
from craftrl.replay.store import ReplayStoreError
from craftrl.train.checkpoint import TrainingState, restore_rng_state
from craftrl.train.home_checkpoints import HomeCheckpoints
from craftrl.train.distributed import all_reduce_min, distributed
from craftrl.train.learner import PPOLearner, zero_value_output
from craftrl.train.reference import make_reference
from craftrl.weights import WeightPublisher

logger = logging.getLogger(__name__)
KEEP_LAST_CHECKPOINTS = 3
DATA_TIMEOUT_S = 600.0  # how long the trainer waits for fresh chunks before giving up
STATISTICS_TIMEOUT_S = 10.0  # how long one iteration's record waits for the components' statistics
DATA_CHECK_S = 5.0  # while waiting, how often it asks the rollout manager whether any worker can still run


class RolloutFailedError(RuntimeError):
    """No rollout worker can produce data any more (the manager gave up on all of them)."""


def reader_actors(num_readers: int, replay: Any) -> int:
    """``num_readers``, except that 0 (read the store in this process) needs this process on the replay buffer's
    node: elsewhere the store's path names nothing, so one reader actor reads for it instead."""
    import ray

    if num_readers > 0:
        return num_readers
    here, there = ray.get_runtime_context().get_node_id(), ray.get(replay.node_id.remote())
    if here == there:
        return 0
    logger.warning("train_config.num_readers=0 reads the replay store in the train worker's process, but this "
                   "train worker runs on node %s and the replay buffer on node %s: reading through 1 reader "
                   "actor instead", here[:8], there[:8])
    return 1


def _device(num_gpus: float) -> torch.device:
    if num_gpus > 0 and torch.cuda.is_available():
        import ray.train.torch

        return ray.train.torch.get_device()
    return torch.device("cpu")


class _Run:
    """State of one rank's training run (what the loop function would otherwise keep in locals)."""

    def __init__(self, loop_config: dict[str, Any]):
        import ray
        import ray.train

        from craftrl.replay.reader import ReaderPool
        from craftrl.system import connect

        self.online = build_config(loop_config["online"])
        self.config_yaml = config_to_yaml(self.online)
        train = self.train = self.online.train_config
        context = ray.train.get_context()
        self.rank, self.world = context.get_world_rank(), context.get_world_size()
        self.device = _device(train.num_gpus_per_worker)
        if train.num_cpus_per_worker >= 1:
            torch.set_num_threads(int(train.num_cpus_per_worker))
        torch.manual_seed(self.online.seed)  # identical initial weights on every rank
        policy: torch.nn.Module = loop_config["policy_generator"]().to(self.device)
        if loop_config.get("policy_shapes") is not None:
            mismatch = weight_mismatch(loop_config["policy_shapes"], policy, "the driver's", "this train worker's")
            if mismatch:
                raise PolicyContractError(f"policy_generator built another network in train worker {self.rank} "
                                          f"than in the driver ({mismatch}); {GENERATORS_RUN_ON_NODES}")
        reference = make_reference(policy) if train.kl_divergence_coef_rho > 0 else None
        self.state = TrainingState(rho=train.kl_divergence_coef_rho)
        self.checkpoints = HomeCheckpoints(train.save_path, loop_config.get("home_node"), train.keep_interval,
                                           KEEP_LAST_CHECKPOINTS)
        self.saved_iteration: int | None = None  # the iteration this run last saved
        resumed = self._maybe_resume(policy, reference)
        if not resumed and train.zero_initial_vf:
            zero_value_output(policy)
        if not train.use_normalized_vf:
            # The value head then predicts returns directly, so its normaliser must be the identity everywhere
            # (GAE here, bootstrap values in rollout workers), not a fresh one's sqrt(min_var) = 0.1 scale.
            policy.value_head.normalizer.set_identity()
        model: torch.nn.Module = policy
        if distributed():
            from torch.nn.parallel import DistributedDataParallel

            model = DistributedDataParallel(policy, device_ids=[self.device.index] if self.device.type == "cuda"
                                            else None)
        exact = self.online.rollout_config.weights_dtype == "float32"
        self.learner = PPOLearner(model, train, self.device, reference, acted_with_exact_weights=exact)
        self.learner.rho = self.state.rho
        if train.target_entropy is not None and self.state.entropy_coef is not None:
            self.learner.entropy_coef = self.state.entropy_coef  # the controller continues where it stood
        if resumed and train.resume_optimizer and self._payload.get("optimizer"):
            self.learner.load_optimizer_state(self._payload["optimizer"])
            if self._payload.get("scaler"):
                self.learner.scaler.load_state_dict(self._payload["scaler"])
        self.generator = torch.Generator().manual_seed(self.online.seed * 7919 + self.rank + self.state.iteration)
        actors = connect()
        self.replay, self.manager, self.statistics = actors.replay, actors.manager, actors.statistics
        if self.replay is None:
            raise RuntimeError("no replay buffer actor is running: call start_rolloutmanager before start_trainer")
        self.readers = ReaderPool(self.replay, num_readers=reader_actors(train.num_readers, self.replay),
                                  num_cpus_per_reader=train.num_cpus_per_reader,
                                  prefetch_batches=train.prefetch_batches,
                                  chunks_per_batch=self.online.chunks_per_batch())
        parameters = [] if exact else [name for name, _ in self.learner.policy.named_parameters()]
        self.publisher = WeightPublisher(self.manager, half_precision=parameters) if self.rank == 0 else None
        self.metrics = MetricsClient(actors.metrics) if actors.metrics is not None and self.rank == 0 else None
        self.started = time.monotonic()
        # A resumed run's counters continue from the checkpoint: the new rollout side counts from 0.
        self.env_steps_before = self.state.env_steps
        self.elapsed_before = float(self.state.extra.get("elapsed_s", 0.0))

    def _maybe_resume(self, policy: torch.nn.Module, reference: torch.nn.Module | None) -> bool:
        self._payload: dict[str, Any] = {}
        if not self.train.resume:
            return False
        path, self._payload = self.checkpoints.load(self.train.resume, map_location=self.device)
        policy.load_state_dict(self._payload["model"])
        if reference is not None:  # the saved reference, or the resumed policy when the run had none
            reference.load_state_dict(self._payload.get("reference") or self._payload["model"])
        self.state = self._payload["training"]
        restore_rng_state(self._payload["rng"])
        logger.info("resumed from %s at iteration %d (version %d)", path, self.state.iteration, self.state.version)
        return True

    # ------------------------------------------------------------------ per iteration

    def fetch(self) -> list[Any]:
        descriptors = self._sample()
        fragments = [f for result in self.readers.read(descriptors) if result.ok for f in result.fragments]
        # Every rank must run the same number of batches or DDP's collectives hang: use the common minimum.
        common = all_reduce_min(torch.tensor([len(fragments)], device=self.device))
        return fragments[:int(common.item())]

    def _sample(self) -> list[Any]:
        """Wait for fresh chunks; stop with the rollout side's error rather than wait for data that cannot come."""
        import ray

        waited = 0.0
        while True:
            wait = min(DATA_CHECK_S, DATA_TIMEOUT_S - waited)
            try:
                return ray.get(self.replay.sample_chunks.remote(self.online.chunks_per_iteration(), timeout_s=wait))
            except TimeoutError:
                waited += wait
                if waited >= DATA_TIMEOUT_S:
                    raise
            fatal = ray.get(self.manager.fatal_error.remote(), timeout=30) if self.manager is not None else None
            if fatal:
                raise RolloutFailedError(fatal)

    def publish(self) -> float:
        """Rank 0: ship CPU weights to the rollout workers; returns the seconds it took (not awaited)."""
        if self.publisher is None:
            return 0.0
        seconds = self.publisher.publish(self.state.version, self.learner.policy.state_dict())
        self.replay.update_version.remote(self.state.version)
        return seconds

    def log(self, metrics: dict[str, float]) -> None:
        import ray

        if self.metrics is None:
            return
        calls: dict[str, Any] = {}
        if self.manager is not None:
            calls["rollout manager"] = self.manager.status.remote()
        if self.statistics is not None:
            calls["episode statistics"] = self.statistics.summary.remote()
        calls["replay store"] = self.replay.metrics.remote()
        episodes = self.statistics.take_records.remote() if self.statistics is not None else None
        asked = time.monotonic()
        extra, missing = collect_statistics(calls, timeout_s=STATISTICS_TIMEOUT_S)
        for name, reason in missing.items():  # statistics are nice to have; training goes on
            logger.warning("iteration %d is logged without the %s's statistics: %s",
                           self.state.iteration, name, reason)
        try:  # apart: the episodes were taken from the actor, so a failed summary must not lose them too
            if episodes is not None:
                records = ray.get(episodes, timeout=STATISTICS_TIMEOUT_S)
                self.metrics.log_episodes(records, step=self.state.trained_samples)
        except Exception as error:
            logger.warning("collecting finished episodes failed: %s", error)
        extra["time/statistics_s"] = time.monotonic() - asked  # the learner waits for them every iteration
        if "rollout/env_steps" in extra:
            self.state.env_steps = self.env_steps_before + int(extra["rollout/env_steps"])
            extra["rollout/env_steps"] = float(self.state.env_steps)
        self.state.extra["elapsed_s"] = self.elapsed_before + time.monotonic() - self.started
        metrics = {**metrics, **extra, "train/iteration": float(self.state.iteration),
                   "train/version": float(self.state.version), "train/trained_samples": float(self.state.trained_samples),
                   "train/elapsed_s": self.state.extra["elapsed_s"]}
        self.metrics.log(metrics, step=self.state.trained_samples)

    def checkpoint(self, final: bool = False) -> None:
        if self.rank != 0:
            return
        interval = self.train.save_interval
        if not final and not (interval and self.state.iteration % interval == 0):
            return
        if self.saved_iteration == self.state.iteration:  # a final save right after a periodic one: nothing new
            return
        learner = self.learner
        self.state.rho = learner.rho
        self.state.entropy_coef = learner.entropy_coef
        self.checkpoints.save(self.state, model=learner.policy.state_dict(),
                              optimizer=learner.optimizer.state_dict(),
                              reference=learner.reference.state_dict() if learner.reference is not None else None,
                              scaler=learner.scaler.state_dict() if learner.use_amp else None,
                              config_yaml=self.config_yaml)
        self.saved_iteration = self.state.iteration

    def close(self) -> None:
        self.readers.close()
        if self.metrics is not None:
            self.metrics.flush()


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def stop_on_sigterm() -> None:
    """Make SIGTERM stop a run like Ctrl-C (a final checkpoint, then a clean shutdown).

    Only the main thread can install it. The CLI calls it at start, and the training loop calls it again
    once Ray and Ray Train finished their set-up (in local mode the loop runs in the driver's main thread),
    because Ray's native failure-signal handler, which prints a stack and kills the process, can be
    installed after the CLI's.
    """
    import signal
    import threading

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _raise_interrupt)


def train_loop_per_worker(loop_config: dict[str, Any]) -> None:
    """The body every Ray Train worker runs (rank 0 also publishes, logs and checkpoints)."""
    run = _Run(loop_config)
    stop_on_sigterm()
    train = run.train
    try:
        run.publish()  # the workers act with the learner's initial (or resumed) weights from the start
        while run.state.iteration < train.num_iterations:
            waited = time.monotonic()
            fragments = run.fetch()
            waited = time.monotonic() - waited
            computed = time.monotonic()
            metrics = run.learner.iteration(fragments, run.state.iteration, run.state.version, run.generator)
            computed = time.monotonic() - computed
            run.state.iteration += 1
            run.state.trained_samples += int(metrics["data/env_steps"]) if "data/env_steps" in metrics else 0
            if run.state.iteration > train.vf_warmup:  # no new policy during value warm-up
                run.state.version += 1
            broadcast = run.publish()
            interval = train.record_video_interval
            if run.rank == 0 and interval and run.state.iteration % interval == 0 and run.manager is not None:
                run.manager.request_video.remote(run.state.iteration, run.state.version)
            metrics.update({"time/wait_data_s": waited, "time/compute_s": computed, "time/broadcast_s": broadcast,
                            "time/samples_per_s": metrics.get("data/env_steps", 0.0) / max(computed, 1e-9)})
            run.log(metrics)
            run.checkpoint()
        run.checkpoint(final=True)
    except (KeyboardInterrupt, ReplayStoreError, RolloutFailedError):
        # Ctrl-C / SIGTERM in local mode, or the data side failing (a full disk, envs that cannot run): the
        # learner's state is whole between iterations, so what it learned is kept before the run stops
        run.checkpoint(final=True)
        raise
    finally:
        run.close()


def run_trainer(policy_generator: Callable[[], Any], online_config: dict[str, Any], storage_path: str | Path,
                policy_shapes: Mapping[str, tuple[int, ...]] | None = None) -> Any:
    """Start one ``TorchTrainer.fit()`` for the whole run and block until it ends. ``policy_shapes``: the tensors of
    the policy the driver built, which each train worker's must match (None: not checked)."""
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    online = build_config(online_config)
    train = online.train_config
    use_gpu = train.num_gpus_per_worker > 0
    resources = {"CPU": train.num_cpus_per_worker, **(train.resources_per_worker or {})}
    if use_gpu:
        resources["GPU"] = train.num_gpus_per_worker
    # num_workers 0 is craftrl's documented local mode: Ray's INFO note that it is running in local mode is not
    # something the user needs to act on, so it stays out of the console
    ray_config_logger = logging.getLogger("ray.train.v2.api.config")
    level = ray_config_logger.level
    ray_config_logger.setLevel(logging.WARNING)
    try:
        scaling = ScalingConfig(num_workers=train.num_workers, use_gpu=use_gpu,
                                resources_per_worker=resources if train.num_workers > 0 else None)
    finally:
        ray_config_logger.setLevel(level)
    from craftrl.placement import current_node_id

    trainer = TorchTrainer(
        train_loop_per_worker,
        # home_node: where save_path is; a train worker on another node saves and loads checkpoints through it
        train_loop_config={"online": online_config, "policy_generator": policy_generator,
                           "home_node": current_node_id(), "policy_shapes": policy_shapes},
        scaling_config=scaling,
        # a unique name: reusing one with the same storage path would make Ray Train "resume" it
        run_config=RunConfig(name=f"craftrl-{uuid.uuid4().hex[:8]}", storage_path=str(storage_path)),
    )
    return trainer.fit()
