"""One metrics path: every number goes through ``MetricsLogger.log`` and fans out to all sinks.

Sinks: ``metrics.jsonl`` (the machine-readable record that plots are made from, and that the driver's progress
display reads: ``craftrl/progress.py``), TensorBoard, and wandb when ``logger_config.project`` is set. wandb runs offline unless an API key is configured, so a
run never blocks on the network.

Ray actors must not wait on logging (MineStudio's synchronous RPC per log call stalls its rollout loop), so
they use ``MetricsClient``: fire-and-forget calls to a ``MetricsSink`` actor, with a bound on calls in flight
beyond which metrics are dropped *and counted* rather than queued without limit.
"""

from __future__ import annotations

import json
import math
import netrc
import os
import sys
import time
from pathlib import Path
from typing import Any, Mapping, Protocol

from craftrl.config.schema import LoggerConfig


class Sink(Protocol):
    label: str  # what a person knows it by: its file or service

    def write(self, metrics: Mapping[str, Any], step: int, wall_time: float) -> None: ...
    def close(self) -> None: ...


def _numeric(metrics: Mapping[str, Any]) -> dict[str, float]:
    return {k: float(v) for k, v in metrics.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(float(v))}


class JsonlSink:
    """Appends one JSON object per line; a resumed run appends to the metrics of the run it continues."""

    def __init__(self, path: Path):
        path = Path(path)
        self.label = path.name
        cut_line = path.is_file() and path.stat().st_size > 0 and _last_byte(path) != b"\n"
        self._file = open(path, "a", buffering=1)  # line-buffered: a crash loses at most one line
        if cut_line:  # a killed run's last line: end it, or our first record would be glued onto it
            self._file.write("\n")

    def write(self, metrics: Mapping[str, Any], step: int, wall_time: float) -> None:
        record = {"step": step, "time": wall_time}
        record.update({k: _jsonable(v) for k, v in metrics.items()})
        self._file.write(json.dumps(record) + "\n")

    def close(self) -> None:
        self._file.close()


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The records of a JSON-lines file that a ``JsonlSink`` wrote (``metrics.jsonl``, ``episodes.jsonl``).

    A run killed mid-write leaves a cut line (the next run's sink ends it); it is skipped, not an error."""
    records = []
    for line in Path(path).read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


def _last_byte(path: Path) -> bytes:
    with open(path, "rb") as file:
        file.seek(-1, os.SEEK_END)
        return file.read(1)


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if hasattr(value, "item"):
        return value.item()
    return value


class TensorBoardSink:
    def __init__(self, log_dir: Path):
        from torch.utils.tensorboard import SummaryWriter

        self._writer = SummaryWriter(log_dir=str(log_dir))
        self.label = "tensorboard"

    def write(self, metrics: Mapping[str, Any], step: int, wall_time: float) -> None:
        for name, value in _numeric(metrics).items():
            self._writer.add_scalar(name, value, global_step=step, walltime=wall_time)

    def close(self) -> None:
        self._writer.close()


def wandb_has_api_key() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        return netrc.netrc().authenticators("api.wandb.ai") is not None
    except (FileNotFoundError, netrc.NetrcParseError, OSError):
        return False


def wandb_environment() -> dict[str, str]:
    """This process's ``WANDB_*`` variables (API key, entity, host, group, ...): wandb reads its settings from
    them, and on a cluster the metrics actor runs with its node's environment, not the driver's (docs/cluster.md)."""
    return {name: value for name, value in os.environ.items() if name.startswith("WANDB_")}


def resolve_wandb_mode(mode: str) -> str:
    if mode == "auto":
        return "online" if wandb_has_api_key() else "offline"
    return mode


class WandbSink:
    def __init__(self, logger_config: LoggerConfig, run_dir: Path, config: Mapping[str, Any] | None):
        import wandb

        self.label = "wandb"
        self._run = wandb.init(project=logger_config.project, name=logger_config.name, entity=logger_config.entity,
                               mode=resolve_wandb_mode(logger_config.wandb_mode), dir=str(run_dir),
                               config=dict(config or {}), reinit=True)

    def write(self, metrics: Mapping[str, Any], step: int, wall_time: float) -> None:
        self._run.log(_numeric(metrics), step=step)

    def close(self) -> None:
        self._run.finish()


def _stopped_at(label: str, iteration: float | None, error: Exception) -> str:
    at = f" at iteration {int(iteration)}" if iteration is not None else ""
    return f"{label} stopped being written{at} ({type(error).__name__}: {error})"


class MetricsLogger:
    """Fan-out to every configured sink; a failing sink is reported once, then skipped, and named by ``close``."""

    def __init__(self, run_dir: Path, logger_config: LoggerConfig | None = None,
                 config: Mapping[str, Any] | None = None, tensorboard: bool = True):
        logger_config = logger_config or LoggerConfig()
        run_dir = Path(run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        self.sinks: list[Sink] = [JsonlSink(run_dir / "metrics.jsonl")]
        if tensorboard:
            self.sinks.append(TensorBoardSink(run_dir / "tensorboard"))
        if logger_config.project and logger_config.wandb_mode != "disabled":
            self.sinks.append(WandbSink(logger_config, run_dir, config))
        self._broken: set[int] = set()
        self.failures: list[str] = []  # one line per sink that stopped writing, for the run's summary

    def log(self, metrics: Mapping[str, Any], step: int, wall_time: float | None = None) -> None:
        wall_time = time.time() if wall_time is None else wall_time
        for i, sink in enumerate(self.sinks):
            if i in self._broken:
                continue
            try:
                sink.write(metrics, step, wall_time)
            except Exception as error:  # one broken sink (e.g. a full disk for TB) must not stop training
                self._broken.add(i)
                self.failures.append(_stopped_at(sink.label, metrics.get("train/iteration"), error))
                print(f"craftrl: {self.failures[-1]}; training goes on", file=sys.stderr)

    def close(self) -> list[str]:
        """Close every sink; returns :attr:`failures`."""
        for sink in self.sinks:
            try:
                sink.close()
            except Exception:
                pass
        return self.failures


class MetricsSink:
    """Body of the ``metrics`` Ray actor; wrap with ``ray.remote(num_cpus=0)(MetricsSink)``."""

    def __init__(self, run_dir: str, logger_config: LoggerConfig | None = None,
                 config: Mapping[str, Any] | None = None):
        self._logger = MetricsLogger(Path(run_dir), logger_config, config)
        self._episodes_path = Path(run_dir) / "episodes.jsonl"
        self._episodes: JsonlSink | None = None  # opened by the first episode: runs without any have no file
        self._episodes_failure = ""
        self._iteration: float | None = None  # the last one logged: where episodes.jsonl stopped, if it does

    def ready(self) -> bool:
        return True

    def log(self, metrics: Mapping[str, Any], step: int, wall_time: float) -> None:
        self._iteration = metrics.get("train/iteration", self._iteration)
        self._logger.log(metrics, step, wall_time)

    def log_episodes(self, records: list[Mapping[str, Any]], step: int, wall_time: float) -> None:
        """One line per finished episode in ``episodes.jsonl`` (``step``: trained samples when it was logged)."""
        if self._episodes_failure:
            return
        try:
            if self._episodes is None:
                self._episodes = JsonlSink(self._episodes_path)
            for record in records:
                self._episodes.write(record, step, wall_time)
        except Exception as error:  # as a broken metrics sink: training goes on, the summary says so
            self._episodes_failure = _stopped_at(self._episodes_path.name, self._iteration, error)
            print(f"craftrl: {self._episodes_failure}; training goes on", file=sys.stderr)

    def save_file(self, path: str, data: bytes) -> None:
        """Write a file a process on another node produced (an episode video) onto this node's disk."""
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(target.name + ".part")
        partial.write_bytes(data)
        partial.replace(target)

    def close(self) -> list[str]:
        """Close the files; returns one line per sink that stopped writing during the run (a full disk, say)."""
        failures = self._logger.close()
        if self._episodes is not None:
            try:
                self._episodes.close()
            except OSError:  # its last buffered line could not be written; a failure before it is already named
                pass
        return failures + ([self._episodes_failure] if self._episodes_failure else [])


class MetricsClient:
    """Non-blocking logging from inside actors: calls are sent and never awaited."""

    def __init__(self, sink_handle: Any, max_in_flight: int = 256):
        self._sink = sink_handle
        self._max_in_flight = max_in_flight
        self._in_flight: list[Any] = []
        self.dropped = 0

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        import ray

        if len(self._in_flight) >= self._max_in_flight:
            _, self._in_flight = ray.wait(self._in_flight, num_returns=len(self._in_flight), timeout=0)
            if len(self._in_flight) >= self._max_in_flight:
                self.dropped += 1
                return
        self._in_flight.append(self._sink.log.remote(dict(metrics), step, time.time()))

    def log_episodes(self, records: list[Mapping[str, Any]], step: int) -> None:
        """Episodes are data, not a sample of it: never dropped, however many calls are in flight."""
        if records:
            self._in_flight.append(self._sink.log_episodes.remote(list(records), step, time.time()))

    def flush(self, timeout: float | None = 30.0) -> int:
        """Wait for calls in flight (e.g. before an actor exits); returns how many are still pending."""
        import ray

        if self._in_flight:
            _, self._in_flight = ray.wait(self._in_flight, num_returns=len(self._in_flight), timeout=timeout)
        return len(self._in_flight)


def collect_statistics(calls: Mapping[str, Any], timeout_s: float) -> tuple[dict[str, float], dict[str, str]]:
    """The statistics each named actor call returned within ``timeout_s``, and why the others are missing.

    Each call counts on its own, so a component that is slow to answer (a rollout manager on a loaded machine)
    leaves only its own keys out of the record rather than the replay's and the episodes' too.
    """
    import ray

    refs = list(calls.values())
    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)  # ([], []) for no refs
    collected: dict[str, float] = {}
    missing: dict[str, str] = {}
    for name, ref in calls.items():
        if ref not in ready:
            missing[name] = f"no answer within {timeout_s:g} s"
            continue
        try:
            collected.update(ray.get(ref))
        except Exception as error:  # statistics are nice to have: the caller goes on without these
            missing[name] = str(error).strip().splitlines()[-1] if str(error).strip() else type(error).__name__
    return collected, missing
