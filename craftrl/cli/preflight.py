"""Checks ``craftrl train`` runs before it creates a run directory or starts Ray.

Why: once Ray is up, a broken generator, an env that returns the wrong observation or a policy with the wrong
output shapes fails inside a Ray actor -- as a remote traceback, or as a worker that is restarted over and over
-- minutes after the command was typed. Here the same mistakes are found in a few seconds and reported as one
line each (a ``ConfigError``), naming the culprit and what was expected.

What runs, in the order the real system runs it:

1. the GPUs the config reserves are compared with the GPUs this machine has (local Ray only);
2. an explicit ``train_config.resume`` path must hold a readable craftrl checkpoint;
3. one env is built in a spawned process of its own session (as rollout workers build theirs: a game may hang
   or leave children behind) and reset, under ``worker_config.reset_timeout``;
4. meanwhile the driver builds the policy, then runs it on that first observation exactly as a rollout
   worker does (batch 1, time 1, ``initial_state(1)``, ``first=True``) and checks the shapes of what it returns;
5. the env takes up to ``PROBE_STEPS`` steps with actions the policy sampled on that observation, each under
   ``worker_config.step_timeout`` (an env that rejects some of the policy's actions, as one of 5 actions given a
   policy of 17, fails here: one step would pass 5 times in 17);
6. the resume checkpoint's weights must fit the policy.

Steps 3-5 can be switched off with ``rollout_config.worker_config.preflight=false``, for a driver machine that
cannot build the env (its game is installed only on the cluster's rollout nodes).
"""

from __future__ import annotations

import pickle
import time
import traceback
import zipfile
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Callable

from craftrl.config.validate import ConfigError
from craftrl.envs.contract import (ContractError, check_env_methods, check_reset_result, check_step_result,
                                   declared_task_metrics)
from craftrl.envs.env_process import SupervisedProcess, become_supervised
from craftrl.rollout.fragment import fragment_nbytes

ENV = "env_generator"
POLICY = "policy_generator"
CLOSE_WAIT_S = 5.0  # an env's close() gets this long before its process group is killed anyway
PROBE_STEPS = 8  # the preflight's env steps (step 5 above); they end early where the episode does
MESSAGE_CHARS = 600  # of an exception's message in an error line


def describe_exception(error: BaseException, with_location: bool = True) -> str:
    """``ValueError: the message (at file.py:12)``: one line that still says where it came from. A message of
    several lines (one listing what is missing, say) is joined into one, and cut at ``MESSAGE_CHARS``.

    ``with_location=False`` drops the location where it would only name library internals (pickling, torch.load).
    """
    message = " ".join(line.strip() for line in str(error).splitlines() if line.strip())
    if len(message) > MESSAGE_CHARS:
        message = message[:MESSAGE_CHARS - 3] + "..."
    text = type(error).__name__ + (f": {message}" if message else "")
    frames = traceback.extract_tb(error.__traceback__)
    if frames and with_location:
        text += f" (at {Path(frames[-1].filename).name}:{frames[-1].lineno})"
    return text


# ---------------------------------------------------------------------------------------------- entry points


