"""Benchmark (GPU): a VPT-2x-sized policy's rollout inference frames/s and learner samples/s, fp16 autocast on and off.

The policy is craftrl's VPT-2x (248.5 M parameters) with random weights, on the first CUDA device. Inference:
``policy.act`` on ``--envs`` 128x128 frames per call with the recurrent state carried, as a rollout worker on a
GPU calls it. Learner: ``PPOLearner.iteration`` (the run's PPO step: re-evaluation, GAE, epochs of minibatches,
AdamW) on fragments the same policy acted, ``train_config.use_amp`` off and on. TF32 stays at torch's default.
Writes bench/results/gpu_vpt.md; the last line is ``P8 vpt2x_learner_samples_per_s=<use_amp on>``.

    python bench/gpu_vpt.py [--envs 8] [--fragment-length 32] [--fragments 8]
    python bench/gpu_vpt.py --smoke     # the same code paths with a tiny VPT on the CPU; writes no results
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

from machine import describe_machine
from headlines import finish, headline  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "gpu_vpt.md"


def frames(rng: np.random.Generator, count: int) -> torch.Tensor:
    return torch.from_numpy(rng.integers(0, 256, (count, 1, 128, 128, 3), dtype=np.uint8))


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def inference_fps(policy, envs: int, steps: int, amp: bool) -> float:
    rng = np.random.default_rng(0)
    device = policy.device
    state = policy.initial_state(envs)
    first = torch.zeros(envs, 1, dtype=torch.bool, device=device)
    images = [frames(rng, envs).to(device) for _ in range(4)]
    with torch.no_grad(), torch.autocast(device.type, dtype=torch.float16, enabled=amp):
        for step in range(steps + 5):
            if step == 5:  # after warm-up
                sync(device)
                started = time.perf_counter()
            result = policy.act({"image": images[step % 4]}, state, first)
            state = result.state_out
            result.logp.cpu()  # a worker needs the numbers on the host every step
    sync(device)
    return envs * steps / (time.perf_counter() - started)


def acted_fragments(policy, count: int, length: int) -> list:
    """``count`` fragments of ``length`` steps that ``policy`` acted on random frames (episodes of 50 steps)."""
    from craftrl.policies.state import split_state, state_to_numpy, tree_map
    from craftrl.rollout.cutter import FragmentCutter

    rng = np.random.default_rng(1)
    cutters = [FragmentCutter(f"env{i}", length) for i in range(count)]
    state = policy.initial_state(count)
    first = np.ones(count, dtype=bool)
    fragments, t = [], 0
    with torch.no_grad():
        while len(fragments) < count:
            images = frames(rng, count)
            out = policy.act({"image": images.to(policy.device)}, state,
                             torch.from_numpy(first)[:, None].to(policy.device))
            states_in = split_state(state_to_numpy(state), count)
            actions = tree_map(lambda a: a[:, 0].cpu().numpy(), out.action)
            for i, cutter in enumerate(cutters):
                closed = cutter.begin_step({"image": images[i, 0].numpy()}, bool(first[i]),
                                           tree_map(lambda a: a[i], actions), float(out.logp[i, 0]),
                                           float(out.value[i, 0]), 0, lambda s=states_in[i]: s)
                if closed is not None:
                    fragments.append(closed)
                else:
                    cutter.end_step(float(rng.random() < 0.1), terminated=(t + 1) % 50 == 0, truncated=False)
            first = np.full(count, (t + 1) % 50 == 0)
            state, t = out.state_out, t + 1
    return fragments


def learner_samples_per_s(policy, fragments: list, amp: bool, repeats: int) -> tuple[float, float]:
    """(median samples/s over ``repeats`` iterations after one warm-up, peak GPU memory in GB)."""
    from craftrl.config.validate import build_config
    from craftrl.train.learner import PPOLearner

    length = fragments[0].length
    config = build_config({"rollout_config": {"fragment_length": length},
                           "train_config": {"batch_size_per_gpu": len(fragments) // 2, "epochs_per_iteration": 1,
                                            "context_length": min(length, 32), "use_amp": amp}}).train_config
    device = policy.device
    learner = PPOLearner(policy, config, device)
    generator = torch.Generator().manual_seed(0)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    rates = []
    for iteration in range(repeats + 1):
        sync(device)
        started = time.perf_counter()
        metrics = learner.iteration(fragments, iteration, 0, generator)
        sync(device)
        if iteration:
            rates.append(metrics["data/env_steps"] / (time.perf_counter() - started))
    return statistics.median(rates), torch.cuda.max_memory_allocated() / 1e9 if device.type == "cuda" else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--envs", type=int, default=8)
    parser.add_argument("--fragment-length", type=int, default=32)
    parser.add_argument("--fragments", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--smoke", action="store_true",
                        help="a tiny VPT on the CPU: checks the script, measures nothing")
    args = parser.parse_args()
    if not args.smoke and not torch.cuda.is_available():
        print("gpu_vpt.py: no CUDA device; nothing measured", file=sys.stderr)
        sys.exit(1)
    from craftrl.policies.vpt import VPT_2X, VPTPolicy, vpt_tiny

    torch.manual_seed(0)
    policy = vpt_tiny() if args.smoke else VPTPolicy(VPT_2X).to("cuda")
    parameters = sum(p.numel() for p in policy.parameters())
    rows = {}
    for amp in (False, True) if not args.smoke else (False,):
        rows[amp] = {"fps": inference_fps(policy.eval(), args.envs, 50, amp)}
        print(f"use_amp={amp}: inference {rows[amp]['fps']:.0f} frames/s", flush=True)
    fragments = acted_fragments(policy.eval(), args.fragments, args.fragment_length)
    initial = {k: v.clone() for k, v in policy.state_dict().items()}
    for amp in rows:
        policy.load_state_dict(initial)
        rows[amp]["samples"], rows[amp]["memory"] = learner_samples_per_s(policy.train(), fragments, amp,
                                                                           args.repeats)
        print(f"use_amp={amp}: learner {rows[amp]['samples']:.0f} samples/s, peak {rows[amp]['memory']:.1f} GB",
              flush=True)
    if args.smoke:
        return
    command = "python bench/gpu_vpt.py " + " ".join(sys.argv[1:])
    lines = [
        "## VPT-2x on a GPU: rollout inference and learner throughput (P8)", "",
        f"`{command.strip()}`, {datetime.date.today().isoformat()}, {torch.cuda.get_device_name(0)}, torch "
        f"{torch.__version__}, host {describe_machine()}. VPT-2x with random weights ({parameters / 1e6:.1f} M "
        f"parameters), 128x128 frames. Inference: `policy.act` on {args.envs} envs per call, state carried. "
        f"Learner: `PPOLearner.iteration` on {args.fragments} fragments of {args.fragment_length} steps "
        f"(batches of {args.fragments // 2}, 1 epoch, context {min(args.fragment_length, 32)}), median of "
        f"{args.repeats} after a warm-up.", "",
        "| use_amp | inference frames/s | learner samples/s | learner peak GPU memory GB |", "|---|---:|---:|---:|",
        *[f"| {'on (fp16)' if amp else 'off (fp32)'} | {row['fps']:.0f} | {row['samples']:.0f} | {row['memory']:.1f} |"
          for amp, row in rows.items()], ""]
    finish(RESULTS, "\n".join(lines), [headline("P8", "vpt2x_learner_samples_per_s", rows[True]["samples"], 0,
                                                 f"use_amp on, {torch.cuda.get_device_name(0)}")])


if __name__ == "__main__":
    main()
