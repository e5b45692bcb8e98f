"""P1 sampler efficiency: rollout steps/s with the default config's policy acting / raw random-action steps/s.

Both sides use the same number of supervised env processes (``EnvPool``) on ``crafter/cows``, in one run,
alternating raw and rollout windows so that machine noise hits both alike. The rollout side is the real
``RolloutLoop`` (batched inference of the default config's policy, recurrent state per env if it has one,
fragment cutting); fragments are dropped instead of sent, so what is measured is the sampler, not the replay
path. The ratio says what the sampler costs on top of the env itself.

    .venv/bin/python bench/sampler.py [--envs 8] [--batch-size 4] [--envs-per-process 0] [--seconds 10] [--rounds 3]

Env count, group size and envs per process default to the default config's (craftrl/configs/default.py).

Last line: ``P1 sampler_efficiency=<rollout sps / raw sps>``.
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

from craftrl.envs import EnvPool, env_generator
from craftrl.configs import default as default_config
from craftrl.testing.counting_policy import CountingPolicy
from craftrl.rollout.loop import RolloutLoop

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import describe_machine  # noqa: E402  (bench scripts share helpers by plain import)
from headlines import finish, headline  # noqa: E402

RESULTS_DIR = Path(__file__).resolve().parent / "results"
TASK = "crafter/cows"


def raw_steps_per_s(pool: EnvPool, seconds: float, rng: np.random.Generator) -> float:
    """Answer every result immediately with a random action: the env-only ceiling."""
    results = pool.recv(pool.num_envs)
    steps, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        pool.send([r.env_index for r in results], [int(a) for a in rng.integers(17, size=len(results))])
        results = pool.recv(1)
        steps += len(results)
    elapsed = time.perf_counter() - started
    pending = pool.num_envs - len(results)
    if pending:
        results += pool.recv(pending)
    pool.send([r.env_index for r in results], [0] * len(results))  # leave every env with one request, as found
    return steps / elapsed


def rollout_steps_per_s(loop: RolloutLoop, seconds: float) -> float:
    steps, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        steps += loop.step()
    return steps / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    worker = default_config.online_dict["rollout_config"]["worker_config"]
    parser.add_argument("--envs", type=int, default=worker["num_envs"])
    parser.add_argument("--batch-size", type=int, default=worker["batch_size"])
    parser.add_argument("--envs-per-process", type=int, default=worker.get("envs_per_process", 1),
                        help="0: as the rollout worker picks it (about one env process per core)")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch threads for inference")
    parser.add_argument("--policy", choices=("default", "counting"), default="default",
                        help="'counting' is a no-compute policy: it measures the sampler's own overhead")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rng = np.random.default_rng(0)
    generator = env_generator(TASK)
    dropped: list[int] = []
    policy = default_config.policy_generator() if args.policy == "default" else CountingPolicy(17)
    parameters = sum(p.numel() for p in policy.parameters())
    loop = RolloutLoop(generator, policy, num_envs=args.envs, batch_size=args.batch_size,
                       fragment_length=256, emit=lambda fragment: dropped.append(fragment.length),
                       envs_per_process=args.envs_per_process)
    raw_pool = EnvPool(generator, args.envs, reset_timeout_s=120, envs_per_process=loop.envs_per_process)
    raw_pool.reset_all()
    # warm up both (process start-up and first forward passes are not part of the steady state)
    raw_steps_per_s(raw_pool, 2.0, rng)
    rollout_steps_per_s(loop, 2.0)
    raw, rollout = [], []
    load_before = os.getloadavg()[0]
    for _ in range(args.rounds):
        raw.append(raw_steps_per_s(raw_pool, args.seconds, rng))
        rollout.append(rollout_steps_per_s(loop, args.seconds))
    timers = loop.timers.as_dict()
    raw_pool_processes = len(raw_pool.process_ids())
    loop.close()
    raw_pool.close()
    ratios = [r / w for r, w in zip(rollout, raw)]
    efficiency = statistics.median(ratios)
    busy = timers["inference_s"] / max(timers["elapsed_s"], 1e-9)
    lines = [
        f"## Sampler efficiency, P1 (`bench/sampler.py`, {args.policy} policy)",
        "",
        f"`python bench/sampler.py --envs {args.envs} --batch-size {args.batch_size} "
        f"--envs-per-process {args.envs_per_process} "
        f"--seconds {args.seconds:g} --rounds {args.rounds} --threads {args.threads} --policy {args.policy}`, "
        f"{datetime.date.today().isoformat()}, {describe_machine()}, load average {load_before:.1f} at start.",
        "",
        f"Task `{TASK}`, {args.envs} envs in {raw_pool_processes} env processes on both sides, "
        + (f"the default config's policy ({type(policy.encoder).__name__} + {policy.core.kind.upper() if policy.core else 'no'} "
           f"core, {parameters / 1e6:.2f} M parameters)" if args.policy == "default"
           else "a no-compute counting policy (sampler overhead only)")
        + f" acting in groups of {args.batch_size}; raw and rollout windows of {args.seconds:g} s alternate.",
        "",
        "| round | raw env steps/s | rollout steps/s | ratio |",
        "|---|---:|---:|---:|",
        *[f"| {i + 1} | {r:.0f} | {w:.0f} | {q:.2f} |" for i, (r, w, q) in enumerate(zip(raw, rollout, ratios))],
        "",
        f"Median ratio **{efficiency:.2f}**. The rollout loop spent {busy:.0%} of its time in inference "
        f"(forward + sampling) and the rest waiting for env results.",
        "",
    ]
    suffix = "" if args.policy == "default" else f"_{args.policy}"
    print("\n".join(lines))
    finish(RESULTS_DIR / f"sampler{suffix}.md", "\n".join(lines),
           [headline("P1", "sampler_efficiency", efficiency, 2,
                     f"rollout over raw env steps/s, {args.policy} policy, {args.envs} envs in groups of {args.batch_size}")])


if __name__ == "__main__":
    main()
