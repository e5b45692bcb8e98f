"""Episode statistics: per-episode return, length, discounted return and task metrics, with moving averages.

``EpisodeStatistics`` is plain (tested without Ray); the ``episode_statistics`` actor wraps it. Workers
report episodes fire-and-forget; the trainer asks for a ``summary`` once per iteration and logs it, and
takes the finished episodes themselves (``take_records``) for the run's ``episodes.jsonl`` -- a moving
mean cannot answer per-episode questions such as Crafter's achievement success rates.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import asdict
from typing import Any

from craftrl.rollout.loop import EpisodeRecord


class EpisodeStatistics:
    # Records waiting for ``take_records``; a run nobody takes them from must not grow without bound.
    MAX_UNTAKEN_RECORDS = 100_000

    def __init__(self, moving_window: int = 20):
        self.moving_window = moving_window
        self.recent: deque[EpisodeRecord] = deque(maxlen=moving_window)
        self.total_episodes = 0
        self.total_env_steps = 0
        self.restarted_episodes = 0
        self._since_summary: list[EpisodeRecord] = []
        self._untaken: deque[EpisodeRecord] = deque(maxlen=self.MAX_UNTAKEN_RECORDS)
        self.untaken_dropped = 0

    def report(self, record: EpisodeRecord | dict[str, Any]) -> None:
        if isinstance(record, dict):
            record = EpisodeRecord(**record)
        self.recent.append(record)
        self._since_summary.append(record)
        if len(self._untaken) == self._untaken.maxlen:
            self.untaken_dropped += 1
        self._untaken.append(record)
        self.total_episodes += 1
        self.total_env_steps += record.length
        self.restarted_episodes += int(record.env_restarted)

    def summary(self) -> dict[str, float]:
        """Moving averages over the last ``moving_window`` episodes plus counts since the last summary."""
        out: dict[str, float] = {
            "episodes/total": float(self.total_episodes),
            "episodes/new": float(len(self._since_summary)),
            "episodes/env_restarted_total": float(self.restarted_episodes),
        }
        if self.untaken_dropped:
            out["episodes/records_dropped_total"] = float(self.untaken_dropped)
        if self.recent:
            out["episodes/return_mean"] = _mean(r.episode_return for r in self.recent)
            out["episodes/length_mean"] = _mean(r.length for r in self.recent)
            out["episodes/discounted_return_mean"] = _mean(r.discounted_return for r in self.recent)
            keys = sorted({key for r in self.recent for key in r.metrics})
            for key in keys:
                values = [r.metrics[key] for r in self.recent if key in r.metrics]
                out[f"episodes/{key}_mean"] = _mean(values)
        if self._since_summary:
            out["episodes/return_mean_new"] = _mean(r.episode_return for r in self._since_summary)
        self._since_summary = []
        return out

    def take_records(self) -> list[dict[str, Any]]:
        """Every episode reported since the last call, oldest first, each exactly once."""
        records = [asdict(r) for r in self._untaken]
        self._untaken.clear()
        return records

    def recent_records(self) -> list[dict[str, Any]]:
        return [asdict(r) for r in self.recent]


def _mean(values) -> float:
    values = [float(v) for v in values]
    finite = [v for v in values if math.isfinite(v)]
    return sum(finite) / len(finite) if finite else float("nan")
