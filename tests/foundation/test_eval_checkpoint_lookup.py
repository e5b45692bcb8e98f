"""Which checkpoint `craftrl eval` plays for a path it is given (no Ray: real files as runs leave them)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from craftrl.cli.evaluate import FINAL_SAVE_GRACE_S, locate_checkpoint
from craftrl.config.validate import ConfigError
from craftrl.train.checkpoint import STATE_FILE, write_checkpoint


def _run_directory(root: Path, save_path: str, started: float, last_metrics: float) -> Path:
    run = root / "runs" / "cows-20261207-114214"
    run.mkdir(parents=True)
    (run / "config.yaml").write_text(yaml.safe_dump({"train_config": {"save_path": save_path}}))
    (run / "metrics.jsonl").write_text("{}\n")
    os.utime(run / "config.yaml", (started, started))
    os.utime(run / "metrics.jsonl", (last_metrics, last_metrics))
    return run


def _checkpoint(save_path: Path, iteration: int, written: float) -> Path:
    path = write_checkpoint(save_path, iteration, lambda state: state.write_bytes(b"weights"))
    os.utime(path / STATE_FILE, (written, written))
    return path


def test_a_run_directory_of_craftrl_train_gives_its_newest_checkpoint(tmp_path: Path):
    run = _run_directory(tmp_path, "checkpoints", started=1000.0, last_metrics=2000.0)
    _checkpoint(run / "checkpoints", 10, written=1500.0)
    newest = _checkpoint(run / "checkpoints", 20, written=1900.0)
    assert locate_checkpoint(str(run)) == (newest, run)
    assert locate_checkpoint(str(run / "checkpoints")) == (newest, None)


def test_a_shared_save_path_gives_the_newest_checkpoint_this_run_wrote(tmp_path: Path):
    """A MineStudio launcher's relative save_path lies in its working directory, which later runs share."""
    shared = tmp_path / "checkpoints"
    run = _run_directory(tmp_path, str(shared), started=1000.0, last_metrics=2000.0)
    _checkpoint(shared, 5, written=900.0)  # an earlier run's
    ours = _checkpoint(shared, 46, written=2000.0 + FINAL_SAVE_GRACE_S / 2)  # the final save, after the last line
    _checkpoint(shared, 300, written=5000.0)  # a later run's, in the same directory
    assert locate_checkpoint(str(run)) == (ours, run)


def test_a_run_whose_checkpoints_are_all_another_runs_is_one_clear_error(tmp_path: Path):
    shared = tmp_path / "checkpoints"
    run = _run_directory(tmp_path, str(shared), started=1000.0, last_metrics=2000.0)
    _checkpoint(shared, 300, written=5000.0)
    with pytest.raises(ConfigError, match="no checkpoint here"):
        locate_checkpoint(str(run))


def test_a_run_directory_moved_elsewhere_still_gives_its_own_checkpoints(tmp_path: Path):
    run = _run_directory(tmp_path, "/nowhere/it/was/checkpoints", started=1000.0, last_metrics=2000.0)
    newest = _checkpoint(run / "checkpoints", 20, written=1900.0)
    assert locate_checkpoint(str(run)) == (newest, run)


def test_a_saved_config_whose_generator_needs_its_launchers_argument_points_to_config(tmp_path: Path):
    """ROCKET-3's config module: its policy_generator takes the checkpoint path its launcher binds."""
    from craftrl.cli.evaluate import load_for_eval
    from craftrl.train.checkpoint import TrainingState, save_checkpoint

    run = _run_directory(tmp_path, "checkpoints", started=1000.0, last_metrics=2000.0)
    (run / "config_source.py").write_text("def env_generator():\n    pass\n\n"
                                          "def policy_generator(checkpoint_path):\n    pass\n\nonline_dict = {}\n")
    save_checkpoint(run / "checkpoints", TrainingState(iteration=4), model={}, optimizer=None, reference=None)
    with pytest.raises(ConfigError) as raised:
        load_for_eval(str(run), None)
    (problem,) = raised.value.problems
    assert "policy_generator: expected a callable taking no arguments" in problem
    assert problem.startswith("eval: the run's saved config ") and "pass --config CONFIG" in problem


def test_a_saved_config_whose_modules_directory_is_gone_says_so(tmp_path: Path):
    """A run submitted as a Ray job imports its config's modules from Ray's copy of the working directory, which
    goes with the job: eval names that directory and says it is gone, instead of only the missing module."""
    from craftrl.cli.evaluate import load_for_eval
    from craftrl.run_dir import CONFIG_DIR_FILE
    from craftrl.train.checkpoint import TrainingState, save_checkpoint

    run = _run_directory(tmp_path, "checkpoints", started=1000.0, last_metrics=2000.0)
    (run / "config_source.py").write_text("from helper import EPISODE_LENGTH\n")
    job_copy = tmp_path / "ray" / "runtime_resources" / "working_dir_files" / "_ray_pkg_1"  # gone with its job
    (run / CONFIG_DIR_FILE).write_text(f"{job_copy}\n")
    save_checkpoint(run / "checkpoints", TrainingState(iteration=4), model={}, optimizer=None, reference=None)
    with pytest.raises(ConfigError) as raised:
        load_for_eval(str(run), None)
    (problem,) = raised.value.problems
    assert "No module named 'helper'" in problem
    assert f"(it imported its modules from {job_copy}, which no longer exists)" in problem
