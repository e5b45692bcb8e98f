"""What every peer script shares: the launch clock, the learning curve it writes, its summary, a clean stop.

The clock is the one ``bench/time_to_cows.py`` uses for craftrl: seconds since the command was launched, so
imports, Ray's start-up and env construction all count. When the harness (``bench/peers.py``) starts a script
it passes its own launch instant in ``CRAFTRL_BENCH_LAUNCHED_AT`` (taken just before ``Popen``, exactly as
``time_to_cows.py`` does); run by hand, the script reads its own process start time from ``/proc``.

Cows per episode is the moving mean over the last 20 finished episodes, and a threshold counts as reached only
once 20 episodes have finished -- the same rule ``time_to_cows.py`` applies to craftrl's
``episodes/cows_killed_mean``.

    curve.jsonl   one record per finished episode or per reporting interval:
                  {"wall_s", "env_steps", "episodes", "cows_mean_last20"}  (cows_mean_last20 null before any episode)
    summary.json  end-to-end env steps/s, time (and env steps) to 1/2/3 cows, cows at fixed minutes,
                  the model's parameter count and the settings used
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import signal
import sys
import time
from collections import deque
from pathlib import Path
from typing import Any, Iterable

LAUNCHED_AT_ENV = "CRAFTRL_BENCH_LAUNCHED_AT"
MOVING_WINDOW = 20
THRESHOLDS = (1.0, 2.0, 3.0)
CHECKPOINTS_MIN = (2.5, 3.75, 5.0, 10.0, 15.0, 20.0)


def launched_at() -> float:
    """Unix time at which this command was launched (see the module docstring)."""
    if os.environ.get(LAUNCHED_AT_ENV):
        return float(os.environ[LAUNCHED_AT_ENV])
    try:  # /proc/self/stat field 22: start time in clock ticks after boot; /proc/uptime: seconds since boot
        stat = Path("/proc/self/stat").read_text()
        start_ticks = int(stat[stat.rindex(")") + 2:].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return time.time() - (uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return time.time()


def stop_on_sigterm() -> None:
    """Turn SIGTERM into ``SystemExit`` so that ``finally`` blocks close env processes and Ray."""
    def _exit(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, _exit)


def peer_arguments(description: str) -> argparse.ArgumentParser:
    """The options every peer script takes; each adds its own library's settings."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--minutes", type=float, required=True, help="stop this long after launch")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", required=True, help="directory for curve.jsonl and summary.json")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--ent-coef", type=float, default=0.01)
    parser.add_argument("--torch-threads", type=int, default=None,
                        help="torch threads of the driver (default: torch's own, one per core); craftrl pins 1 per process")
    return parser


def start(args: argparse.Namespace) -> None:
    """Stop cleanly on SIGTERM (the harness's deadline) and apply ``--torch-threads``."""
    stop_on_sigterm()
    if args.torch_threads:
        import torch

        torch.set_num_threads(args.torch_threads)


def parameter_count(module: Any) -> int:
    return int(sum(p.numel() for p in module.parameters()))


class CowsCurve:
    """Appends the learning curve to ``out_dir/curve.jsonl`` as it is measured and writes ``summary.json``."""

    def __init__(self, out_dir: str | os.PathLike, system: str, seed: int, minutes: float, launched: float) -> None:
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.system, self.seed, self.minutes, self.launched = system, seed, minutes, launched
        self.deadline = launched + minutes * 60.0
        self.recent: deque[float] = deque(maxlen=MOVING_WINDOW)
        self.episodes = 0
        self.env_steps = 0
        self.points: list[dict[str, Any]] = []
        self._file = (self.out_dir / "curve.jsonl").open("w")

    def wall_s(self, now: float | None = None) -> float:
        return (time.time() if now is None else now) - self.launched

    def time_left(self) -> float:
        return self.deadline - time.time()

    def add_episodes(self, cows: Iterable[float]) -> None:
        """Count finished episodes (their cows) without writing a record yet."""
        for value in cows:
            self.recent.append(float(value))
            self.episodes += 1

    def record(self, env_steps: int, now: float | None = None) -> dict[str, Any]:
        """One curve point at ``now`` with the episodes counted so far."""
        self.env_steps = int(env_steps)
        point = {"wall_s": round(self.wall_s(now), 3), "env_steps": self.env_steps, "episodes": self.episodes,
                 "cows_mean_last20": (sum(self.recent) / len(self.recent)) if self.recent else None}
        self.points.append(point)
        self._file.write(json.dumps(point) + "\n")
        self._file.flush()
        return point

    def finish(self, params: int, settings: dict[str, Any]) -> dict[str, Any]:
        """Write ``summary.json`` from the points recorded so far.

        Scripts record a last point when training stops and before they close envs and Ray, so end-to-end
        steps/s spans launch to the end of training -- as for craftrl, whose last point is its last logged
        iteration before SIGTERM."""
        self._file.close()
        summary = {"system": self.system, "seed": self.seed, "minutes_asked": self.minutes, "params": int(params),
                   **summarize_points(self.points), "settings": settings,
                   "machine": {"cores": os.cpu_count(), "python": platform.python_version(),
                               "date": datetime.date.today().isoformat(), "argv": sys.argv}}
        (self.out_dir / "summary.json").write_text(json.dumps(summary, indent=1, default=_json_default) + "\n")
        return summary


def summarize_points(points: list[dict[str, Any]]) -> dict[str, Any]:
    """Times to thresholds, cows at fixed minutes, end-to-end steps/s from curve points; ``None`` = not reached."""
    out: dict[str, Any] = {}
    for threshold in THRESHOLDS:
        hit = first_reaching(points, threshold)
        out[f"time_to_{threshold:g}_cows_s"] = hit["wall_s"] if hit else None
        out[f"env_steps_to_{threshold:g}_cows"] = hit["env_steps"] if hit else None
    last_t = points[-1]["wall_s"] if points else 0.0
    for minute in CHECKPOINTS_MIN:
        before = [p for p in points if p["wall_s"] <= minute * 60 and p["cows_mean_last20"] is not None]
        lasted = last_t >= minute * 60 - 30  # the run reached (about) that minute
        out[f"cows_at_{minute:g}min"] = before[-1]["cows_mean_last20"] if before and lasted else None
    if points:
        out["wall_s"] = last_t
        out["env_steps"] = points[-1]["env_steps"]
        out["episodes"] = points[-1]["episodes"]
        out["end_to_end_sps"] = points[-1]["env_steps"] / max(last_t, 1e-9)
        out["final_cows_mean_last20"] = points[-1]["cows_mean_last20"]
    return out


def first_reaching(points: list[dict[str, Any]], cows: float) -> dict[str, Any] | None:
    """The first curve point whose moving mean is at least ``cows`` over a full window of episodes."""
    return next((p for p in points if p["cows_mean_last20"] is not None and p["episodes"] >= MOVING_WINDOW
                 and p["cows_mean_last20"] >= cows), None)


def reached_or_inf(value: float | None) -> float:
    """A time or step count to a threshold; None (never reached) as infinity, so medians rank it last."""
    return math.inf if value is None else float(value)


def _json_default(value: Any) -> Any:
    return repr(value)
