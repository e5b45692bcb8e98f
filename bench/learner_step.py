"""Seconds of learner compute per PPO iteration of the default config: float32, ``cpu_bf16`` and the default's 'auto'.

Why: on 2 cores the learner and the env processes share the CPU, so every second the learner saves per
iteration goes back to stepping envs (BENCHMARKS.md, "Where the time goes"). Whether bf16 autocast saves any
depends on the CPU (native AVX512-BF16 or AMX, or emulation), so it is measured on the machine at hand; the
third column checks that 'auto', which times one pass of each on its first iteration, picks the faster.

The iteration is the real ``PPOLearner.iteration`` on real fragments: the default config's policy acts on
``crafter/cows`` through the ``RolloutLoop`` (8 env processes) until one iteration's worth of fragments is
cut, then each precision trains on copies of them, from the same initial weights, in both of the default
config's phases (one whole-batch minibatch per epoch, then sequence minibatches). Torch gets the learner's
threads (``train_config.num_cpus_per_worker``), as in a run.

    .venv/bin/python bench/learner_step.py [--repeats 3]

Last line: ``P0 learner_bf16_speedup=<float32 s / bf16 s, sequence-minibatch phase>``.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import datetime
import os
import statistics
import time
from pathlib import Path
from typing import Any, Callable

import torch

from craftrl.config.validate import build_config
from craftrl.configs import default as default_config
from craftrl.envs import env_generator
from craftrl.rollout.loop import RolloutLoop
from craftrl.train.learner import PPOLearner
from craftrl.utils.hardware import native_cpu_bf16_flags
from machine import describe_machine  # bench scripts share helpers by plain import (sys.path[0] is bench/)
from headlines import finish, headline  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "learner_step.md"
TASK = "crafter/cows"


def collect_fragments(policy: torch.nn.Module, count: int, length: int, num_envs: int, batch_size: int,
                      make_env: Callable[[], Any] | None = None) -> list:
    """``count`` fragments of ``length`` steps of ``make_env``'s env (the cows task by default), cut by the
    ``RolloutLoop`` with ``policy`` acting."""
    fragments: list = []
    loop = RolloutLoop(make_env or env_generator(TASK), policy, num_envs=num_envs, batch_size=batch_size,
                       fragment_length=length, emit=fragments.append)
    try:
        while len(fragments) < count:
            loop.step()
    finally:
        loop.close()
    return fragments[:count]


def one_iteration_of(config_module: Any, make_env: Callable[[], Any] | None = None) -> tuple[Any, torch.nn.Module, list]:
    """A config module's train config, its policy (seed 0) and one iteration's worth of fragments that policy cut,
    with torch given the learner's threads as in a run."""
    online = build_config(config_module.online_dict)
    train, worker = online.train_config, online.rollout_config.worker_config
    torch.set_num_threads(int(train.num_cpus_per_worker))
    torch.manual_seed(0)
    policy = config_module.policy_generator()
    count = train.batch_size_per_gpu * train.batches_per_iteration
    fragments = collect_fragments(policy, count, online.rollout_config.fragment_length, worker.num_envs,
                                  worker.batch_size, make_env)
    return train, policy, fragments


def seconds_per_iteration(policy: torch.nn.Module, config, fragments: list, iteration: int,
                          repeats: int) -> tuple[float, bool]:
    """Median wall seconds of ``repeats`` iterations (after one warm-up, which holds 'auto''s probe), each on the
    same fragments, and whether the learner computed in bf16."""
    learner = PPOLearner(copy.deepcopy(policy), config, torch.device("cpu"))
    times = []
    for number in range(repeats + 1):
        started = time.perf_counter()
        learner.iteration(fragments, iteration, iteration, torch.Generator().manual_seed(number))
        times.append(time.perf_counter() - started)
    return statistics.median(times[1:]), learner.use_cpu_bf16


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    train, policy, fragments = one_iteration_of(default_config)
    load_before = os.getloadavg()[0]
    phases = {"whole-batch (first iterations)": 0, "sequence minibatches (later)": train.whole_batch_iterations}
    rows, speedups = [], {}
    for phase, iteration in phases.items():
        fp32, _ = seconds_per_iteration(policy, dataclasses.replace(train, cpu_bf16=False), fragments, iteration,
                                        args.repeats)
        bf16, _ = seconds_per_iteration(policy, dataclasses.replace(train, cpu_bf16=True), fragments, iteration,
                                        args.repeats)
        auto, auto_chose_bf16 = seconds_per_iteration(policy, dataclasses.replace(train, cpu_bf16="auto"),
                                                      fragments, iteration, args.repeats)
        speedups[phase] = fp32 / bf16
        rows.append(f"| {phase} | {fp32:.2f} | {bf16:.2f} | {fp32 / bf16:.2f} | {auto:.2f} "
                    f"({'bf16' if auto_chose_bf16 else 'float32'}) |")
    steps = sum(len(f.reward) for f in fragments)
    lines = [
        "## Learner compute per iteration (`bench/learner_step.py`)", "",
        f"`python bench/learner_step.py --repeats {args.repeats}`, {datetime.date.today().isoformat()}, "
        f"{describe_machine()}, {torch.get_num_threads()} torch threads, load average {load_before:.1f} at start, "
        f"native CPU bf16: {', '.join(native_cpu_bf16_flags()) or 'none'}.", "",
        f"One iteration of the default config ({steps} env steps of `{TASK}` in {len(fragments)} fragments, "
        f"{train.epochs_per_iteration} epochs), median of {args.repeats} after a warm-up, seconds:", "",
        "| phase | float32 | cpu_bf16 | speed-up | 'auto' (its choice) |", "|---|---:|---:|---:|---:|", *rows, "",
        *([] if native_cpu_bf16_flags() else
          ["This CPU has no native bf16, so the learner ignores cpu_bf16: every column ran in float32.", ""]),
    ]
    print("\n".join(lines))
    finish(RESULTS, "\n".join(lines), [headline("P0", "learner_bf16_speedup", speedups["sequence minibatches (later)"], 2,
                                                 "float32 seconds over cpu_bf16 seconds per iteration")])


if __name__ == "__main__":
    main()
