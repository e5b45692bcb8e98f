"""The ``online_dict`` schema: the single source of truth for every configuration key.

Each key is a typed dataclass field whose metadata holds its one-line meaning and its value check;
``craftrl.config.docs`` renders ``docs/config.md`` from these fields, and the validator in
``craftrl.config.validate`` reads the same metadata, so the documentation cannot drift from what is enforced.

Key names follow MineStudio's ``online_dict`` so its users can bring their config modules. Where MineStudio's
docs and code disagree we chose deliberately (see the ``Decisions`` notes below and in docs/config.md):

* ``worker_config.restart_interval``: ``None`` or ``0`` disables recycling (the docs' meaning; MineStudio's
  code restarts the env after *every* episode on 0).
* ``train_config.record_video_interval``: ``None`` or ``0`` disables videos (MineStudio divides by it).
* ``train_config.num_workers``: ``0`` runs the learner in the driver process (Ray Train local mode, handy on
  a laptop and in tests); ``n >= 1`` starts ``n`` Ray Train DDP workers. MineStudio builds a broken
  ScalingConfig on 0.
* ``rollout_config.to_send_queue_size``: at least 1; there is no "unbounded" (MineStudio treats <= 0 so),
  because an unbounded send queue hides a slow consumer until memory runs out.
* ``train_config.fix_decoder``: accepted as ``False`` only, for seed configs that carry it; it never had an
  effect in MineStudio.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional


@dataclass(frozen=True)
class Check:
    """A value constraint plus the phrase shown to the user when it fails ("expected <expect>")."""

    predicate: Callable[[Any], bool]
    expect: str

    def __call__(self, value: Any) -> bool:
        return self.predicate(value)


def at_least(bound: float) -> Check:
    return Check(lambda v: v >= bound, f">= {bound}")


def greater_than(bound: float) -> Check:
    return Check(lambda v: v > bound, f"> {bound}")


def between(low: float, high: float) -> Check:
    return Check(lambda v: low <= v <= high, f"a value in [{low}, {high}]")


def one_of(*choices: Any) -> Check:
    return Check(lambda v: v in choices, "one of " + ", ".join(repr(c) for c in choices))


def key(default: Any, doc: str, check: Check | None = None) -> Any:
    """Declare a scalar key: its default, its one-line meaning and an optional value check."""
    return field(default=default, metadata={"doc": doc, "check": check})


def section(factory: type, doc: str) -> Any:
    """Declare a nested section (a dataclass of its own)."""
    return field(default_factory=factory, metadata={"doc": doc, "check": None})


NON_NEGATIVE = at_least(0)
POSITIVE = greater_than(0)
AT_LEAST_ONE = at_least(1)
UNIT_INTERVAL = between(0.0, 1.0)


@dataclass
class DatabaseConfig:
    path: str = key("replay_buffer", "Directory of the LMDB replay store; relative paths resolve inside the run directory.")
    num_shards: int = key(8, "Number of LMDB shards (separate environments) the fragments are spread over.", AT_LEAST_ONE)
    max_fragment_bytes: Optional[int] = key(None, "Largest encoded fragment in bytes; sizes the LMDB map (sparse: it takes no disk) and the room the disk must have at start for the first fragments, from whose encoded sizes the buffer then projects whether the full store fits. None: craftrl train sizes it from the env's first observation, the policy's recurrent state and fragment_length (the raw size plus zstd's worst case, so any fragment fits); without that probe (preflight off, the Python API) 4 MiB.", AT_LEAST_ONE)
    compression_level: int = key(3, "zstd level for stored fragments (1 fastest, 22 smallest).", between(1, 22))


@dataclass
class ReplayBufferConfig:
    max_chunks: int = key(512, "Capacity in chunks; the oldest chunk is evicted first (FIFO) when full.", AT_LEAST_ONE)
    max_reuse: int = key(2, "A chunk is sampled for training at most this many times, then retired.", AT_LEAST_ONE)
    max_staleness: int = key(2, "A chunk whose oldest step is more than this many policy versions behind the trainer is never sampled.", NON_NEGATIVE)
    fragments_per_report: int = key(40, "The buffer reports its metrics (size, throughput, evictions) every this many added fragments.", AT_LEAST_ONE)
    fragments_per_chunk: int = key(1, "Consecutive fragments of one env slot grouped into one chunk (the unit of sampling).", AT_LEAST_ONE)
    read_grace_samples: int = key(2, "A sampled chunk's records stay readable for this many further sample calls, so the trainer can prefetch the next iteration.", AT_LEAST_ONE)
    max_unsampled_chunks: int = key(0, "Paces the rollout by the trainer. 0: rollout workers never wait. n > 0: while n chunks await their first sample, the buffer takes no more of a worker's fragments and leaves its registration unanswered, so the worker stops stepping its envs until the trainer samples; for a trainer slower than its envs, which would otherwise make experience that goes stale unused. Between the chunks one train worker samples per iteration (batch_size_per_gpu x batches_per_iteration / fragments_per_chunk) and max_chunks. Pair it with a small to_send_queue_size (2): fragments queued in a held worker age while it waits and can still go stale.", NON_NEGATIVE)
    database_config: DatabaseConfig = section(DatabaseConfig, "Where and how the fragments are stored on disk.")


@dataclass
class WorkerConfig:
    num_envs: int = key(4, "Envs owned by each rollout worker, run in num_envs / envs_per_process env processes.", AT_LEAST_ONE)
    envs_per_process: int = key(1, "Envs that share one env process: one pipe round trip per process and step instead of one per env, but a failure rebuilds all of them. 0 picks it on the worker's machine: about one env process per CPU core (num_envs / cores, rounded up to a divisor of batch_size so that inference groups are whole processes); 1 where restart_interval is set, and 1 for an env whose step mostly waits (a game in another process, like MinecraftSim's), which craftrl train's preflight measures on its steps, because envs of one process step one after another. Must be <= num_envs; recycling (restart_interval) needs 1.", NON_NEGATIVE)
    batch_size: int = key(4, "Most envs in one policy forward pass; must be <= num_envs. The worker acts on the envs that have answered: it waits for the first, then up to max_batch_wait for more, so a slow or resetting env never holds the others.", AT_LEAST_ONE)
    max_batch_wait: float = key(0.0, "Seconds the worker waits, once an env has answered, for others to join its forward pass (up to batch_size). Longer makes fewer, fuller passes (less CPU per step); shorter keeps envs that answered waiting less. 0 acts at once on whatever has answered.", NON_NEGATIVE)
    restart_interval: Optional[float] = key(None, "Recycle an env process after this many seconds, at the next episode boundary; None or 0 disables.", NON_NEGATIVE)
    step_timeout: float = key(60.0, "Seconds an env step may take before the env process is killed and restarted (a hang).", POSITIVE)
    reset_timeout: float = key(300.0, "Seconds an env reset may take before it is treated as a hang: every reset (the first one including the env's construction, the one after each episode, a rebuilt env's), each under its own deadline, apart from step_timeout.", POSITIVE)
    preflight: bool = key(True, "Before starting Ray, craftrl train builds one env in a subprocess, runs the policy on its first observation and steps the env with up to 8 of the actions it samples there, so a broken generator, or an env that rejects actions the policy takes, fails in one line; False skips this (a driver that cannot build the env).")
    video_fps: int = key(20, "Frame rate of recorded episode videos.", AT_LEAST_ONE)
    video_output_dir: str = key("videos", "Directory for mp4 episode videos; relative paths resolve inside the run directory.")


@dataclass
class EpisodeStatisticsConfig:
    moving_window: int = key(20, "Episodes in the moving averages of return, length and task metrics.", AT_LEAST_ONE)


@dataclass
class RolloutConfig:
    num_rollout_workers: int = key(1, "Rollout worker actors; each owns num_envs env processes.", AT_LEAST_ONE)
    num_gpus_per_worker: float = key(0.0, "GPU share reserved per rollout worker; inference runs on the GPU when > 0 and CUDA exists.", NON_NEGATIVE)
    num_cpus_per_worker: float = key(1.0, "CPUs reserved per rollout worker in Ray's accounting; from 1 on, its whole part is also the worker's torch threads for inference.", NON_NEGATIVE)
    resources_per_worker: Optional[dict[str, float]] = key(None, "Custom Ray resources each rollout worker requires, e.g. {rollout_node: 1} to place workers on nodes started with that resource; a local Ray declares what the run needs.")
    fragment_length: int = key(256, "Env steps per fragment, the unit sent from rollout to the replay buffer.", AT_LEAST_ONE)
    weights_dtype: str = key("float32", "Precision of the policy parameters the trainer publishes to rollout workers each version; 'float16' halves the bytes each version puts on the network, and the workers load them into their float32 policy. Buffers (e.g. the value normaliser's statistics) stay float32. The rollout's log-probs move by at most 1e-3 (craftrl.weights.HALF_PRECISION_LOGP_TOLERANCE, tested).", one_of("float32", "float16"))
    synchronous_sampling: bool = key(False, "Collect in lock-step with the learner, as PPO is defined: each env cuts its share of one iteration's fragments (the fragments all train workers sample per iteration / the envs of all rollout workers; it must divide evenly) with one policy version, then waits for the next version (while a worker waits for a node, the others' envs cut its share too), so every trained step was acted by the policy being updated (sampled staleness 0). Costs the overlap of env steps and training: envs are idle while the learner computes. Needs train_config.vf_warmup 0 (warm-up iterations publish no version to wait for) and replay_buffer_config.max_reuse 1 (a reused chunk is a version old). False: workers never wait for weights and train data is up to max_staleness versions old.")
    to_send_queue_size: int = key(1, "Fragments a worker may hold waiting to be sent; when full the worker waits (backpressure).", AT_LEAST_ONE)
    worker_config: WorkerConfig = section(WorkerConfig, "Settings of each rollout worker and its env processes.")
    replay_buffer_config: ReplayBufferConfig = section(ReplayBufferConfig, "Replay buffer capacity, reuse and staleness limits.")
    episode_statistics_config: EpisodeStatisticsConfig = section(EpisodeStatisticsConfig, "Episode statistics actor settings.")


@dataclass
class TrainConfig:
    num_workers: int = key(0, "Ray Train DDP workers; 0 runs the learner inside the driver process (local mode).", NON_NEGATIVE)
    num_gpus_per_worker: float = key(0.0, "GPUs per train worker; 0 trains on CPU (gloo), > 0 on CUDA (nccl).", NON_NEGATIVE)
    num_cpus_per_worker: float = key(1.0, "CPUs reserved per train worker in Ray's accounting; from 1 on, its whole part is also the learner's torch threads. With num_workers 0 the learner runs in the driver, outside Ray's accounting, and this sets only its threads.", NON_NEGATIVE)
    resources_per_worker: Optional[dict[str, float]] = key(None, "Custom Ray resources each train worker requires, e.g. {learner_node: 1}; needs num_workers >= 1 (local mode trains in the driver).")
    num_iterations: int = key(4000, "Training iterations to run; each publishes a new policy version.", AT_LEAST_ONE)
    vf_warmup: int = key(0, "First iterations that train only the value function (the policy is not updated or published).", NON_NEGATIVE)
    learning_rate: float = key(2.5e-4, "AdamW learning rate at the start of training.", POSITIVE)
    anneal_lr_linearly: bool = key(False, "Decay the learning rate linearly to 0 over num_iterations.")
    weight_decay: float = key(0.0, "AdamW decoupled weight decay.", NON_NEGATIVE)
    adam_eps: float = key(1e-5, "AdamW epsilon.", POSITIVE)
    batch_size_per_gpu: int = key(8, "Fragments per training batch on each train worker.", AT_LEAST_ONE)
    batches_per_iteration: int = key(4, "Batches each train worker processes per iteration (per epoch).", AT_LEAST_ONE)
    gradient_accumulation: int = key(1, "Batches whose gradients are summed before one optimiser step.", AT_LEAST_ONE)
    minibatch_sequence_length: int = key(0, "0: each minibatch holds whole fragments. n > 0: every fragment is cut into sequences of n steps, each starting from the recurrent state of the iteration's first pass, and every epoch shuffles them across the minibatches, so a rare reward reaches every minibatch instead of one (1 shuffles single steps, as feed-forward PPO does).", NON_NEGATIVE)
    whole_batch_iterations: int = key(0, "For the first this many iterations every epoch is one optimiser step over all of the worker's data (one minibatch), whatever batch_size_per_gpu and minibatch_sequence_length say; later iterations use those minibatches. While rewards are rare, most small minibatches hold none of them.", NON_NEGATIVE)
    epochs_per_iteration: int = key(1, "Passes over the iteration's data.", AT_LEAST_ONE)
    context_length: int = key(64, "Truncated BPTT: steps per recurrent slice of a training pass; the state is carried across slices, gradients are not.", AT_LEAST_ONE)
    discount: float = key(0.99, "Discount factor gamma.", UNIT_INTERVAL)
    gae_lambda: float = key(0.95, "GAE lambda: 0 is one-step TD, 1 is Monte Carlo.", UNIT_INTERVAL)
    ppo_clip: float = key(0.2, "PPO ratio clip epsilon (also the value clip range when clip_vloss).", POSITIVE)
    clip_vloss: bool = key(False, "Clip the value loss around the behaviour value, as the policy ratio is clipped.")
    max_grad_norm: float = key(0.5, "Global gradient-norm clip.", POSITIVE)
    zero_initial_vf: bool = key(True, "Zero the value head's output layer at start so initial predictions are 0.")
    ppo_policy_coef: float = key(1.0, "Weight of the clipped policy loss.", NON_NEGATIVE)
    ppo_vf_coef: float = key(0.5, "Weight of the value loss.", NON_NEGATIVE)
    kl_divergence_coef_rho: float = key(0.0, "Weight rho of KL(policy || reference policy); the reference is the initial policy, or with enable_ref_update a moving average of the policy.", NON_NEGATIVE)
    entropy_bonus_coef: float = key(0.01, "Weight of the entropy bonus; with target_entropy, its weight in the first iteration.", NON_NEGATIVE)
    target_entropy: Optional[float] = key(None, "Keep the policy's mean entropy (nats) from falling below this by adapting the entropy bonus's weight after every iteration: weight <- max(0, weight + entropy_coef_step * (target_entropy - the iteration's mean entropy)), starting from entropy_bonus_coef. While the policy is more random than the target the bonus fades to 0, so rare early rewards are not pulled back; once it is less random the bonus grows until its entropy stops falling. None: the fixed entropy_bonus_coef.", NON_NEGATIVE)
    entropy_coef_step: float = key(0.01, "With target_entropy: how far the entropy bonus's weight moves per iteration per nat of entropy below (or above) the target.", POSITIVE)
    coef_rho_decay: float = key(0.9995, "rho is multiplied by this after every iteration.", between(0.0, 1.0))
    target_kl: Optional[float] = key(None, "Stop an iteration's epochs early once the mean KL between the learner's policy at the iteration's start and its current policy, measured on the next minibatch before its step, exceeds 1.5x this (Stable-Baselines3's target_kl). Bounds how far one iteration moves the policy, and skips the learner work that would go past it. None: always all epochs.", POSITIVE)
    log_ratio_range: float = key(50.0, "The log-ratio log(pi/pi_behaviour) is clamped to +-this before exponentiation.", POSITIVE)
    normalize_advantage_full_batch: bool = key(True, "Normalise advantages with the mean/std of the whole iteration's data across all ranks.")
    advantage_std_floor: float = key(0.0, "Advantages are divided by max(their std, this floor), in return units; a floor keeps batches without reward (advantages = value noise) from becoming unit-scale updates. 0 = plain standardisation.", NON_NEGATIVE)
    use_normalized_vf: bool = key(True, "Learn the value in normalised return units (running mean/std), denormalised for GAE.")
    num_readers: int = key(2, "Replay reader actors per train worker that load and decode chunks in parallel. 0 reads them in the train worker's own process, without reader processes or object transfers (the least CPU on one machine); a train worker on another node than the replay buffer then reads through 1 reader actor, with a warning.", NON_NEGATIVE)
    num_cpus_per_reader: float = key(0.0, "CPUs reserved per reader in Ray's accounting.", NON_NEGATIVE)
    prefetch_batches: int = key(2, "Batches read ahead while the learner computes: each train worker keeps the batch it reads plus this many more in flight over its readers (MineStudio's window).", NON_NEGATIVE)
    save_interval: int = key(10, "Save a checkpoint every this many iterations; 0 saves only the final one.", NON_NEGATIVE)
    keep_interval: int = key(40, "Checkpoints at multiples of this are kept forever; others only while among the newest few. 0 keeps only the newest few.", NON_NEGATIVE)
    record_video_interval: Optional[int] = key(None, "Record one episode to mp4 every this many iterations; None or 0 disables.", NON_NEGATIVE)
    enable_ref_update: bool = key(False, "Move the KL reference policy towards the current policy after every iteration, reference <- (1 - ref_update_rate) * reference + ref_update_rate * policy (an exponential moving average), so the KL term limits how fast the policy moves without pulling it back to where it started. False: the reference is the initial (or resumed) policy. Needs kl_divergence_coef_rho > 0.")
    ref_update_rate: float = key(0.01, "With enable_ref_update: the share of the way the reference moves to the policy per iteration (0 never moves it, 1 makes it the policy of the iteration's end).", UNIT_INTERVAL)
    fix_decoder: bool = key(False, "Accepted for MineStudio seed configs; it never had an effect. Only False is supported.", one_of(False))
    use_amp: bool = key(False, "Mixed precision (autocast + grad scaling) on CUDA; ignored on CPU.")
    cpu_bf16: bool | str = key(False, "bfloat16 autocast for the learner's passes on CPU (convolutions, matmuls and the LSTM in bf16, losses in float32; bf16 needs no grad scaling); the rollout's inference stays float32. True: bf16. 'auto': on the first iteration, time one forward + backward pass in each precision and compute in bf16 only if it is at least 5 % faster (metric ppo/cpu_bf16); native bf16 instructions alone do not make it faster (bench/notes/crafter_score.md). Either way only on CPUs with native bf16 instructions (AVX512-BF16 or AMX, from /proc/cpuinfo) that ONEDNN_MAX_CPU_ISA leaves to torch; elsewhere bf16 runs emulated and float32 is used (with a warning for True). Ignored on CUDA (see use_amp).", one_of(False, True, "auto"))
    resume: Optional[str] = key(None, "Checkpoint directory, run directory or 'latest' to continue from; craftrl train then continues that run (docs/training.md). None starts fresh.")
    resume_optimizer: bool = key(True, "When resuming, restore the optimiser state too.")
    save_path: str = key("checkpoints", "Checkpoint directory; relative paths resolve inside the run directory.")


@dataclass
class LoggerConfig:
    project: Optional[str] = key(None, "wandb project; when set, metrics also go to wandb (offline unless an API key is configured).")
    name: str = key("craftrl", "Run name: prefix of the run directory and the wandb run name.")
    entity: Optional[str] = key(None, "wandb entity (team or user).")
    wandb_mode: str = key("auto", "wandb mode: 'auto' (online if an API key is configured, else offline), 'online', 'offline' or 'disabled'.",
                          one_of("auto", "online", "offline", "disabled"))
    console_interval: float = key(10.0, "Seconds between progress lines when the console is not a terminal (a log file, CI); 0: a line per iteration. A terminal shows one live line with a bar instead.", NON_NEGATIVE)


@dataclass
class RayConfig:
    address: Optional[str] = key(None, "Ray cluster to join ('auto' or host:port); None starts a local Ray sized to this config.")
    num_cpus: Optional[int] = key(None, "Logical CPUs for a local Ray; None sizes it to what this config reserves (never fewer than the machine's cores).", AT_LEAST_ONE)
    object_store_memory_mb: Optional[int] = key(None, "Object store size for a local Ray in MiB; None lets Ray choose.", AT_LEAST_ONE)
    include_dashboard: bool = key(False, "Start the Ray dashboard (local Ray only).")


@dataclass
class OnlineConfig:
    trainer_name: str = key("PPOTrainer", "Training algorithm; only 'PPOTrainer' exists.", one_of("PPOTrainer"))
    detach_rollout_manager: bool = key(True, "Create the rollout manager as a detached actor that outlives the driver (a MineStudio launcher's rollout side then keeps running after it exits). craftrl train ties it to its own run instead: it stops it at the end, and a driver killed outright takes it along.")
    seed: int = key(0, "Seed for env, policy initialisation and replay sampling.", NON_NEGATIVE)
    output_root: str = key("runs", "Where run directories runs/<logger name>-<timestamp>/ are created.")
    rollout_config: RolloutConfig = section(RolloutConfig, "How experience is collected.")
    train_config: TrainConfig = section(TrainConfig, "How the policy is optimised.")
    logger_config: LoggerConfig = section(LoggerConfig, "Where metrics go.")
    ray_config: RayConfig = section(RayConfig, "How Ray is started or joined.")

    def chunks_per_batch(self) -> int:
        """Chunks in one train worker's batch (batch_size_per_gpu fragments)."""
        return max(1, self.train_config.batch_size_per_gpu // self.rollout_config.replay_buffer_config.fragments_per_chunk)

    def chunks_per_iteration(self) -> int:
        """Chunks one train worker samples from the replay buffer per iteration."""
        return self.chunks_per_batch() * self.train_config.batches_per_iteration

    def fragments_per_iteration(self) -> int:
        """The fragments all train workers sample per iteration."""
        return (self.chunks_per_iteration() * self.rollout_config.replay_buffer_config.fragments_per_chunk
                * max(self.train_config.num_workers, 1))

    def fragments_per_env_per_version(self, producing_workers: int | None = None) -> int:
        """Under ``synchronous_sampling``, the fragments each env cuts with one policy version: one iteration's
        fragments shared by the envs of ``producing_workers`` rollout workers (all of them by default; a whole
        share when the config is valid), rounded up so that fewer workers still fill an iteration."""
        rollout = self.rollout_config
        workers = rollout.num_rollout_workers if producing_workers is None else producing_workers
        return -(-self.fragments_per_iteration() // (rollout.worker_config.num_envs * max(workers, 1)))
