"""P6: the Crafter score after 1M env steps of ``crafter/score``, over one or more seeds.

Runs ``craftrl train <config>`` (``craftrl.configs.crafter_score`` by default) once per seed until the run's
``rollout/env_steps`` passes ``--env-steps`` (then SIGTERM: a checkpoint is saved and everything stops), and
scores each run's ``episodes.jsonl`` the way the Crafter paper does (Hafner, 2021, "Benchmarking the Spectrum
of Agent Capabilities"): an achievement's success rate is the share of the training episodes in which it was
unlocked at least once, and the score is the geometric mean over the 22 achievements, computed as
``exp(mean(ln(1 + s_i))) - 1`` with ``s_i`` in percent. The episodes scored are the ones that together make
up the first ``--env-steps`` env steps, in the order they finished. Beside the score it reports the mean return
of the episodes that finished within the last 100k of those env steps, the reward Moon et al. (2023) report.

    python bench/crafter_score.py --write-results                  # ~30-35 min a seed on 2 cores
    python bench/crafter_score.py --config craftrl.configs.crafter_resnet --seeds 0 1 2 --concurrent  # a GPU
    python bench/crafter_score.py --runs runs/bench_crafter_score/crafter-score-...   # re-score runs

The last line is ``P6 crafter_score_pct=<mean over the seeds>``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from craftrl.metrics import read_jsonl

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import describe_machine  # noqa: E402  (bench scripts share helpers by plain import)
from headlines import finish, headline  # noqa: E402
from seeds import add_seed_arguments, seeds_from  # noqa: E402
from time_to_cows import run_directory, stop_run  # noqa: E402

# Published scores (%, mean ± std over seeds) and, where given, rewards at 1M env steps, for the agents a reader
# compares against: the Crafter paper's table, and Moon et al.'s (2023; figures/result.png of
# github.com/snu-mllab/Achievement-Distillation), whose reward is the mean return of the episodes that finished
# within the last 100k env steps (``late_return``).
PUBLISHED = {"PPO, Moon et al. 2023 (10 seeds)": ("15.60 ± 1.66", "10.32 ± 0.53"),
             "PPO (Crafter paper)": ("4.6 ± 0.3", "-"), "Random (Crafter paper)": ("1.6 ± 0.0", "-")}
LATE_WINDOW = 100_000  # env steps before the budget whose episodes' returns make up ``late_return``
ACHIEVEMENT_PREFIX = "achievements/"
MAX_EPISODE_STEPS = 10_000  # Crafter's episode limit: a finished run's scored episodes end within it of env_steps
# Env steps at which the score so far is also reported: where short A/B runs stop (bench/notes/crafter_score.md)
# and where a 1M run stands on the way, so the two compare without re-scoring by hand.
ALONG_THE_WAY = (200_000, 440_000, 700_000)


def start_run(config: str, overrides: list[str], seed: int, output_root: Path, log: Path) -> subprocess.Popen:
    """One ``craftrl train`` process (its own local Ray), its output in ``log``."""
    command = [sys.executable, "-m", "craftrl.cli.main", "train", config, f"seed={seed}",
               f"output_root={output_root}", *overrides]
    with log.open("w") as out:
        return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})


def run_until(config: str, overrides: list[str], seeds: list[int], env_steps: int, max_minutes: float,
              output_root: Path, concurrent: bool) -> list[Path]:
    """Training runs, one per seed, each stopped (SIGTERM) once it logged ``env_steps`` env steps or at
    ``max_minutes``; all at once with ``concurrent``, else one after the other. Returns their run directories."""
    groups = [seeds] if concurrent else [[seed] for seed in seeds]
    run_dirs = []
    for group in groups:
        logs = [output_root / f"seed{seed}.log" for seed in group]
        children = [start_run(config, overrides, seed, output_root, log) for seed, log in zip(group, logs)]
        deadline = time.monotonic() + max_minutes * 60
        running = dict(enumerate(children))
        try:
            while running and time.monotonic() < deadline:
                time.sleep(5)
                for index, child in list(running.items()):
                    run_dir = run_directory(logs[index])
                    if child.poll() is not None or (
                            run_dir is not None and last_logged(run_dir, "rollout/env_steps") >= env_steps):
                        stop_run(child, grace_s=180)
                        del running[index]
        finally:
            for child in running.values():
                stop_run(child, grace_s=180)
        for log in logs:
            run_dir = run_directory(log)
            if run_dir is None:
                raise SystemExit(f"crafter_score: no run directory in {log}")
            run_dirs.append(run_dir)
    return run_dirs


def first_episodes_within(episodes: list[dict], env_steps: int) -> list[dict]:
    """The episodes, in finishing order, whose lengths add up to at most ``env_steps``."""
    kept, total = [], 0
    for episode in episodes:
        total += int(episode["length"])
        if total > env_steps:
            break
        kept.append(episode)
    return kept


def success_rates(episodes: list[dict], achievements: list[str]) -> dict[str, float]:
    """Percent of episodes in which each achievement was unlocked (its counter above 0 at the episode's end)."""
    if not episodes:
        return {name: 0.0 for name in achievements}
    return {name: 100.0 * sum(e["metrics"].get(ACHIEVEMENT_PREFIX + name, 0.0) > 0 for e in episodes) / len(episodes)
            for name in achievements}


def crafter_score(rates_pct: dict[str, float]) -> float:
    """The Crafter paper's score: a geometric mean that rewards unlocking rare achievements at all."""
    return math.exp(sum(math.log(1.0 + s) for s in rates_pct.values()) / len(rates_pct)) - 1.0


def late_return(episodes: list[dict], env_steps: int, window: int = LATE_WINDOW) -> float:
    """The mean return of the episodes, in finishing order, that finished within the last ``window`` of
    ``env_steps`` env steps: the policy's return near the end of the budget, as Moon et al. report it."""
    scored = first_episodes_within(episodes, env_steps)
    late = scored[len(first_episodes_within(scored, env_steps - window)):]
    return statistics.mean(float(e["episode_return"]) for e in late) if late else math.nan


def scores_along_the_way(episodes: list[dict], env_steps: int, achievements: list[str]) -> dict[int, float]:
    """The score of the episodes within each of ``ALONG_THE_WAY``'s budgets below ``env_steps`` that the
    episodes pass (an episode finished after it, so none that it holds is still missing)."""
    passed = sum(int(e["length"]) for e in episodes)
    return {budget: crafter_score(success_rates(first_episodes_within(episodes, budget), achievements))
            for budget in ALONG_THE_WAY if budget < env_steps and passed > budget}


def all_achievements() -> list[str]:
    import crafter.constants

    return sorted(crafter.constants.achievements)


def last_logged(run_dir: Path, key: str) -> float:
    """The last value of ``key`` in the run's metrics.jsonl (0 if it never logged it)."""
    value, path = 0.0, run_dir / "metrics.jsonl"
    for record in read_jsonl(path) if path.exists() else []:
        try:
            value = float(record.get(key, value))
        except (TypeError, ValueError):
            continue
    return value


@dataclass
class SeedResult:
    seed: int
    run_dir: Path
    episodes: list[dict]
    rates: dict[str, float]
    score: float
    elapsed_s: float  # training wall-clock time, the run's last ``train/elapsed_s``
    logged_env_steps: float  # all the run stepped, scored or not: its last ``rollout/env_steps``
    along_the_way: dict[int, float]  # the score within fewer env steps (``scores_along_the_way``)
    late_return: float  # the mean return over the budget's last ``LATE_WINDOW`` env steps (``late_return``)

    @property
    def env_steps(self) -> int:
        return sum(int(e["length"]) for e in self.episodes)

    @property
    def minutes(self) -> float:
        return self.elapsed_s / 60

    @property
    def env_steps_per_s(self) -> float:
        return self.logged_env_steps / self.elapsed_s if self.elapsed_s else 0.0


def score_run(seed: int, run_dir: Path, env_steps: int) -> SeedResult:
    path = run_dir / "episodes.jsonl"  # absent while no episode has finished
    episodes = first_episodes_within(read_jsonl(path) if path.exists() else [], env_steps)
    achievements = all_achievements()
    rates = success_rates(episodes, achievements)
    return SeedResult(seed, run_dir, episodes, rates, crafter_score(rates), last_logged(run_dir, "train/elapsed_s"),
                      last_logged(run_dir, "rollout/env_steps"),
                      scores_along_the_way(episodes, env_steps, achievements), late_return(episodes, env_steps))


def describe_accelerator() -> str:
    """``NVIDIA H100 80GB HBM3, torch 2.11.0+cu130, host `` when CUDA is there, else nothing."""
    import torch

    return f"{torch.cuda.get_device_name()}, torch {torch.__version__}, host " if torch.cuda.is_available() else ""


def mean_and_spread(values: list[float]) -> str:
    if len(values) < 2:
        return f"{values[0]:.1f}"
    return f"{statistics.mean(values):.1f} ± {statistics.stdev(values):.1f}"


def results_text(results: list[SeedResult], env_steps: int, command: str, config: str, machine: str) -> str:
    scores = [r.score for r in results]
    seeds = "one seed" if len(results) == 1 else f"{len(results)} seeds, mean ± standard deviation"
    late_returns = [r.late_return for r in results]
    late = f"{LATE_WINDOW // 1000}k"
    rows = [f"| agent | Crafter score (%) | return over the last {late} env steps |", "|---|---:|---:|",
            f"| craftrl, `{config}` ({seeds}) | {mean_and_spread(scores)} | {mean_and_spread(late_returns)} |"]
    rows += [f"| {name} | {score} | {reward} |" for name, (score, reward) in PUBLISHED.items()]
    budgets = [budget for budget in ALONG_THE_WAY if all(budget in r.along_the_way for r in results)]
    runs = ["| seed | run | score (%) | " + "".join(f"at {budget // 1000}k | " for budget in budgets)
            + f"episodes | env steps scored | mean return | return, last {late} | env steps/s | training (min) |",
            "|---:|---|---:|" + "---:|" * len(budgets) + "---:|---:|---:|---:|---:|---:|"]
    runs += [f"| {r.seed} | `{r.run_dir.name}` | {r.score:.2f} | "
             + "".join(f"{r.along_the_way[budget]:.2f} | " for budget in budgets)
             + f"{len(r.episodes)} | {r.env_steps:,} | "
             f"{statistics.mean(float(e['episode_return']) for e in r.episodes) if r.episodes else 0.0:.2f} | "
             f"{r.late_return:.2f} | {r.env_steps_per_s:.0f} | {r.minutes:.0f} |" for r in results]
    names = sorted(results[0].rates, key=lambda name: -statistics.mean(r.rates[name] for r in results))
    per_seed_columns = results if len(results) > 1 else []  # one seed: its rate is the mean
    table = ["| achievement | success rate (%) |" + "".join(f" seed {r.seed} |" for r in per_seed_columns),
             "|---|---:|" + "---:|" * len(per_seed_columns)]
    for name in names:
        cells = "".join(f" {r.rates[name]:.1f} |" for r in per_seed_columns)
        table.append(f"| {name} | {statistics.mean(r.rates[name] for r in results):.1f} |{cells}")
    # a run stopped at --max-minutes (or one that failed) finishes its last episode short of env_steps
    short = [r for r in results if r.env_steps < env_steps - MAX_EPISODE_STEPS]
    scope = f"its first {env_steps:,} env steps"
    if short:
        first, last = min(r.env_steps for r in short), max(r.env_steps for r in short)
        stopped_at = f"{first:,}" if first == last else f"{first:,} to {last:,}"
        scope += (f"; {len(short)} of the runs stopped before them (at {stopped_at} env steps), so this is "
                  f"**not** the benchmark's {env_steps:,}-step score")
    text = [f"## Crafter score (`bench/crafter_score.py`, P6){'' if not short else ' -- runs stopped short'}", "",
            f"`{command}`, {datetime.date.today().isoformat()}, {machine}. "
            f"`crafter/score` (the full game, Crafter's own reward) with the policy and PPO settings of `{config}`, "
            f"{seeds} (the paper averages 10). Each run is scored over the episodes that finished within {scope}. "
            "Scored as the Crafter paper scores its agents: success rate = share of training episodes with the "
            "achievement unlocked, score = exp(mean ln(1 + rate %)) - 1. 'at 200k' and the like: the score of the "
            "episodes within that many env steps of the same run. 'Return over the last 100k env steps': the mean "
            "return of the episodes that finished within the budget's last 100k env steps, the reward Moon et al. "
            "report. The published rows are copied from the papers' tables; their per-achievement rates are not "
            "reproduced here.", "",
            *rows, "", *runs, "", *table]
    return "\n".join(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default="craftrl.configs.crafter_score")
    parser.add_argument("--env-steps", type=int, default=1_000_000)
    add_seed_arguments(parser, 3, "--seed")
    parser.add_argument("--concurrent", action="store_true",
                        help="run the seeds at once (a machine with cores to spare), not one after the other")
    parser.add_argument("--max-minutes", type=float, default=120.0, help="stop a run here even short of --env-steps")
    parser.add_argument("--output-root", default="runs/bench_crafter_score")
    parser.add_argument("--runs", nargs="*", default=None,
                        help="score existing run directories instead (one per seed, in the order of --seeds)")
    parser.add_argument("--write-results", action="store_true", help="rewrite bench/results/<--results-file>")
    parser.add_argument("--results-file", default="crafter_score.md")
    parser.add_argument("--ran-on", default=None,
                        help="with --runs: the machine the runs ran on, for the results (default: this machine)")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    if args.runs:
        run_dirs = [Path(run) for run in args.runs]
        seeds = args.seeds if args.seeds and len(args.seeds) == len(run_dirs) else list(range(len(run_dirs)))
    else:
        root = Path(args.output_root).resolve()
        root.mkdir(parents=True, exist_ok=True)
        seeds, _ = seeds_from(args, "crafter_score")
        run_dirs = run_until(args.config, args.overrides, seeds, args.env_steps, args.max_minutes, root,
                             args.concurrent)
    results = [score_run(seed, run_dir, args.env_steps) for seed, run_dir in zip(seeds, run_dirs)]
    for result in results:
        print(json.dumps({"seed": result.seed, "run": str(result.run_dir), "score_pct": round(result.score, 3),
                          "episodes": len(result.episodes), "env_steps": result.env_steps,
                          "score_along_the_way_pct": {str(k): round(v, 3) for k, v in result.along_the_way.items()},
                          "env_steps_per_s": round(result.env_steps_per_s), "rates_pct": result.rates}), flush=True)
    shown = [arg if arg != args.ran_on else "'<below>'" for arg in sys.argv[1:]]  # the machine is said apart
    command = "python bench/crafter_score.py " + " ".join(shown)
    machine = args.ran_on or f"{describe_accelerator()}{describe_machine()}"
    out = Path(__file__).resolve().parent / "results" / args.results_file
    finish(out if args.write_results else None, results_text(results, args.env_steps, command, args.config, machine),
           [headline("P6", "crafter_score_pct", statistics.mean(r.score for r in results), 2,
                     f"mean of {len(results)} seeds at {args.env_steps:,} env steps, `{args.config}`")])


if __name__ == "__main__":
    main()