def preflight(loaded: Any) -> Probe | None:
    """Run the checks that need no run directory (module docstring); raise ``ConfigError`` on the first failure.

    ``loaded`` is a ``craftrl.config.loading.LoadedConfig``. Returns what the probe measured (:class:`Probe`: the
    raw size of one of the run's fragments, from the env's first observation, the action the policy took on it
    and the policy's recurrent state; the time of one env step; the shapes of the policy's tensors, which the
    train workers' policies must match), or None when the env was not probed.
    """
    from craftrl.policies.checks import tensor_shapes

    config = loaded.online
    check_local_gpus(config)
    resume = config.train_config.resume
    checkpoint = check_resume_checkpoint(resume) if resume and resume != "latest" else None
    if checkpoint is not None:
        check_iterations_left(checkpoint, config.train_config.num_iterations)
    if not config.rollout_config.worker_config.preflight:
        return None
    worker = config.rollout_config.worker_config
    with EnvProbe(loaded.env_generator, seed=config.seed, reset_timeout=worker.reset_timeout,
                  step_timeout=worker.step_timeout) as env:
        policy = build_policy(loaded.policy_generator)  # while the env process builds its env
        check_picklable(POLICY, loaded.policy_generator, "Ray workers")
        first = env.wait_for_reset()
        actions = probe_policy(policy, first.obs, first.num_actions, samples=PROBE_STEPS)
        step_wall_s, step_cpu_s = env.steps(actions)
        action = actions[0]
    if checkpoint is not None:
        check_checkpoint_fits(checkpoint, policy)
    state = _call_policy("initial_state(1)", lambda: policy.initial_state(1))
    return Probe(fragment_nbytes(first.obs, action, state, config.rollout_config.fragment_length), step_wall_s,
                 step_cpu_s, first.task_metrics, tensor_shapes(policy.state_dict()))


def check_resume(resume: str | None, save_path: str | Path) -> Path | None:
    """Resolve ``train_config.resume`` (``'latest'`` = newest checkpoint under ``save_path``) and check it is readable.

    Returns the checkpoint directory, or None when not resuming.
    """
    if not resume:
        return None
    if resume == "latest":
        from craftrl.train.checkpoint import resolve_resume

        try:
            resume = str(resolve_resume(resume, save_path))
        except FileNotFoundError as error:
            raise ConfigError([str(error)]) from None
    return check_resume_checkpoint(resume).path


# ---------------------------------------------------------------------------------------------- resources


def check_local_gpus(config: Any) -> None:
    """A local Ray cannot lend GPUs this machine lacks; an existing cluster is checked when Ray joins it."""
    if config.ray_config.address:
        return
    from craftrl.ray_bootstrap import required_resources

    need = required_resources(config)
    if need.gpus <= 0:
        return
    try:
        import torch

        have = torch.cuda.device_count()
    except Exception:  # a broken CUDA install counts as no GPU
        have = 0
    if need.gpus > have:
        raise ConfigError([f"the config reserves {need.describe()}, but this machine has {have} GPU; "
                           "set rollout_config.num_gpus_per_worker and train_config.num_gpus_per_worker to 0"])


# ---------------------------------------------------------------------------------------------- checkpoints


@dataclass
class CheckpointSummary:
    """What resume needs to know about a checkpoint without reading its tensors: where, the weights' shapes, and
    the iterations it has trained."""

    path: Path
    model_shapes: dict[str, tuple[int, ...]]
    iteration: int


def check_resume_checkpoint(resume: str | Path) -> CheckpointSummary:
    """Check that ``resume`` is a directory holding a readable craftrl ``state.pt``; raise ``ConfigError`` if not.

    The file is memory-mapped, so even a multi-GB checkpoint is checked in milliseconds (tensors are not read).
    """
    from craftrl.policies.checks import tensor_shapes
    from craftrl.train.checkpoint import STATE_FILE, list_checkpoints

    where = "train_config.resume"
    path = Path(resume).expanduser()
    if not path.exists():
        raise ConfigError([f"{where}: {resume} does not exist (expected a checkpoint directory holding {STATE_FILE}, "
                           "or 'latest')"])
    state_file = path / STATE_FILE if path.is_dir() else path
    if not state_file.is_file():
        nested = list_checkpoints(path) or list_checkpoints(path / "checkpoints")
        hint = f"; did you mean {nested[-1][1]}?" if nested else ""
        raise ConfigError([f"{where}: {resume} is not a checkpoint directory (expected it to hold {STATE_FILE}){hint}"])
    payload = _read_checkpoint(state_file, where)
    training = payload["training"]
    iteration = int(training.get("iteration", 0)) if isinstance(training, dict) else 0
    return CheckpointSummary(state_file.parent, tensor_shapes(payload["model"]), iteration)


