"""bench/time_to_cows.py's summary (P3) and results file, on hand-made run directories."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import time_to_cows  # noqa: E402

LAUNCH = 1000.0


def make_run(directory: Path, cows_by_second: list[tuple[float, float]], raw_env_sps: float | None,
             cores: dict[str, float] | None) -> Path:
    directory.mkdir()
    (directory / "launched_at").write_text(f"{LAUNCH}\n")
    lines = [json.dumps({"time": LAUNCH + t, "rollout/env_steps": 100.0 * t, "episodes/total": 25.0,
                         time_to_cows.COWS: cows}) for t, cows in cows_by_second]
    (directory / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    if raw_env_sps is not None:
        (directory / "machine.json").write_text(json.dumps({"raw_env_steps_per_s_1_process": raw_env_sps}))
    if cores is not None:
        (directory / "cpu_split.json").write_text(json.dumps({"wall_s": 600.0, "cores_used": cores}))
    return directory


def test_thresholds_are_the_first_logged_points_at_or_above_them(tmp_path):
    run = make_run(tmp_path / "a", [(60, 0.5), (120, 1.2), (180, 2.0), (240, 3.5), (600, 4.0)], None, None)
    summary = time_to_cows.summarize(time_to_cows.read_curve(run))
    assert (summary["time_to_1_s"], summary["time_to_2_s"], summary["time_to_3_s"]) == (120, 180, 240)
    assert summary["steps_to_3"] == 24000
    assert summary["cows_at_3.75min"] == 2.0  # the last point at or before 225 s
    assert math.isnan(summary["cows_at_20min"])  # the run never got near minute 20


def test_results_name_each_runs_machine_and_average_the_cpu_split(tmp_path):
    fast = make_run(tmp_path / "fast", [(100, 3.0), (600, 4.0)], 2400.0,
                    {"env processes": 0.7, "learner (driver process)": 0.6})
    slow = make_run(tmp_path / "slow", [(300, 3.0), (600, 3.1)], None,
                    {"env processes": 0.5, "learner (driver process)": 0.8, "Ray system processes": 0.1})
    out = tmp_path / "results.md"
    results = [(run, time_to_cows.summarize(time_to_cows.read_curve(run))) for run in (fast, slow)]
    time_to_cows.write_results(results, "python bench/time_to_cows.py --runs fast slow", out)
    text = out.read_text()
    fast_row = next(line for line in text.splitlines() if line.startswith("| `fast`"))
    slow_row = next(line for line in text.splitlines() if line.startswith("| `slow`"))
    assert fast_row.endswith("| 2400 |") and slow_row.endswith("| - |")  # no machine.json: unknown machine
    assert "Median time to 3 cows per episode: 200 s." in text
    assert "| learner (driver process) | 0.70 |" in text and "| env processes | 0.60 |" in text
    assert "| Ray system processes | 0.05 |" in text  # missing from one run counts as 0 there
    assert "| all | 1.35 of" in text


def test_wall_time_split_reads_the_rollout_timers_and_sums_the_learner_times(tmp_path):
    run = make_run(tmp_path / "timed", [(10, 0.0)], None, None)
    # 40 s from the first to the last iteration, 4 iterations inside it
    records = [{"time": LAUNCH + 10 * i, "time/compute_s": 6.0, "time/wait_data_s": 3.0, "time/broadcast_s": 0.5,
                "time/statistics_s": 0.25} for i in range(1, 6)]
    records[-1].update({"rollout/loop_s": 200.0, "rollout/inference_s": 80.0, "rollout/env_wait_s": 60.0,
                        "rollout/emit_wait_s": 20.0, "rollout/weights_wait_s": 30.0})
    with (run / "metrics.jsonl").open("a") as metrics:
        metrics.write("\n".join(json.dumps(r) for r in records) + "\n")
    split = time_to_cows.wall_time_split(run)
    assert split["rollout: inference (forward + sampling)"] == 0.4
    assert split["rollout: waiting for env processes"] == 0.3
    assert split["rollout: every env held for the next version (lock-step)"] == 0.15
    assert split["rollout: fragment cutting, sends (transport)"] == pytest.approx(0.05)
    assert split["learner: computing (evaluation, GAE, epochs)"] == 24.0 / 40.0
    assert split["learner: waiting for data"] == 12.0 / 40.0
    assert split["learner: waiting for statistics"] == 1.0 / 40.0
    # 24 + 12 + 2 s of broadcasts + 1 s of statistics
    assert split["learner: other (metrics, checkpoints)"] == pytest.approx(1.0 - 39.0 / 40.0)
    old = make_run(tmp_path / "untimed", [(10, 0.0), (20, 1.0)], None, None)
    assert time_to_cows.wall_time_split(old) == {}  # a run from before these metrics: no table, no error
    out = tmp_path / "results.md"
    learner_only = make_run(tmp_path / "learner-only", [(10, 0.0)], None, None)
    with (learner_only / "metrics.jsonl").open("a") as metrics:  # a run from before rollout/loop_s was logged
        metrics.write("\n".join(json.dumps({**r, "time/compute_s": 2.0}) for r in records[:-1]) + "\n")
    runs = [(r, time_to_cows.summarize(time_to_cows.read_curve(r))) for r in (run, learner_only)]
    time_to_cows.write_results(runs, "cmd", out)
    text = out.read_text()
    assert "| rollout: inference (forward + sampling) | 40% | 1 |" in text  # not averaged with a run that lacks it
    assert "| learner: computing (evaluation, GAE, epochs) | 40% | 2 |" in text  # (24/40 + 6/30) / 2


def test_stop_at_cows_waits_for_the_threshold_over_20_episodes(tmp_path):
    """``--stop-at-cows``: a run is stopped once its curve reaches the threshold as ``summarize`` counts it."""
    log = tmp_path / "seed0.log"
    log.write_text("2026-11-25 INFO starting Ray\n")
    assert not time_to_cows._reached(log, LAUNCH, 3.0)  # the run has not named its directory yet
    run = tmp_path / "run"
    run.mkdir()
    log.write_text(f"craftrl: run directory {run}\n")
    assert not time_to_cows._reached(log, LAUNCH, 3.0)  # no metrics yet
    early = {"time": LAUNCH + 30, "rollout/env_steps": 3000.0, "episodes/total": 12.0, time_to_cows.COWS: 3.5}
    (run / "metrics.jsonl").write_text(json.dumps(early) + "\n")
    assert not time_to_cows._reached(log, LAUNCH, 3.0)  # a lucky mean over fewer than 20 episodes
    later = {"time": LAUNCH + 90, "rollout/env_steps": 9000.0, "episodes/total": 40.0, time_to_cows.COWS: 2.9}
    with (run / "metrics.jsonl").open("a") as metrics:
        metrics.write(json.dumps(later) + "\n")
    assert not time_to_cows._reached(log, LAUNCH, 3.0)
    assert time_to_cows._reached(log, LAUNCH, 2.5)
    assert not (run / "launched_at").exists()  # polling leaves the run directory alone
