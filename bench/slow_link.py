"""Benchmark: how often a rollout node behind a slow link gets a new version of the weights, against the link's rate.

A Ray head on this machine publishes a version every ``--period`` seconds through the run's own path
(:class:`craftrl.weights.WeightPublisher`, one ``ray.put`` per version); a second Ray node, in network and mount
namespaces of its own (:mod:`craftrl.testing.simulated_nodes`), reaches the head only through a virtual cable that
``tc``'s token bucket filter limits to ``--rate``. On that node a rollout worker's weight path alone
(:class:`craftrl.weights.NewestWeights` loading into a policy of ``MB`` megabytes) keeps up with the newest version.
The learner publishes faster than a version crosses the link, so the node can only load one version after another:
the figure is the seconds between two versions loaded on the node, against a plain TCP copy of one version's bytes
over the same link. Ray sends an object again when its pull has not finished after
``object_manager_pull_timeout_ms`` (10 s by default), which the publisher's shards are there to avoid, so each case
names that setting and how the version travels: in craftrl's shards (``craftrl.weights.shard_size``), or whole, as
one object (``whole``).

As in a run, the versions reach the node through a stand-in for the rollout manager on the head, which offers the
node every version with its refs.

Each case in ``--cases`` is ``MB:PULL_TIMEOUT_MS[:whole]`` (``default`` for Ray's own timeout) and
gets a fresh cluster. Needs root, ``unshare``, ``nsenter``, ``ip`` and ``tc``. Writes bench/results/slow_link.md;
the last line is ``P10 slow_link_efficiency=<link time / seconds between versions, first case>``.

    python bench/slow_link.py [--rate 20mbit] [--cases 16:default 32:default 16:default:whole ...]

"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from machine import describe_machine
from headlines import finish, headline  # noqa: E402

from craftrl.weights import RAY_DEFAULT_PULL_TIMEOUT_MS

RESULTS = Path(__file__).resolve().parent / "results"
WARM_UP_VERSIONS = 2  # the first fetches over the slowed link start side by side with no measure yet: not counted


class WeightsHolder:
    """A rollout worker's weight path alone: a policy of ``nbytes`` bytes kept at the newest version offered."""

    def __init__(self, nbytes: int) -> None:
        import torch

        from craftrl.weights import NewestWeights

        torch.set_num_threads(1)
        self.policy = torch.nn.Linear(nbytes // 4, 1, bias=False)
        self.applied: list[tuple[int, float]] = []  # (version, time.time() when loaded)
        self.weights = NewestWeights(self._apply)

    def _apply(self, version: int, state_dict: dict) -> None:
        self.policy.load_state_dict(state_dict)
        self.applied.append((version, time.time()))

    def update_weights(self, version: int, refs: list) -> None:
        """A rollout worker's offer."""
        self.weights.offer(version, refs)

    def report(self) -> dict:
        return {"applied": list(self.applied), "overtaken": self.weights.fetches_overtaken}


class ManagerStandIn:
    """The rollout manager's part in the weight path, on the head, for one worker: offers it every version."""

    def __init__(self) -> None:
        self.holder = None

    def use_holder(self, holder) -> None:
        self.holder = holder

    def update_weights(self, version: int, refs: list) -> None:
        self.holder.update_weights.remote(version, list(refs))


def run_case(megabytes: int, pull_timeout_ms: int | None, rate: str, period: float, versions: int,
             sharding: str, scratch: Path, timeout_s: float) -> dict:
    """One fresh cluster: the node joins over a fast link, the link is slowed, the head publishes a version every
    ``period`` s until the node has loaded ``WARM_UP_VERSIONS + versions`` versions since the slow-down."""
    import ray
    import torch
    from ray.cluster_utils import Cluster

    from craftrl.testing.simulated_nodes import NodeLink, RolloutNode, wait_for_nodes
    from craftrl.weights import WeightPublisher

    nbytes = megabytes << 20
    system_config = {} if pull_timeout_ms is None else {"object_manager_pull_timeout_ms": pull_timeout_ms}
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": True,
                                                            "resources": {"head": 1}, "_system_config": system_config})
    link = NodeLink(index=7)
    hidden = scratch / "hidden"
    hidden.mkdir(exist_ok=True)
    node = RolloutNode(cluster.address, {"slow_node": 1}, hidden,
                       scratch / f"view-{megabytes}-{pull_timeout_ms}-{sharding}", range(21000, 21200), link)
    try:
        wait_for_nodes(cluster.address, 2, [node])
        ray.init(address=cluster.address)
        manager = ray.remote(ManagerStandIn).options(num_cpus=0, resources={"head": 1}, max_concurrency=4).remote()
        holder = ray.remote(WeightsHolder).options(num_cpus=0, resources={"slow_node": 1}).remote(nbytes)
        ray.get(manager.use_holder.remote(holder))
        shard_bytes = {"shards": None, "whole": nbytes}[sharding]
        publisher = WeightPublisher(manager, shard_bytes=shard_bytes)
        weights = torch.zeros(1, nbytes // 4)
        published = 0

        def publish() -> None:
            nonlocal published
            weights.fill_(published)
            publisher.publish(published, {"weight": weights})
            published += 1

        publish()
        while not ray.get(holder.report.remote())["applied"]:  # the first version, over the fast link
            time.sleep(0.2)
        link.slow_down(rate)
        copy_s = link.copy_seconds(nbytes)
        slowed = time.time()
        wanted = WARM_UP_VERSIONS + versions
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            publish()
            report = ray.get(holder.report.remote())
            if sum(at > slowed for _, at in report["applied"]) >= wanted:
                break
            time.sleep(period)
        else:
            raise TimeoutError(f"{megabytes} MB ({sharding}): fewer than {wanted} versions loaded over the slow link "
                               f"in {timeout_s:.0f} s")
    finally:
        ray.shutdown()
        node.stop()
        cluster.shutdown()
    loaded = [slowed, *(at for _, at in report["applied"] if at > slowed)]
    between = [later - earlier for earlier, later in zip(loaded, loaded[1:])]
    return {"megabytes": megabytes, "pull_timeout_ms": pull_timeout_ms, "shards": len(publisher.latest[1]),
            "sharding": sharding,
            "copy_s": copy_s,
            "warm_up": between[:WARM_UP_VERSIONS], "gaps": between[WARM_UP_VERSIONS:], "overtaken": report["overtaken"]}


def listed(seconds: list[float]) -> str:
    return ", ".join(f"{value:.1f}" for value in seconds)


def parse_case(text: str) -> tuple[int, int | None, str]:
    """``(MB, pull timeout in ms or None for Ray's, 'shards' or 'whole')``."""
    parts = text.split(":")
    megabytes, timeout, sharding = parts[0], (parts[1:] or [""])[0], parts[2:]
    if (not megabytes.isdigit() or not (timeout == "default" or timeout.isdigit())
            or sharding not in ([], ["whole"])):
        raise SystemExit(f"--cases: expected MB:PULL_TIMEOUT_MS[:whole] with 'default' for Ray's own timeout "
                         f"(e.g. 16:default or 16:default:whole), got {text!r}")
    return int(megabytes), None if timeout == "default" else int(timeout), sharding[0] if sharding else "shards"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rate", default="20mbit", help="the link's rate towards the node, in tc's units")
    parser.add_argument("--cases", nargs="+",
                        default=["16:default", "32:default", "16:default:whole", "32:default:whole"],
                        help="MB:PULL_TIMEOUT_MS[:whole] per case ('default': Ray's own pull timeout; "
                             "'whole': each version as one object)")
    parser.add_argument("--period", type=float, default=0.25, help="seconds between two published versions")
    parser.add_argument("--versions", type=int, default=4, help="versions timed per case, after the warm-up")
    parser.add_argument("--case-timeout", type=float, default=600.0,
                        help="seconds a case may take from the slow-down until its last version is loaded")
    args = parser.parse_args()
    cases = [parse_case(text) for text in args.cases]
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    from craftrl.testing.simulated_nodes import nodes_behind_links_work

    reason = nodes_behind_links_work()
    if reason:
        raise SystemExit(f"slow_link: cannot simulate a node behind a link here: {reason}")
    results = []
    with tempfile.TemporaryDirectory(prefix="craftrl-slow-link-") as scratch:
        for megabytes, pull_timeout_ms, sharding in cases:
            result = run_case(megabytes, pull_timeout_ms, args.rate, args.period, args.versions,
                              sharding, Path(scratch), args.case_timeout)
            results.append(result)
            print(f"{megabytes} MB in {result['shards']} objects ({sharding}), "
                  f"pull timeout {pull_timeout_ms or 'default'}: copy {result['copy_s']:.1f} s, "
                  f"versions loaded every {listed(result['gaps'])} s (warm-up {listed(result['warm_up'])})", flush=True)
    command = "python bench/slow_link.py " + " ".join(sys.argv[1:])
    rows = []
    for result in results:
        median = statistics.median(result["gaps"])
        result["efficiency"] = result["copy_s"] / median
        timeout = result["pull_timeout_ms"] or f"{RAY_DEFAULT_PULL_TIMEOUT_MS} (Ray default)"
        rows.append(f"| {result['megabytes']} | {result['shards']} ({result['sharding']}) | {timeout} | "
                    f"{result['copy_s']:.1f} | {listed(result['warm_up'])} | {listed(result['gaps'])} | {median:.1f} | "
                    f"{result['efficiency']:.2f} | {result['overtaken']} |")
    lines = [
        "## Weights over a slow link (`bench/slow_link.py`)", "",
        f"`{command.strip()}`, {datetime.date.today().isoformat()}, {describe_machine()}. A Ray node in a network "
        f"namespace of its own reaches the head only through a cable limited to {args.rate} (`tc` token bucket "
        f"filter); the head publishes a version every {args.period} s, faster than one crosses, and the node's "
        "`NewestWeights` loads one version after another. Seconds between two versions loaded on the node, after "
        f"{WARM_UP_VERSIONS} warm-up versions (the first fetches over the slowed link start side by side), against "
        "a plain TCP copy of one version's bytes over the same cable; efficiency = copy / median.", "",
        "| MB per version | objects per version (sharding) | pull timeout ms | TCP copy s "
        "| warm-up s | between versions s | median s | efficiency | fetches overtaken |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|", *rows, ""]
    first = results[0]
    finish(RESULTS / "slow_link.md", "\n".join(lines),
           [headline("P10", "slow_link_efficiency", first["efficiency"], 2,
                     f"TCP copy over median seconds between versions loaded, {first['megabytes']} MB versions "
                     f"behind {args.rate}")])


if __name__ == "__main__":
    main()