def _read_checkpoint(state_file: Path, where: str) -> dict[str, Any]:
    import torch

    if not zipfile.is_zipfile(state_file):
        raise ConfigError([f"{where}: {state_file} is unreadable (not a torch.save archive; truncated or corrupt?)"])
    try:
        payload = torch.load(state_file, map_location="cpu", mmap=True, weights_only=False)
    except Exception as error:
        reason = describe_exception(error, with_location=False)
        raise ConfigError([f"{where}: {state_file} is unreadable ({reason})"]) from None
    if not isinstance(payload, dict) or not isinstance(payload.get("model"), dict) or "training" not in payload:
        raise ConfigError([f"{where}: {state_file} is not a craftrl checkpoint (expected a dict with 'model' and "
                           "'training' entries, as craftrl train saves)"])
    return payload


def check_iterations_left(checkpoint: CheckpointSummary, num_iterations: int) -> None:
    """``num_iterations`` is the run's total, resumed or not: a checkpoint that has trained as many leaves nothing
    to train, and the run would start Ray, the envs and the trainer only to stop at once."""
    if checkpoint.iteration >= num_iterations:
        raise ConfigError([f"train_config.num_iterations: {num_iterations}, and {checkpoint.path} has already trained "
                           f"{checkpoint.iteration} iterations, so nothing is left to train; pass "
                           f"train_config.num_iterations=N with N > {checkpoint.iteration} (the run's total)"])


def check_checkpoint_fits(checkpoint: CheckpointSummary, policy: Any) -> None:
    """The trainer loads the weights strictly: names and shapes must match the policy's exactly."""
    from craftrl.policies.checks import REBUILD_HINT, weight_mismatch

    mismatch = weight_mismatch(checkpoint.model_shapes, policy, "the checkpoint")
    if mismatch:
        raise ConfigError([f"train_config.resume: the weights in {checkpoint.path} do not fit the policy from "
                           f"{POLICY} ({mismatch}); {REBUILD_HINT}"])


# ---------------------------------------------------------------------------------------------- generators


def check_picklable(name: str, generator: Callable[[], Any], destination: str) -> bytes:
    """Generators travel to other processes by (cloud)pickle; one that cannot be pickled fails there otherwise."""
    import cloudpickle

    try:
        return cloudpickle.dumps(generator)
    except Exception as error:
        reason = describe_exception(error, with_location=False)
        raise ConfigError([f"{name}: cannot be pickled to send it to {destination} ({reason}); "
                           "expected a module-level function or a functools.partial of one"]) from None


def build_policy(policy_generator: Callable[[], Any]) -> Any:
    """Call the generator and check the result is a policy module; raise ``ConfigError`` otherwise."""
    from craftrl.policies.checks import PolicyContractError, check_policy_members

    try:
        policy = policy_generator()
    except Exception as error:
        raise ConfigError([f"{POLICY} raised {describe_exception(error)}"]) from None
    try:
        check_policy_members(policy)
    except PolicyContractError as error:
        raise ConfigError([f"{POLICY}: {error}"]) from None
    return policy


def _call_policy(what: str, call: Callable[[], Any], context: str = "") -> Any:
    try:
        return call()
    except Exception as error:
        raise ConfigError([f"{POLICY}: {what} raised {describe_exception(error)}{context}"]) from None


def describe_obs(obs: dict[str, Any]) -> str:
    """``image uint8 [64, 64, 3], t int64 []``: what the policy was given, for error messages."""
    import numpy as np

    parts = []
    for key, value in list(obs.items())[:6]:
        array = np.asarray(value)
        parts.append(f"{key} {array.dtype} {list(array.shape)}")
    return ", ".join(parts)


