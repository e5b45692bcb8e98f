"""``EnvPool``: a batch of supervised env processes that a rollout worker drives asynchronously.

Protocol (one outstanding request per env; results arrive in completion order)::

    pool = EnvPool(env_generator, num_envs=8, step_timeout_s=60, restart_interval_s=None)
    pool.reset_all()                                  # every env answers with a from_reset result
    while training:
        results = pool.recv(min_count=4, timeout=None)   # blocks without spinning
        actions = policy([r.obs for r in results])
        pool.send([r.env_index for r in results], actions)

Auto-reset: a step that ends an episode (terminated or truncated) yields ONE result carrying that
step's ``reward``/``terminated``/``truncated``/``info``, the episode's last observation as
``final_obs`` (the trainer bootstraps a truncation with its value), and as ``obs`` the first
observation of the next episode (``first=True``, its reset info in ``reset_info``). Every result
answers exactly one ``send`` except ``from_reset`` results, which answer ``reset_all``.

Processes: ``envs_per_process`` consecutive envs share one process, which steps all of the envs an
action batch names in one request and answers in one reply (1 keeps every env alone). Results still
come per env, so callers see no difference, except that a group (``recv``'s batch) made of whole
processes' envs pays one pipe round trip per process instead of one per env.

Deadlines: a step must be answered within ``step_timeout_s``; a reset, whether ``reset_all``'s, the one
after an episode's last step or a rebuilt env's, within ``reset_timeout_s`` (for a new process, counted from
its start, so that building the env is included). The reset after an episode's end is the env's own reply,
after the process answered the step request, so a slow reset never eats into the step's deadline. The env's
result (its last step, with the next episode's first observation) comes once the reset is done, and so do
the results of the other envs of its process, which could not step again before that anyway (see
``_release``); an env alone in its process holds nobody.

Failures: if an env process dies, hangs past its deadline, or raises, its process group is killed, fresh envs
are built and reset, and each interrupted step comes back as ``truncated=True, reward=0.0, final_obs=None`` with
``info["env_restarted"] = True`` (the trainer then bootstraps with the value of the last observation
it has). An env of that process that was not stepping (its result was with the caller) loses its
episode too: its next ``send`` is answered the same way, without reaching the env. ``restart_counts``
goes up for every env of the process. With ``restart_interval_s`` set (one env per process only), an
env older than that is rebuilt at its next episode end; that does not count as a failure and the
episode ends normally.
"""

from __future__ import annotations

import logging
import selectors
import time
import weakref
from dataclasses import dataclass, field
from multiprocessing.connection import wait
from typing import Any, Callable, Sequence

import cloudpickle

from craftrl.envs.env_process import EnvProcess

logger = logging.getLogger(__name__)

RESTART_REASONS = ("died", "timeout", "exception")


class EnvPoolError(RuntimeError):
    """An env cannot be kept running (its generator or reset keeps failing)."""


@dataclass
class EpisodeSummary:
    """Statistics of a finished episode, as the pool saw it."""

    episode_return: float
    length: int
    restarted: bool  # the episode was cut short by an env failure


@dataclass
class EnvResult:
    """One env's answer to ``send`` (or to ``reset_all`` when ``from_reset``)."""

    env_index: int  # the env's position in the pool, 0 to num_envs - 1
    obs: dict[str, Any]  # what the policy acts on next (the reset obs after an episode end)
    reward: float
    terminated: bool
    truncated: bool
    info: dict[str, Any]  # the step's info; for from_reset results, the reset info
    first: bool  # ``obs`` starts an episode: reset the recurrent state before acting on it
    from_reset: bool = False  # answers reset_all: no action was consumed, reward is 0
    final_obs: dict[str, Any] | None = None  # last obs of the ended episode; None if the env failed
    reset_info: dict[str, Any] | None = None
    episode: EpisodeSummary | None = None  # set when a step ended an episode
    frames: list[Any] | None = None  # render() frames of a recorded episode, on its last result

    @property
    def done(self) -> bool:
        return self.terminated or self.truncated


@dataclass
class _Slot:
    """One env, as the caller sees it."""

    env_index: int
    host: _Host
    index: int  # the env's position among its process's envs
    waiting_for: str | None = None  # "reset" | "step" | None (idle: waits for an action)
    deadline: float = float("inf")
    auto_reset_sent: bool = True
    held_step: tuple | None = None  # an episode-ending step reply, held until its reset arrives
    lost_step: bool = False  # the in-flight step died with its process
    stale: bool = False  # the process was rebuilt while the caller held this env's result
    stale_reset: tuple | None = None  # the rebuilt env's reset reply, kept until the caller's next send
    restart_reason: str | None = None
    record_pending: bool = False
    episode_return: float = 0.0
    episode_length: int = 0
    restarts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(RESTART_REASONS, 0))
    recycles: int = 0


