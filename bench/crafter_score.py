"""P6: the Crafter score after 1M env steps of ``crafter/score`` with the default recurrent policy.

Runs ``craftrl train craftrl.configs.crafter_score`` until the run's ``rollout/env_steps`` passes
``--env-steps`` (then SIGTERM: a checkpoint is saved and everything stops), and scores the run's
``episodes.jsonl`` the way the Crafter paper does (Hafner, 2021, "Benchmarking the Spectrum of Agent
Capabilities"): an achievement's success rate is the share of the training episodes in which it was unlocked
at least once, and the score is the geometric mean over the 22 achievements, computed as
``exp(mean(ln(1 + s_i))) - 1`` with ``s_i`` in percent. The episodes scored are the ones that together make
up the first ``--env-steps`` env steps, in the order they finished.

    python bench/crafter_score.py --write-results                      # ~40 min on 2 cores, run in background
    python bench/crafter_score.py --runs runs/bench_crafter_score/crafter-score-...   # re-score a run

The last line is ``P6 crafter_score_pct=<score>``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from craftrl.metrics import read_jsonl

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import describe_machine  # noqa: E402  (bench scripts share helpers by plain import)
from time_to_cows import stop_run  # noqa: E402

# The Crafter paper's table (score in %, mean ± std over seeds) for the agents a reader compares against.
PAPER_SCORES = {"PPO (Crafter paper)": "4.6 ± 0.3", "Random (Crafter paper)": "1.6 ± 0.0"}
ACHIEVEMENT_PREFIX = "achievements/"


def run_until(config: str, overrides: list[str], seed: int, env_steps: int, max_minutes: float,
              output_root: Path, log: Path) -> Path:
    """One training run stopped (SIGTERM) once it logged ``env_steps`` env steps; returns its run directory."""
    command = [sys.executable, "-m", "craftrl.cli.main", "train", config, f"seed={seed}",
               f"output_root={output_root}", *overrides]
    deadline = time.monotonic() + max_minutes * 60
    run_dir: Path | None = None
    with log.open("w") as out:
        child = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT,
                                 env={**os.environ, "PYTHONUNBUFFERED": "1"})
        while child.poll() is None and time.monotonic() < deadline:
            time.sleep(10)
            if run_dir is None:
                match = re.search(r"run directory (\S+)", log.read_text())
                run_dir = Path(match.group(1)) if match else None
            if run_dir is not None and logged_env_steps(run_dir / "metrics.jsonl") >= env_steps:
                break
        stop_run(child, grace_s=180)
    if run_dir is None:
        match = re.search(r"run directory (\S+)", log.read_text())
        if not match:
            raise SystemExit(f"crafter_score: no run directory in {log}")
        run_dir = Path(match.group(1))
    return run_dir


def logged_env_steps(metrics_path: Path) -> float:
    """The last ``rollout/env_steps`` in a metrics.jsonl (0 before the first iteration)."""
    if not metrics_path.exists():
        return 0.0
    steps = 0.0
    for record in read_jsonl(metrics_path):
        try:
            steps = float(record.get("rollout/env_steps", steps))
        except (TypeError, ValueError):
            continue
    return steps


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


def all_achievements() -> list[str]:
    import crafter.constants

    return sorted(crafter.constants.achievements)


def elapsed_minutes(run_dir: Path) -> float:
    """Training wall-clock time of the run (``train/elapsed_s`` of its last logged iteration)."""
    elapsed = 0.0
    for record in read_jsonl(run_dir / "metrics.jsonl"):
        try:
            elapsed = float(record.get("train/elapsed_s", elapsed))
        except (TypeError, ValueError):
            continue
    return elapsed / 60


def write_results(run_dir: Path, episodes: list[dict], rates: dict[str, float], score: float, env_steps: int,
                  command: str, config: str, out: Path) -> None:
    steps = sum(int(e["length"]) for e in episodes)
    mean_return = sum(float(e["episode_return"]) for e in episodes) / max(len(episodes), 1)
    rows = ["| agent | Crafter score (%) |", "|---|---:|", f"| craftrl, `{config}` (`{run_dir.name}`) | {score:.1f} |"]
    rows += [f"| {name} | {value} |" for name, value in PAPER_SCORES.items()]
    table = ["| achievement | success rate (%) |", "|---|---:|"]
    table += [f"| {name} | {rate:.1f} |" for name, rate in sorted(rates.items(), key=lambda item: -item[1])]
    text = ["## Crafter score (`bench/crafter_score.py`, P6)", "",
            f"`{command}`, {datetime.date.today().isoformat()}, {describe_machine()}. `crafter/score` (the full "
            f"game, Crafter's own reward) with the policy and PPO settings of `{config}`. Scored over the {len(episodes)} episodes that make up the first "
            f"{steps:,} of {env_steps:,} env steps (mean return {mean_return:.2f}; one seed, the paper averages 10; "
            f"{elapsed_minutes(run_dir):.0f} min of training), as the Crafter paper scores its "
            "agents: success rate = share of training episodes with the achievement unlocked, score = "
            "exp(mean ln(1 + rate %)) - 1. The paper's rows are copied from its table; its per-achievement "
            "rates are not reproduced here.", "",
            *rows, "", *table]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(text) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default="craftrl.configs.crafter_score")
    parser.add_argument("--env-steps", type=int, default=1_000_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-minutes", type=float, default=120.0, help="stop the run here even short of --env-steps")
    parser.add_argument("--output-root", default="runs/bench_crafter_score")
    parser.add_argument("--runs", nargs="*", default=None, help="score an existing run directory instead")
    parser.add_argument("--write-results", action="store_true", help="rewrite bench/results/crafter_score.md")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    if args.runs:
        run_dir = Path(args.runs[0])
    else:
        root = Path(args.output_root).resolve()
        root.mkdir(parents=True, exist_ok=True)
        run_dir = run_until(args.config, args.overrides, args.seed, args.env_steps, args.max_minutes, root,
                            root / f"seed{args.seed}.log")
    episodes = first_episodes_within(read_jsonl(run_dir / "episodes.jsonl"), args.env_steps)
    rates = success_rates(episodes, all_achievements())
    score = crafter_score(rates)
    print(json.dumps({"run": str(run_dir), "episodes": len(episodes),
                      "env_steps": sum(int(e["length"]) for e in episodes), "rates_pct": rates}), flush=True)
    if args.write_results:
        command = "python bench/crafter_score.py " + " ".join(sys.argv[1:])
        write_results(run_dir, episodes, rates, score, args.env_steps, command, args.config,
                      Path(__file__).resolve().parent / "results" / "crafter_score.md")
    print(f"P6 crafter_score_pct={score:.2f}")


if __name__ == "__main__":
    main()
