"""On a cluster a worker runs its generators with its node's environment, not the driver's (docs/cluster.md).

``ray.cluster_utils.Cluster`` starts the nodes from this test's process; ``craftrl train --address`` runs in a
subprocess whose environment alone sets ``CRAFTRL_TEST_HIDDEN``, as a user's shell sets ``VPT_MODEL`` on the head
node while every ``ray start`` ran without it. A config that reads the variable inside its policy generator builds
one network in the driver and another in the workers; one that reads it at the top of the module trains the
driver's network everywhere. wandb, which runs in the metrics actor, gets the driver's ``WANDB_*`` variables.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from craftrl.train.checkpoint import STATE_FILE, list_checkpoints

pytestmark = pytest.mark.ray

VARIABLE = "CRAFTRL_TEST_HIDDEN"
TEMPLATE = '''
import functools, os

from craftrl.testing.scripted_env import ScriptedEnv
from craftrl.policies import default_policy_generator

HIDDEN_AT_LOAD = int(os.environ.get({variable!r}, "16"))
env_generator = functools.partial(ScriptedEnv, episode_length=6)


def policy_generator():
    hidden = {hidden}
    return default_policy_generator(num_actions=2, image_shape=(8, 8, 3), hidden_size=hidden, channels=(4, 4, 4))


online_dict = {{
    "rollout_config": {{
        "num_rollout_workers": 1, "num_cpus_per_worker": 0, "fragment_length": 8,
        "worker_config": {{"num_envs": 2, "batch_size": 2}},
        "replay_buffer_config": {{"max_chunks": 32, "max_staleness": 3,
                                  "database_config": {{"num_shards": 1, "max_fragment_bytes": 1 << 20}}}},
    }},
    "train_config": {{"num_workers": 1, "num_cpus_per_worker": 1, "num_iterations": 2, "batch_size_per_gpu": 2,
                      "batches_per_iteration": 2, "context_length": 4, "save_interval": 1, "keep_interval": 0,
                      "num_readers": 1, "num_cpus_per_reader": 0}},
    "logger_config": {{"name": "node-environment", "console_interval": 0, "project": {project!r},
                       "wandb_mode": "offline"}},
    "output_root": {output_root!r},
}}
'''


def train_on_a_cluster(tmp_path: Path, hidden: str, wandb_project: str | None = None,
                       driver_environment: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    from ray.cluster_utils import Cluster

    config = tmp_path / "my_config.py"
    config.write_text(TEMPLATE.format(variable=VARIABLE, hidden=hidden, output_root=str(tmp_path / "runs"),
                                      project=wandb_project))
    driver_environment = {VARIABLE: "32", **(driver_environment or {})}
    assert not set(driver_environment) & set(os.environ), "the nodes must start without the driver's variables"
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 3, "include_dashboard": False})
    try:
        return subprocess.run([sys.executable, "-m", "craftrl.cli.main", "train", str(config),
                               "--address", cluster.address], capture_output=True, text=True, timeout=300,
                              env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0", **driver_environment})
    finally:
        cluster.shutdown()


def test_a_train_worker_whose_generator_reads_the_drivers_variable_stops_the_run_in_one_line(tmp_path: Path):
    """Without the check the train worker and the rollout worker both build the 16-wide network and the run
    trains it, while the driver, and the user, saw 32."""
    result = train_on_a_cluster(tmp_path, hidden=f"int(os.environ.get({VARIABLE!r}, '16'))")
    assert result.returncode == 1, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("craftrl: error:")]
    assert len(errors) == 1, result.stderr[-3000:]
    assert errors[0].startswith("craftrl: error: train: policy_generator built another network in train worker 0 "
                                "than in the driver ('encoder.dense.weight' is [32, ")
    assert "in this train worker's" in errors[0] and "node's environment variables" in errors[0]
    assert not list((tmp_path / "runs").glob("*/checkpoints/*"))
    logs = Path(errors[0].rsplit("(worker logs: ", 1)[1].removesuffix(")"))  # where the train worker's traceback is
    assert any("PolicyContractError" in log.read_text(errors="replace") for log in logs.glob("worker-*.err"))


def test_the_drivers_variables_reach_the_workers_through_the_config_and_wandb_through_the_metrics_actor(
        tmp_path: Path):
    """The advice of the error line: the value read when the driver loads the file travels with the generator.
    And wandb, configured by ``WANDB_*`` variables (an API key, a group), sees the driver's: without them it would
    quietly run offline, or elsewhere, on a cluster."""
    result = train_on_a_cluster(tmp_path, hidden="HIDDEN_AT_LOAD", wandb_project="craftrl-test",
                                driver_environment={"WANDB_RUN_GROUP": "set-in-the-drivers-shell"})
    assert result.returncode == 0, result.stderr[-3000:]
    run = next((tmp_path / "runs").iterdir())
    checkpoints = list_checkpoints(run / "checkpoints")
    model = torch.load(checkpoints[-1][1] / STATE_FILE, map_location="cpu", weights_only=False)["model"]
    assert model["encoder.dense.weight"].shape[0] == 32
    [wandb_run] = run.glob("wandb/offline-run-*/run-*.wandb")
    assert b"set-in-the-drivers-shell" in wandb_run.read_bytes()
