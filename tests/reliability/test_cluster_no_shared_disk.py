"""A run on a cluster whose rollout nodes do not share the driver's disk.

The head node (learner resource) is started by ``ray.cluster_utils.Cluster``; each rollout node is a ``ray start``
run inside a mount namespace of its own, where an empty directory is bind-mounted over the run root: its
processes cannot see the driver's run directory or the replay store, and whatever they write there lands in that
empty directory, where the test finds it. ``craftrl train --address`` then runs from the driver's view.
"""
from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from cluster_config import last_metrics, metric_records, placements, write_cluster_config

from craftrl.testing.simulated_nodes import (NodeLink, RolloutNode, mount_namespaces_work, nodes_behind_links_work,
                                           wait_for, wait_for_nodes)

pytestmark = pytest.mark.ray

# Ray declares a node dead after 5 failed health checks; with a check every second and a 2-s deadline the cut-off
# worker's position waited for a node 31 s after the cut, with Ray's defaults 80 s, and a crashed node's 21 s against
# 28 s (one run each): shorter tests
QUICK_HEALTH_CHECKS = {"health_check_period_ms": 1000, "health_check_timeout_ms": 2000,
                       "health_check_failure_threshold": 5}


def _head_and_two_rollout_nodes(runs: Path, tmp_path: Path, system_config: dict | None = None,
                                 link: NodeLink | None = None):
    """A head with the learner resource (and the dashboard, which serves Ray's state API) and two rollout nodes
    that see an empty directory where the driver sees ``runs``; the second one reaches the cluster only through
    ``link`` when given."""
    from ray.cluster_utils import Cluster

    runs.mkdir()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "resources": {"learner_node": 1},
                                                            "include_dashboard": True,
                                                            "_system_config": system_config or {}})
    nodes = [RolloutNode(cluster.address, {"rollout_node": 1}, runs, tmp_path / f"view-{name}",
                         range(21000 + 1000 * index, 21000 + 1000 * index + 200), link if index else None)
             for index, name in enumerate("ab")]
    return cluster, nodes


def _files_under(root: Path) -> list[str]:
    return sorted(str(path.relative_to(root)) for path in root.rglob("*"))


@contextlib.contextmanager
def _training_on(cluster, nodes: list[RolloutNode], config: Path, runs: Path, stdout: Path, stderr: Path):
    """``craftrl train`` from the driver's view once the head and ``nodes`` are up, its output in ``stdout`` and
    ``stderr``; yields the process, the head's node id and the rollout nodes' ids. At the end of the block the run
    is interrupted (SIGTERM) and waited for; then whatever still runs is stopped: the run, every node in ``nodes``
    (those added meanwhile too) and the head."""
    process = None
    try:
        head = cluster.head_node.node_id
        rollout_nodes = wait_for_nodes(cluster.address, 1 + len(nodes), nodes) - {head}
        with open(stdout, "w") as out, open(stderr, "w") as err:
            process = subprocess.Popen(
                [sys.executable, "-m", "craftrl.cli.main", "train", str(config), f"output_root={runs}",
                 "--address", cluster.address], stdout=out, stderr=err,
                env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0"})
        yield process, head, rollout_nodes
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=180)
    finally:
        if process is not None and process.poll() is None:
            process.kill()
        for node in nodes:
            node.stop()
        cluster.shutdown()


def _assert_the_lost_node_is_accounted_for(runs: Path, stdout: Path) -> str:
    """After a run that lost one of its rollout nodes: its worker was replaced, booked under the node's loss, every
    fragment is accounted for and the buffer refuses the replaced worker. Returns the printed accounting."""
    # an iteration whose record waited in vain for the rollout manager's answer is logged without its keys
    metrics = last_metrics(runs, having="rollout/workers_given_up")
    # recreated once, or twice when the first replacement was placed on the dead node before Ray knew it was dead
    assert metrics["rollout/workers_given_up"] == 0.0 and metrics["rollout/workers_recreated"] in (1.0, 2.0)
    # every fragment is accounted for, those that crossed to the store through Ray and those the lost node held
    accounting = re.search(r"craftrl:   fragments: (.*)", stdout.read_text()).group(1)
    counts = [int(n) for n in re.search(r"emitted (\d+) = sent (\d+) \+ discarded as stale (\d+) \+ dropped at stop "
                                        r"(\d+) \+ unsent by replaced workers (\d+) \+ lost with dead nodes (\d+)",
                                        accounting).groups()]
    assert counts[0] == sum(counts[1:]) and re.search(r"unaccounted 0\b", accounting), accounting
    assert counts[4] == 0, "the lost node's worker is booked under the node's loss, not as a replaced worker"
    retired = last_metrics(runs, having="replay/retired_workers")["replay/retired_workers"]
    assert retired == metrics["rollout/workers_recreated"], "the buffer refuses each replaced worker from then on"
    return accounting


