"""The body of one env process, and the parent-side handle that starts and kills it.

Why a separate process: a game that crashes, hangs or leaks (Minecraft's JVM does all three) must not
take the rollout worker with it, and it must be possible to kill it together with everything it
started. Each env process therefore makes itself the leader of a new session (``os.setsid``), so its
process group holds its envs and all of their children; killing that group reaps a JVM too.

Why it may host several envs: every request and reply costs a pipe round trip and two process
wake-ups, which on a small machine cost about as much CPU as a Crafter step itself. A process that
steps ``count`` envs per request pays that once for all of them. The price is shared fate: when one
of them fails, the process and all of its envs are rebuilt.

Wire protocol (tuples over a duplex pipe; at most one request outstanding per env, one reply per request):

* parent -> child: ``("reset", [(index, seed, record), ...])``, ``("step", [(index, action, auto_reset,
  record), ...])``, ``("close",)``; ``index`` numbers the envs of this process from 0;
* child -> parent: ``("results", [entry, ...])`` with one entry per env of the request, in its order:
  ``(index, "reset", obs, info, frames_started)`` or ``(index, "step", obs, reward, terminated, truncated,
  info, frames)``; or ``("error", where, traceback_text)``, after which the parent kills the process; or
  ``("region", index, kind, size)`` followed by a file descriptor: shared memory for that env's large
  observation arrays, which replies then reference instead of carrying (``shared_frames.py``).

A step request is answered once every env it names has stepped. Then the child resets, one at a time, the
envs whose episode ended with ``auto_reset`` set, and answers each reset with a reply of its own: the steps
are never held back by a reset, and the parent times a reset under its own deadline. When a request fails
partway, the entries that were finished (other envs' steps) are sent first, then the error, so no result that
exists is lost.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import signal
import threading
import time
import traceback
from multiprocessing import popen_spawn_posix, spawn
from multiprocessing.connection import Connection
from typing import Any, Callable

from craftrl.envs.contract import check_reset_result, check_step_result
from craftrl.envs.shared_frames import FrameReceiver, FrameSender

_PARENT_CHECK_PERIOD_S = 2.0


def send_message(conn: Connection, message: tuple) -> None:
    """Pickle with protocol 5 instead of ``Connection.send``'s default protocol 4.

    Replies carry several observations each, and protocol 5 pickles the transposed views of Crafter's frames in a
    fraction of protocol 4's time, once per request in every env process (bench/notes/code_figures.md). Unpickled
    arrays stay writable. Nothing on this pipe needs ``ForkingPickler``'s reducers: no connections cross it, and the
    descriptors of shared-memory regions (``shared_frames.py``) travel as ancillary data of their own, outside any
    pickle.
    """
    conn.send_bytes(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))


def receive_message(conn: Connection) -> tuple:
    return pickle.loads(conn.recv_bytes())


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


def _step_entry(env: Any, recorder: _Recorder, sender: FrameSender, index: int, action: Any, record: bool) -> tuple:
    recorder.requested |= record
    result = env.step(action)
    check_step_result(result, "env.step")
    obs, reward, terminated, truncated, info = result
    frames = recorder.on_step(env, bool(terminated or truncated))
    return (index, "step", sender.pack(index, "step", obs), float(reward), bool(terminated), bool(truncated), info,
            frames)


def _reset_entry(env: Any, recorder: _Recorder, sender: FrameSender, index: int, seed: int | None,
                 record: bool) -> tuple:
    recorder.requested |= record
    obs, info = _reset(env, seed)
    return (index, "reset", sender.pack(index, "reset", obs), info, recorder.on_reset(env))


def become_supervised() -> None:
    """First thing in a supervised child: lead a process group of its own (killing the group takes the env and
    everything it started), die with its parent, and leave Ctrl-C to the parent, which kills it."""
    os.setsid()
    _watch_parent(os.getppid())
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def env_process_main(conn: Connection, generator_bytes: bytes, count: int = 1) -> None:
    """Entry point of an env process: build ``count`` envs, then serve requests until told to stop."""
    become_supervised()
    where = "env_generator"
    entries: list[tuple] = []
    try:
        generator = pickle.loads(generator_bytes)
        envs = [generator() for _ in range(count)]
        recorders = [_Recorder() for _ in range(count)]
        sender = FrameSender(conn, lambda message: send_message(conn, message))
        while True:
            try:
                message = receive_message(conn)
            except EOFError:  # the parent is gone: take the envs' children with us
                _kill_own_group()
            command, where, entries = message[0], message[0], []
            if command == "close":
                for env in envs:
                    env.close()
                return
            if command == "reset":
                for index, seed, record in message[1]:
                    entries.append(_reset_entry(envs[index], recorders[index], sender, index, seed, record))
            elif command == "step":
                to_reset = []
                for index, action, auto_reset, record in message[1]:
                    entries.append(_step_entry(envs[index], recorders[index], sender, index, action, record))
                    terminated, truncated = entries[-1][4:6]
                    if (terminated or truncated) and auto_reset:
                        to_reset.append(index)
                send_message(conn, ("results", entries))
                where, entries = "reset", []  # sent: a failing reset must not send the steps again
                for index in to_reset:
                    send_message(conn, ("results", [_reset_entry(envs[index], recorders[index], sender, index,
                                                                 None, False)]))
                continue
            else:
                raise ValueError(f"env process: unknown command {command!r}")
            send_message(conn, ("results", entries))
    except BaseException:  # noqa: BLE001 - every failure is reported; the parent then kills the group
        report = ("error", where, traceback.format_exc())
        # What the other envs (or this env's finished step) produced still counts, unless it is the reply that
        # failed (an observation that cannot be pickled): then only the error goes.
        for message in ([("results", entries)] if entries else []) + [report]:
            try:
                send_message(conn, message)
            except Exception:  # noqa: BLE001 - a broken pipe or an unpicklable reply; nothing more to tell
                pass


class _SpawnWithoutMain(popen_spawn_posix.Popen):
    """Spawns without re-running the parent's ``__main__`` in the child, which multiprocessing does by default.

    An env process needs nothing from it: its generator arrives pickled with cloudpickle, by value where it
    was defined in ``__main__``. Re-running it would cost every env process the parent's imports, and in a Ray
    rollout worker ``__main__`` is Ray's worker module, and importing Ray into every env process triples the time
    they take to come up (bench/notes/sampler.md).
    """

    _lock = threading.Lock()  # the preparation function is swapped for this process's launch only

    def _launch(self, process_obj: Any) -> None:
        with self._lock:
            prepare = spawn.get_preparation_data

            def without_main(name: str) -> dict[str, Any]:
                data = prepare(name)
                data.pop("init_main_from_path", None)
                data.pop("init_main_from_name", None)
                return data

            spawn.get_preparation_data = without_main
            try:
                super()._launch(process_obj)
            finally:
                spawn.get_preparation_data = prepare


def start_without_main(process: multiprocessing.process.BaseProcess) -> None:
    """Start a spawn-context ``process`` without the parent's ``__main__`` (see ``_SpawnWithoutMain``)."""
    process._Popen = _SpawnWithoutMain  # BaseProcess.start calls self._Popen(self)
    process.start()


