"""bench/cartpole_steps.py's stop condition and figure (P5), on a hand-made run directory."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import cartpole_steps  # noqa: E402


def test_the_run_stops_and_counts_at_the_first_mean_of_475_over_20_episodes(tmp_path):
    records = [{"time": 10.0, "episodes/return_mean": 480.0, "episodes/total": 5, "rollout/env_steps": 100},
               {"time": 20.0, "episodes/return_mean": 300.0, "episodes/total": 25, "rollout/env_steps": 200},
               {"time": 30.0, "episodes/return_mean": 476.0, "episodes/total": 30, "rollout/env_steps": 300}]
    metrics = tmp_path / "metrics.jsonl"
    assert not cartpole_steps.reached_target(tmp_path)  # the run has not written metrics yet
    metrics.write_text("".join(json.dumps(r) + "\n" for r in records[:2]))
    assert not cartpole_steps.reached_target(tmp_path)  # 480 over 5 episodes is not a mean over 20
    metrics.write_text("".join(json.dumps(r) + "\n" for r in records))
    assert cartpole_steps.reached_target(tmp_path)
    (tmp_path / "launched_at").write_text("5.0\n")
    assert cartpole_steps.steps_to_target(tmp_path) == (300.0, 25.0, 476.0)
