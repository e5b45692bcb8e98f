"""P7 latency-bound rollout: how close rollout workers keep Minecraft-timed envs to their own speed.

64 envs of ``synthetic/latency`` (craftrl/envs/latency.py: it sleeps with Minecraft's timing and has no game):
steps of 20 ms +-50 %, episodes of 50-150 steps, resets of 0.6-1.8 s, so envs drift out of step and spend
37.5 % of their time in resets, as 20 frames/s with 30 s resets every 1000 steps would. 4 rollout worker
processes each run the real ``RolloutLoop`` over 16 of them with the default config's policy (recurrent, batched
inference); fragments are dropped instead of sent, so what is measured is the rollout side (the replay path has
``bench/cluster_transport.py``).

The figure is rollout env steps/s divided by the ideal, 64 envs x 50 steps/s x (1 - 0.375) = 2000: the share of
the envs' own speed that the workers keep. Rows: ``batch_size`` 8 and 16 (== num_envs, MineStudio's examples'
choice) with one env per process; the same with 1 and 2 workers (16 and 32 envs), where the rollout has cores to
spare, which 64 env processes and 4 workers do not leave on 2; 8 envs per process (what ``envs_per_process: 0``
picks for Crafter on 2 cores), to decide how latency-bound envs are grouped; one env in 16 hanging until ``step_timeout`` (5 s) at any time;
360x640x3 frames (MineStudio's native size, through shared memory: ``craftrl/envs/shared_frames.py``), which
the policy samples down to 64x64 in the worker; and the workers as craftrl's ``RolloutWorker`` Ray actors, two on
each of 2 simulated nodes (``ray.cluster_utils.Cluster``), instead of plain processes.

    .venv/bin/python bench/latency_bound.py [--seconds 20] [--warmup 6]

Writes bench/results/latency_bound.md; the last line is ``P7 latency_efficiency=<the lower of the two
batch-size rows>``.
"""

from __future__ import annotations

import argparse
import datetime
import multiprocessing
import sys
import time
from pathlib import Path

from machine import describe_machine, machine_busy_seconds
from headlines import finish, headline  # noqa: E402

RESULTS_DIR = Path(__file__).resolve().parent / "results"
WORKERS, ENVS_PER_WORKER = 4, 16
STEP_S, RESET_S, EPISODE_STEPS = 0.020, 1.2, 100
RESET_SHARE = RESET_S / (RESET_S + EPISODE_STEPS * STEP_S)
IDEAL_SPS = WORKERS * ENVS_PER_WORKER / STEP_S * (1 - RESET_SHARE)
STEP_TIMEOUT_S = 5.0
# per-step chance of a hang that lasts STEP_TIMEOUT_S plus a rebuild: about 1 env in 16 hung at any time
HANG_RATE = STEP_S / (15 * (STEP_TIMEOUT_S + RESET_S) * (1 - RESET_SHARE))

ROWS = {
    "batch 8 of 16, 1 env per process": dict(batch_size=8, envs_per_process=1),
    "batch 16 of 16, 1 env per process": dict(batch_size=16, envs_per_process=1),
    "batch 8 of 16, 1 env per process, 1 worker": dict(batch_size=8, envs_per_process=1, workers=1),
    "batch 8 of 16, 1 env per process, 2 workers": dict(batch_size=8, envs_per_process=1, workers=2),
    "batch 8 of 16, 8 envs per process": dict(batch_size=8, envs_per_process=8),
    "batch 8 of 16, 1 in 16 envs hung": dict(batch_size=8, envs_per_process=1, hang_rate=HANG_RATE),
    "batch 8 of 16, 360x640x3 frames": dict(batch_size=8, envs_per_process=1, obs_shape=(360, 640, 3)),
    "batch 8 of 16, Ray rollout workers on 2 simulated nodes": dict(batch_size=8, envs_per_process=1, ray=True),
}


def downsampling_policy(size: tuple[int, int]):
    """The default config's policy, sampling larger frames down to ``size`` (nearest pixel) before its encoder."""
    import torch

    from craftrl.configs.default import policy_generator

    policy = policy_generator()
    forward = policy.forward

    def forward_on_small_frames(input, state_in, first=None, **kwargs):  # noqa: A002 - the contract's name
        image = input["image"]
        if tuple(image.shape[2:4]) != size:
            rows = torch.linspace(0, image.shape[2] - 1, size[0], device=image.device).round().long()
            cols = torch.linspace(0, image.shape[3] - 1, size[1], device=image.device).round().long()
            input = dict(input, image=image.index_select(2, rows).index_select(3, cols))
        return forward(input, state_in, first, **kwargs)

    policy.forward = forward_on_small_frames
    return policy


