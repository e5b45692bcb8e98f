"""Run directory layout, path resolution, and the metrics fan-out to real files."""

from __future__ import annotations

import functools
import io
import json
from pathlib import Path

import pytest

from craftrl.config import build_config
from craftrl.config.schema import LoggerConfig
from craftrl.metrics import JsonlSink, MetricsLogger, read_jsonl, resolve_wandb_mode
from craftrl.progress import ProgressDisplay, progress_line
from craftrl.run_dir import RunDirectory
from craftrl.weights import pull_retry_advice


def test_run_directory_layout_and_path_resolution(tmp_path: Path):
    run = RunDirectory.create(tmp_path / "runs", "cows", now=0)
    assert run.root.parent == tmp_path / "runs" and run.root.name.startswith("cows-")
    assert (run.root / "tensorboard").is_dir()
    assert not (run.root / "logs").exists(), "logs/ holds a resumed run's earlier configs: none in a new run"
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


def test_metrics_reach_jsonl_and_tensorboard(tmp_path: Path):
    logger = MetricsLogger(tmp_path, LoggerConfig())
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


TRAINING_RECORD = {"train/iteration": 2, "rollout/env_steps": 31500, "rollout/sps": 155.4,
                   "episodes/return_mean": 0.35, "episodes/cows_killed_mean": 0.3, "data/version_lag_mean": 1.24,
                   "train/elapsed_s": 200.0}


def test_progress_line_shows_headline_numbers_the_envs_task_metrics_and_eta():
    line = progress_line(TRAINING_RECORD, num_iterations=10, task_metrics=("cows_killed",))
    assert line == ("iter 2/10 | 31.5k env steps | 155 sps | return 0.35 | cows_killed 0.30 | lag 1.2 | "
                    "3m20s, ETA 13m20s")
    # no task metric is shown that the env did not declare, and a declared one no episode reported yet is left out
    assert "cows" not in progress_line(TRAINING_RECORD, num_iterations=10)
    assert progress_line({**TRAINING_RECORD, "episodes/wood_mean": 2.0}, 10, ("wood", "stone")).count("wood 2.00") == 1
    assert "stone" not in progress_line(TRAINING_RECORD, 10, ("stone",))
    assert progress_line({"replay/added": 5.0}) is None  # another component's report is not progress


def record(iteration: int, time: float) -> str:
    return json.dumps(dict(TRAINING_RECORD, **{"train/iteration": iteration, "time": time})) + "\n"


def test_progress_display_prints_plain_lines_from_the_growing_metrics_file(tmp_path: Path):
    path = tmp_path / "metrics.jsonl"
    path.write_text(record(0, 0.0))  # a resumed run's earlier lines are not shown again
    out = io.StringIO()
    display = ProgressDisplay(path, num_iterations=10, interval=0, stream=out)
    assert not display.live  # not a terminal
    with open(path, "a") as file:
        file.write(json.dumps({"replay/added": 1.0}) + "\n")
        file.write(record(1, 1.0) + record(2, 1.1))  # read in one burst: a line each
        file.write(record(3, 1.2)[:20])  # still being written
    display.update()
    assert out.getvalue().splitlines() == [progress_line(json.loads(record(i, 1.0)), 10) for i in (1, 2)]
    with open(path, "a") as file:
        file.write(record(3, 1.2)[20:])
    display.update()
    display.update(final=True)  # nothing new: not printed twice
    assert [line.split(" | ")[0] for line in out.getvalue().splitlines()] == ["iter 1/10", "iter 2/10", "iter 3/10"]


def test_progress_display_keeps_to_its_interval_and_shows_the_last_record_at_the_end(tmp_path: Path):
    path, out = tmp_path / "metrics.jsonl", io.StringIO()
    display = ProgressDisplay(path, num_iterations=10, interval=60, stream=out)
    for iteration, time in ((1, 0.0), (2, 10.0), (3, 70.0), (4, 80.0)):
        with open(path, "a") as file:
            file.write(record(iteration, time))
        display.update()
    display.update(final=True)
    assert [line.split(" | ")[0] for line in out.getvalue().splitlines()] == ["iter 1/10", "iter 3/10", "iter 4/10"]


def test_progress_display_on_a_terminal_is_one_live_line_with_a_bar(tmp_path: Path):
    path, out = tmp_path / "metrics.jsonl", io.StringIO()
    path.write_text(json.dumps(TRAINING_RECORD) + "\n")
    with ProgressDisplay(path, num_iterations=10, interval=0, stream=out, live=True) as display:
        display.tail._offset = 0  # read the record written before the display started
        display.update()
    shown = out.getvalue()
    assert "iter 2/10 | 31.5k env steps" in shown and "━" in shown  # rich's bar