def test_rollout_nodes_without_the_drivers_disk_train_through_the_object_store_and_outlive_one_of_them(tmp_path):
    """The learner on the head, rollout workers on two rollout nodes that cannot see the run directory: they
    train through Ray's object store. Then one rollout node dies: its worker's position waits for a node while the
    run trains on with the other, a node that joins takes the position back, and the fragments the dead node held are
    counted. The driver's disk has the run's outputs; the rollout nodes' view of the run root stays empty."""
    from ray.util.state import list_actors

    reason = mount_namespaces_work()
    if reason:
        pytest.skip(reason)
    runs, log = tmp_path / "runs", tmp_path / "placement.jsonl"
    config = write_cluster_config(tmp_path / "cluster_config.py", log, iterations=100_000, video_interval=2)
    cluster, nodes = _head_and_two_rollout_nodes(runs, tmp_path, QUICK_HEALTH_CHECKS)
    stdout, stderr = tmp_path / "stdout.txt", tmp_path / "stderr.txt"
    with _training_on(cluster, nodes, config, runs, stdout, stderr) as (process, head, rollout_nodes):
        wait_for("2 iterations", lambda: last_metrics(runs).get("train/iteration", 0) >= 2)
        wait_for("a rollout worker on each rollout node", lambda: {
            record["node"] for record in placements(log) if "rollout_node" in record["resources"]} == rollout_nodes)
        actors = list_actors(address=cluster.address, detail=True, limit=1000, raise_on_missing_output=False)
        before_crash = placements(log)
        nodes[1].crash()
        wait_for("the lost worker's position waiting for a node",
                  lambda: last_metrics(runs).get("rollout/workers_waiting_for_node") == 1.0)
        before = last_metrics(runs)["train/iteration"]
        wait_for("training on with the other node", lambda: last_metrics(runs)["train/iteration"] >= before + 2)
        nodes.append(RolloutNode(cluster.address, {"rollout_node": 1}, runs, tmp_path / "view-c", range(23000, 23200)))
        joined = wait_for_nodes(cluster.address, 3, nodes[-1:]) - {head}
        wait_for("the position back on the new node", lambda: last_metrics(runs).get("rollout/workers_waiting_for_node")
                  == 0.0 and len({record["node"] for record in placements(log)} & joined) == 2)
    assert process.returncode == 130, stderr.read_text()[-4000:]

    # before the crash: rollout workers on the two rollout nodes, everything else on the driver's (head) node
    assert [r["node"] for r in before_crash if "learner_node" in r["resources"]] == [head]
    placed = {actor.name: actor.node_id for actor in actors if actor.name}
    for name in ("replay_buffer", "rollout_manager", "episode_statistics", "metrics"):
        assert placed.get(name) == head, (name, placed)
    workers = [actor.node_id for actor in actors if actor.class_name == "RolloutWorker"]
    assert workers and set(workers) == rollout_nodes

    accounting = _assert_the_lost_node_is_accounted_for(runs, stdout)
    # every fragment came through Ray; bounded by what the store registered, not by `sent`, which counts the dead
    # node's worker up to its last status answer only
    remote = last_metrics(runs, having="replay/remote_fragments_written")["replay/remote_fragments_written"]
    assert 0 < remote <= int(re.search(r"replay registered (\d+)", accounting).group(1)), accounting

    # the driver's disk has the run's outputs; the rollout nodes' view of the run root stayed empty
    (run_dir,) = runs.iterdir()
    assert list((run_dir / "checkpoints").glob("iter_*")) and any((run_dir / "tensorboard").iterdir())
    assert list((run_dir / "videos").glob("*.mp4")), _files_under(run_dir)
    for node in nodes:
        assert _files_under(node.view) == [], node.view


# an 8 MB version takes ~3.5 s over 20 Mbit/s: the learner publishes several versions while one crosses
SLOW_LINK, WEIGHTS_BYTES = "20mbit", 8 << 20


def _times_the_slowest_worker_caught_up(runs: Path, since_iteration: float) -> int:
    """How often, after iteration ``since_iteration``, the weights of the rollout worker furthest behind the
    learner came at least 5 versions closer to the learner's: a worker that loads no version only falls behind."""
    lags = [record["rollout/weights_behind_max"] for record in metric_records(runs)
            if record.get("train/iteration", 0) > since_iteration and "rollout/weights_behind_max" in record]
    return sum(later <= earlier - 5 for earlier, later in zip(lags, lags[1:]))


