"""Seconds of learner compute per PPO iteration of ``craftrl.configs.crafter_score``, under each CPU speed-up.

Why: on 2 cores the Crafter score is bounded by how much network the learner can afford per env step
(issue 76). This measures, on the machine at hand, what each standard CPU speed-up saves on one iteration of
that config, against the config as it runs today (``cpu_bf16`` 'auto', which times both precisions on its first
iteration and keeps the faster):

* ``float32``: the policy's input arrives NHWC, so its convolutions already run channels-last; in lock-step the
  learner takes the fragments' own values and log-probs instead of evaluating every step, as a run does;
* ``float32, evaluating every step``: that evaluation pass run all the same, to show what skipping it saves;
* ``float32, NCHW input``: the frames made NCHW-contiguous before the first convolution, to show what the
  channels-last layout is worth;
* ``bf16``: ``cpu_bf16`` on (bf16 autocast; only with native bf16 instructions);
* ``float32 + torch.compile`` and ``bf16 + torch.compile``: the encoder and the wide layer compiled by
  TorchInductor, from an empty compile cache (compile time shows in the warm-up's seconds, not in the
  iteration's).

The optimiser is torch's fused AdamW in every variant (``craftrl.train.learner.make_optimizer``).

The iteration is the real ``PPOLearner.iteration`` on real fragments: the config's policy acts on its env through
``RolloutLoop`` until one iteration's worth of fragments is cut, then every variant trains on them from the same
initial weights. Torch gets the learner's threads (``train_config.num_cpus_per_worker``), as in a run.

    .venv/bin/python bench/score_learner.py [--repeats 5] [--write-results]

Last lines: ``P6 score_learner_today_speedup=<float32 seconds / today's>`` and
``P6 score_learner_compile_speedup=<bf16 seconds / bf16 + torch.compile's>``.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import datetime
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Callable

os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="score_learner_inductor_")  # compile from scratch
import torch  # noqa: E402

from craftrl.configs import crafter_score  # noqa: E402
from craftrl.train.learner import PPOLearner  # noqa: E402
from craftrl.utils.hardware import native_cpu_bf16_flags  # noqa: E402
from headlines import finish, headline  # noqa: E402  (bench scripts share helpers by plain import)
from learner_step import one_iteration_of  # noqa: E402
from machine import describe_machine  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "score_learner.md"
TODAY = "today's config"


def nchw_input(policy: torch.nn.Module) -> torch.nn.Module:
    """The policy with its first convolution's input made NCHW-contiguous (the layout channels-last replaces)."""
    policy.encoder.tile.register_forward_pre_hook(lambda module, args: (args[0].contiguous(),))
    return policy


def compiled(policy: torch.nn.Module) -> torch.nn.Module:
    policy.encoder = torch.compile(policy.encoder)
    policy.mlp = torch.compile(policy.mlp)
    return policy


def time_variant(policy: torch.nn.Module, prepare: Callable[[torch.nn.Module], torch.nn.Module], train, fragments,
                 repeats: int, evaluate_every_step: bool = False) -> tuple[float, float, bool]:
    """(median seconds of ``repeats`` iterations after a warm-up, the warm-up's seconds, whether it ran in bf16).
    Each iteration trains the version that acted, as in lock-step, on weights sent in float32 as a run sends them."""
    learner = PPOLearner(prepare(copy.deepcopy(policy)), train, torch.device("cpu"),
                         acted_with_exact_weights=not evaluate_every_step)
    version = fragments[0].min_version
    times = []
    for number in range(repeats + 1):
        started = time.perf_counter()
        learner.iteration(fragments, train.whole_batch_iterations, version, torch.Generator().manual_seed(number))
        times.append(time.perf_counter() - started)
    return statistics.median(times[1:]), times[0], learner.use_cpu_bf16


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--write-results", action="store_true", help="rewrite bench/results/score_learner.md")
    args = parser.parse_args()
    train, policy, fragments = one_iteration_of(crafter_score, crafter_score.env_generator)
    load_before = os.getloadavg()[0]
    float32, bf16 = dataclasses.replace(train, cpu_bf16=False), dataclasses.replace(train, cpu_bf16=True)
    variants = {TODAY: (train, lambda p: p), "float32": (float32, lambda p: p),
                "float32, evaluating every step": (float32, lambda p: p),
                "float32, NCHW input": (float32, nchw_input), "bf16": (bf16, lambda p: p),
                "float32 + torch.compile": (float32, compiled), "bf16 + torch.compile": (bf16, compiled)}
    measured, failed, seconds, today_in_bf16 = [], [], {}, False
    for name, (config, prepare) in variants.items():
        try:
            median, first, in_bf16 = time_variant(policy, prepare, config, fragments, args.repeats,
                                                  evaluate_every_step=name == "float32, evaluating every step")
        except Exception as error:  # torch.compile needs a working C++ toolchain; say so rather than stop
            failed.append(f"| {name} | failed: {type(error).__name__}: {str(error).splitlines()[0][:120]} | | |")
            continue
        seconds[name] = median
        if config is train:
            today_in_bf16 = in_bf16
            name = f"{name} (cpu_bf16 {train.cpu_bf16!r}: {'bf16' if in_bf16 else 'float32'})"
        elif "bf16" in name and not in_bf16:
            name += " (ran in float32)"
        measured.append((name, median, first))
    rows = [f"| {name} | {median:.2f} | {seconds['float32'] / median:.2f} | {first:.1f} |"
            for name, median, first in measured] + failed
    steps = sum(len(f.reward) for f in fragments)
    fastest = min(seconds, key=seconds.get)
    lines = [
        "## Learner compute per iteration of the Crafter-score config (`bench/score_learner.py`)", "",
        f"`python bench/score_learner.py --repeats {args.repeats}`, {datetime.date.today().isoformat()}, "
        f"{describe_machine()}, {torch.get_num_threads()} torch threads, torch {torch.__version__}, load average "
        f"{load_before:.1f} at start, native CPU bf16: {', '.join(native_cpu_bf16_flags()) or 'none'}.", "",
        f"One iteration of `craftrl.configs.crafter_score` ({steps} env steps in {len(fragments)} fragments, "
        f"{train.epochs_per_iteration} epochs of {train.batches_per_iteration} minibatches), median of "
        f"{args.repeats} after a warm-up; the warm-up's seconds include torch.compile's compiling:", "",
        "| variant | seconds per iteration | speed-up over float32 | warm-up seconds |", "|---|---:|---:|---:|",
        *rows, "", f"Fastest: {fastest}.", "",
        *([f"Today's config ran in bf16 here, the same computation as the `bf16` row: the gap between those two "
           f"rows ({abs(seconds[TODAY] - seconds['bf16']) / seconds['bf16']:.0%}) is this measurement's noise.", ""]
          if today_in_bf16 and "bf16" in seconds else []),
    ]
    text = "\n".join(lines)
    print(text)
    figures = [headline("P6", "score_learner_today_speedup", seconds["float32"] / seconds[TODAY], 2,
                        "float32 learner seconds per iteration over today's config's"),
               headline("P6", "score_learner_compile_speedup",
                        seconds["bf16"] / seconds.get("bf16 + torch.compile", float("nan")), 2,
                        "bf16 learner seconds per iteration over bf16 with torch.compile's")]
    finish(RESULTS if args.write_results else None, text, figures)


if __name__ == "__main__":
    main()
