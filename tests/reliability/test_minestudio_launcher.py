"""MineStudio launchers run unchanged but for their imports: ROCKET-3's shape (tests/minestudio_launcher/) joins a Ray
cluster by address, trains, and leaves its detached rollout side running; bad input to it is one line and exit 2.

The cluster's head is started by ``ray.cluster_utils.Cluster`` in this process's name but runs in processes of its
own; the launcher runs as a user would run it, ``python run_online.py`` in its directory.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from cluster_config import metric_records

from craftrl.testing.simulated_nodes import RolloutNode, mount_namespaces_work, wait_for_nodes

pytestmark = pytest.mark.ray

LAUNCHER = Path(__file__).resolve().parents[1] / "minestudio_launcher"
ENVIRONMENT = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "WANDB_MODE": "offline"}

# A second driver: finds the detached rollout actors the launcher left and stops them, with their accounting.
STOP_DETACHED = textwrap.dedent("""
    import json, sys, ray
    from craftrl.system import stop_rollout_system
    from craftrl.system import EPISODE_STATISTICS, REPLAY_BUFFER, ROLLOUT_MANAGER, find
    ray.init(address=sys.argv[1], namespace="craftrl", log_to_driver=False)
    alive = [name for name in (ROLLOUT_MANAGER, REPLAY_BUFFER, EPISODE_STATISTICS) if find(name) is not None]
    print(json.dumps({"alive": alive, "accounting": stop_rollout_system()}))
""")

# The remedy the error line names: the launcher's directory shipped as Ray's runtime_env working_dir; then the
# node without it imports the generators' modules.
CHECK_WITH_WORKING_DIR = textwrap.dedent("""
    import sys, ray
    from craftrl.config import build_config
    from craftrl.config.generator_modules import problems_on_cluster
    from online_configs.rocket_log import env_generator, online_dict, policy_generator
    ray.init(address=sys.argv[1], namespace="craftrl", runtime_env={"working_dir": "."}, log_to_driver=False)
    print(problems_on_cluster(env_generator, policy_generator, build_config(online_dict)))
