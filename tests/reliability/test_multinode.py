"""A run across a simulated Ray cluster: rollout workers and the learner land on the nodes the config names.

``ray.cluster_utils.Cluster`` starts a head node and two worker nodes (separate raylets) on this machine; the
nodes carry custom resources, and ``craftrl train --address`` joins the cluster from a subprocess. Every
process that builds a policy writes down its node and the resources Ray assigned to it, which is how the test
sees where things ran.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from cluster_config import last_metrics, placements, write_cluster_config

from craftrl.testing.simulated_nodes import mount_namespaces_work

pytestmark = pytest.mark.ray

def test_rollout_workers_and_learner_run_on_the_nodes_the_config_names(tmp_path: Path):
    """Where the tests of test_cluster_no_shared_disk.py can run, they check the same placement and more (rollout
    workers on rollout nodes, a learner rank on a learner node off the driver's), so this run is left to machines
    that cannot give a node a disk view of its own."""
    if mount_namespaces_work() is None:
        pytest.skip("the placement is checked by test_cluster_no_shared_disk.py, which can run here")
    from ray.cluster_utils import Cluster

    log = tmp_path / "placement.jsonl"
    config = write_cluster_config(tmp_path / "multinode_config.py", log)
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    try:
        rollout_node = cluster.add_node(num_cpus=2, resources={"rollout_node": 2})
        learner_node = cluster.add_node(num_cpus=2, resources={"learner_node": 1})
        cluster.wait_for_nodes()
        environment = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
        result = subprocess.run(
            [sys.executable, "-m", "craftrl.cli.main", "train", str(config), f"output_root={tmp_path / 'runs'}",
             "--address", cluster.address],
            capture_output=True, text=True, timeout=300, env=environment)
    finally:
        cluster.shutdown()
    assert result.returncode == 0, result.stderr[-4000:]
    records = placements(log)
    rollout = [r for r in records if "rollout_node" in r["resources"]]
    learner = [r for r in records if "learner_node" in r["resources"]]
    assert len(rollout) == 2 and {r["node"] for r in rollout} == {rollout_node.node_id}
    assert len(learner) == 1 and learner[0]["node"] == learner_node.node_id
    runs = tmp_path / "runs"
    assert len(list(runs.iterdir())) == 1
    assert last_metrics(runs)["train/iteration"] == 4.0
    assert last_metrics(runs, having="rollout/fragments_sent")["rollout/fragments_sent"] > 0


def test_a_cluster_without_the_named_resources_is_one_clear_error(tmp_path: Path):
    from ray.cluster_utils import Cluster

    config = write_cluster_config(tmp_path / "multinode_config.py", tmp_path / "placement.jsonl")
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 4, "include_dashboard": False})
    try:
        result = subprocess.run(
            [sys.executable, "-m", "craftrl.cli.main", "train", str(config), f"output_root={tmp_path / 'runs'}",
             "--address", cluster.address],
            capture_output=True, text=True, timeout=120, env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0"})
    finally:
        cluster.shutdown()
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert "0 rollout_node" in result.stderr and "ray start --resources" in result.stderr
