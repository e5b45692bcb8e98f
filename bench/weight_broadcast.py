"""Benchmark: seconds from publishing a VPT-2x-sized policy until every rollout node has loaded it.

A simulated cluster on this machine (``ray.cluster_utils.Cluster``): the head node publishes, ``--nodes`` more
raylets each hold one rollout worker stand-in with a VPT-2x policy (248.5 M parameters, about 1 GB in float32,
built from the layout in shared/vpt with random weights). Publishing goes through the run's own path,
:class:`craftrl.weights.WeightPublisher` (one ``ray.put`` per version) and :class:`craftrl.weights.NewestWeights`
in each worker (fetch on a thread of its own, then ``load_state_dict``). The figure is the wall time from the
publish call until the last worker reports the version applied, per version, over ``--versions`` versions.
The nodes share this machine's memory bus and 2 cores, so it is the cost of the copies and the loads, not of a
network. Writes bench/results/weight_broadcast.md (``_float16.md`` with ``--weights-dtype float16``); the last
line is ``P10 vpt2x_broadcast_s=<median>`` (``vpt2x_broadcast_float16_s``).

    .venv/bin/python bench/weight_broadcast.py [--nodes 4] [--versions 3]
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys
import time
from pathlib import Path

from machine import describe_machine
from headlines import finish, headline  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


class PolicyHolder:
    """A rollout worker's weight path alone: a VPT-2x policy and the loader that keeps it at the newest version."""

    def __init__(self) -> None:
        import torch

        from craftrl.policies.vpt import VPT_2X, VPTPolicy
        from craftrl.weights import NewestWeights

        torch.set_num_threads(1)
        self.policy = VPTPolicy(VPT_2X)
        self.weights = NewestWeights(lambda version, state: self.policy.load_state_dict(state))

    def offer(self, version: int, refs: list) -> None:
        self.weights.offer(version, refs)

    def wait_for(self, version: int) -> float:
        """Block until ``version`` is applied; returns the seconds this worker spent fetching and loading so far."""
        if not self.weights.wait_for(version, timeout=600):
            raise TimeoutError(f"version {version} not applied: {self.weights.error}")
        return self.weights.fetch_seconds


class Fanout:
    """The rollout manager's part: offer each published ``(version, [ref])`` to every worker."""

    def __init__(self, holders: list) -> None:
        self.holders = holders

    def update_weights(self, version: int, refs: list) -> None:
        for holder in self.holders:
            holder.offer.remote(version, refs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--versions", type=int, default=3)
    parser.add_argument("--weights-dtype", choices=("float32", "float16"), default="float32",
                        help="rollout_config.weights_dtype: float16 sends the parameters in half precision")
    parser.add_argument("--shard-mb", type=float, default=None,
                        help="the most MB in one object of a version (default: craftrl.weights.shard_size)")
    args = parser.parse_args()
    shard_bytes = None if args.shard_mb is None else int(args.shard_mb * 2**20)
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import ray
    import torch
    from ray.cluster_utils import Cluster

    from craftrl.policies.vpt import VPT_2X, VPTPolicy
    from craftrl.weights import WeightPublisher

    store = 3 << 30  # a version and the next one in flight
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False,
                                                            "object_store_memory": store})
    for _ in range(args.nodes):
        cluster.add_node(num_cpus=1, resources={"rollout_node": 1}, object_store_memory=store)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address)
    timings = []
    try:
        holders = [ray.remote(PolicyHolder).options(num_cpus=0, resources={"rollout_node": 1},
                                                     max_concurrency=2).remote() for _ in range(args.nodes)]
        ray.get([holder.wait_for.remote(-1) for holder in holders])  # policies built
        learner = VPTPolicy(VPT_2X)
        parameters = sum(p.numel() for p in learner.parameters())
        nbytes = sum(t.numel() * t.element_size() for t in learner.state_dict().values())
        manager = ray.remote(Fanout).options(num_cpus=0).remote(holders)
        half = [name for name, _ in learner.named_parameters()] if args.weights_dtype == "float16" else []
        publisher = WeightPublisher(manager, half_precision=half, shard_bytes=shard_bytes)
        for version in range(args.versions):
            with torch.no_grad():
                for parameter in learner.parameters():
                    parameter.add_(0.001)  # a new version
            started = time.perf_counter()
            publisher.publish(version, learner.state_dict())
            put_s = time.perf_counter() - started
            ray.get([holder.wait_for.remote(version) for holder in holders])
            timings.append((put_s, time.perf_counter() - started))
            print(f"version {version}: put {put_s:.2f} s, all {args.nodes} nodes loaded after "
                  f"{timings[-1][1]:.2f} s", flush=True)
    finally:
        ray.shutdown()
        cluster.shutdown()
    median = statistics.median(total for _, total in timings)
    command = "python bench/weight_broadcast.py " + " ".join(sys.argv[1:])
    lines = [
        f"## Weight broadcast: a VPT-2x-sized policy to rollout nodes ({args.weights_dtype})", "",
        f"`{command.strip()}`, {datetime.date.today().isoformat()}, {describe_machine()}. "
        f"One machine plays the head and {args.nodes} rollout nodes; the policy has {parameters / 1e6:.1f} M "
        f"parameters, {nbytes / 1e9:.2f} GB in float32, published as {args.weights_dtype}. Seconds from "
        "`WeightPublisher.publish` until every node's worker has loaded the version into its policy.", "",
        "| version | ray.put s | all nodes loaded s |", "|---:|---:|---:|",
        *[f"| {version} | {put:.2f} | {total:.2f} |" for version, (put, total) in enumerate(timings)],
        "", f"Median: {median:.2f} s.", ""]
    suffix = "" if args.weights_dtype == "float32" else f"_{args.weights_dtype}"
    finish(RESULTS / f"weight_broadcast{suffix}.md", "\n".join(lines),
           [headline("P10", f"vpt2x_broadcast{suffix}_s", median, 2,
                     f"median seconds until {args.nodes} simulated nodes loaded a {args.weights_dtype} version")])


if __name__ == "__main__":
    main()