def latency_env(row: dict):
    from craftrl.envs import env_generator

    return env_generator("synthetic/latency", step_latency_s=STEP_S, step_jitter=0.5, reset_latency_s=RESET_S,
                         reset_jitter=0.5, episode_length=EPISODE_STEPS, length_jitter=0.5,
                         obs_shape=row.get("obs_shape", (64, 64, 3)), hang_rate=row.get("hang_rate", 0.0))


def worker_main(conn, index: int, row: dict) -> None:
    """One rollout worker: build its loop, wait for the common start, count steps in the measured window."""
    import torch

    from craftrl.rollout.loop import RolloutLoop

    torch.set_num_threads(1)
    env = latency_env(row)
    emitted = []
    loop = RolloutLoop(env, downsampling_policy((64, 64)), num_envs=ENVS_PER_WORKER, batch_size=row["batch_size"],
                       fragment_length=32, emit=lambda fragment: emitted.append(1),
                       envs_per_process=row["envs_per_process"], step_timeout=STEP_TIMEOUT_S, reset_timeout=60.0,
                       seed=index, worker_name=f"w{index}", max_batch_wait=row["max_batch_wait"])
    conn.send("built")
    start, end = conn.recv()
    try:
        while time.monotonic() < start:
            loop.step(timeout=0.5)
        before = loop.stats()
        steps = 0
        while time.monotonic() < end:
            steps += loop.step(timeout=0.5)
        after = loop.stats()
        conn.send({"steps": steps, "seconds": time.monotonic() - start,
                   "forward_passes": after["forward_passes"] - before["forward_passes"],
                   "inference_s": after["inference_s"] - before["inference_s"],
                   "restarts": after["restarts"] - before["restarts"]})
    finally:
        loop.close()


def run_row(row: dict, warmup: float, seconds: float, workers: int = WORKERS) -> dict:
    context = multiprocessing.get_context("spawn")
    pipes, processes = [], []
    for index in range(workers):
        parent, child = context.Pipe()
        process = context.Process(target=worker_main, args=(child, index, row))
        process.start()
        pipes.append(parent)
        processes.append(process)
    for pipe in pipes:
        assert pipe.recv() == "built"
    start = time.monotonic() + warmup
    for pipe in pipes:
        pipe.send((start, start + seconds))
    time.sleep(max(0.0, start - time.monotonic()))
    busy = machine_busy_seconds()
    results = [pipe.recv() for pipe in pipes]
    cores = (machine_busy_seconds() - busy) / max(time.monotonic() - start, 1e-9)
    for process in processes:
        process.join(60)
    return row_result(sum(r["steps"] for r in results), max(r["seconds"] for r in results), workers, cores,
                      sum(r["forward_passes"] for r in results), sum(r["inference_s"] for r in results),
                      sum(r["restarts"] for r in results))


def row_result(steps: float, measured: float, workers: int, cores: float, forward_passes: float,
               inference_s: float, restarts: float) -> dict:
    """A row's figures from the workers' totals over the measured window."""
    ideal = IDEAL_SPS * workers / WORKERS
    return {"sps": steps / measured, "efficiency": steps / measured / ideal, "ideal": ideal, "cores": cores,
            "group": steps / max(forward_passes, 1), "inference_ms": 1000 * inference_s / max(steps, 1),
            "restarts": int(restarts)}


class DroppingSink:
    """The Ray workers' fragment sink: drops fragments, as the plain-process rows do."""

    def open(self) -> None:
        pass

    def send(self, fragments: list) -> None:
        pass

    def close(self) -> None:
        pass