""")


def _project_with_checkpoint(tmp_path: Path) -> tuple[Path, Path]:
    """A copy of the launcher's directory (outputs land there) and a checkpoint of craftrl's default policy."""
    import torch

    from craftrl.policies import default_policy_generator

    project = Path(shutil.copytree(LAUNCHER, tmp_path / "project"))
    checkpoint = tmp_path / "rocket.ckpt"
    torch.save(default_policy_generator(num_actions=17, image_shape=(64, 64, 3)).state_dict(), checkpoint)
    return project, checkpoint


def _launch(project: Path, *arguments: str, timeout: float = 420) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "run_online.py", *arguments], cwd=project, env=ENVIRONMENT,
                          capture_output=True, text=True, timeout=timeout)


def test_a_rocket3_launcher_trains_on_a_cluster_and_leaves_its_detached_rollout_side_running(tmp_path):
    """ROCKET-3's ``online_dict`` (GPU keys 0, an iteration's counts shrunk, tests/minestudio_launcher/), its
    checkpoint bound into the policy generator by ``functools.partial``, its env importing a module beside the
    launcher: four iterations on a head joined by address, and each key means what it means in MineStudio."""
    from ray.cluster_utils import Cluster
    from ray.util.state import list_actors

    from craftrl.train.checkpoint import list_checkpoints

    project, checkpoint = _project_with_checkpoint(tmp_path)
    # rollout 2 x 1 CPU, train 2 x 1 CPU, readers 2 x 4 x 0.1 CPU; the dashboard serves Ray's state API
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 6, "include_dashboard": True})
    try:
        result = _launch(project, "--checkpoint", str(checkpoint), "--ray-address", cluster.address)
        assert result.returncode == 0, result.stderr[-4000:]
        stopped = subprocess.run([sys.executable, "-c", STOP_DETACHED, cluster.address], env=ENVIRONMENT,
                                 capture_output=True, text=True, timeout=180)
        assert stopped.returncode == 0, stopped.stderr[-3000:]
        readers = list_actors(address=cluster.address, filters=[("class_name", "=", "ChunkReader")], detail=True,
                              raise_on_missing_output=False)
    finally:
        cluster.shutdown()
    after = json.loads(stopped.stdout.strip().splitlines()[-1])
    assert after["alive"] == ["rollout_manager", "replay_buffer", "episode_statistics"], \
        "detach_rollout_manager: the rollout side outlives the launcher"
    assert after["accounting"]["replay/unaccounted"] == 0

    (run,) = (project / "runs").iterdir()  # relative paths resolve against the launcher's working directory
    records = [r for r in metric_records(project / "runs") if "train/iteration" in r]
    assert [r["train/iteration"] for r in records] == [1.0, 2.0, 3.0, 4.0]
    assert all(r["data/fragments"] == 10 for r in records), "2 train workers x 5 batches of 1 fragment"
    # coef_rho_decay: rho shrinks by the decay after every iteration (the KL reference moves: enable_ref_update)
    assert [r["ppo/rho"] for r in records] == pytest.approx([0.2 * 0.9995 ** k for k in range(4)], rel=1e-9)
    # num_readers / num_cpus_per_reader: 4 reader actors per train worker, each reserving 0.1 CPU
    assert len(readers) == 8 and all(r.required_resources == {"CPU": 0.1} for r in readers), readers
    # the env processes of both rollout workers imported the module beside the launcher
    assert len(list((project / "imported_by").iterdir())) >= 2 * 4
    # record_video_interval 1: a video is asked for every iteration; episodes of 60 steps end within one
    assert list((project / "output" / "videos").glob("*.mp4")), "no video recorded"
    # save_interval 10 / keep_interval 40: a 4-iteration run keeps its final checkpoint
    assert [iteration for iteration, _ in list_checkpoints(project / "output")] == [4]
    assert (run / "config_source.py").read_text() == (project / "online_configs" / "rocket_log.py").read_text()


def _unused_loopback_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]  # closed again: nothing listens there


def test_a_launcher_whose_address_points_nowhere_stops_in_one_line_with_exit_2(tmp_path):
    project, checkpoint = _project_with_checkpoint(tmp_path)
    port = _unused_loopback_port()
    result = _launch(project, "--checkpoint", str(checkpoint), "--ray-address", f"127.0.0.1:{port}", timeout=120)
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    (line,) = [line for line in result.stderr.splitlines() if line.startswith("craftrl: error:")]
    assert f"cannot reach a Ray cluster at '127.0.0.1:{port}'" in line and "ray start --head" in line
    assert not (project / "imported_by").exists(), "no env process started"


def test_a_policy_generator_partial_that_lacks_its_argument_stops_in_one_line_with_exit_2(tmp_path):
    project, _ = _project_with_checkpoint(tmp_path)
    launcher = project / "run_online.py"
    launcher.write_text(launcher.read_text().replace("partial(policy_generator, str(checkpoint))",
                                                     "partial(policy_generator)"))
    result = _launch(project, "--checkpoint", "unused", "--ray-address", "127.0.0.1:1", timeout=120)
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    (line,) = [line for line in result.stderr.splitlines() if line.startswith("craftrl: error:")]
    assert "policy_generator" in line and "functools.partial(policy_generator, ...)" in line
    assert "'checkpoint_path'" in line
    assert not (project / "imported_by").exists()


def test_a_node_that_cannot_see_the_launchers_directory_is_one_line_naming_the_module_and_exit_2(tmp_path):
    """A rollout node in a mount namespace of its own sees an empty directory where the launcher lies: the modules
    beside the launcher are not on that node. The launcher stops before any env process starts, in one line that
    names the module and Ray's runtime_env, and leaves no rollout actor behind; with the directory shipped as the
    runtime_env's working_dir, the node imports them."""
    reason = mount_namespaces_work()
    if reason is not None:
        pytest.skip(reason)
    from ray.cluster_utils import Cluster

    project, checkpoint = _project_with_checkpoint(tmp_path)
    config = project / "online_configs" / "rocket_log.py"
    # the workers go to a node with the rollout_node resource, which only the node without the directory has
    config.write_text(config.read_text().replace('"num_cpus_per_worker": 1,\n        "fragment_length"',
                                                 '"num_cpus_per_worker": 1,\n        "resources_per_worker": '
                                                 '{"rollout_node": 1},\n        "fragment_length"', 1))
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 6, "include_dashboard": True})
    node = RolloutNode(cluster.address, {"rollout_node": 2}, project, tmp_path / "node-view", range(23000, 23200))
    try:
        wait_for_nodes(cluster.address, 2, [node])
        result = _launch(project, "--checkpoint", str(checkpoint), "--ray-address", cluster.address, timeout=180)
        left = subprocess.run([sys.executable, "-c", STOP_DETACHED, cluster.address], env=ENVIRONMENT,
                              capture_output=True, text=True, timeout=120)
        shipped = subprocess.run([sys.executable, "-c", CHECK_WITH_WORKING_DIR, cluster.address], cwd=project,
                                 env=ENVIRONMENT, capture_output=True, text=True, timeout=180)
    finally:
        node.stop()
        cluster.shutdown()
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("craftrl: error:")]
    assert any("env_generator: needs module 'crafter_callbacks'" in line and "runtime_env" in line
               for line in lines), lines
    assert any("env_generator and policy_generator: need module 'online_configs'" in line for line in lines), \
        "the generators' own package is not there either"
    assert len(lines) == 2
    assert json.loads(left.stdout.strip().splitlines()[-1])["alive"] == [], "nothing left running"
    assert shipped.returncode == 0 and shipped.stdout.strip().splitlines()[-1] == "[]", shipped.stderr[-3000:]
    assert not (project / "imported_by").exists() and not list((tmp_path / "node-view").iterdir())
