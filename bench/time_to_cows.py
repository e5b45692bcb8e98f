"""P3: wall-clock time to a mean of N cows per episode on ``crafter/cows``, measured from the command's launch.

Runs ``craftrl train CONFIG [overrides]`` as a child process for ``--minutes`` (then SIGTERM, which saves a
checkpoint and stops everything), once per seed, and reads the run's ``metrics.jsonl``. The clock starts when
the command is launched, so Ray's start-up, env construction and the trainer's start-up all count -- the same
clock a user's stopwatch would use. "Cows per episode" is the moving mean over the last 20 episodes
(``episodes/cows_killed_mean``), as in issue 11's table.

    python bench/time_to_cows.py --minutes 20 --seeds 0 1 2
    python bench/time_to_cows.py --minutes 6 --seeds 0 -- train_config.learning_rate=1e-3
    python bench/time_to_cows.py --minutes 11 --stop-at-cows 3 --seeds 0 1 -- <override>   # an A/B of time to 3 cows

``--stop-at-cows N`` stops each run once its 20-episode mean reaches N (the figure an A/B compares), so a
seed costs its time to N cows instead of the whole ``--minutes``; the later columns are then empty.

The last line is ``P3 time_to_3_cows_s=<median over seeds, or inf>``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import re
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

from craftrl.metrics import read_jsonl

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import describe_machine  # noqa: E402  (bench scripts share helpers by plain import)
from seeds import add_seed_arguments, seeds_from  # noqa: E402

COWS = "episodes/cows_killed_mean"
THRESHOLDS = (1.0, 2.0, 3.0)
CHECKPOINTS_MIN = (2.5, 3.75, 5.0, 10.0, 15.0, 20.0)


COMPONENTS = (  # (label, test on a process's command line); the first match wins
    ("env processes", lambda cmd, parent_cmd: parent_cmd.startswith("ray::RolloutWorker")),
    ("rollout worker: inference, fragments, replay writes", lambda cmd, parent_cmd: cmd.startswith("ray::RolloutWorker")),
    ("replay buffer and readers", lambda cmd, parent_cmd: cmd.startswith(("ray::ReplayBuffer", "ray::ChunkReader"))),
    ("metrics, statistics, manager", lambda cmd, parent_cmd: cmd.startswith(("ray::Metrics", "ray::Episode", "ray::RolloutManager"))),
)


def _proc_table() -> dict[int, tuple[int, str, float]]:
    """pid -> (parent pid, command line, CPU seconds used) for every live process."""
    ticks = os.sysconf("SC_CLK_TCK")
    table = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        table[int(entry.name)] = (int(fields[1]), cmd, (int(fields[11]) + int(fields[12])) / ticks)
    return table


def cpu_by_component(root: int) -> dict[str, float]:
    """CPU seconds used so far by the run's live processes (the driver and its descendants), by component.

    The driver runs the learner (local mode), so its own CPU is "learner"; Ray's own daemons are "Ray system".
    """
    return cpu_split(root, "learner (driver process)", COMPONENTS, "Ray system processes")


def cpu_split(root: int, root_label: str, rules, other_label: str) -> dict[str, float]:
    """CPU seconds of ``root`` and its live descendants, summed by label.

    ``rules`` is ``(label, test(cmd, parent_cmd))`` pairs, the first match wins; ``root`` itself is
    ``root_label`` and a process no rule matches is ``other_label``.
    """
    table = _proc_table()
    children: dict[int, list[int]] = {}
    for pid, (parent, _, _) in table.items():
        children.setdefault(parent, []).append(pid)
    split: dict[str, float] = {}
    stack = [root]
    while stack:
        pid = stack.pop()
        stack.extend(children.get(pid, []))
        if pid not in table:
            continue
        parent, cmd, seconds = table[pid]
        parent_cmd = table.get(parent, (0, "", 0.0))[1]
        label = root_label if pid == root else next(
            (name for name, test in rules if test(cmd, parent_cmd)), other_label)
        split[label] = split.get(label, 0.0) + seconds
    return split


def stop_run(child: subprocess.Popen, grace_s: float) -> None:
    """SIGTERM a ``craftrl train`` still running (it checkpoints and stops everything), SIGKILL after ``grace_s``."""
    if child.poll() is not None:
        return
    child.send_signal(signal.SIGTERM)
    try:
        child.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()


def machine_speed(seconds: float = 3.0) -> float:
    """Raw ``crafter/cows`` steps/s of one env stepped in this process, random actions, resets included.

    Why: machines sold as the same 2 cores differed 2.4x in this figure between sessions, and every time in
    the results scales with it; stored next to each run, it says which machine a time came from."""
    from env_throughput import in_process  # bench/ is sys.path[0] when this script runs

    return in_process("crafter/cows", seconds)[0]


def run_once(config: str, overrides: list[str], seed: int, minutes: float, output_root: Path, log: Path,
             stop_at_cows: float | None = None, stop_when: Callable[[Path], bool] | None = None) -> Path:
    """One training run; returns its run directory. The child gets SIGTERM at the deadline, or as soon as the
    20-episode mean reaches ``stop_at_cows`` (an A/B of time to N cows needs nothing after it), or as soon as
    ``stop_when(run directory)`` is true.

    Before launch the machine's raw env speed is measured (``machine.json``); just before the stop the CPU
    time of every process of the run is recorded by component (``cpu_split.json`` in the run directory), which
    says where a 2-core machine's time goes."""
    raw_env_sps = machine_speed()
    # num_iterations raised so the run lasts the whole --minutes on a fast machine too (the default's 400
    # iterations ended after ~9 minutes on one); an override given on the command line still wins
    command = [sys.executable, "-m", "craftrl.cli.main", "train", config, f"seed={seed}",
               f"output_root={output_root}", "train_config.num_iterations=1000000", *overrides]
    launched = time.time()
    split: dict[str, float] = {}
    with log.open("w") as out:
        child = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        if stop_when is not None:
            def done() -> bool:
                run_dir = run_directory(log)
                return run_dir is not None and stop_when(run_dir)
        elif stop_at_cows is not None:
            def done() -> bool:
                return _reached(log, launched, stop_at_cows)
        else:
            done = None
        reached = wait_until(child, max(minutes * 60 - 5, 1), done)
        if child.poll() is None:
            split = cpu_by_component(child.pid)
            elapsed = time.time() - launched
            if not reached:  # the CPU split was taken 5 s early; the run still gets its whole --minutes
                try:
                    child.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    pass
        stop_run(child, grace_s=120)
    run_dir = run_directory(log)
    if run_dir is None:
        raise SystemExit(f"time_to_cows: no run directory in {log}")
    (run_dir / "launched_at").write_text(f"{launched}\n")
    (run_dir / "machine.json").write_text(json.dumps({"raw_env_steps_per_s_1_process": raw_env_sps}))
    if split:
        (run_dir / "cpu_split.json").write_text(json.dumps(
            {"wall_s": elapsed, "cpu_s": split, "cores_used": {k: v / elapsed for k, v in split.items()}}, indent=1))
    return run_dir


