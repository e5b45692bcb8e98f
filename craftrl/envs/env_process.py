"""The body of one env process, and the parent-side handle that starts and kills it.

Why a process per env: a game that crashes, hangs or leaks (Minecraft's JVM does all three) must not
take the rollout worker with it, and it must be possible to kill it together with everything it
started. Each env process therefore makes itself the leader of a new session (``os.setsid``), so its
process group holds the env and all of its children; killing that group reaps a JVM too.

Wire protocol (tuples over a duplex pipe; the parent never has more than one request outstanding
except the fire-and-forget ``record``):

* parent -> child: ``("reset", seed, record)``, ``("step", action, auto_reset, record)``, ``("close",)``
* child -> parent: ``("reset", obs, info, frames_started)``,
  ``("step", obs, reward, terminated, truncated, info, frames)``, ``("error", where, traceback_text)``

After a step that ends the episode with ``auto_reset`` set, the child sends the step reply and then,
unasked, the reply of the reset it runs at once, so the reset overlaps the policy's inference.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import signal
import threading
import time
import traceback
from multiprocessing.connection import Connection
from typing import Any

from craftrl.envs.contract import check_reset_result, check_step_result

_PARENT_CHECK_PERIOD_S = 2.0


def _kill_own_group() -> None:
    try:
        os.killpg(os.getpgid(0), signal.SIGKILL)
    finally:
        os._exit(1)


def _watch_parent(parent_pid: int) -> None:
    """Kill this env's whole process group if the parent disappears while the env hangs."""

    def watch() -> None:
        stop = threading.Event()
        while not stop.wait(_PARENT_CHECK_PERIOD_S):
            if os.getppid() != parent_pid:
                _kill_own_group()

    threading.Thread(target=watch, name="parent-watchdog", daemon=True).start()


class _Recorder:
    """Collects ``env.render()`` frames for one whole episode, from its reset to its last step."""

    def __init__(self) -> None:
        self.requested = False
        self.frames: list[Any] | None = None

    def on_reset(self, env: Any) -> bool:
        self.frames = None
        if self.requested:
            self.requested = False
            self.frames = [env.render()]
        return self.frames is not None

    def on_step(self, env: Any, episode_over: bool) -> list[Any] | None:
        if self.frames is None:
            return None
        self.frames.append(env.render())
        if not episode_over:
            return None
        frames, self.frames = self.frames, None
        return frames


def _reset(env: Any, seed: int | None) -> tuple[Any, Any]:
    result = env.reset() if seed is None else env.reset(seed=seed)
    check_reset_result(result, "env.reset")
    return result


def env_process_main(conn: Connection, generator_bytes: bytes) -> None:
    """Entry point of an env process: build the env, then serve reset/step requests until told to stop."""
    os.setsid()
    _watch_parent(os.getppid())
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle; it kills us
    where = "env_generator"
    try:
        env = pickle.loads(generator_bytes)()
        recorder = _Recorder()
        while True:
            try:
                message = conn.recv()
            except EOFError:  # the parent is gone: take the env's children with us
                _kill_own_group()
            command, where = message[0], message[0]
            if command == "close":
                env.close()
                return
            if command == "record":
                recorder.requested = True
            elif command == "reset":
                _, seed, record = message
                recorder.requested |= record
                obs, info = _reset(env, seed)
                conn.send(("reset", obs, info, recorder.on_reset(env)))
            elif command == "step":
                _, action, auto_reset, record = message
                recorder.requested |= record
                result = env.step(action)
                check_step_result(result, "env.step")
                obs, reward, terminated, truncated, info = result
                episode_over = bool(terminated or truncated)
                frames = recorder.on_step(env, episode_over)
                conn.send(("step", obs, float(reward), bool(terminated), bool(truncated), info, frames))
                if episode_over and auto_reset:
                    where = "reset"
                    obs, info = _reset(env, None)
                    conn.send(("reset", obs, info, recorder.on_reset(env)))
            else:
                raise ValueError(f"env process: unknown command {command!r}")
    except BaseException:  # noqa: BLE001 - every failure is reported; the parent then kills the group
        try:
            conn.send(("error", where, traceback.format_exc()))
        except (OSError, ValueError):
            pass


class EnvProcess:
    """Parent-side handle of one env process: start it, talk to it, kill its whole process group."""

    def __init__(self, context: multiprocessing.context.BaseContext, generator_bytes: bytes) -> None:
        self.conn, child_conn = context.Pipe(duplex=True)
        self.process = context.Process(target=env_process_main, args=(child_conn, generator_bytes),
                                       name="craftrl-env", daemon=False)
        self.process.start()
        child_conn.close()  # so that the child's death reads as EOF here
        self.started_at = time.monotonic()

    @property
    def pid(self) -> int:
        assert self.process.pid is not None
        return self.process.pid

    @property
    def sentinel(self) -> int:
        return self.process.sentinel

    def send(self, message: tuple) -> bool:
        """Send a request; False if the pipe is already broken (the death is noticed by ``wait``)."""
        try:
            self.conn.send(message)
            return True
        except (BrokenPipeError, ConnectionResetError, OSError):
            return False

    def kill(self) -> None:
        """SIGKILL the env's process group (the env and everything it started), then reap it."""
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            # No such group: killed before its setsid, or the group is gone. Only signal the pid while
            # it is unreaped, so that a recycled pid is never hit.
            if self.process.exitcode is None:
                try:
                    os.kill(self.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        self.process.join(timeout=10.0)
        self.conn.close()

    def close(self, timeout_s: float) -> None:
        """Ask the env to close cleanly, wait up to ``timeout_s``, then kill the group regardless."""
        if self.send(("close",)):
            self.process.join(timeout=timeout_s)
        self.kill()
