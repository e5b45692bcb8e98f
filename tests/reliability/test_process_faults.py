"""Faults with real processes: a trainer killed outright, a run stopped by a signal, NaN in the loss.

The first two tests run ``craftrl train`` as a user would (a subprocess, in its own session so that a signal
sent to its process group reaches nothing of pytest's) and read the process table from ``/proc`` to check
that every process the run started -- Ray's gcs_server, raylet and workers, and the env processes the rollout
workers start -- is gone afterwards. A process is identified by its pid *and* its start time, so a pid the
kernel hands to a new process is never mistaken for a survivor.
"""

from __future__ import annotations

import functools
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from craftrl.config.loading import config_to_dict
from craftrl.policies.default import ImpalaRecurrentPolicy
from craftrl.train.checkpoint import list_checkpoints, load_checkpoint

pytestmark = pytest.mark.ray

TESTS = Path(__file__).resolve().parents[1]
TINY = str(TESTS / "config_fixtures" / "tiny.py")
GONE_WITHIN_S = 15.0
# Ray's dashboard and runtime-env agents notice a dead raylet within ~2 s, then try to report it to the (also
# dead) GCS with a timeout hard-coded to 60 s before exiting. Only after a SIGKILL: a graceful raylet stop is
# recognised and they exit at once. The kill test removes them itself rather than wait a minute.
RAY_AGENTS_THAT_LINGER_AFTER_SIGKILL = (b"ray::DashboardAgent", b"ray::RuntimeEnvAgent")


# ----------------------------------------------------------------------------------------- the process table

Processes = dict[int, str]  # pid -> start time (field 22 of /proc/<pid>/stat, in clock ticks since boot)


