"""The rollout loop: supervised env processes, batched inference, per-env fragment cutting.

``RolloutLoop`` is a plain class (the Ray actor in ``craftrl.rollout.worker`` is a thin shell around it), so
its bookkeeping is tested with real env processes but without Ray.

One ``step()``:

1. swap in pending weights, if any -- only here, between forward passes, so every step is stamped with
   the version that really acted;
2. wait (blocking, no spinning) until an env has answered, then at most ``max_batch_wait`` seconds more for
   others, up to ``batch_size``; take them. A slow or resetting env never holds the others: they act
   without it, and it joins a later group once it answers;
3. close their previous step in the cutters (reward, terminated/truncated, truncation bootstrap value);
4. one forward pass for the group, sample actions, send them -- those envs step while the next group is
   being inferred, which is where env time and inference time overlap;
5. hand finished fragments to ``emit`` (the worker's bounded send queue: it blocks when full).

With ``fragments_per_version`` > 0 (synchronous sampling) an env whose fragment is complete when its result
arrives has the fragment closed at once; once it has cut that many fragments with the current version it is
held, its result unanswered, until the next version arrives. The first version is waited for too. Every step of
every fragment is then acted by one version, the one the learner trains next. ``set_fragments_per_version``
changes the share (the manager raises it while a worker is missing, so that the others fill the iteration).
"""

from __future__ import annotations

import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import torch

from craftrl.envs import EnvPool, EnvResult
from craftrl.policies.checks import GENERATORS_RUN_ON_NODES, PolicyContractError, tensor_shapes, weight_mismatch
from craftrl.policies.state import merge_states, split_state, state_to_numpy
from craftrl.rollout.cutter import FragmentCutter
from craftrl.rollout.fragment import Fragment
from craftrl.utils.hardware import usable_cores


@dataclass
class EpisodeRecord:
    """One finished episode, for the episode statistics."""

    env_id: str
    episode_return: float
    length: int
    discounted_return: float
    metrics: dict[str, float]
    env_restarted: bool
    version: int


@dataclass
class WeightsUpdate:
    version: int
    state_dict: dict[str, torch.Tensor]


@dataclass
class _EnvTrack:
    cutter: FragmentCutter
    state: Any
    last_value: float = 0.0
    discounted: float = 0.0
    discount_power: float = 1.0
    pending_action: bool = False  # an action was sent and its result is outstanding
    fragments_this_version: int = 0  # fragments cut since the policy version last changed
    recording: dict[str, Any] | None = None


@dataclass
class LoopTimers:
    """Seconds spent per activity, so the status can say where rollout time goes."""

    env_wait: float = 0.0
    inference: float = 0.0
    emit_wait: float = 0.0
    weights_wait: float = 0.0  # synchronous sampling: every env held until the next policy version
    steps: int = 0
    forward_passes: int = 0  # inference groups acted on: steps / forward_passes is the mean group size
    started: float = field(default_factory=time.monotonic)
    emit_blocked_since: float | None = None  # set while the loop waits on a full send queue

    def as_dict(self) -> dict[str, float]:
        blocked = self.emit_blocked_since
        emit_wait = self.emit_wait + (time.monotonic() - blocked if blocked is not None else 0.0)
        return {"env_wait_s": self.env_wait, "inference_s": self.inference, "emit_wait_s": emit_wait,
                "weights_wait_s": self.weights_wait,
                "env_steps": float(self.steps), "forward_passes": float(self.forward_passes),
                "elapsed_s": time.monotonic() - self.started}


def episode_metrics(info: dict[str, Any]) -> dict[str, float]:
    """Numeric task metrics from an episode's last info: top-level scalars and one level of dicts of scalars."""
    metrics = {}
    for key, value in info.items():
        if isinstance(value, dict):
            for sub, inner in value.items():
                if _is_scalar(inner):
                    metrics[f"{key}/{sub}"] = float(inner)
        elif _is_scalar(value):
            metrics[key] = float(value)
    return metrics


def _is_scalar(value: Any) -> bool:
    if isinstance(value, (bool, np.bool_)):
        return False
    return isinstance(value, (int, float, np.integer, np.floating))


LATENCY_BOUND_STEP_S = 0.005  # an env step this long pays for its own pipe round trip many times over