@dataclass(eq=False)  # hashed by identity: pending requests and ready handles are keyed by their host
class _Host:
    """One env process and the slots of the envs it runs."""

    slots: list[_Slot] = field(default_factory=list)
    process: EnvProcess | None = None
    fresh: bool = True  # the process has not answered yet (it may still be building its envs)
    start_failures: int = 0
    held: list[EnvResult] = field(default_factory=list)  # results kept back while a neighbour resets

    @property
    def env_indices(self) -> list[int]:
        return [slot.env_index for slot in self.slots]


def _kill_all(hosts: list[_Host]) -> None:
    for host in hosts:
        if host.process is not None:
            host.process.kill()
            host.process = None


class EnvPool:
    """``num_envs`` envs from ``env_generator`` in supervised processes (spawn context), ``envs_per_process`` each.

    ``env_generator`` is a zero-argument callable, pickled with cloudpickle (by reference when it is
    importable, by value otherwise). ``restart_interval_s`` of None or 0 disables recycling.
    """

    def __init__(
        self,
        env_generator: Callable[[], Any],
        num_envs: int,
        *,
        step_timeout_s: float = 60.0,
        reset_timeout_s: float = 300.0,
        restart_interval_s: float | None = None,
        max_start_failures: int = 3,
        close_timeout_s: float = 5.0,
        envs_per_process: int = 1,
    ) -> None:
        if not callable(env_generator):
            raise TypeError(f"EnvPool env_generator: expected a zero-argument callable, got {type(env_generator).__name__}")
        if not isinstance(num_envs, int) or num_envs < 1:
            raise ValueError(f"EnvPool num_envs: expected a positive int, got {num_envs!r}")
        for name, value in (("step_timeout_s", step_timeout_s), ("reset_timeout_s", reset_timeout_s)):
            if not value > 0:
                raise ValueError(f"EnvPool {name}: expected a positive number of seconds, got {value!r}")
        if restart_interval_s is not None and restart_interval_s < 0:
            raise ValueError(f"EnvPool restart_interval_s: expected None, 0 (disabled) or seconds > 0, got {restart_interval_s!r}")
        if not isinstance(envs_per_process, int) or not 1 <= envs_per_process <= num_envs:
            raise ValueError(f"EnvPool envs_per_process: expected an int in [1, num_envs={num_envs}], got {envs_per_process!r}")
        if restart_interval_s and envs_per_process > 1:
            raise ValueError("EnvPool restart_interval_s: expected None or 0 when envs_per_process > 1 "
                             f"(got {restart_interval_s!r}); recycling one env's process would cut its other envs' episodes")
        self.num_envs = num_envs
        self.step_timeout_s = float(step_timeout_s)
        self.reset_timeout_s = float(reset_timeout_s)
        self.restart_interval_s = restart_interval_s or None
        self.max_start_failures = int(max_start_failures)
        self.close_timeout_s = float(close_timeout_s)
        self._generator_bytes = cloudpickle.dumps(env_generator)
        self._hosts = [_Host() for _ in range(0, num_envs, envs_per_process)]
        self._slots = []
        for env_index in range(num_envs):
            host = self._hosts[env_index // envs_per_process]
            host.slots.append(_Slot(env_index, host, index=len(host.slots)))
            self._slots.append(host.slots[-1])
        self._results: list[EnvResult] = []
        self._closed = False
        # every process's pipe and sentinel, registered once per process: building a poll set of all of them on
        # every wait cost about a fifth of a rollout worker's CPU with 16 envs of one process each
        self._selector = selectors.DefaultSelector()
        self._finalizer = weakref.finalize(self, _kill_all, self._hosts)
        for host in self._hosts:  # build all envs in parallel, before the first reset is asked for
            self._start_process(host)

    # ------------------------------------------------------------------ public API

    def reset_all(self, seeds: Sequence[int | None] | None = None) -> None:
        """Reset every env; each answers through ``recv`` with a ``from_reset=True, first=True`` result.

        Only allowed while no request is outstanding (at start, or after all results were received).
        """
        self._check_open()
        if seeds is not None and len(seeds) != self.num_envs:
            raise ValueError(f"EnvPool.reset_all seeds: expected {self.num_envs} seeds, got {len(seeds)}")
        busy = [slot.env_index for slot in self._slots if slot.waiting_for is not None]
        undelivered = self._results + [result for host in self._hosts for result in host.held]
        if busy or undelivered:
            raise RuntimeError(f"EnvPool.reset_all: envs {busy or [r.env_index for r in undelivered]} still have "
                               "undelivered results; recv them first")
        for host in self._hosts:
            self._request_resets(host, None if seeds is None else [seeds[env_index] for env_index in host.env_indices])

    def send(self, env_indices: Sequence[int], actions: Sequence[Any]) -> None:
        """Start one step on each of ``env_indices`` with the matching action; returns without waiting."""
        self._check_open()
        env_indices = [int(env_index) for env_index in env_indices]
        if len(env_indices) != len(actions):
            raise ValueError(f"EnvPool.send: got {len(env_indices)} env indices but {len(actions)} actions")
        if len(set(env_indices)) != len(env_indices):
            raise ValueError(f"EnvPool.send: env indices must be distinct, got {env_indices}")
        for env_index in env_indices:
            if not 0 <= env_index < self.num_envs:
                raise ValueError(f"EnvPool.send: env index {env_index} out of range [0, {self.num_envs})")
            slot = self._slots[env_index]
            if slot.waiting_for is not None and not slot.stale:
                raise RuntimeError(f"EnvPool.send: env {env_index} is still busy; send only to envs whose result you received")
        requests: dict[_Host, list[tuple]] = {}  # the step requests of each process's envs
        for env_index, action in zip(env_indices, actions):
            slot = self._slots[env_index]
            if slot.stale:
                self._lose_step_of_stale(slot)
                continue
            slot.auto_reset_sent = not self._recycle_due(slot.host)
            slot.waiting_for, slot.deadline = "step", time.monotonic() + self.step_timeout_s
            requests.setdefault(slot.host, []).append((slot.index, action, slot.auto_reset_sent, slot.record_pending))
        for host, host_requests in requests.items():
            assert host.process is not None
            host.process.send(("step", host_requests))

    def recv(self, min_count: int = 1, timeout: float | None = None) -> list[EnvResult]:
        """Block until at least ``min_count`` results are ready, then return every ready result.

        With ``timeout`` (seconds), return whatever is ready when it expires (possibly nothing).
        Envs that die, hang or raise meanwhile are restarted here, and their results still come.
        """
        self._check_open()
        outstanding = self.outstanding
        if min_count > outstanding:
            raise ValueError(f"EnvPool.recv: min_count={min_count} but only {outstanding} results are outstanding "
                             "(send actions first)")
        give_up_at = float("inf") if timeout is None else time.monotonic() + timeout
        while True:
            self._poll(give_up_at if len(self._results) < min_count else time.monotonic())
            if len(self._results) >= min_count or time.monotonic() >= give_up_at:
                break
        results, self._results = self._results, []
        return results

    @property
    def outstanding(self) -> int:
        """Results still to come from ``recv``: envs stepping or resetting, and results received but not returned."""
        held = sum(len(host.held) for host in self._hosts)
        return sum(slot.waiting_for is not None and not slot.stale for slot in self._slots) + len(self._results) + held

    def record_episode(self, env_index: int) -> None:
        """Record the next episode that starts on ``env_index``: its result carries ``frames``."""
        if not 0 <= env_index < self.num_envs:
            raise ValueError(f"EnvPool.record_episode: env index {env_index} out of range [0, {self.num_envs})")
        self._slots[env_index].record_pending = True

    @property
    def restart_counts(self) -> list[int]:
        """Failures (death, hang, exception) per env since the pool started."""
        return [sum(slot.restarts.values()) for slot in self._slots]

    @property
    def recycle_counts(self) -> list[int]:
        """Planned ``restart_interval_s`` rebuilds per env (not failures)."""
        return [slot.recycles for slot in self._slots]

    def stats(self) -> dict[str, Any]:
        totals = {reason: sum(slot.restarts[reason] for slot in self._slots) for reason in RESTART_REASONS}
        return {"restarts": sum(totals.values()), "restarts_by_reason": totals,
                "recycles": sum(self.recycle_counts), "restart_counts": self.restart_counts,
                "env_processes": len(self.process_ids())}

    @property
    def idle_env_indices(self) -> list[int]:
        """Envs waiting for an action (their last result was delivered)."""
        delivered = {result.env_index for result in self._results + [r for host in self._hosts for r in host.held]}
        return [slot.env_index for slot in self._slots
                if (slot.waiting_for is None or slot.stale) and slot.env_index not in delivered]

    def process_ids(self) -> list[int]:
        """PIDs of the live env processes (each is also its process group id)."""
        return [host.process.pid for host in self._hosts if host.process is not None]

    def close(self) -> None:
        """Ask every env to close, wait up to ``close_timeout_s`` in total, then kill every group."""
        if self._closed:
            return
        self._closed = True
        live = [host.process for host in self._hosts if host.process is not None]
        asked = [process for process in live if process.send(("close",))]
        give_up_at = time.monotonic() + self.close_timeout_s
        pending = {process.sentinel: process for process in asked}
        while pending and time.monotonic() < give_up_at:
            for sentinel in wait(list(pending), timeout=max(0.0, give_up_at - time.monotonic())):
                pending.pop(sentinel)
        self._finalizer()
        self._selector.close()

    def __enter__(self) -> EnvPool:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    # ------------------------------------------------------------------ supervision

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("EnvPool: the pool is closed")

    def _recycle_due(self, host: _Host) -> bool:
        assert host.process is not None
        return self.restart_interval_s is not None and (
            time.monotonic() - host.process.started_at >= self.restart_interval_s)

    def _start_process(self, host: _Host) -> None:
        host.process = EnvProcess(self._generator_bytes, len(host.slots))
        host.fresh = True
        self._selector.register(host.process.conn, selectors.EVENT_READ, host)
        self._selector.register(host.process.sentinel, selectors.EVENT_READ, host)

    def _stop_process(self, host: _Host) -> None:
        if host.process is not None:
            for handle in (host.process.conn, host.process.sentinel):
                self._selector.unregister(handle)
        _kill_all([host])

    def _request_resets(self, host: _Host, seeds: Sequence[int | None] | None = None) -> None:
        """Reset every env of the process, in one request."""
        assert host.process is not None
        deadline = (host.process.started_at if host.fresh else time.monotonic()) + self.reset_timeout_s
        for slot in host.slots:
            slot.waiting_for, slot.deadline = "reset", deadline
        host.process.send(("reset", [(slot.index, None if seeds is None else seeds[slot.index], slot.record_pending)
                                     for slot in host.slots]))

    def _poll(self, give_up_at: float) -> None:
        """Wait (blocking, no spinning) for replies, deaths or deadlines, and handle what happened."""
        busy = [slot for slot in self._slots if slot.waiting_for is not None]
        if not busy:
            return
        next_deadline = min(slot.deadline for slot in busy)
        timeout = max(0.0, min(give_up_at, next_deadline) - time.monotonic())
        # an idle process (its results are with the caller) is drained too: a reply cannot come from it, but a
        # death can, and it then stays readable until handled
        for host in dict.fromkeys(key.data for key, _ in self._selector.select(timeout)):
            self._drain(host)
        now = time.monotonic()
        for slot in busy:
            if slot.waiting_for is not None and slot.deadline <= now:
                self._restart(slot.host, "timeout", f"env {slot.env_index}: no {slot.waiting_for} reply within the timeout")

    def _drain(self, host: _Host) -> None:
        """Handle every message this process has sent; restart it if it has died."""
        process = host.process
        assert process is not None
        try:
            while host.process is process and process.conn.poll():
                message = process.receive()
                if message is not None:
                    self._handle(host, message)
        except (EOFError, OSError):  # the child closed its end: it is dead or dying
            process.process.join(timeout=1.0)
            self._restart(host, "died", f"env process exited with code {process.process.exitcode}")
            return
        if host.process is process and not process.process.is_alive():  # dead, its pipe held open by a child
            self._restart(host, "died", f"env process exited with code {process.process.exitcode}")

    def _handle(self, host: _Host, message: tuple) -> None:
        if message[0] == "error":
            _, where, text = message
            self._restart(host, "exception", f"exception in {where}:\n{text}")
            return
        process = host.process
        for index, kind, *payload in message[1]:
            slot = host.slots[index]
            if kind == "step" and slot.waiting_for == "step":
                self._on_step(slot, *payload)
            elif kind == "reset" and slot.waiting_for == "reset":
                self._on_reset(slot, *payload)
            else:
                self._restart(host, "exception", f"env {slot.env_index}: unexpected {kind!r} reply while waiting "
                                                 f"for {slot.waiting_for!r}")
            if host.process is not process:  # rebuilt (a failure or a recycle): the rest is stale
                return
        self._release(host)

    def _on_step(self, slot: _Slot, obs: Any, reward: float, terminated: bool, truncated: bool,
                 info: dict, frames: list | None) -> None:
        slot.host.fresh = False
        slot.host.start_failures = 0
        slot.episode_return += reward
        slot.episode_length += 1
        if not (terminated or truncated):
            slot.waiting_for = None
            slot.host.held.append(EnvResult(slot.env_index, obs, reward, terminated, truncated, info, first=False))
            return
        slot.held_step = (obs, reward, terminated, truncated, info, frames)
        if slot.auto_reset_sent:  # the env resets now and answers on its own
            slot.waiting_for, slot.deadline = "reset", time.monotonic() + self.reset_timeout_s
        else:
            self._replace_process(slot.host)
            slot.recycles += 1

    def _on_reset(self, slot: _Slot, obs: Any, reset_info: dict, recording_started: bool) -> None:
        slot.host.fresh = False
        slot.host.start_failures = 0
        slot.waiting_for = None
        if slot.stale:  # the caller has not asked yet: answer its next send with this
            slot.stale_reset = (obs, reset_info, recording_started)
            return
        if recording_started:
            slot.record_pending = False
        restarted = slot.restart_reason is not None
        episode = EpisodeSummary(slot.episode_return, slot.episode_length, restarted=slot.lost_step)
        if slot.held_step is not None:
            final_obs, reward, terminated, truncated, info, frames = slot.held_step
            if restarted:
                info = dict(info, env_restarted=True, restart_reason=slot.restart_reason)
            result = EnvResult(slot.env_index, obs, reward, terminated, truncated, info, first=True,
                               final_obs=final_obs, reset_info=reset_info, episode=episode, frames=frames)
        elif slot.lost_step:
            info = {"env_restarted": True, "restart_reason": slot.restart_reason}
            result = EnvResult(slot.env_index, obs, 0.0, False, True, info, first=True,
                               reset_info=reset_info, episode=episode)
        else:
            info = dict(reset_info, env_restarted=True, restart_reason=slot.restart_reason) if restarted else reset_info
            result = EnvResult(slot.env_index, obs, 0.0, False, False, info, first=True, from_reset=True,
                               reset_info=reset_info)
        slot.held_step, slot.lost_step, slot.restart_reason = None, False, None
        slot.episode_return, slot.episode_length = 0.0, 0
        slot.host.held.append(result)

    def _release(self, host: _Host) -> None:
        """Deliver a process's results once none of its envs is resetting after an episode's end.

        The envs of a shared process cannot step again before their neighbour's reset is done (the process does
        one thing at a time), so delivering their results earlier would gain nothing but would split the
        process's envs into groups that answer apart, each with its own round trip and forward pass, for the
        rest of the run. A process of one env releases each result at once.
        """
        if host.held and not any(slot.waiting_for == "reset" and slot.held_step is not None for slot in host.slots):
            self._results.extend(host.held)
            host.held.clear()

    def _lose_step_of_stale(self, slot: _Slot) -> None:
        """The caller acted on an observation of an env that has since been rebuilt: the step is lost."""
        slot.stale, slot.lost_step = False, True
        if slot.stale_reset is not None:  # the fresh env is ready: answer now
            reset_reply, slot.stale_reset = slot.stale_reset, None
            self._on_reset(slot, *reset_reply)
            self._release(slot.host)
        # else its reset is still on the way and is answered as a lost step when it comes

    def _restart(self, host: _Host, reason: str, detail: str) -> None:
        """Kill the process group, count the failure for each of its envs, and build and reset fresh envs."""
        self._results.extend(host.held)  # results that exist are delivered; their envs' next steps are lost below
        host.held.clear()
        for slot in host.slots:
            slot.restarts[reason] += 1
            if slot.waiting_for == "step":
                slot.lost_step = True
            elif slot.waiting_for is None or slot.stale:  # its last result went (or goes) to the caller
                slot.stale, slot.stale_reset = True, None
            slot.restart_reason = reason
        logger.warning("env process of envs %s restarted (%s): %s", host.env_indices, reason, detail)
        if host.fresh:
            host.start_failures += 1
            if host.start_failures >= self.max_start_failures:
                self._stop_process(host)
                raise EnvPoolError(f"env {', '.join(map(str, host.env_indices))}: {host.start_failures} fresh envs in a "
                                   f"row failed before answering; last failure ({reason}): {detail}")
        self._replace_process(host)

    def _replace_process(self, host: _Host) -> None:
        self._stop_process(host)
        self._start_process(host)
        self._request_resets(host)
