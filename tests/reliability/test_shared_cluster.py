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
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.ray

TINY = str(Path(__file__).resolve().parents[1] / "config_fixtures" / "tiny.py")


def test_two_runs_on_one_cluster_at_once_each_train_to_their_end(tmp_path: Path):
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 4, "include_dashboard": False})
    environment = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    outputs = []

    def train(name: str, iterations: int) -> subprocess.Popen:  # output to files: a full pipe would stall a run
        outputs.extend([open(tmp_path / f"{name}.out", "w"), open(tmp_path / f"{name}.err", "w")])
        return subprocess.Popen([sys.executable, "-m", "craftrl.cli.main", "train", TINY, "--address", cluster.address,
                                 f"output_root={tmp_path / 'runs'}", f"logger_config.name={name}",
                                 f"train_config.num_iterations={iterations}"],
                                stdout=outputs[-2], stderr=outputs[-1], env=environment)

    try:
        first = train("first", 100_000)  # trains until stopped, all through the second run
        deadline = time.monotonic() + 120
        while "\niter " not in "\n" + (tmp_path / "first.out").read_text():  # the first run trains: its actors are up
            assert first.poll() is None and time.monotonic() < deadline, (tmp_path / "first.err").read_text()[-3000:]
            time.sleep(0.5)
        second = train("second", 20)
        second.wait(timeout=240)
        assert first.poll() is None, "the first run must still be training"
        first.send_signal(signal.SIGTERM)  # stopped as Ctrl-C stops it: exit 130 after a final checkpoint
        first.wait(timeout=240)
    finally:
        cluster.shutdown()
        for output in outputs:
            output.close()
    assert second.returncode == 0, (tmp_path / "second.err").read_text()[-3000:]
    assert first.returncode == 130, (tmp_path / "first.err").read_text()[-3000:]
    for name in ("first", "second"):
        out = (tmp_path / f"{name}.out").read_text()
        assert "unaccounted 0" in out, out[-2000:]
        (run,) = (tmp_path / "runs").glob(f"{name}-*")
        records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        trained = max(record.get("train/iteration", 0) for record in records)
        assert trained == 20 if name == "second" else trained > 20, (name, trained)