def test_progress_display_shows_each_advice_once_when_a_record_first_calls_for_it(tmp_path: Path):
    path, out = tmp_path / "metrics.jsonl", io.StringIO()
    slow = functools.partial(pull_retry_advice, pull_timeout_ms=10_000)
    display = ProgressDisplay(path, num_iterations=10, interval=0, stream=out, advice=(slow,))
    for iteration, shard_s in ((1, 0.2), (2, 14.1), (3, 30.0)):
        with open(path, "a") as file:
            file.write(json.dumps(dict(json.loads(record(iteration, iteration)),
                                       **{"rollout/weights_shard_s_max": shard_s})) + "\n")
        display.update()
    lines = out.getvalue().splitlines()
    shown = [line.split(" | ")[0] for line in lines if line.startswith("iter")]
    assert shown == ["iter 1/10", "iter 2/10", "iter 3/10"]
    advice = [line for line in lines if not line.startswith("iter")]
    assert advice == [slow({"rollout/weights_shard_s_max": 14.1})], "shown once, when first called for"
    assert lines.index(advice[0]) == 1, "before the progress line of the record that called for it"


def test_wandb_runs_offline_without_an_api_key(tmp_path: Path, monkeypatch):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc
    assert resolve_wandb_mode("auto") == "offline"
    logger = MetricsLogger(tmp_path, LoggerConfig(project="craftrl-test", name="t"), config={"a": 1})
    logger.log({"reward": 1.5}, step=1)
    logger.close()
    assert list((tmp_path / "wandb").glob("offline-run-*/run-*.wandb")), "wandb wrote no offline run"


def test_a_failing_sink_is_disabled_without_stopping_the_others(tmp_path: Path, capsys):
    logger = MetricsLogger(tmp_path, tensorboard=False)

    class Broken:
        label = "broken.log"

        def write(self, *args):
            raise OSError("disk full")

        def close(self):
            pass

    logger.sinks.insert(0, Broken())
    logger.log({"a": 1, "train/iteration": 7}, step=0)
    logger.log({"a": 2}, step=1)
    assert logger.close() == ["broken.log stopped being written at iteration 7 (OSError: disk full)"]
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 2
    assert capsys.readouterr().err.count("disk full") == 1


METRICS_WITH_A_FILE_SIZE_LIMIT = """
import resource, signal, sys
from craftrl.metrics import MetricsSink
sink = MetricsSink(sys.argv[1])
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead of killing us
resource.setrlimit(resource.RLIMIT_FSIZE, (1500, 1500))
for iteration in range(1, 61):
    sink.log({"train/iteration": iteration, "loss": 0.5}, step=100 * iteration, wall_time=0.0)
    sink.log_episodes([{"return": 1.0, "length": 10}], step=100 * iteration, wall_time=0.0)
print("\\n".join(sink.close()))
"""


def test_metrics_files_that_stop_being_written_are_named_by_close_and_logging_goes_on(tmp_path: Path):
    """What the run's summary lists as incomplete when its disk fills: a file size limit fails the writes as a
    full disk does (EFBIG for ENOSPC), in a process of its own."""
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-c", METRICS_WITH_A_FILE_SIZE_LIMIT, str(tmp_path)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    stopped = {line.split(" stopped being written at iteration ")[0]: line for line in result.stdout.splitlines()}
    assert {"metrics.jsonl", "episodes.jsonl"} <= set(stopped), result.stdout
    assert "(OSError: [Errno 27] File too large)" in stopped["metrics.jsonl"]
    iteration = int(stopped["metrics.jsonl"].split(" at iteration ")[1].split()[0])
    assert 1 < iteration < 60
    assert [record["train/iteration"] for record in read_jsonl(tmp_path / "metrics.jsonl")] == \
        list(range(1, iteration))


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


def test_output_paths_where_no_directory_can_be_made_are_named_and_nothing_is_left_behind(tmp_path: Path):
    from craftrl.run_dir import unwritable_output_paths

    (tmp_path / "a_file").write_text("text")
    problems = unwritable_output_paths({"fine": tmp_path / "new" / "deeper", "existing": tmp_path,
                                        "file": tmp_path / "a_file" / "sub"})
    assert problems == [f"file: cannot make a directory at {tmp_path / 'a_file' / 'sub'}: "
                        f"{tmp_path / 'a_file'} is not a directory"]
    assert sorted(path.name for path in tmp_path.iterdir()) == ["a_file"], "the check makes nothing that stays"
    if Path("/proc/self").is_dir():  # Linux: a directory even root cannot make anything in
        (problem,) = unwritable_output_paths({"train_config.save_path": "/proc/craftrl-checkpoints"})
        assert problem.startswith("train_config.save_path: cannot make a directory at /proc/craftrl-checkpoints: "
                                  "/proc is not writable (")


def test_a_launchers_output_path_inside_a_file_is_one_line_and_exit_2(tmp_path: Path, monkeypatch, capsys):
    from craftrl import start_rolloutmanager

    tests = Path(__file__).resolve().parents[1]
    monkeypatch.syspath_prepend(str(tests / "config_fixtures"))
    from tiny import env_generator, policy_generator, tiny_online

    (tmp_path / "a_file").write_text("text")
    online = tiny_online(tmp_path, train_config={"save_path": str(tmp_path / "a_file" / "checkpoints")})
    with pytest.raises(SystemExit) as stopped:
        start_rolloutmanager(policy_generator, env_generator, online)
    assert stopped.value.code == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line == (f"craftrl: error: train_config.save_path: cannot make a directory at "
                    f"{tmp_path / 'a_file' / 'checkpoints'}: {tmp_path / 'a_file'} is not a directory")