class SupervisedProcess:
    """A spawned child that runs ``target(conn, *args)`` (which starts with ``become_supervised``), talks over a
    duplex pipe, and is killed together with its whole process group."""

    def __init__(self, target: Callable[..., None], args: tuple, name: str) -> None:
        context = multiprocessing.get_context("spawn")
        self.conn, child_conn = context.Pipe(duplex=True)
        self.process = context.Process(target=target, args=(child_conn, *args), name=name, daemon=False)
        start_without_main(self.process)
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
        """Send a message; False if the pipe is already broken (the death is noticed by whoever waits)."""
        try:
            send_message(self.conn, message)
            return True
        except (BrokenPipeError, ConnectionResetError, OSError):
            return False

    def close(self, timeout_s: float) -> None:
        """Ask the child to close cleanly, wait up to ``timeout_s``, then kill the group regardless."""
        if self.send(("close",)):
            self.process.join(timeout=timeout_s)
        self.kill()

    def kill(self) -> None:
        """SIGKILL the process group (the child and everything it started), then reap the child."""
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


class EnvProcess(SupervisedProcess):
    """Parent-side handle of one env process: start it, talk to it, kill its whole process group."""

    def __init__(self, generator_bytes: bytes, count: int = 1) -> None:
        super().__init__(env_process_main, (generator_bytes, count), "craftrl-env")
        self.shared = FrameReceiver()

    def receive(self) -> tuple | None:
        """The next message from the env process (blocks), its observations whole; None for a message that only
        announced shared memory (``shared_frames.py``); EOFError or OSError once the process is gone."""
        message = receive_message(self.conn)
        if message[0] == "region":
            self.shared.add_region(self.conn, *message[1:])
            return None
        if message[0] == "results":
            for position, entry in enumerate(message[1]):
                if type(entry[2]) is not dict:
                    message[1][position] = (*entry[:2], self.shared.unpack(entry[0], entry[2]), *entry[3:])
        return message

    def kill(self) -> None:
        super().kill()
        self.shared.close()