def probe_policy(policy: Any, obs: dict[str, Any], num_actions: int | None = None, samples: int = 1) -> list[Any]:
    """Run ``policy`` on one observation as a rollout worker does and check its outputs; return ``samples`` actions
    sampled on it (the first by ``act``, the others by ``pi_head.sample`` of the same logits).

    Mirrors ``craftrl.rollout.loop.RolloutLoop._act``: ``obs_batch`` -> ``[1, 1, ...]`` tensors, the merged
    ``initial_state(1)``, ``first`` = True, then ``act``; the forward call is also made on its own first, so that
    a missing or misshapen output is named instead of failing inside ``act``.
    """
    import torch

    from craftrl.policies.checks import PolicyContractError, check_act_result, check_forward_outputs
    from craftrl.policies.state import merge_states, split_state
    from craftrl.rollout.loop import action_rows, obs_batch

    device = policy.device if hasattr(policy, "device") else torch.device("cpu")
    policy.eval()
    seen = f"; observation: {describe_obs(obs)}"
    try:
        batch = obs_batch([obs], device)
    except Exception as error:
        raise ConfigError([f"{ENV}: reset() returned an observation that cannot be batched into tensors "
                           f"({describe_exception(error)}){seen}"]) from None
    first = torch.ones(1, 1, dtype=torch.bool, device=device)
    with torch.no_grad():
        state = _call_policy("initial_state(1)", lambda: merge_states([policy.initial_state(1)]))
        outputs = _call_policy("forward() on the env's first observation",
                               lambda: policy(input=batch, state_in=state, first=first), seen)
        try:
            check_forward_outputs(outputs, 1, 1, num_actions)
            result = _call_policy("act()", lambda: policy.act(batch, state, first), seen)
            check_act_result(result, 1, 1)
        except PolicyContractError as error:
            raise ConfigError([f"{POLICY}: {error}"]) from None
        _call_policy("split_state() of the state forward() returned", lambda: split_state(result.state_out, 1))
        actions = [result.action] + [_call_policy("pi_head.sample() of forward()'s logits",
                                                  lambda: policy.pi_head.sample(outputs[0]["pi_logits"]), seen)
                                     for _ in range(samples - 1)]
        return [_call_policy("action_rows() of a sampled action", lambda: action_rows(action, 1)[0])
                for action in actions]


# ---------------------------------------------------------------------------------------------- the env process


@dataclass
class Probe:
    """What the preflight learned about the run's env and policy, for settings left to craftrl."""

    raw_fragment_bytes: int  # one fragment's raw size: observation, action and recurrent state per step
    step_wall_s: float  # one env step, in the env process (the mean of the preflight's)
    step_cpu_s: float  # CPU of the thread that called step() (a game in another process, e.g. a JVM, not counted)
    task_metrics: tuple[str, ...] = ()  # the env's declared task metrics (docs/envs.md), for the progress line
    policy_shapes: dict[str, tuple[int, ...]] | None = None  # the driver's policy's tensors: train workers compare


@dataclass
class FirstObservation:
    obs: dict[str, Any]
    num_actions: int | None  # the env's action_space.n when it declares a discrete action space
    task_metrics: tuple[str, ...] = ()


def _discrete_actions(env: Any) -> int | None:
    """``action_space.n`` of a gymnasium-style ``Discrete`` space, else None (other spaces are not compared)."""
    space = getattr(env, "action_space", None)
    if type(space).__name__ != "Discrete":
        return None
    n = getattr(space, "n", None)
    try:
        return int(n)
    except (TypeError, ValueError):
        return None


