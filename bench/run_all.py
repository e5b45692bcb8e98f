"""Run every benchmark script and rebuild BENCHMARKS.md from their result sections.

Each script writes its own section to bench/results/<name>.md (with the command that produced it) and
prints its headline as its last line, ``P<n> <name>=<value>``. This runner only orchestrates: it runs the
scripts one after another (never in parallel: they would share the 2 cores and skew each other) and
concatenates the sections under a header with the machine and date.
"""

from __future__ import annotations

import argparse
import datetime
import os
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
# Order matters only for reading: raw env speed first, then the parts, then end-to-end comparisons.
SCRIPTS = [["env_throughput.py"], ["policy_inference.py"], ["learner_step.py"], ["replay_bytes.py"],
           ["sampler.py", "--policy", "counting"], ["sampler.py"],
           ["latency_bound.py"],  # 64 Minecraft-timed envs: about 4 minutes
           # simulated clusters on this machine: fragments into the buffer, a VPT-2x policy out to 4 nodes (~12 GB)
           ["cluster_transport.py"], ["weight_broadcast.py", "--versions", "6"],
           ["weight_broadcast.py", "--versions", "6", "--weights-dtype", "float16"],
           ["slow_link.py"],  # a node behind a 20 Mbit/s link (network namespaces: root only): about 10 minutes
           ["gpu_vpt.py"],  # GPU only: skipped without CUDA
           # learning runs, each on 3 seeds drawn at random when it starts (bench/seeds.py): about 5 minutes and
           # then 3 x 20 minutes
           ["cartpole_steps.py", "--write-results"],
           ["time_to_cows.py", "--minutes", "20", "--write-results"],
           # LONG, ~1 h on 2 cores: craftrl and RLlib PPO side by side on 10 seeds drawn at random, each run until
           # 3 cows per episode or 7 minutes, one at a time (needs the bench extra: pip install -e '.[bench]');
           # skipped by --skip-long
           ["peers.py", "--minutes", "7", "--stop-at-cows", "3", "--systems", "craftrl", "rllib-ppo", "--write-results"],
           # LONG, ~1 h 25 min: 1M env steps of crafter/score for 3 seeds one after the other, the Crafter score (P6);
           # skipped by --skip-long
           ["crafter_score.py", "--write-results"]]
LONG = {"peers.py", "crafter_score.py"}
GPU_ONLY = {"gpu_vpt.py"}
NEEDS_NAMESPACES = {"slow_link.py"}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--skip-long", action="store_true", help=f"skip the benchmarks that take hours: {sorted(LONG)}")
    parser.add_argument("--rebuild-only", action="store_true",
                        help="run nothing: rebuild BENCHMARKS.md from bench/results and bench/notes after one script "
                             "re-measured or a note changed (the previous headlines and date line stay)")
    args = parser.parse_args()
    if args.rebuild_only:
        write_benchmarks_md([])
        return 0
    headlines, failures = [], []
    for script, *arguments in SCRIPTS:
        path = BENCH / script
        if not path.exists() or (args.skip_long and script in LONG) or (script in GPU_ONLY and not _has_cuda()):
            continue
        unable = _why_no_simulated_links() if script in NEEDS_NAMESPACES else None
        if unable:
            print(f"== {script}: skipped, {unable}", flush=True)
            continue
        print(f"== {script} {' '.join(arguments)}", flush=True)
        result = subprocess.run([sys.executable, str(path), *arguments], cwd=ROOT, capture_output=True, text=True)
        sys.stdout.write(result.stdout[-4000:])
        lines = result.stdout.strip().splitlines()
        if result.returncode != 0 or not lines or not lines[-1].startswith("P"):
            failures.append(script)
            sys.stderr.write(result.stderr[-4000:])
            continue
        headlines.append(f"- `{' '.join([script, *arguments])}`: {'; '.join(trailing_headlines(lines))}")
    write_benchmarks_md(headlines)
    if failures:
        print(f"benchmarks failed: {', '.join(failures)}", file=sys.stderr)
        return 1
    return 0


def _why_no_simulated_links() -> str | None:
    from craftrl.utils.simulated_nodes import nodes_behind_links_work

    return nodes_behind_links_work()


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def trailing_headlines(lines: list[str]) -> list[str]:
    """The headline lines a script ends with (peers.py ends with three: P2, P3, P3b), in printed order."""
    found = []
    for line in reversed(lines):
        if not (line.startswith("P") and line[1:2].isdigit()):
            break
        found.append(line)
    return found[::-1]


def write_benchmarks_md(headlines: list[str]) -> None:
    """Without headlines (a partial rebuild) the previous headlines and date line stay: nothing was run in full,
    and the date line is where a person says which sections a partial re-measurement refreshed."""
    # measured sections only (rewritten by the scripts); the analysis and history behind them stay in bench/notes
    sections = [p.read_text().strip() for p in sorted((BENCH / "results").glob("*.md"))]
    date_line = f"Last full run: {datetime.date.today().isoformat()}, {os.cpu_count()} cores."
    if not headlines:
        previous = (ROOT / "BENCHMARKS.md").read_text().splitlines() if (ROOT / "BENCHMARKS.md").exists() else []
        date_line = next((line for line in previous if line.startswith(("Last full run:", "Last rebuilt"))), date_line)
        headlines = [line for line in previous if line.startswith("- `")]
    header = [
        "# Benchmarks",
        "",
        "Rebuilt by `make bench` (`python bench/run_all.py`); each section names the command that produced it.",
        date_line,
        "Numbers come from noisy shared 2-core VMs: compare ratios measured within one run, not across runs.",
        "What the numbers mean, how the defaults were chosen and what was tried: [bench/notes/](bench/notes/), by topic.",
        "",
    ]
    if headlines:
        header += ["## Headlines (last run)", "", *headlines, ""]
    (ROOT / "BENCHMARKS.md").write_text("\n".join(header + sections) + "\n")


if __name__ == "__main__":
    sys.exit(main())
