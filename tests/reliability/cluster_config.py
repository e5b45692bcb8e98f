"""The config module the cluster tests run: rollout workers on ``rollout_node`` nodes, the learner on a
``learner_node`` node, and every process that builds a policy writes down its node and the resources Ray gave it
(one JSON line in ``placement_log``), which is how a test sees where things ran. Also what the cluster tests read
back (those lines, the run's metrics records)."""
from __future__ import annotations

import textwrap
from pathlib import Path

from craftrl.metrics import read_jsonl

TEMPLATE = '''
import functools, json, os

from craftrl.testing.scripted_env import ScriptedEnv
from craftrl.policies import default_policy_generator

PLACEMENT_LOG = {log!r}
BALLAST_BYTES = {ballast_bytes}
env_generator = functools.partial(ScriptedEnv, episode_length=6)


def policy_generator():
    import ray

    if ray.is_initialized():
        context = ray.get_runtime_context()
        record = {{"node": context.get_node_id(), "pid": os.getpid(),
                   "resources": context.get_assigned_resources()}}
        try:  # a train worker also writes down its rank
            import ray.train

            record["rank"] = ray.train.get_context().get_world_rank()
        except Exception:
            pass
        with open(PLACEMENT_LOG, "a") as log:
            log.write(json.dumps(record) + "\\n")
    policy = default_policy_generator(num_actions=2, image_shape=(8, 8, 3), hidden_size=16, channels=(4, 4, 4))
    if BALLAST_BYTES:  # weights that take seconds to cross a slow link, as a large policy's do
        import torch

        policy.register_buffer("ballast", torch.zeros(BALLAST_BYTES // 4))
    return policy


online_dict = {{
    "detach_rollout_manager": False,
    "rollout_config": {{
        "num_rollout_workers": 2, "num_cpus_per_worker": 0.5, "fragment_length": 8,
        "resources_per_worker": {{"rollout_node": 1}},
        "worker_config": {{"num_envs": 2, "batch_size": 2}},
        "replay_buffer_config": {{"max_chunks": 32, "max_staleness": 3,
                                  "database_config": {{"num_shards": 1, "max_fragment_bytes": 1048576}}}},
    }},
    "train_config": {{"num_workers": {train_workers}, "num_cpus_per_worker": 1, "resources_per_worker": {{"learner_node": 1}},
                      "num_iterations": {iterations}, "batch_size_per_gpu": 2, "batches_per_iteration": 2,
                      "context_length": 4, "save_interval": 2, "num_readers": 0,
                      "record_video_interval": {video_interval}}},
    "logger_config": {{"name": "cluster", "console_interval": 0}},
}}
'''


def write_cluster_config(path: Path, placement_log: Path, iterations: int = 4,
                         video_interval: int | None = None, train_workers: int = 1, ballast_bytes: int = 0) -> Path:
    """``ballast_bytes``: a buffer of zeros that makes the policy's weights that large."""
    path.write_text(textwrap.dedent(TEMPLATE.format(log=str(placement_log), iterations=iterations,
                                                    video_interval=video_interval, train_workers=train_workers,
                                                    ballast_bytes=ballast_bytes)))
    return path


def placements(placement_log: Path) -> list[dict]:
    """The placement log's records so far, one per process that built a policy ([] before the first; a line being
    written is left for the next read)."""
    return read_jsonl(placement_log) if placement_log.exists() else []


def metric_records(run_root: Path) -> list[dict]:
    """The records of the metrics.jsonl of the run under ``run_root`` so far ([] before the first); a line the
    metrics actor is still writing is left for the next read."""
    paths = list(run_root.glob("*/metrics.jsonl"))
    return read_jsonl(paths[0]) if paths else []


def last_metrics(run_root: Path, having: str | None = None) -> dict:
    """The last record of the metrics.jsonl of the run under ``run_root``, or the last one with the key ``having``
    (a record whose iteration waited in vain for one component's statistics goes without its keys)."""
    records = [record for record in metric_records(run_root) if having is None or having in record]
    return records[-1] if records else {}
