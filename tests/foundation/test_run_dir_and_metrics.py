"""Run directory layout, path resolution, and the metrics fan-out to real files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from craftrl.config import build_config
from craftrl.config.schema import LoggerConfig
from craftrl.metrics import JsonlSink, MetricsLogger, read_jsonl, resolve_wandb_mode
from craftrl.run_dir import RunDirectory


def test_run_directory_layout_and_path_resolution(tmp_path: Path):
    run = RunDirectory.create(tmp_path / "runs", "cows", now=0)
    assert run.root.parent == tmp_path / "runs" and run.root.name.startswith("cows-")
    assert (run.root / "tensorboard").is_dir() and (run.root / "logs").is_dir()
    config = build_config({
        "train_config": {"save_path": "ckpt"},
        "rollout_config": {"worker_config": {"video_output_dir": "output/videos"},
                           "replay_buffer_config": {"database_config": {"path": str(tmp_path / "abs_db")}}},
    })
    resolved = run.resolve_config_paths(config)
    assert resolved.train_config.save_path == str(run.root / "ckpt")
    assert resolved.rollout_config.worker_config.video_output_dir == str(run.root / "output" / "videos")
    assert resolved.rollout_config.replay_buffer_config.database_config.path == str(tmp_path / "abs_db")
    run.save_config(resolved, "online_dict = {}\n", "my_config.py")
    assert (run.root / "config_source.py").read_text() == "online_dict = {}\n"
    assert "save_path: " + str(run.root / "ckpt") in (run.root / "config.yaml").read_text()


def test_two_runs_in_the_same_second_get_distinct_directories(tmp_path: Path):
    first = RunDirectory.create(tmp_path, "x", now=100)
    second = RunDirectory.create(tmp_path, "x", now=100)
    assert first.root != second.root


def test_metrics_reach_jsonl_tensorboard_and_console(tmp_path: Path, capsys):
    logger = MetricsLogger(tmp_path, LoggerConfig(console_interval=0))
    for step in range(3):
        logger.log({"loss": 1.0 / (step + 1), "note": "text", "nan": float("nan")}, step=step)
    logger.close()
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [0, 1, 2]
    assert records[2]["loss"] == pytest.approx(1 / 3) and records[0]["nan"] == "nan"
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert [e.value for e in events.Scalars("loss")] == pytest.approx([1.0, 0.5, 1 / 3])
    assert "[step 2] loss=0.3333" in capsys.readouterr().out


def test_console_progress_line_shows_headline_numbers_and_eta():
    from craftrl.metrics import ConsoleSink

    line = ConsoleSink(0, num_iterations=10).format(
        {"train/iteration": 2, "rollout/env_steps": 31500, "rollout/sps": 155.4, "episodes/return_mean": 0.35,
         "episodes/cows_killed_mean": 0.3, "data/version_lag_mean": 1.24, "train/elapsed_s": 200.0}, step=0)
    assert line == "iter 2/10 | 31.5k env steps | 155 sps | return 0.35 | cows 0.30 | lag 1.2 | 3m20s, ETA 13m20s"


def test_wandb_runs_offline_without_an_api_key(tmp_path: Path, monkeypatch):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc
    assert resolve_wandb_mode("auto") == "offline"
    logger = MetricsLogger(tmp_path, LoggerConfig(project="craftrl-test", name="t"), config={"a": 1}, console=False)
    logger.log({"reward": 1.5}, step=1)
    logger.close()
    assert list((tmp_path / "wandb").glob("offline-run-*/run-*.wandb")), "wandb wrote no offline run"


def test_a_failing_sink_is_disabled_without_stopping_the_others(tmp_path: Path, capsys):
    logger = MetricsLogger(tmp_path, console=False, tensorboard=False)

    class Broken:
        def write(self, *args):
            raise OSError("disk full")

        def close(self):
            pass

    logger.sinks.insert(0, Broken())
    logger.log({"a": 1}, step=0)
    logger.log({"a": 2}, step=1)
    logger.close()
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 2
    assert capsys.readouterr().err.count("disk full") == 1


def test_read_jsonl_skips_the_line_a_killed_run_cut_and_keeps_what_a_resume_appends(tmp_path: Path):
    path = tmp_path / "metrics.jsonl"
    sink = JsonlSink(path)
    sink.write({"loss": 1.0}, step=1, wall_time=10.0)
    sink.close()
    with open(path, "a") as file:
        file.write('{"step": 2, "loss"')  # killed mid-write
    resumed = JsonlSink(path)
    resumed.write({"loss": 0.5}, step=3, wall_time=30.0)
    resumed.close()
    assert [(r["step"], r["loss"]) for r in read_jsonl(path)] == [(1, 1.0), (3, 0.5)]