def test_a_rollout_node_keeps_loading_weights_over_a_slow_link_and_is_given_up_when_cut_off(tmp_path):
    """Rollout node b first reaches the cluster over a slow link, where each version of the weights takes longer to
    arrive than the learner takes to publish the next: its worker still loads one version after another. Then b
    loses its network while every process on it runs on (a partition, not a crash). Ray declares it dead, its
    worker's position waits for a node and the run trains on with node a. When the network comes back, node b learns
    it was declared dead and stops with every process it ran (the rollout worker's env processes too), without
    disturbing the run; the fragments it had cut are accounted for."""
    reason = nodes_behind_links_work()
    if reason:
        pytest.skip(reason)
    runs, log = tmp_path / "runs", tmp_path / "placement.jsonl"
    config = write_cluster_config(tmp_path / "cluster_config.py", log, iterations=100_000, ballast_bytes=WEIGHTS_BYTES)
    link = NodeLink(index=1)
    cluster, nodes = _head_and_two_rollout_nodes(runs, tmp_path, QUICK_HEALTH_CHECKS, link)
    stdout, stderr = tmp_path / "stdout.txt", tmp_path / "stderr.txt"
    with _training_on(cluster, nodes, config, runs, stdout, stderr) as (process, head, rollout_nodes):
        wait_for("a rollout worker on each rollout node and 2 iterations", lambda: {
            record["node"] for record in placements(log) if "rollout_node" in record["resources"]} == rollout_nodes
            and last_metrics(runs).get("train/iteration", 0) >= 2)
        link.slow_down(SLOW_LINK)
        slowed = last_metrics(runs)["train/iteration"]
        wait_for("node b's worker loading two versions over the slow link",
                  lambda: _times_the_slowest_worker_caught_up(runs, slowed) >= 2, timeout=120)
        slow_fetch_s = last_metrics(runs, having="rollout/weights_fetch_s_max")["rollout/weights_fetch_s_max"]
        link.speed_up()
        env_processes = [line for line in link.processes() if "spawn_main" in line]
        link.cut()
        wait_for("the cut-off worker's position waiting for a node",
                  lambda: last_metrics(runs).get("rollout/workers_waiting_for_node") == 1.0)
        before = last_metrics(runs)["train/iteration"]
        wait_for("training on with node a", lambda: last_metrics(runs)["train/iteration"] >= before + 2)
        link.mend()
        wait_for("node b stopped with everything it ran", lambda: not link.processes(), timeout=90)
        returned = last_metrics(runs)["train/iteration"]
        wait_for("training on after node b came back", lambda: last_metrics(runs)["train/iteration"] >= returned + 2)
    assert process.returncode == 130, stderr.read_text()[-4000:]
    assert slow_fetch_s > 1.0, "an 8 MB version crosses 20 Mbit/s in ~3.5 s: the metric shows the slow link"
    assert env_processes, "the worker on node b stepped its envs in env processes, which must go with the node"
    _assert_the_lost_node_is_accounted_for(runs, stdout)
    for node in nodes:
        assert _files_under(node.view) == [], node.view


def _train(config: Path, runs: Path, address: str, *overrides: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "craftrl.cli.main", "train", str(config), f"output_root={runs}", *overrides,
         "--address", address],
        capture_output=True, text=True, timeout=300, env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0"})


def test_ddp_across_two_nodes_one_without_the_store_trains_checkpoints_and_resumes_on_the_drivers_disk(tmp_path):
    """Two train workers: one on the head with the store, one on a node that cannot see the run directory. That
    one reads its chunks through a reader actor on the store's node, and whichever rank saves, the checkpoints
    reach the driver's disk; on resume, every rank loads the checkpoint from there."""
    from ray.cluster_utils import Cluster
    from ray.util.state import list_actors

    reason = mount_namespaces_work()
    if reason:
        pytest.skip(reason)
    runs, log = tmp_path / "runs", tmp_path / "placement.jsonl"
    runs.mkdir()
    config = write_cluster_config(tmp_path / "cluster_config.py", log, iterations=4, train_workers=2)
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "resources": {"learner_node": 1},
                                                            "include_dashboard": True})
    node = RolloutNode(cluster.address, {"learner_node": 1, "rollout_node": 2}, runs, tmp_path / "view",
                       range(21000, 21200))
    try:
        head = cluster.head_node.node_id
        (other,) = wait_for_nodes(cluster.address, 2, [node]) - {head}
        first = _train(config, runs, cluster.address)
        actors = list_actors(address=cluster.address, detail=True, limit=1000, raise_on_missing_output=False)
        resumed = _train(config, runs, cluster.address, "train_config.resume=latest",
                         "train_config.num_iterations=6") if first.returncode == 0 else None
    finally:
        node.stop()
        cluster.shutdown()
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-4000:]
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-4000:]

    records = placements(log)
    ranks = {r["rank"]: r["node"] for r in records if "learner_node" in r["resources"]}
    assert set(ranks.values()) == {head, other} and set(ranks) == {0, 1}, records
    readers = {actor.node_id for actor in actors if actor.class_name == "ChunkReader"}
    assert readers == {head}, "the rank off the store's node reads through a reader actor beside the store"

    (run_dir,) = runs.iterdir()  # the resumed run continued the same directory
    assert "resuming from" in resumed.stdout and str(run_dir) in resumed.stdout
    metrics = metric_records(runs)
    assert [m["train/iteration"] for m in metrics if "train/iteration" in m] == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    assert {p.name for p in (run_dir / "checkpoints").iterdir()} == {"iter_00000002", "iter_00000004",
                                                                    "iter_00000006"}, \
        "saved on the driver's disk, whichever node rank 0 was on"
    assert _files_under(node.view) == [], (ranks, _files_under(node.view))