def wait_until(child: subprocess.Popen, seconds: float, reached: Callable[[], bool] | None = None) -> bool:
    """Wait up to ``seconds`` for ``child`` to exit, asking ``reached`` every 2 s whether the run may stop early;
    True as soon as it says so."""
    deadline = time.monotonic() + seconds
    while child.poll() is None and time.monotonic() < deadline:
        try:
            child.wait(timeout=min(2.0, max(deadline - time.monotonic(), 0.01)))
        except subprocess.TimeoutExpired:
            if reached is not None and reached():
                return True
    return False


def run_directory(log: Path) -> Path | None:
    """The run directory ``craftrl train`` announced in ``log`` (None before it did)."""
    match = re.search(r"run directory (\S+)", log.read_text())
    return Path(match.group(1)) if match else None


def _reached(log: Path, launched: float, cows: float) -> bool:
    """Whether the run logging to ``log`` has reached a mean of ``cows`` per episode (as ``summarize`` counts it)."""
    run_dir = run_directory(log)
    if run_dir is None or not (run_dir / "metrics.jsonl").exists():
        return False
    return math.isfinite(summarize(read_curve(run_dir, launched), thresholds=(cows,))[f"time_to_{cows:g}_s"])


def read_curve(run_dir: Path, launched: float | None = None) -> list[dict[str, float]]:
    """(seconds since launch, env steps, cows/episode, samples trained) for every logged iteration; the launch
    time is the run's ``launched_at`` file unless given."""
    if launched is None:
        launched = float((run_dir / "launched_at").read_text())
    points = []
    for record in read_jsonl(run_dir / "metrics.jsonl"):
        if not isinstance(record.get(COWS), (int, float)):
            continue
        points.append({"t": float(record["time"]) - launched, "steps": float(record.get("rollout/env_steps", 0.0)),
                       "cows": float(record[COWS]), "episodes": float(record.get("episodes/total", 0.0))})
    return points


