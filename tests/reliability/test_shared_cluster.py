"""Two runs of ``craftrl train`` on one Ray cluster at the same time, as several experiments share a lab's cluster.

Their named actors carry MineStudio's names, the same in every run: each run keeps them in a Ray namespace of its
own, so the second neither replaces the first's replay buffer and rollout manager nor stops on its metrics actor.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.ray

TINY = str(Path(__file__).resolve().parents[1] / "config_fixtures" / "tiny.py")


def test_two_runs_on_one_cluster_at_once_each_train_to_their_end(tmp_path: Path):
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 4, "include_dashboard": False})
    environment = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}

    def train(name: str, iterations: int) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "craftrl.cli.main", "train", TINY, "--address", cluster.address,
                                 f"output_root={tmp_path / 'runs'}", f"logger_config.name={name}",
                                 f"train_config.num_iterations={iterations}"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environment)

    try:
        first = train("first", 100_000)  # trains until stopped, all through the second run
        for line in first.stdout:  # the first run trains: its actors are up
            if line.startswith("iter "):
                break
        second = train("second", 20)
        second_out, second_err = second.communicate(timeout=240)
        assert first.poll() is None, "the first run must still be training"
        first.send_signal(signal.SIGTERM)  # stopped as Ctrl-C stops it: exit 130 after a final checkpoint
        first_out, first_err = first.communicate(timeout=240)
    finally:
        cluster.shutdown()
    assert second.returncode == 0, second_err[-3000:]
    assert first.returncode == 130, first_err[-3000:]
    for name, out in (("first", first_out), ("second", second_out)):
        assert "unaccounted 0" in out, out[-2000:]
        (run,) = (tmp_path / "runs").glob(f"{name}-*")
        records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        trained = max(record.get("train/iteration", 0) for record in records)
        assert trained == 20 if name == "second" else trained > 20, (name, trained)
