"""A run's progress on the driver's console: one live line on a terminal, plain lines in a log file or CI.

The metrics actor writes ``metrics.jsonl`` on the driver's node; the driver reads it back as it grows, so progress
comes from the driver's own process, not from an actor whose every line Ray prefixes with its name and pid.

    iter 12/400 | 31.5k env steps | 155 sps | return 0.35 | cows_killed 0.30 | lag 1.2 | 3m20s, ETA 1h48m

After the return come the env's declared task metrics (``task_metrics``, docs/envs.md), as episode means.
"""

from __future__ import annotations

import json
import math
import sys
import threading
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence, TextIO

Advice = Callable[[Mapping[str, Any]], str | None]  # a console line a record calls for, or None

ROLLOUT = (("rollout/sps", "{:.0f} sps"), ("episodes/return_mean", "return {:.2f}"))
LEARNER = (("data/version_lag_mean", "lag {:.1f}"),)
REFRESH_S = 0.5  # how often the file is read


def progress_line(record: Mapping[str, Any], num_iterations: int | None = None,
                  task_metrics: Sequence[str] = ()) -> str | None:
    """The progress line of a training record of ``metrics.jsonl``; None for records of other components."""
    if not isinstance(record.get("train/iteration"), (int, float)):
        return None
    iteration = int(record["train/iteration"])
    total = f"/{num_iterations}" if num_iterations else ""
    parts = [f"iter {iteration}{total}", f"{_short(record.get('rollout/env_steps', record.get('step', 0)))} env steps"]
    shown = (*ROLLOUT, *((f"episodes/{name}_mean", name + " {:.2f}") for name in task_metrics), *LEARNER)
    parts += [fmt.format(record[key]) for key, fmt in shown if _finite(record.get(key))]
    elapsed = record.get("train/elapsed_s")
    if _finite(elapsed):
        timing = _duration(elapsed)
        if num_iterations and iteration:
            timing += f", ETA {_duration(elapsed / iteration * max(num_iterations - iteration, 0))}"
        parts.append(timing)
    return " | ".join(parts)


class MetricsTail:
    """The records appended to a JSON-lines file since the last ``read``; a line still being written waits."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._offset = self.path.stat().st_size if self.path.exists() else 0  # a resumed run's old lines: not news
        self._partial = b""

    def read(self) -> list[dict[str, Any]]:
        try:
            with open(self.path, "rb") as file:
                file.seek(self._offset)
                data = file.read()
        except FileNotFoundError:
            return []
        self._offset += len(data)
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()
        records = []
        for line in lines:
            try:
                records.append(json.loads(line))
            except ValueError:  # a cut line of a killed run
                continue
        return records


class ProgressDisplay:
    """Shows the newest training record while the run goes on (a context manager around the blocking ``fit``).

    On a terminal, ``rich`` keeps one live line with a bar; elsewhere a plain line every ``interval`` seconds
    (0: every record); when the display closes, the last record is shown if it was not yet. Each of ``advice``
    looks at every record (of any component) and the first line it returns is shown, once per run. The line shows
    the episode means of ``task_metrics``, the env's declared ones.
    """

    def __init__(self, metrics_path: Path, num_iterations: int | None, interval: float,
                 stream: TextIO | None = None, live: bool | None = None, advice: tuple[Advice, ...] = (),
                 task_metrics: Sequence[str] = ()) -> None:
        self.tail = MetricsTail(metrics_path)
        self.num_iterations = num_iterations
        self.task_metrics = tuple(task_metrics)
        self.interval = interval
        self.stream = stream or sys.stdout
        self.live = self.stream.isatty() if live is None else live
        self.latest: dict[str, Any] | None = None
        self._printed: dict[str, Any] | None = None  # the record of the last plain line
        self._advice = list(advice)  # those that have not spoken yet
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="craftrl-progress", daemon=True)
        self._rich_live = None

    def __enter__(self) -> ProgressDisplay:
        if self.live:
            from rich.console import Console
            from rich.live import Live

            console = Console(file=self.stream, force_terminal=True)
            self._rich_live = Live(self._renderable(), console=console, refresh_per_second=2, transient=False)
            self._rich_live.start()
        self._thread.start()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.update(final=True)
        if self._rich_live is not None:
            self._rich_live.stop()

    def update(self, final: bool = False) -> None:
        """Read what the run logged since the last update and show it. Plain lines are spaced by the records' own
        times (``interval`` seconds of the run apart), so a burst of records read at once keeps its lines."""
        for record in self.tail.read():
            self._advise(record)
            if progress_line(record) is None:
                continue
            self.latest = record
            if self._rich_live is None and (self._printed is None or
                                            _time(record) - _time(self._printed) >= self.interval):
                self._print(record)
        if self._rich_live is not None:
            self._rich_live.update(self._renderable())
        elif final and self.latest is not None and self.latest is not self._printed:
            self._print(self.latest)

    def _advise(self, record: dict[str, Any]) -> None:
        for advice in list(self._advice):
            line = advice(record)
            if line is None:
                continue
            self._advice.remove(advice)
            if self._rich_live is not None:
                self._rich_live.console.print(line, markup=False, highlight=False)
            else:
                print(line, file=self.stream, flush=True)

    def _print(self, record: dict[str, Any]) -> None:
        print(progress_line(record, self.num_iterations, self.task_metrics), file=self.stream, flush=True)
        self._printed = record

    def _run(self) -> None:
        while not self._stop.wait(REFRESH_S):
            try:
                self.update()
            except Exception:  # a display must never stop the run
                continue

    def _renderable(self) -> Any:
        from rich.console import Group
        from rich.progress_bar import ProgressBar
        from rich.text import Text

        if self.latest is None:
            return Text("waiting for the first iteration ...")
        line = Text(progress_line(self.latest, self.num_iterations, self.task_metrics) or "")
        if not self.num_iterations:
            return line
        bar = ProgressBar(total=self.num_iterations, completed=int(self.latest["train/iteration"]), width=40)
        return Group(bar, line)


def _time(record: Mapping[str, Any]) -> float:
    value = record.get("time")
    return float(value) if _finite(value) else 0.0


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _short(value: float) -> str:
    return f"{value / 1e6:.2f}M" if value >= 1e6 else f"{value / 1e3:.1f}k" if value >= 1e3 else f"{value:.0f}"


def _duration(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    hours, rest = divmod(seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{seconds:02d}s"