def _probe_env_main(conn: Connection, generator_bytes: bytes, seed: int) -> None:
    """Body of the preflight env process: build, reset, report; then step once if asked; then close."""
    become_supervised()
    stage = "unpickle"
    try:
        generator = pickle.loads(generator_bytes)
        stage = "build"
        env = generator()
        check_env_methods(env, ENV)
        stage = "reset()"
        result = env.reset(seed=seed)
        check_reset_result(result, f"{ENV}: reset()")
        conn.send(("reset", result[0], _discrete_actions(env), declared_task_metrics(env)))
        request = conn.recv()
        while request[0] == "step":
            stage = f"step() of the policy's action {request[1]!s:.60}"
            wall, cpu = time.perf_counter(), time.thread_time()  # this thread: others (BLAS pools) are noise
            result = env.step(request[1])
            wall, cpu = time.perf_counter() - wall, time.thread_time() - cpu
            check_step_result(result, f"{ENV}: step()")
            conn.send(("step", wall, cpu, bool(result[2] or result[3])))
            request = conn.recv()
        stage = "close()"
        env.close()
    except ContractError as error:
        conn.send(("contract", str(error)))
    except EOFError:
        pass  # the parent is gone or done
    except BaseException as error:  # noqa: BLE001 - every failure is reported as one line to the parent
        try:
            conn.send(("raised", stage, describe_exception(error)))
        except (OSError, ValueError, pickle.PicklingError):
            pass


class EnvProbe:
    """The parent side: start the env process, wait for its answers under the configured timeouts, kill it."""

    def __init__(self, env_generator: Callable[[], Any], *, seed: int, reset_timeout: float,
                 step_timeout: float) -> None:
        generator_bytes = check_picklable(ENV, env_generator, "env processes")
        self.reset_timeout, self.step_timeout = reset_timeout, step_timeout
        self.child = SupervisedProcess(_probe_env_main, (generator_bytes, seed), "craftrl-preflight-env")
        self.conn, self.process = self.child.conn, self.child.process
        self.idle = False  # True while the env process waits for a request (so it can close itself)

    def __enter__(self) -> "EnvProbe":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def wait_for_reset(self) -> FirstObservation:
        remaining = self.reset_timeout - (time.monotonic() - self.child.started_at)
        reply = self._receive("building and resetting the env", remaining, "reset_timeout", self.reset_timeout)
        return FirstObservation(obs=reply[1], num_actions=reply[2], task_metrics=reply[3])

    def steps(self, actions: list[Any]) -> tuple[float, float]:
        """Step with each of ``actions`` until the episode ends; returns a step's mean wall-clock and CPU seconds in
        the env process."""
        wall = cpu = 0.0
        for taken, action in enumerate(actions, start=1):
            try:
                self.conn.send(("step", action))
            except (OSError, ValueError) as error:
                raise ConfigError([f"{ENV}: the env process stopped before step() "
                                   f"({describe_exception(error)})"]) from None
            reply = self._receive(f"step({action!r:.60})", self.step_timeout, "step_timeout", self.step_timeout)
            wall, cpu = wall + reply[1], cpu + reply[2]
            if reply[3]:  # the episode ended: a further step would need a reset
                break
        return wall / taken, cpu / taken

    def _receive(self, what: str, timeout: float, timeout_key: str, configured: float) -> tuple:
        self.idle = False
        if not self.conn.poll(max(timeout, 0.0)):
            raise ConfigError([f"{ENV}: {what} took longer than rollout_config.worker_config.{timeout_key} "
                               f"({configured:g} s); expected it to finish (a hang?), or raise {timeout_key}"])
        try:
            reply = self.conn.recv()
        except (EOFError, OSError):
            self.process.join(timeout=5.0)
            raise ConfigError([f"{ENV}: the env process died during {what} (exit code {self.process.exitcode}); "
                               "expected it to stay alive"]) from None
        if reply[0] == "contract":
            raise ConfigError([reply[1]])
        if reply[0] == "raised":
            stage, error = reply[1], reply[2]
            if stage == "unpickle":
                raise ConfigError([f"{ENV}: cannot be rebuilt in an env process ({error}); expected a generator "
                                   "importable there"])
            if stage == "build":
                raise ConfigError([f"{ENV} raised {error}"])
            raise ConfigError([f"{ENV}: {stage} raised {error}"])
        self.idle = True
        return reply

    def close(self) -> None:
        """Let the env close itself briefly (only while it waits for a request), then kill its whole process
        group regardless."""
        if self.idle:
            self.child.close(CLOSE_WAIT_S)
        else:
            self.child.kill()