def summarize(points: list[dict[str, float]], thresholds: tuple[float, ...] = THRESHOLDS) -> dict[str, float]:
    out: dict[str, float] = {}
    for threshold in thresholds:
        # at least 20 episodes behind the moving mean, so an early lucky episode does not count
        hit = next((p for p in points if p["cows"] >= threshold and p["episodes"] >= 20), None)
        out[f"time_to_{threshold:g}_s"] = hit["t"] if hit else math.inf
        out[f"steps_to_{threshold:g}"] = hit["steps"] if hit else math.inf
    for minute in CHECKPOINTS_MIN:
        before = [p for p in points if p["t"] <= minute * 60]
        lasted = bool(points) and points[-1]["t"] >= minute * 60 - 30  # the run reached (about) that minute
        out[f"cows_at_{minute:g}min"] = before[-1]["cows"] if before and lasted else math.nan
    if len(points) >= 2:
        last = points[-1]
        out["end_to_end_sps"] = last["steps"] / max(last["t"], 1e-9)
        out["env_steps"] = last["steps"]
        out["minutes"] = last["t"] / 60
    return out


def fmt(value: float, unit: str = "") -> str:
    if isinstance(value, float) and math.isinf(value):
        return "not reached"
    if isinstance(value, float) and math.isnan(value):
        return "-"
    return f"{value:.0f}{unit}" if unit else f"{value:.2f}"


def _read_json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {}


def cpu_split_rows(run_dirs: list[Path]) -> list[str]:
    """A table of cores used per component, the mean over the runs that recorded ``cpu_split.json``."""
    splits = [s["cores_used"] for s in (_read_json(d / "cpu_split.json") for d in run_dirs) if s]
    if not splits:
        return []
    names = sorted({name for split in splits for name in split}, key=lambda n: -statistics.mean(
        split.get(n, 0.0) for split in splits))
    rows = ["| component | cores used (mean of the runs) |", "|---|---:|"]
    rows += [f"| {name} | {statistics.mean(split.get(name, 0.0) for split in splits):.2f} |" for name in names]
    total = statistics.mean(sum(split.values()) for split in splits)
    return [*rows, f"| all | {total:.2f} of {os.cpu_count()} |"]


def wall_time_split(run_dir: Path) -> dict[str, float]:
    """Where the rollout loop's and the learner's wall time went over a run, as fractions of each.

    Rollout: from the manager's cumulative timers in the last ``metrics.jsonl`` record (``rollout/loop_s`` is
    the loops' whole time; what the named parts, lock-step waits included, leave is fragment cutting and sending
    actions and fragments).
    Learner: the per-iteration ``time/*`` seconds summed, against the time from its first to last iteration
    (the rest is logging and checkpoints). Empty for a run without these metrics."""
    records = read_jsonl(run_dir / "metrics.jsonl")
    timed = [r for r in records if "time/compute_s" in r]
    split: dict[str, float] = {}
    last = next((r for r in reversed(records) if r.get("rollout/loop_s")), None)
    if last:
        loop = last["rollout/loop_s"]
        parts = {"rollout: inference (forward + sampling)": last.get("rollout/inference_s", 0.0),
                 "rollout: waiting for env processes": last.get("rollout/env_wait_s", 0.0),
                 "rollout: blocked on a full send queue": last.get("rollout/emit_wait_s", 0.0),
                 "rollout: every env held for the next version (lock-step)": last.get("rollout/weights_wait_s", 0.0)}
        split.update({name: seconds / loop for name, seconds in parts.items()})
        split["rollout: fragment cutting, sends (transport)"] = max(0.0, 1.0 - sum(split.values()))
    if len(timed) >= 2:
        span = float(timed[-1]["time"]) - float(timed[0]["time"])
        later = timed[1:]  # the first record's times fall before the span starts
        parts = {"learner: computing (evaluation, GAE, epochs)": sum(r["time/compute_s"] for r in later),
                 "learner: waiting for data": sum(r.get("time/wait_data_s", 0.0) for r in later),
                 "learner: weight broadcast": sum(r.get("time/broadcast_s", 0.0) for r in later),
                 "learner: waiting for statistics": sum(r.get("time/statistics_s", 0.0) for r in later)}
        learner = {name: seconds / span for name, seconds in parts.items()} if span > 0 else {}
        if learner:
            learner["learner: other (metrics, checkpoints)"] = max(0.0, 1.0 - sum(learner.values()))
        split.update(learner)
    return split


