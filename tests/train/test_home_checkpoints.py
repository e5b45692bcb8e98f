"""Checkpoints saved and loaded in place on the home node, and through Ray from a train worker elsewhere: the same
files, the same payload, the same retention."""
from __future__ import annotations

import pytest
import torch

from craftrl.train.checkpoint import TrainingState, list_checkpoints, load_checkpoint
from craftrl.train.home_checkpoints import HomeCheckpoints


def _save_five(checkpoints: HomeCheckpoints) -> None:
    for iteration in (10, 20, 30, 40, 50):
        checkpoints.save(TrainingState(iteration=iteration, version=iteration - 1, env_steps=7 * iteration),
                         model={"weight": torch.full((3, 2), float(iteration))}, optimizer=None, reference=None,
                         config_yaml=f"iteration: {iteration}\n")


def _check_saved(save_path, checkpoints: HomeCheckpoints) -> None:
    assert [i for i, _ in list_checkpoints(save_path)] == [20, 40, 50]  # multiples of 20 and the newest 2
    assert (save_path / "iter_00000050" / "config.yaml").read_text() == "iteration: 50\n"
    path, payload = checkpoints.load("latest")
    assert path == str(save_path / "iter_00000050")
    assert payload["training"].version == 49 and payload["training"].env_steps == 350
    torch.testing.assert_close(payload["model"]["weight"], torch.full((3, 2), 50.0))
    path, payload = checkpoints.load(str(save_path / "iter_00000020"))
    torch.testing.assert_close(payload["model"]["weight"], load_checkpoint(path)["model"]["weight"])
    assert payload["training"].iteration == 20


def test_on_the_home_node_checkpoints_are_written_and_read_in_place(tmp_path):
    checkpoints = HomeCheckpoints(tmp_path / "checkpoints", home_node=None, keep_interval=20, keep_last=2)
    assert not checkpoints.through_ray
    _save_five(checkpoints)
    _check_saved(tmp_path / "checkpoints", checkpoints)


def test_from_another_node_checkpoints_travel_through_ray_to_a_task_on_the_home_node(ray_session, tmp_path):
    """One node here, so the test takes the path a train worker on another node takes (``through_ray``): the
    serialised state goes to a task pinned to the home node, which writes it and applies the retention."""
    home = ray_session.get_runtime_context().get_node_id()
    checkpoints = HomeCheckpoints(tmp_path / "checkpoints", home_node=home, keep_interval=20, keep_last=2)
    assert not checkpoints.through_ray  # this process is on the home node
    checkpoints.through_ray = True
    _save_five(checkpoints)
    _check_saved(tmp_path / "checkpoints", checkpoints)
    with pytest.raises(FileNotFoundError, match="is not a checkpoint directory"):
        checkpoints.load(str(tmp_path / "nope"))