def run_ray_row(row: dict, warmup: float, seconds: float, workers: int) -> dict:
    """The same workload through craftrl's ``RolloutWorker`` actors (their rollout and sender threads), two per
    simulated node (``ray.cluster_utils.Cluster``: a raylet each, on this machine)."""
    import functools
    import os

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import ray
    from ray.cluster_utils import Cluster

    from craftrl.config import build_config
    from craftrl.config.loading import config_to_dict
    from craftrl.rollout.worker import RolloutWorker

    worker_config = {"num_envs": ENVS_PER_WORKER, "batch_size": row["batch_size"],
                     "envs_per_process": row["envs_per_process"], "step_timeout": STEP_TIMEOUT_S,
                     "reset_timeout": 60.0, "max_batch_wait": row["max_batch_wait"]}
    config = config_to_dict(build_config({"rollout_config": {
        "num_rollout_workers": workers, "num_cpus_per_worker": 1, "fragment_length": 32,
        "worker_config": worker_config}}))
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    for _ in range(2):
        cluster.add_node(num_cpus=-(-workers // 2), resources={"rollout_node": 1})
    cluster.wait_for_nodes()
    ray.init(address=cluster.address)
    try:
        actor = ray.remote(RolloutWorker).options(num_cpus=1, max_concurrency=4)
        handles = [actor.remote(f"w{index}", latency_env(row), functools.partial(downsampling_policy, (64, 64)),
                                config, DroppingSink(), None, index) for index in range(workers)]
        ray.get([handle.status.remote() for handle in handles])  # built: envs started, first resets asked
        time.sleep(warmup)
        busy = machine_busy_seconds()
        started = time.monotonic()
        before = ray.get([handle.status.remote() for handle in handles])
        time.sleep(seconds)
        after = ray.get([handle.status.remote() for handle in handles])
        measured = time.monotonic() - started
        cores = (machine_busy_seconds() - busy) / measured
        nodes = {status["node"] for status in after}
        assert len(nodes) == 2, f"expected the workers on 2 nodes, got {len(nodes)}"
        ray.get([handle.stop.remote() for handle in handles])
    finally:
        ray.shutdown()
        cluster.shutdown()

    def delta(key: str) -> float:
        return sum(a[key] - b[key] for a, b in zip(after, before))

    return row_result(delta("env_steps"), measured, workers, cores, delta("forward_passes"), delta("inference_s"),
                      delta("restarts"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="measured window per row")
    parser.add_argument("--warmup", type=float, default=6.0, help="seconds before it (first resets, drift)")
    parser.add_argument("--rows", nargs="*", default=list(ROWS), help="which rows (default: all)")
    parser.add_argument("--workers", type=int, default=WORKERS, help="rollout workers of 16 envs each, where the "
                        "row does not say")
    parser.add_argument("--results-name", default="latency_bound",
                        help="the results file bench/results/NAME.md to rewrite (another name for another machine kind)")
    parser.add_argument("--max-batch-wait", type=float, default=None,
                        help="worker_config.max_batch_wait (default: the schema's default)")
    args = parser.parse_args()
    from craftrl.config.schema import WorkerConfig

    wait = WorkerConfig().max_batch_wait if args.max_batch_wait is None else args.max_batch_wait
    results = {}
    for name in args.rows:
        row = dict(ROWS[name], max_batch_wait=wait)
        run = run_ray_row if row.get("ray") else run_row
        results[name] = run(row, args.warmup, args.seconds, row.get("workers", args.workers))
        r = results[name]
        print(f"{name}: {r['sps']:.0f} env steps/s = {r['efficiency']:.3f} of the ideal {r['ideal']:.0f}; "
              f"{r['group']:.1f} envs per forward pass, inference {r['inference_ms']:.3f} ms per step, "
              f"{r['restarts']} env restarts, {r['cores']:.2f} cores busy", flush=True)
    command = "python bench/latency_bound.py " + " ".join(sys.argv[1:])
    lines = [
        "## Latency-bound envs (P7): rollout env steps/s against the envs' own speed", "",
        f"`{command.strip()}`, {datetime.date.today().isoformat()}, {describe_machine()}. {args.workers} worker "
        f"processes x {ENVS_PER_WORKER} envs of `synthetic/latency` (steps 20 ms +-50 %, episodes 50-150 steps, "
        f"resets 0.6-1.8 s: {RESET_SHARE:.1%} of the time), default policy, {args.seconds:.0f} s measured after "
        f"{args.warmup:.0f} s, `max_batch_wait` {wait * 1000:g} ms. Ideal: {IDEAL_SPS * args.workers / WORKERS:.0f} env "
        "steps/s.", "",
        "| row | env steps/s | of the ideal | envs per forward pass | inference ms per step | env restarts "
        "| cores busy (all processes) |",
        "|---|---:|---:|---:|---:|---:|---:|",
        *[f"| {name} | {r['sps']:.0f} | {r['efficiency']:.3f} | {r['group']:.1f} | {r['inference_ms']:.3f} "
          f"| {r['restarts']} | {r['cores']:.2f} |" for name, r in results.items()],
        "",
    ]
    first_two = [results[name]["efficiency"] for name in list(ROWS)[:2] if name in results]
    finish(RESULTS_DIR / f"{args.results_name}.md", "\n".join(lines),
           [headline("P7", "latency_efficiency", min(first_two, default=float("nan")), 3,
                     f"share of the envs' own speed, {args.workers * ENVS_PER_WORKER} envs on {args.workers} workers, "
                     f"the lower of the first two rows; {describe_machine()}")])


if __name__ == "__main__":
    main()