def waits_more_than_computes(step_wall_s: float, step_cpu_s: float) -> bool:
    """An env whose steps mostly wait (on a game in another process, a socket, a timer), as MinecraftSim's do.

    Envs that share a process step one after another, so such envs get one process each: 8 of them per process
    ran at 0.14 of their speed against 0.79 alone in ``bench/latency_bound.py``, while for a Crafter step, which
    computes, sharing a process saves the round trips.
    """
    return step_wall_s >= LATENCY_BOUND_STEP_S and step_cpu_s <= step_wall_s / 2


def auto_envs_per_process(num_envs: int, batch_size: int, cores: int, recycling: bool = False) -> int:
    """``envs_per_process=0``: about one env process per core, each inference group made of whole processes.

    Why per core: more env processes than cores only adds pipe round trips and wake-ups (each costs about
    as much CPU as a Crafter step); fewer would leave cores idle on a larger machine. Recycling needs 1.
    """
    if recycling:
        return 1
    needed = -(-num_envs // max(cores, 1))
    if needed <= batch_size:
        return next(k for k in range(needed, batch_size + 1) if batch_size % k == 0)
    return min(num_envs, -(-needed // batch_size) * batch_size)


def obs_batch(observations: list[dict[str, Any]], device: torch.device) -> dict[str, torch.Tensor]:
    """Stack numeric observation entries into ``[B, 1, ...]`` tensors (non-numeric entries are skipped)."""
    batch = {}
    for key, value in observations[0].items():
        array = np.asarray(value)
        if array.dtype.kind not in "biuf":
            continue
        stacked = np.stack([np.asarray(obs[key]) for obs in observations])
        batch[key] = torch.from_numpy(stacked).unsqueeze(1).to(device)
    return batch


def action_rows(action: Any, count: int) -> list[Any]:
    """Per-env actions from a batched ``[B, 1, ...]`` action (tensor or dict of tensors), as numpy."""
    if isinstance(action, dict):
        parts = {key: value[:, 0].cpu().numpy() for key, value in action.items()}
        return [{key: value[i] for key, value in parts.items()} for i in range(count)]
    array = action[:, 0].cpu().numpy()
    return [array[i] for i in range(count)]


def worker_prefix(worker_name: str) -> str:
    """What the env id of every fragment a worker of this name cuts starts with, and no other worker's does (the
    manager names each worker it creates differently): ``<worker_name>.<loop id>/env<i>``."""
    return f"{worker_name}."


class RolloutLoop:
    """Steps ``num_envs`` env processes with a policy, cutting fragments of ``fragment_length`` steps."""

    def __init__(self, env_generator: Callable[[], Any], policy: torch.nn.Module, *, num_envs: int,
                 batch_size: int, fragment_length: int, emit: Callable[[Fragment], None],
                 on_episode: Callable[[EpisodeRecord], None] | None = None,
                 on_video: Callable[[dict[str, Any], list[Any]], None] | None = None,
                 discount: float = 0.99, step_timeout: float = 60.0, reset_timeout: float = 300.0,
                 restart_interval: float | None = None, worker_name: str = "w0", seed: int | None = None,
                 initial_version: int = -1, envs_per_process: int = 1, max_batch_wait: float = 0.0,
                 fragments_per_version: int = 0) -> None:
        if not 1 <= batch_size <= num_envs:
            raise ValueError(f"batch_size: expected 1 <= batch_size <= num_envs ({num_envs}), got {batch_size}")
        if fragments_per_version < 0:
            raise ValueError(f"fragments_per_version: expected >= 0, got {fragments_per_version}")
        self.fragments_per_version = fragments_per_version
        self.policy = policy.eval()
        self.device = policy.device if hasattr(policy, "device") else torch.device("cpu")
        self.batch_size = batch_size
        self.max_batch_wait = max_batch_wait
        self.emit = emit
        self.on_episode = on_episode or (lambda record: None)
        self.on_video = on_video or (lambda label, frames: None)
        self.discount = discount
        self.version = initial_version
        self.timers = LoopTimers()
        self.fragments_emitted = 0
        self._pending_weights: WeightsUpdate | None = None
        self._pending_share: int | None = None
        self._pending_lock = threading.Lock()
        self._change_arrived = threading.Event()  # new weights or a new share: wakes a loop waiting for them
        self._held: list[EnvResult] = []  # synchronous sampling: results of envs waiting for the next version
        self._released: set[int] = set()  # envs whose held result is back in _ready, its step already closed
        self._video_label: dict[str, Any] | None = None
        loop_id = uuid.uuid4().hex[:8]  # a recreated worker must never continue an old chain of indices
        self.envs_per_process = envs_per_process or auto_envs_per_process(
            num_envs, batch_size, usable_cores(), recycling=bool(restart_interval))
        self.pool = EnvPool(env_generator, num_envs, step_timeout_s=step_timeout, reset_timeout_s=reset_timeout,
                            restart_interval_s=restart_interval, envs_per_process=self.envs_per_process)
        self.tracks = [
            _EnvTrack(FragmentCutter(f"{worker_prefix(worker_name)}{loop_id}/env{i}", fragment_length),
                      policy.initial_state(1))
            for i in range(num_envs)
        ]
        self._ready: list[EnvResult] = []
        seeds = None if seed is None else [seed * 10_007 + i for i in range(num_envs)]
        self.pool.reset_all(seeds)

    # ---------------------------------------------------------------- control from other threads

    def set_weights(self, version: int, state_dict: dict[str, torch.Tensor]) -> None:
        """Queue new weights; they replace the current ones before the next forward pass (latest wins)."""
        with self._pending_lock:
            self._pending_weights = WeightsUpdate(int(version), state_dict)
        self._change_arrived.set()

    def set_fragments_per_version(self, count: int) -> None:
        """Synchronous sampling: each env's share of fragments per version from now on, this version included."""
        if not self.fragments_per_version or count < 1:
            raise ValueError(f"set_fragments_per_version: expected >= 1 under synchronous sampling, got {count}")
        with self._pending_lock:
            self._pending_share = int(count)
        self._change_arrived.set()

    def request_video(self, label: dict[str, Any]) -> None:
        """Record the next episode that starts on env 0; ``label`` names the file (iteration, version)."""
        self._video_label = dict(label)
        self.pool.record_episode(0)

    # ---------------------------------------------------------------- the loop

    def step(self, timeout: float | None = None) -> int:
        """Run one inference group; returns the number of env steps it consumed (0 on timeout)."""
        self._apply_pending_changes()
        if self.fragments_per_version and (self.version < 0 or not (self._ready or self.pool.outstanding)):
            return self._wait_for_weights(timeout)  # no version yet, or every env has cut its share of this one
        started = time.monotonic()
        if not self._ready:
            self._ready.extend(self.pool.recv(min_count=1, timeout=timeout))
        if self._ready and len(self._ready) < self.batch_size and self.max_batch_wait > 0:
            # a moment for the others, so that envs in step make one forward pass rather than several
            missing = min(self.batch_size - len(self._ready), self.pool.outstanding)
            if missing > 0:
                self._ready.extend(self.pool.recv(min_count=missing, timeout=self.max_batch_wait))
        self.timers.env_wait += time.monotonic() - started
        if not self._ready:
            return 0
        group, self._ready = self._ready[:self.batch_size], self._ready[self.batch_size:]
        closing = [result for result in group if result.env_index not in self._released]
        self._released.difference_update(result.env_index for result in group)
        finished = sum(1 for result in closing if not result.from_reset)
        self._close_steps(closing)
        self.timers.steps += finished
        if self.fragments_per_version:
            group = self._hold_envs_with_their_share(group)
            if not group:
                return finished
        started = time.monotonic()
        actions, fragments = self._act(group)
        self.timers.inference += time.monotonic() - started
        self.timers.forward_passes += 1
        self.pool.send([result.env_index for result in group], actions)
        self._emit_all(fragments)
        return finished

    def close(self) -> None:
        self.pool.close()

    def stats(self) -> dict[str, Any]:
        return {**self.timers.as_dict(), **self.pool.stats(), "version": self.version,
                "fragments_emitted": self.fragments_emitted}

    # ---------------------------------------------------------------- internals

    def _apply_pending_changes(self) -> None:
        with self._pending_lock:
            update, self._pending_weights = self._pending_weights, None
            share, self._pending_share = self._pending_share, None
        if share is not None and share != self.fragments_per_version:
            self.fragments_per_version = share
            self._release_held()  # those still at their share are held again before they act
        if update is not None:
            try:
                self.policy.load_state_dict(update.state_dict)
            except RuntimeError:  # torch's many lines; which tensors differ, and the likely cause, in one
                mismatch = weight_mismatch(tensor_shapes(update.state_dict), self.policy, "the learner's",
                                           "this rollout worker's")
                if mismatch is None:
                    raise
                raise PolicyContractError("policy_generator built another network in this rollout worker than in "
                                          f"the learner ({mismatch}); {GENERATORS_RUN_ON_NODES}") from None
            if update.version != self.version:
                for track in self.tracks:
                    track.fragments_this_version = 0
                self._release_held()
            self.version = update.version

    def _release_held(self) -> None:
        self._released.update(result.env_index for result in self._held)
        self._ready, self._held = self._held + self._ready, []  # the held envs waited longest

    def _wait_for_weights(self, timeout: float | None) -> int:
        started = time.monotonic()
        if self._change_arrived.wait(timeout):
            self._change_arrived.clear()
        self.timers.weights_wait += time.monotonic() - started
        return 0

    def _hold_envs_with_their_share(self, group: list[EnvResult]) -> list[EnvResult]:
        """Close the fragments these results complete; hold the envs that have cut their share for this version.

        Returns the results to act on now."""
        closed, acting = [], []
        for result in group:
            track = self.tracks[result.env_index]
            fragment = track.cutter.close_if_full(result.obs, result.first)
            if fragment is not None:
                closed.append(fragment)
                track.fragments_this_version += 1
            if track.fragments_this_version >= self.fragments_per_version and not track.cutter.num_steps:
                self._held.append(result)
            else:
                acting.append(result)
        self._emit_all(closed)
        return acting

    def _emit_all(self, fragments: list[Fragment]) -> None:
        for fragment in fragments:
            self.timers.emit_blocked_since = started = time.monotonic()
            self.emit(fragment)
            self.timers.emit_blocked_since = None
            self.timers.emit_wait += time.monotonic() - started
            self.fragments_emitted += 1

    def _close_steps(self, group: list[EnvResult]) -> None:
        """Give each env's previous step its outcome; report finished episodes."""
        bootstrap = self._truncation_values(group)
        for result in group:
            track = self.tracks[result.env_index]
            if result.from_reset:
                continue
            track.cutter.end_step(result.reward, result.terminated, result.truncated,
                                  bootstrap.get(result.env_index))
            track.discounted += track.discount_power * result.reward
            track.discount_power *= self.discount
            if result.done:
                self._finish_episode(result, track)

    def _truncation_values(self, group: list[EnvResult]) -> dict[int, float]:
        """Value of the final observation of each truncated episode, from the state the episode reached.

        Envs that failed (no final observation) get ``None`` here, and the cutter falls back to the value
        of the last observation the policy saw.
        """
        rows = [r for r in group if r.truncated and r.final_obs is not None and not r.from_reset]
        if not rows:
            return {}
        with torch.inference_mode():
            state = merge_states([self.tracks[r.env_index].state for r in rows])
            first = torch.zeros(len(rows), 1, dtype=torch.bool, device=self.device)
            latents, _ = self.policy(input=obs_batch([r.final_obs for r in rows], self.device),
                                     state_in=state, first=first)
            values = self.policy.value_head.denormalize(latents["vpred"])[:, 0].cpu().numpy()
        return {r.env_index: float(v) for r, v in zip(rows, values)}

    def _finish_episode(self, result: EnvResult, track: _EnvTrack) -> None:
        summary = result.episode
        self.on_episode(EpisodeRecord(
            env_id=track.cutter.env_id,
            episode_return=summary.episode_return if summary else float("nan"),
            length=summary.length if summary else 0,
            discounted_return=track.discounted,
            metrics=episode_metrics(result.info),
            env_restarted=bool(result.info.get("env_restarted", False)),
            version=self.version,
        ))
        track.discounted, track.discount_power = 0.0, 1.0
        if result.frames is not None and self._video_label is not None:
            self.on_video(self._video_label, result.frames)
            self._video_label = None

    def _act(self, group: list[EnvResult]) -> tuple[list[Any], list[Fragment]]:
        tracks = [self.tracks[result.env_index] for result in group]
        states_in = [track.state for track in tracks]
        first = torch.tensor([[result.first] for result in group], dtype=torch.bool, device=self.device)
        with torch.inference_mode():
            out = self.policy.act(obs_batch([result.obs for result in group], self.device),
                                  merge_states(states_in), first)
        actions = action_rows(out.action, len(group))
        logp = out.logp[:, 0].cpu().numpy()
        values = out.value[:, 0].cpu().numpy()
        states_out = split_state(out.state_out, len(group))
        fragments = []
        for i, (result, track) in enumerate(zip(group, tracks)):
            closed = track.cutter.begin_step(result.obs, result.first, actions[i], logp[i], values[i], self.version,
                                             state_in=lambda s=states_in[i]: state_to_numpy(s))
            if closed is not None:
                fragments.append(closed)
            track.state = states_out[i]
        return actions, fragments
