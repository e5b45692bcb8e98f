"""Benchmark: single-step batched CPU inference of the built-in policies (what a rollout worker does).

Measures ``policy.act`` on a batch of 8 env slots, one time step per call, recurrent state carried, with
torch limited to ``--threads`` intra-op threads (default 2: the CPU budget of a small rollout worker). The
first row is the default config's policy; the others are the library's other built-ins. Reports the median
over repeats, and rewrites bench/results/policy_inference.md; the last printed line is
``P0 policy_inference_fps=<default config's policy, frames/s>``.

    .venv/bin/python bench/policy_inference.py [--threads 2] [--seconds 2] [--repeats 5]
"""
from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys
import time
from pathlib import Path

import torch

from craftrl.configs import default as default_config
from craftrl.policies import default_policy_generator, mlp_policy_generator

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import describe_machine  # noqa: E402  (bench scripts share helpers by plain import)
from headlines import finish, headline  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "policy_inference.md"


def _candidates():
    yield "default config's policy (configs/default.py)", default_config.policy_generator, "image", (64, 64, 3)
    yield "default_policy_generator() (Impala CNN + LSTM)", default_policy_generator, "image", (64, 64, 3)
    yield "mlp (CartPole)", lambda: mlp_policy_generator(obs_dim=4, num_actions=2), "vector", (4,)
    try:
        from craftrl.policies.vpt import vpt_tiny
    except ImportError:
        return
    yield "vpt_tiny", vpt_tiny, "image", (128, 128, 3)


def _measure(policy, key: str, shape: tuple[int, ...], batch: int, seconds: float, repeats: int) -> list[float]:
    if key == "image":
        obs = {key: torch.randint(0, 256, (batch, 1, *shape), dtype=torch.uint8)}
    else:
        obs = {key: torch.randn(batch, 1, *shape)}
    first = torch.zeros(batch, 1, dtype=torch.bool)
    state = policy.initial_state(batch)
    rates = []
    with torch.inference_mode():
        for _ in range(20):  # warm-up: allocator, oneDNN kernel selection
            state = policy.act(obs, state, first).state_out
        for _ in range(repeats):
            calls, start = 0, time.perf_counter()
            while time.perf_counter() - start < seconds:
                state = policy.act(obs, state, first).state_out
                calls += 1
            rates.append(calls * batch / (time.perf_counter() - start))
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    load_before = os.getloadavg()[0]
    rows, p0 = [], None
    for name, build, key, shape in _candidates():
        policy = build().eval()
        params = sum(p.numel() for p in policy.parameters())
        rates = _measure(policy, key, shape, args.batch, args.seconds, args.repeats)
        median = statistics.median(rates)
        p0 = median if p0 is None else p0
        rows.append((name, params, median, min(rates), max(rates)))
        print(f"{name:32s} params={params / 1e6:6.2f}M  median={median:8.0f} frames/s  "
              f"(min {min(rates):.0f}, max {max(rates):.0f})", flush=True)

    command = "python bench/policy_inference.py " + " ".join(
        f"--{k} {v}" for k, v in vars(args).items())
    lines = [
        "## Policy inference on CPU (`bench/policy_inference.py`)", "",
        f"`{command}`, {datetime.date.today().isoformat()}, {describe_machine()}, torch {torch.__version__}, "
        f"{args.threads} torch threads; 1-minute load average {load_before:.2f} before, "
        f"{os.getloadavg()[0]:.2f} after (above {os.cpu_count() - 1} the run shared its cores).", "",
        f"`policy.act` on a batch of {args.batch} env slots, one step per call, recurrent state carried; median, "
        f"min and max frames/s over {args.repeats} windows of {args.seconds:g} s. Target: the default config's "
        "policy >= 1000 frames/s.", "",
        "| policy | params | median frames/s | min | max |", "|---|---|---|---|---|",
    ]
    lines += [f"| {n} | {p / 1e6:.2f} M | {m:.0f} | {lo:.0f} | {hi:.0f} |" for n, p, m, lo, hi in rows]
    finish(RESULTS, "\n".join(lines), [headline("P0", "policy_inference_fps", p0, 0,
                                                 f"the default config's policy, batch {args.batch}, "
                                                 f"{args.threads} threads")])


if __name__ == "__main__":
    main()
