"""Benchmark: raw env steps/s with uniformly random actions, resets included.

Measures one env stepped in this process, then ``EnvPool`` with N = 1, 2, 4 env processes driven the
way a rollout worker drives them (answer each result with a new action as soon as it arrives). The
pool figures include the pipe round trips and the supervision, so N=1 in a process vs in-process
shows the process overhead, and N=2 vs N=1 shows how well the cores are used. Then 8 envs with 1, 2
and 4 envs per process (``envs_per_process``), with the CPU time all processes spent per env step:
what sharing a process saves in round trips. Writes a markdown section to
bench/results/env_throughput.md; its headline is ``P0 env_steps_per_s=<2-process figure>``.

    .venv/bin/python bench/env_throughput.py [--task crafter/cows] [--seconds 8]
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import time
from pathlib import Path

import numpy as np

from craftrl.envs import EnvPool, env_generator, make

sys.path.insert(0, str(Path(__file__).resolve().parent))
from headlines import finish, headline  # noqa: E402  (bench scripts share helpers by plain import)
from machine import describe_machine  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "env_throughput.md"
NUM_ACTIONS = 17


def in_process(task: str, seconds: float) -> tuple[float, int]:
    env = make(task, seed=0)
    rng = np.random.default_rng(0)
    env.reset()
    steps = episodes = 0
    started = time.perf_counter()
    while time.perf_counter() - started < seconds:
        _, _, terminated, truncated, _ = env.step(int(rng.integers(NUM_ACTIONS)))
        steps += 1
        if terminated or truncated:
            env.reset()
            episodes += 1
    env.close()
    return steps / (time.perf_counter() - started), episodes


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU of this process and of ``pids`` so far."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = time.process_time()
    for pid in pids:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / ticks
    return total


def in_pool(task: str, num_envs: int, seconds: float, envs_per_process: int = 1) -> tuple[float, int, float]:
    """Env steps/s, episodes ended, and CPU milliseconds (all processes) per env step."""
    rng = np.random.default_rng(0)
    with EnvPool(env_generator(task, seed=0), num_envs, step_timeout_s=60, reset_timeout_s=120,
                 envs_per_process=envs_per_process) as pool:
        pool.reset_all()
        results = pool.recv(num_envs)  # env start-up is not timed
        steps = episodes = 0
        pids = pool.process_ids()
        cpu_before = cpu_seconds(pids)
        started = time.perf_counter()
        while time.perf_counter() - started < seconds:
            pool.send([r.env_index for r in results], [int(a) for a in rng.integers(NUM_ACTIONS, size=len(results))])
            results = pool.recv(1)
            steps += len(results)
            episodes += sum(r.done for r in results)
        elapsed = time.perf_counter() - started
        cpu_ms_per_step = 1000 * (cpu_seconds(pids) - cpu_before) / steps
        pool.recv(num_envs - len(results))  # let the in-flight steps finish before closing
    return steps / elapsed, episodes, cpu_ms_per_step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--task", default="crafter/cows")
    parser.add_argument("--seconds", type=float, default=8.0)
    args = parser.parse_args()

    load_before = os.getloadavg()[0]
    rows = []
    rate, episodes = in_process(args.task, args.seconds)
    rows.append(("1 env, in-process", rate, episodes, None))
    print(f"in-process: {rate:.0f} steps/s ({episodes} episodes)", flush=True)
    pool_rates = {}
    for num_envs in (1, 2, 4):
        rate, episodes, cpu_ms = in_pool(args.task, num_envs, args.seconds)
        pool_rates[num_envs] = rate
        rows.append((f"EnvPool, {num_envs} env process{'es' if num_envs > 1 else ''}", rate, episodes, cpu_ms))
        print(f"{num_envs} processes: {rate:.0f} steps/s ({episodes} episodes)", flush=True)
    for envs_per_process in (1, 2, 4):
        rate, episodes, cpu_ms = in_pool(args.task, 8, args.seconds, envs_per_process)
        rows.append((f"EnvPool, 8 envs, {envs_per_process} per process", rate, episodes, cpu_ms))
        print(f"8 envs, {envs_per_process} per process: {rate:.0f} steps/s, {cpu_ms:.2f} CPU ms/step", flush=True)

    command = f".venv/bin/python bench/env_throughput.py --task {args.task} --seconds {args.seconds:g}"
    lines = [
        "## Env throughput (`bench/env_throughput.py`)",
        "",
        f"`{command}`, {datetime.date.today().isoformat()}, {describe_machine()}.",
        "",
        f"Task `{args.task}`, uniformly random actions, resets counted in the time, {args.seconds:g} s per row. "
        f"1-minute load average {load_before:.1f} before / {os.getloadavg()[0]:.1f} after: with other jobs on the "
        "machine, more env processes also win a larger share of the CPU, so N=4 can beat N=2 even on 2 cores.",
        "",
        "| setup | env steps/s | episodes ended | CPU ms per env step (all processes) |",
        "|---|---:|---:|---:|",
        *[f"| {name} | {rate:.0f} | {episodes} | {'' if cpu_ms is None else f'{cpu_ms:.2f}'} |"
          for name, rate, episodes, cpu_ms in rows],
        "",
    ]
    finish(RESULTS, "\n".join(lines), [headline("P0", "env_steps_per_s", pool_rates[2], 0,
                                                 f"`{args.task}`, random actions, 2 env processes")])


if __name__ == "__main__":
    main()