def _stat(pid: int) -> tuple[str, int, str] | None:
    """(state, parent pid, start time) of ``pid``, or None if there is no such process."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2:].split()  # the command name in parentheses may hold spaces
    return fields[0], int(fields[1]), fields[19]


def _command_line(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").strip()
    except OSError:
        return b"?"


def descendants(root: int) -> Processes:
    """Every process below ``root`` in the parent tree right now."""
    table: dict[int, tuple[int, str]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            stat = _stat(int(entry))
            if stat is not None:
                table[int(entry)] = (stat[1], stat[2])
    children: dict[int, list[int]] = {}
    for pid, (parent, _) in table.items():
        children.setdefault(parent, []).append(pid)
    found: Processes = {}
    pending = [root]
    while pending:
        for child in children.get(pending.pop(), []):
            found[child] = table[child][1]
            pending.append(child)
    return found


def still_running(processes: Processes) -> dict[int, bytes]:
    """Those of ``processes`` that are still the same process and not a zombie, with their command lines."""
    alive = {}
    for pid, started in processes.items():
        stat = _stat(pid)
        if stat is not None and stat[2] == started and stat[0] not in ("Z", "X"):
            alive[pid] = _command_line(pid)
    return alive


def wait_until_gone(processes: Processes, timeout_s: float) -> tuple[dict[int, bytes], float]:
    """Poll until none of ``processes`` runs; returns the survivors at the deadline and the seconds waited."""
    started = time.monotonic()
    while True:
        alive = still_running(processes)
        waited = time.monotonic() - started
        if not alive or waited > timeout_s:
            return alive, waited
        time.sleep(0.1)


def kill_all(processes: Processes) -> None:
    """SIGKILL whatever of ``processes`` still runs (cleanup: a failing test must not leak a Ray cluster)."""
    for pid in still_running(processes):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


class ProcessTreeRecorder:
    """Records every process that appears below a root process, from a thread, until the root exits.

    A process tree must be collected while it exists: once the root dies, its descendants are re-parented
    to init and can no longer be told apart from anyone else's processes.
    """

    def __init__(self, root: subprocess.Popen, period_s: float = 0.2) -> None:
        self.root = root
        self.seen: Processes = {}
        self._lock = threading.Lock()
        self._period_s = period_s
        self._thread = threading.Thread(target=self._record, name="process-tree-recorder", daemon=True)
        self._thread.start()

    def _record(self) -> None:
        while self.root.poll() is None:
            found = descendants(self.root.pid)
            with self._lock:
                for pid, started in found.items():
                    self.seen.setdefault(pid, started)
            time.sleep(self._period_s)

    def snapshot(self) -> Processes:
        with self._lock:
            return dict(self.seen)

    def command_lines(self) -> list[bytes]:
        return [_command_line(pid) for pid in self.snapshot()]

    def stop(self) -> Processes:
        self._thread.join(timeout=10)
        return self.snapshot()


def assert_tree_has_every_kind_of_process(recorder: ProcessTreeRecorder) -> None:
    """The recorder must have seen the processes this file is about, or its checks would prove nothing."""
    lines = recorder.command_lines()
    for marker in (b"gcs_server", b"raylet", b"ray::RolloutWorker", b"multiprocessing.spawn"):
        assert any(marker in line for line in lines), f"no {marker!r} process seen among {lines}"


def test_the_process_table_helpers_see_a_survivor_and_only_while_it_runs():
    """The checks below prove nothing unless these helpers do find a process that outlives its parent."""
    parent = subprocess.Popen(["sh", "-c", "sleep 120 & wait"], start_new_session=True)
    recorder = ProcessTreeRecorder(parent)
    try:
        deadline = time.monotonic() + 10
        while not any(b"sleep 120" in line for line in recorder.command_lines()) and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(timeout=10)
        tree = recorder.stop()
        survivors, _ = wait_until_gone(tree, timeout_s=0.5)
        assert list(survivors.values()) == [b"sleep 120"], "the orphaned child is a survivor"
        kill_all(tree)
        assert wait_until_gone(tree, timeout_s=5)[0] == {}, "a killed survivor (a zombie at most) no longer counts"
    finally:
        kill_all(recorder.stop())


# ----------------------------------------------------------------------------------------- the CLI as a user runs it


def start_train(tmp_path: Path, *args: str, name: str) -> tuple[subprocess.Popen, Path, Path]:
    """``craftrl train`` on the tiny config, in a session of its own; stdout/stderr go to files.

    Files, not pipes: nobody reads a pipe while the test waits, and a full pipe would block the run.
    """
    stdout, stderr = tmp_path / f"{name}.out", tmp_path / f"{name}.err"
    with open(stdout, "w") as out, open(stderr, "w") as err:
        process = subprocess.Popen([sys.executable, "-m", "craftrl.cli.main", "train", TINY, *args],
                                   stdout=out, stderr=err, start_new_session=True)
    return process, stdout, stderr


def wait_for(condition, timeout_s: float, what: str, process: subprocess.Popen, stderr: Path):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        if process.poll() is not None:
            pytest.fail(f"craftrl train exited ({process.returncode}) before {what}: {stderr.read_text()[-3000:]}")
        time.sleep(0.2)
    pytest.fail(f"timed out after {timeout_s:.0f} s waiting for {what}: {stderr.read_text()[-3000:]}")


def only_run_directory(output_root: Path) -> Path | None:
    runs = [p for p in output_root.iterdir() if p.is_dir()] if output_root.is_dir() else []
    assert len(runs) <= 1, f"expected one run directory, found {runs}"
    return runs[0] if runs else None


def training_records(metrics: Path) -> list[dict]:
    """The per-iteration records of complete lines (a line being written while we read is left out)."""
    complete = metrics.read_text().split("\n")[:-1]
    return [record for record in map(json.loads, complete) if "train/iteration" in record]


# ----------------------------------------------------------------------------------------- 1. SIGKILL, then resume


def test_a_killed_trainer_leaves_no_process_and_resume_latest_continues_its_counters(tmp_path: Path):
    output_root = tmp_path / "runs"
    process, _, stderr = start_train(tmp_path, f"output_root={output_root}", "train_config.num_iterations=1000",
                                     "train_config.save_interval=2", name="killed")
    recorder = ProcessTreeRecorder(process)
    try:
        def checkpoint_at_least_4():
            run = only_run_directory(output_root)
            found = list_checkpoints(run / "checkpoints") if run else []
            return run if found and found[-1][0] >= 4 else None

        run = wait_for(checkpoint_at_least_4, 240, "a checkpoint iter_4", process, stderr)
        assert_tree_has_every_kind_of_process(recorder)
        os.kill(process.pid, signal.SIGKILL)
        process.wait(timeout=30)
        tree = recorder.stop()
        survivors, waited = wait_until_gone(
            {pid: started for pid, started in tree.items()
             if not _command_line(pid).startswith(RAY_AGENTS_THAT_LINGER_AFTER_SIGKILL)}, GONE_WITHIN_S)
        print(f"\n{len(tree)} processes below the killed trainer; all but Ray's agents gone {waited:.1f} s "
              "after SIGKILL")
        assert survivors == {}, f"still running {GONE_WITHIN_S:.0f} s after the trainer was killed: {survivors}"
    finally:
        kill_all(recorder.stop())

    iteration, newest = list_checkpoints(run / "checkpoints")[-1]
    saved = load_checkpoint(newest)["training"]
    assert saved.iteration == iteration >= 4
    metrics = run / "metrics.jsonl"
    lines_before_resume = len(metrics.read_text().splitlines())

    started = time.monotonic()
    resumed = subprocess.run([sys.executable, "-m", "craftrl.cli.main", "train", TINY, f"output_root={output_root}",
                              f"train_config.num_iterations={iteration + 2}", "--resume", "latest"],
                             capture_output=True, text=True, timeout=300)
    print(f"resumed run: {time.monotonic() - started:.1f} s")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "Traceback" not in resumed.stderr
    assert f"resuming from {newest}" in resumed.stdout
    assert only_run_directory(output_root) == run, "the resumed run continues in the killed run's directory"

    lines = metrics.read_text().splitlines()
    appended = [json.loads(line) for line in lines[lines_before_resume:]]
    assert appended and appended[0].get("train/iteration") == iteration + 1, "the first record continues the count"
    records = [r for r in appended if "train/iteration" in r]
    assert [r["train/iteration"] for r in records] == [iteration + 1, iteration + 2]
    first = records[0]
    assert first["train/version"] == saved.version + 1
    assert first["train/trained_samples"] == saved.trained_samples + first["data/env_steps"]
    assert records[1]["train/version"] == saved.version + 2
    # Env steps and elapsed time carry on too (the new rollout side counts from 0; the log adds the saved count).
    # A record whose iteration waited in vain for the rollout manager lacks its keys: take the first that has them.
    with_env_steps = [r for r in records if "rollout/env_steps" in r]
    assert with_env_steps and with_env_steps[0]["rollout/env_steps"] > saved.env_steps > 0
    assert first["train/elapsed_s"] > saved.extra["elapsed_s"] > 0
    final_iteration, final = list_checkpoints(run / "checkpoints")[-1]
    assert final_iteration == iteration + 2
    assert load_checkpoint(final)["training"].trained_samples == records[1]["train/trained_samples"]
    assert (run / "logs" / f"config-until-iter_{iteration:08d}.yaml").is_file(), "the earlier config is kept"


def test_a_metrics_line_cut_by_a_kill_does_not_swallow_the_resumed_runs_first_record(tmp_path: Path):
    from craftrl.metrics import JsonlSink

    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text('{"step": 1, "train/iteration": 1}\n{"step": 2, "train/itera')  # SIGKILL mid-write
    sink = JsonlSink(metrics)
    sink.write({"train/iteration": 2}, step=2, wall_time=0.0)
    sink.close()
    lines = metrics.read_text().splitlines()
    assert len(lines) == 3 and json.loads(lines[2])["train/iteration"] == 2
    assert json.loads(lines[0])["step"] == 1, "earlier records are kept: the sink appends"


def test_resume_latest_with_nothing_to_resume_is_one_clear_error(tmp_path: Path):
    result = subprocess.run([sys.executable, "-m", "craftrl.cli.main", "train", TINY, f"output_root={tmp_path}",
                             "--resume", "latest"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert result.stderr.startswith("craftrl: error: train_config.resume=latest: none of the 0 run directories")
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr
    assert list(tmp_path.iterdir()) == [], "nothing is created for a run that cannot start"


def _fake_run(output_root: Path, name: str, iterations: list[int], written_at: float) -> Path:
    """A run directory as ``craftrl train`` leaves it, with empty ``state.pt`` files written at ``written_at``."""
    run = output_root / name
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.yaml").write_text("{}\n")
    for iteration in iterations:
        state = run / "checkpoints" / f"iter_{iteration:08d}" / "state.pt"
        state.parent.mkdir()
        state.write_bytes(b"")
        os.utime(state, (written_at, written_at))
    return run


def test_resume_picks_the_run_and_checkpoint_a_user_means(tmp_path: Path):
    from craftrl.config.validate import ConfigError
    from craftrl.run_dir import find_resume_target

    older_start = _fake_run(tmp_path, "cows-20260101-100000", [2, 4], written_at=3000)  # resumed most recently
    newer_start = _fake_run(tmp_path, "cows-20260101-110000", [2], written_at=2000)
    _fake_run(tmp_path, "sheep-20260101-120000", [8], written_at=9000)  # another config's run
    (tmp_path / "cows-20260101-130000").mkdir()  # started, killed before its first checkpoint

    latest = find_resume_target("latest", tmp_path, "cows", "checkpoints")
    assert (latest.run_dir.root, latest.iteration) == (older_start, 4), "the run whose checkpoint is newest"
    assert latest.checkpoint == older_start / "checkpoints" / "iter_00000004"

    by_run = find_resume_target(str(newer_start), tmp_path, "cows", "checkpoints")
    assert (by_run.run_dir.root, by_run.iteration) == (newer_start, 2), "a run directory: its newest checkpoint"

    newest = find_resume_target(str(older_start / "checkpoints" / "iter_00000004"), tmp_path, "cows", "checkpoints")
    assert newest.run_dir.root == older_start, "a run's newest checkpoint continues that run"
    branch = find_resume_target(str(older_start / "checkpoints" / "iter_00000002"), tmp_path, "cows", "checkpoints")
    assert branch.run_dir is None and branch.iteration == 2, "an older checkpoint starts a new run directory"

    shared = find_resume_target("latest", tmp_path, "cows", str(older_start / "checkpoints"))
    assert shared.run_dir is None and shared.iteration == 4, "an absolute save_path belongs to no single run"

    for resume, name, message in [("latest", "goats", "none of the 0 run directories named goats-*"),
                                  (str(tmp_path / "missing"), "cows", "does not exist"),
                                  (str(tmp_path / "cows-20260101-130000"), "cows", "holds no checkpoint")]:
        with pytest.raises(ConfigError, match=message):
            find_resume_target(resume, tmp_path, name, "checkpoints")


# ----------------------------------------------------------------------------------------- 2. Ctrl-C and SIGTERM


@pytest.mark.parametrize("stop", ["ctrl-c", "sigterm", "sigterm-to-group"])
def test_a_stopped_run_saves_a_checkpoint_and_leaves_no_process_behind(tmp_path: Path, stop: str):
    """Ctrl-C is SIGINT to the terminal's foreground process group: the CLI and every process in its group;
    ``kill PID`` sends SIGTERM to the CLI alone; ``timeout``, ``kill -- -PGID`` and launchers that stop a job by
    its group send SIGTERM to the whole group."""
    output_root = tmp_path / "runs"
    # A background job of a non-interactive shell (`make test &`, a CI script) starts with SIGINT ignored, and
    # every process it starts inherits that: its Ctrl-C would be ignored by design. A user's Ctrl-C reaches a
    # foreground job, whose SIGINT is never ignored -- so the CLI is started the way a terminal starts it.
    # (This was the "flaky in the full suite" Ctrl-C case: the full suite ran in the background.)
    inherited = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        process, stdout, stderr = start_train(tmp_path, f"output_root={output_root}",
                                              "train_config.num_iterations=100000", "train_config.save_interval=0",
                                              name=stop)
    finally:
        signal.signal(signal.SIGINT, inherited)
    recorder = ProcessTreeRecorder(process)
    try:
        def two_iterations_logged():
            run = only_run_directory(output_root)
            metrics = run / "metrics.jsonl" if run else None
            return run if metrics and metrics.is_file() and len(training_records(metrics)) >= 2 else None

        run = wait_for(two_iterations_logged, 240, "two logged iterations", process, stderr)
        time.sleep(1.0)  # let the recorder see the whole tree once more
        assert_tree_has_every_kind_of_process(recorder)
        if stop == "ctrl-c":
            os.killpg(process.pid, signal.SIGINT)
        elif stop == "sigterm-to-group":
            os.killpg(process.pid, signal.SIGTERM)
        else:
            process.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        try:
            returncode = process.wait(timeout=120)
        except subprocess.TimeoutExpired:  # say where it waits: the CLI dumps its threads' stacks on SIGUSR1
            process.send_signal(signal.SIGUSR1)
            time.sleep(3)
            pytest.fail(f"craftrl train still running 120 s after {stop}:\n{stderr.read_text()[-12000:]}")
        exited = time.monotonic() - signalled
        tree = recorder.stop()
        survivors, waited = wait_until_gone(tree, GONE_WITHIN_S)
        err = stderr.read_text()
        stages = [line for line in err.splitlines() if line.startswith("craftrl: stopped in")]
        print(f"\n{stop}: the CLI exited {exited:.1f} s after the signal; all {len(tree)} processes below it "
              f"gone {waited:.1f} s later; {stages[-1] if stages else 'no stop timings'}")
        assert returncode == 130, err[-3000:]
        assert "interrupted" in err and "Traceback" not in err, err[-3000:]
        assert list_checkpoints(run / "checkpoints"), "the stopped run saved no checkpoint"
        assert survivors == {}, f"still running {GONE_WITHIN_S:.0f} s after the run stopped: {survivors}"
        # The workers were stopped (not killed with the manager), so every fragment they cut is accounted for.
        # (The CLI once dropped its own handles first: the manager died on the spot and "emitted" read 0.)
        line = re.search(r"fragments: emitted (\d+) = sent (\d+) \+ discarded as stale (\d+) \+ dropped at stop "
                         r"(\d+) .*?replay registered (\d+) .*unaccounted (\d+)", stdout.read_text())
        assert line, stdout.read_text()[-3000:]
        emitted, sent, discarded, dropped, registered, unaccounted = map(int, line.groups())
        assert emitted > 0 and emitted == sent + discarded + dropped, line.group(0)
        assert registered == sent and unaccounted == 0, line.group(0)
    finally:
        if process.poll() is None:
            process.kill()
        kill_all(recorder.stop())


def test_a_disk_that_fills_stops_the_run_in_one_line_and_keeps_the_checkpoints_before_it(tmp_path: Path):
    """``save_path`` on a disk (a 300 KiB tmpfs, in a mount namespace of the run's own) that holds two of the tiny
    config's ~120 KB checkpoints but not the third's staging copy."""
    from craftrl.testing.simulated_nodes import mount_namespaces_work

    refused = mount_namespaces_work()
    if refused:
        pytest.skip(refused)
    disk = tmp_path / "small_disk"
    disk.mkdir()
    train = " ".join([sys.executable, "-m", "craftrl.cli.main", "train", TINY, f"output_root={tmp_path / 'runs'}",
                      f"train_config.save_path={disk}", "train_config.num_iterations=6"])
    script = (f"mount -t tmpfs -o size=300k tmpfs {disk} && "
              f"{{ {train}; code=$?; echo left: $(ls -A {disk}); exit $code; }}")
    result = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
                            capture_output=True, text=True, timeout=300)
    errors = [line for line in result.stderr.splitlines() if line.startswith("craftrl: error:")]
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert len(errors) == 1 and errors[0].startswith(
        f"craftrl: error: checkpoint: train_config.save_path: writing iter_00000003 under {disk} failed with"), errors
    assert "MiB free on its disk" in errors[0] and "the checkpoints before it are intact" in errors[0]
    assert f"latest checkpoint: {disk}/iter_00000002" in result.stdout, result.stdout[-2000:]
    assert "left: iter_00000001 iter_00000002\n" in result.stdout, "the failed save's staging directory stayed"


def test_a_replay_disk_that_fills_mid_run_stops_it_in_one_line_after_a_final_checkpoint(tmp_path: Path):
    """The replay store on a tmpfs (a mount namespace of the run's own) that a filler file fills once the
    run has logged two iterations; ``save_interval`` 0, so a checkpoint exists only if the failure kept one."""
    from craftrl.testing.simulated_nodes import mount_namespaces_work

    refused = mount_namespaces_work()
    if refused:
        pytest.skip(refused)
    disk, runs = tmp_path / "replay_disk", tmp_path / "runs"
    disk.mkdir()
    train = " ".join([sys.executable, "-m", "craftrl.cli.main", "train", TINY, f"output_root={runs}",
                      f"rollout_config.replay_buffer_config.database_config.path={disk / 'replay'}",
                      "train_config.num_iterations=100000", "train_config.save_interval=0"])
    fill_after_two_iterations = (f"for wait in $(seq 600); do [ \"$(cat {runs}/*/metrics.jsonl 2>/dev/null | wc -l)\" "
                                 f"-ge 2 ] && break; sleep 0.2; done; cat /dev/zero > {disk}/filler 2>/dev/null")
    # 80 MiB: the store starts only with room for 64 of the tiny config's 1-MiB bound fragments (disk_guard)
    script = (f"mount -t tmpfs -o size=80m tmpfs {disk} && {{ ({fill_after_two_iterations}) & {train}; code=$?; "
              "wait; exit $code; }")
    result = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
                            capture_output=True, text=True, timeout=240)
    errors = [line for line in result.stderr.splitlines() if line.startswith("craftrl: error:")]
    assert result.returncode == 1, result.stderr[-3000:]
    # the buffer's journal or, first, the workers' writes (then no worker can run): either way one line
    assert len(errors) == 1 and "No space left on device" in errors[0], errors or result.stderr[-3000:]
    assert errors[0].startswith(("craftrl: error: replay: replay store at", "craftrl: error: rollout:")), errors
    assert "latest checkpoint:" in result.stdout, result.stdout[-2000:]


# ----------------------------------------------------------------------------------------- 3. NaN in the loss


class NaNInjectingPolicy(ImpalaRecurrentPolicy):
    """The tiny recurrent policy, but chosen training forward passes return NaN outputs.

    Only forward passes with gradients in training mode count -- the learner's loss passes. The learner's
    value evaluation runs under ``no_grad`` and rollout workers run the policy in eval mode, so rollouts and
    advantages stay finite and the NaN reaches exactly the loss of the chosen passes.
    """

    def __init__(self, poisoned_calls: tuple[int, ...], **kwargs) -> None:
        super().__init__(**kwargs)
        self.poisoned_calls = frozenset(poisoned_calls)
        self.loss_calls = 0

    def forward(self, input, state_in, first):  # noqa: A002 - the policy contract's argument name
        latents, state_out = super().forward(input=input, state_in=state_in, first=first)
        if self.training and torch.is_grad_enabled():
            self.loss_calls += 1
            if self.loss_calls in self.poisoned_calls:
                latents = {key: value * float("nan") for key, value in latents.items()}
        return latents, state_out


def in_process_tiny_config(tmp_path: Path, num_iterations: int):
    """tests/config_fixtures/tiny.py's run, with every output path inside ``tmp_path``."""
    from config_fixtures.tiny import tiny_online

    from craftrl.config import build_config

    return build_config(tiny_online(tmp_path, train_config={"num_iterations": num_iterations}))


def test_nan_in_the_loss_skips_exactly_those_optimiser_steps_and_training_goes_on(ray_session, tmp_path: Path):
    from craftrl.system import start_metrics_sink, start_rollout_system, stop_rollout_system
    from craftrl.train.trainer import run_trainer

    config = in_process_tiny_config(tmp_path, num_iterations=5)
    train = config.train_config
    # Each iteration trains 4 fragments (checked below) in batches of 2, each batch in windows of context_length
    # steps, one optimiser step per batch: so loss pass number n belongs to optimiser step (n-1) // windows.
    windows = -(-config.rollout_config.fragment_length // train.context_length)
    assert train.gradient_accumulation == 1 and train.epochs_per_iteration == 1 and windows == 2
    steps_per_iteration = 4 // train.batch_size_per_gpu
    poisoned = (2, 7, 13)  # optimiser steps 0, 3 and 6: iterations 1, 2 and 4
    skipped_in_iteration = [0] * train.num_iterations
    for call in poisoned:
        skipped_in_iteration[(call - 1) // windows // steps_per_iteration] += 1
    assert skipped_in_iteration == [1, 1, 0, 1, 0]

    from config_fixtures.tiny import TINY_POLICY, env_generator as env

    policy = functools.partial(NaNInjectingPolicy, poisoned_calls=poisoned, **TINY_POLICY)
    sink = start_metrics_sink(str(tmp_path), config)
    start_rollout_system(policy, env, config)
    try:
        run_trainer(policy, config_to_dict(config), storage_path=str(tmp_path / "ray_train"))
    finally:
        stop_rollout_system()
        ray_session.get(sink.close.remote())
        ray_session.kill(sink)
    records = training_records(tmp_path / "metrics.jsonl")
    assert [r["train/iteration"] for r in records] == [1, 2, 3, 4, 5], "the run completes every iteration"
    assert all(r["data/fragments"] == 4 for r in records), "the pass-to-step arithmetic above assumes 4 fragments"
    assert [r["ppo/skipped_steps"] for r in records] == skipped_in_iteration
    assert records[-1]["ppo/skipped_steps_total"] == len(poisoned)
    assert [r["train/version"] for r in records] == [1, 2, 3, 4, 5], "a new policy is published every iteration"

    checkpoints = dict(list_checkpoints(tmp_path / "checkpoints"))
    final = load_checkpoint(checkpoints[5])["model"]
    assert all(torch.isfinite(tensor).all() for tensor in final.values() if tensor.is_floating_point())
    earlier = load_checkpoint(checkpoints[3])["model"]
    assert any(not torch.equal(earlier[name], final[name]) for name in final), \
        "the optimiser steps after the skipped ones changed the weights"
