"""Run the benchmarks behind every figure, one after another, and rebuild BENCHMARKS.md from their results.

Each script writes its results file bench/results/<name>.md whole (the command, date and machine, its tables, and
its headline figures as ``Headline:`` lines at the end, bench/headlines.py). BENCHMARKS.md is generated from those
files alone: the headline list, then every section as written. Scripts run one at a time: side by side they would
share the 2 cores and skew each other.

    python bench/run_all.py            # everything: about 3.5 h on 2 cores (make bench)
    python bench/run_all.py --quick    # no learning run: about 30 min (make bench-quick)
    python bench/run_all.py --rebuild-only
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
RESULTS = BENCH / "results"
sys.path.insert(0, str(BENCH))
from headlines import FIGURE, Headline, from_match, read_headlines  # noqa: E402

# Order matters only for reading: raw env speed first, then the parts, then end-to-end comparisons.
SCRIPTS = [["env_throughput.py"], ["policy_inference.py"], ["learner_step.py"],
           ["score_learner.py", "--write-results"],  # the Crafter-score learner under bf16 and torch.compile: ~4 min
           ["replay_bytes.py"],
           ["sampler.py", "--policy", "counting"], ["sampler.py"],
           ["latency_bound.py"],  # 64 Minecraft-timed envs: about 4 minutes
           # simulated clusters on this machine: fragments into the buffer, a VPT-2x policy out to 4 nodes (~12 GB)
           ["cluster_transport.py"], ["weight_broadcast.py", "--versions", "6"],
           ["weight_broadcast.py", "--versions", "6", "--weights-dtype", "float16"],
           ["slow_link.py"],  # a node behind a 20 Mbit/s link (network namespaces: root only): about 10 minutes
           ["gpu_vpt.py"],  # needs a GPU: skipped without CUDA
           # learning runs, each on seeds drawn at random when it starts (bench/seeds.py)
           ["cartpole_steps.py", "--write-results"],  # 3 seeds, about 5 minutes
           # ~1 h: craftrl and RLlib PPO side by side on 10 seeds, each run until 3 cows per episode or 7 minutes
           ["peers.py", "--minutes", "7", "--stop-at-cows", "3", "--systems", "craftrl", "rllib-ppo", "--write-results"],
           # ~2 h: 1M env steps of crafter/score for 3 seeds, the Crafter score
           ["crafter_score.py", "--write-results"]]
LEARNING = {"cartpole_steps.py", "peers.py", "crafter_score.py"}
GPU_ONLY = {"gpu_vpt.py"}
NEEDS_NAMESPACES = {"slow_link.py"}
HEADLINE_ENTRY = re.compile(r"^- \[(?P<file>\w+)\]\(bench/results/(?P=file)\.md\): " + FIGURE)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help=f"leave out the learning runs: {sorted(LEARNING)}")
    parser.add_argument("--rebuild-only", action="store_true",
                        help="run nothing: rebuild BENCHMARKS.md from bench/results after one script re-measured")
    args = parser.parse_args()
    failures = [] if args.rebuild_only else run_scripts(args.quick)
    (ROOT / "BENCHMARKS.md").write_text(benchmarks_md())
    if failures:
        print(f"benchmarks failed: {', '.join(failures)}", file=sys.stderr)
        return 1
    return 0


def run_scripts(quick: bool) -> list[str]:
    failures = []
    for script, *arguments in SCRIPTS:
        why_not = skip_reason(script, quick)
        if why_not:
            print(f"== {script}: skipped, {why_not}", flush=True)
            continue
        print(f"== {script} {' '.join(arguments)}", flush=True)
        result = subprocess.run([sys.executable, str(BENCH / script), *arguments], cwd=ROOT, capture_output=True,
                                text=True)
        sys.stdout.write(result.stdout[-4000:])
        if result.returncode != 0:
            failures.append(script)
            sys.stderr.write(result.stderr[-4000:])
    return failures


def skip_reason(script: str, quick: bool) -> str | None:
    if quick and script in LEARNING:
        return "a learning run (--quick)"
    if script in GPU_ONLY and not _has_cuda():
        return "needs a GPU"
    if script in NEEDS_NAMESPACES:
        return _why_no_simulated_links()
    return None


def _why_no_simulated_links() -> str | None:
    from craftrl.testing.simulated_nodes import nodes_behind_links_work

    return nodes_behind_links_work()


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def benchmarks_md() -> str:
    """BENCHMARKS.md: the headline figures of every results file, then the files as written."""
    results = sorted(RESULTS.glob("*.md"))
    entries = [(h, path.stem) for path in results for h in read_headlines(path.read_text())]
    entries.sort(key=lambda entry: int(re.match(r"P(\d+)", entry[0].label)[1]))  # P3b sorts with P3
    lines = [
        "# Benchmarks",
        "",
        "Generated by `make bench` (`python bench/run_all.py`) from the results files in bench/results/, which the",
        "scripts write whole; each section names the command, date and machine of its run.",
        "Compare figures within one section: 2-core VMs differ from one another by up to 2x.",
        "What the numbers mean and how the defaults were chosen: [bench/notes/](bench/notes/), by topic.",
        "",
        "## Headlines",
        "",
        *[f"- [{stem}](bench/results/{stem}.md): {h.described}" for h, stem in entries],
        "",
    ]
    return "\n".join(lines + [path.read_text().strip() + "\n" for path in results])


def headline_entries(benchmarks: str) -> list[tuple[str, Headline]]:
    """(results file stem, figure) for each line of BENCHMARKS.md's headline list."""
    return [(m["file"], from_match(m)) for m in map(HEADLINE_ENTRY.match, benchmarks.splitlines()) if m]


if __name__ == "__main__":
    sys.exit(main())
