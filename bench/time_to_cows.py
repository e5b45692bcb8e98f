"""P3: wall-clock time to a mean of N cows per episode on ``crafter/cows``, measured from the command's launch.

Runs ``craftrl train CONFIG [overrides]`` as a child process for ``--minutes`` (then SIGTERM, which saves a
checkpoint and stops everything), once per seed, and reads the run's ``metrics.jsonl``. The clock starts when
the command is launched, so Ray's start-up, env construction and the trainer's start-up all count -- the same
clock a user's stopwatch would use. "Cows per episode" is the moving mean over the last 20 episodes
(``episodes/cows_killed_mean``), as in issue 11's table.

    python bench/time_to_cows.py --minutes 20 --seeds 0 1 2
    python bench/time_to_cows.py --minutes 6 --seeds 0 -- train_config.learning_rate=1e-3

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


def run_once(config: str, overrides: list[str], seed: int, minutes: float, output_root: Path, log: Path) -> Path:
    """One training run; returns its run directory. The child gets SIGTERM at the deadline.

    Just before the deadline the CPU time of every process of the run is recorded by component
    (``cpu_split.json`` in the run directory), which says where a 2-core machine's time goes."""
    command = [sys.executable, "-m", "craftrl.cli.main", "train", config, f"seed={seed}",
               f"output_root={output_root}", *overrides]
    launched = time.time()
    with log.open("w") as out:
        child = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        split: dict[str, float] = {}
        try:
            child.wait(timeout=max(minutes * 60 - 5, 1))
        except subprocess.TimeoutExpired:
            split = cpu_by_component(child.pid)
            try:
                child.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        stop_run(child, grace_s=120)
    match = re.search(r"run directory (\S+)", log.read_text())
    if not match:
        raise SystemExit(f"time_to_cows: no run directory in {log}")
    run_dir = Path(match.group(1))
    (run_dir / "launched_at").write_text(f"{launched}\n")
    if split:
        elapsed = minutes * 60 - 5
        (run_dir / "cpu_split.json").write_text(json.dumps(
            {"wall_s": elapsed, "cpu_s": split, "cores_used": {k: v / elapsed for k, v in split.items()}}, indent=1))
    return run_dir


def read_curve(run_dir: Path) -> list[dict[str, float]]:
    """(seconds since launch, env steps, cows/episode, samples trained) for every logged iteration."""
    launched = float((run_dir / "launched_at").read_text())
    points = []
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if not isinstance(record.get(COWS), (int, float)):
            continue
        points.append({"t": float(record["time"]) - launched, "steps": float(record.get("rollout/env_steps", 0.0)),
                       "cows": float(record[COWS]), "episodes": float(record.get("episodes/total", 0.0))})
    return points


def summarize(points: list[dict[str, float]]) -> dict[str, float]:
    out: dict[str, float] = {}
    for threshold in THRESHOLDS:
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


def write_results(results: list[tuple[Path, dict[str, float]]], command: str, out: Path) -> None:
    """bench/results/time_to_cows.md: one row per seed, then the median, with the command and machine."""
    rows = ["| run | time to 1 / 2 / 3 cows | env steps to 3 cows | cows at 2.5 / 3.75 / 5 / 10 / 20 min | end-to-end env steps/s |",
            "|---|---|---:|---|---:|"]
    for run_dir, r in results:
        times = " / ".join(fmt(r[f"time_to_{t:g}_s"], " s") for t in THRESHOLDS)
        cows = " / ".join(fmt(r[f"cows_at_{m:g}min"]) for m in (2.5, 3.75, 5.0, 10.0, 20.0))
        rows.append(f"| `{run_dir.name}` | {times} | {fmt(r['steps_to_3'], ' ')} | {cows} | {r.get('end_to_end_sps', 0):.0f} |")
    median = statistics.median(r["time_to_3_s"] for _, r in results)
    text = [f"## Time to cows on the default task (`bench/time_to_cows.py`, P3)", "",
            f"`{command}`, {datetime.date.today().isoformat()}, {os.cpu_count()} cores. The clock starts at launch "
            "(Ray, env and trainer start-up included); cows per episode is the mean of the last 20 episodes.", "",
            *rows, "", f"Median time to 3 cows per episode: {fmt(median, ' s')}."]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(text) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default="craftrl.configs.default")
    parser.add_argument("--minutes", type=float, default=20.0)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--output-root", default="runs/bench_time_to_cows")
    parser.add_argument("--runs", nargs="*", default=None, help="summarise existing run directories instead")
    parser.add_argument("--write-results", action="store_true", help="rewrite bench/results/time_to_cows.md")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    root = Path(args.output_root).resolve()
    root.mkdir(parents=True, exist_ok=True)
    run_dirs = [Path(r) for r in args.runs] if args.runs else []
    if not run_dirs:
        for seed in args.seeds:
            run_dirs.append(run_once(args.config, args.overrides, seed, args.minutes, root, root / f"seed{seed}.log"))
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