def wall_split_rows(run_dirs: list[Path]) -> list[str]:
    """A table of the wall-time split (``wall_time_split``): each part's mean over the runs that measured it (a run
    from before ``rollout/loop_s`` was logged has no rollout parts; it is not a run whose rollout took no time)."""
    splits = [split for split in (wall_time_split(d) for d in run_dirs) if split]
    if not splits:
        return []
    names = list(dict.fromkeys(name for split in splits for name in split))
    rows = ["| part | share of its wall time (mean of the runs that measured it) | runs |", "|---|---:|---:|"]
    for name in names:
        shares = [split[name] for split in splits if name in split]
        rows.append(f"| {name} | {statistics.mean(shares):.0%} | {len(shares)} |")
    return rows


def write_results(results: list[tuple[Path, dict[str, float]]], command: str, out: Path) -> None:
    """bench/results/time_to_cows.md: one row per seed, the median, the CPU split, the command and machine."""
    rows = ["| run | time to 1 / 2 / 3 cows | env steps to 3 cows | cows at 2.5 / 3.75 / 5 / 10 / 20 min | end-to-end env steps/s | machine: raw env steps/s, 1 process |",
            "|---|---|---:|---|---:|---:|"]
    for run_dir, r in results:
        times = " / ".join(fmt(r[f"time_to_{t:g}_s"], " s") for t in THRESHOLDS)
        cows = " / ".join(fmt(r[f"cows_at_{m:g}min"]) for m in (2.5, 3.75, 5.0, 10.0, 20.0))
        raw = _read_json(run_dir / "machine.json").get("raw_env_steps_per_s_1_process", math.nan)
        rows.append(f"| `{run_dir.name}` | {times} | {fmt(r['steps_to_3'], ' ')} | {cows} | "
                    f"{r.get('end_to_end_sps', 0):.0f} | {'-' if math.isnan(raw) else f'{raw:.0f}'} |")
    median = statistics.median(r["time_to_3_s"] for _, r in results)
    split = cpu_split_rows([run_dir for run_dir, _ in results])
    wall = wall_split_rows([run_dir for run_dir, _ in results])
    text = ["## Time to cows on the default task (`bench/time_to_cows.py`, P3)", "",
            f"`{command}`, {datetime.date.today().isoformat()}, {describe_machine()}. The clock starts at launch "
            "(Ray, env and trainer start-up included); cows per episode is the mean of the last 20 episodes. "
            "Times scale with the machine: compare runs by their raw env steps/s column.", "",
            *rows, "", f"Median time to 3 cows per episode: {fmt(median, ' s')}.",
            *(["", "Where the CPU went (`cpu_split.json`, recorded just before each run's deadline):", "", *split]
              if split else []),
            *(["", "Where the wall time went (from `metrics.jsonl`: the rollout worker's loop and the learner):", "",
               *wall] if wall else [])]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(text) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default="craftrl.configs.default")
    parser.add_argument("--minutes", type=float, default=20.0)
    add_seed_arguments(parser, count=3)
    parser.add_argument("--output-root", default="runs/bench_time_to_cows")
    parser.add_argument("--runs", nargs="*", default=None, help="summarise existing run directories instead")
    parser.add_argument("--write-results", action="store_true", help="rewrite bench/results/time_to_cows.md")
    parser.add_argument("--stop-at-cows", type=float, default=None,
                        help="stop a run as soon as the 20-episode mean reaches this many cows (A/B runs)")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    root = Path(args.output_root).resolve()
    root.mkdir(parents=True, exist_ok=True)
    run_dirs = [Path(r) for r in args.runs] if args.runs else []
    if not run_dirs:
        seeds, _ = seeds_from(args, "time_to_cows")
        for seed in seeds:
            run_dirs.append(run_once(args.config, args.overrides, seed, args.minutes, root, root / f"seed{seed}.log",
                                     stop_at_cows=args.stop_at_cows))
    results = []
    for run_dir in run_dirs:
        summary = summarize(read_curve(run_dir))
        results.append((run_dir, summary))
        print(json.dumps({"run": str(run_dir), **{k: round(v, 3) for k, v in summary.items()}}), flush=True)
    if args.write_results:
        command = "python bench/time_to_cows.py " + " ".join(sys.argv[1:])
        write_results(results, command, Path(__file__).resolve().parent / "results" / "time_to_cows.md")
    median = statistics.median(r.get("time_to_3_s", math.inf) for _, r in results)
    print(f"P3 time_to_3_cows_s={median:.1f}")


if __name__ == "__main__":
    main()
