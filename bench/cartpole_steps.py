"""P5: env steps until ``examples/cartpole.py`` reaches a mean return of 475 (last 20 episodes).

Runs the example through ``craftrl train`` (the whole system: Ray, env processes, LMDB replay, trainer) once per
seed, until the mean return reaches 475 or ``--minutes`` pass, and reads ``metrics.jsonl``. Env steps are the
rollout side's count, so steps collected but never trained on (stale, evicted) count against us.

    python bench/cartpole_steps.py   # 3 seeds drawn at random; --seeds names them

The last line is ``P5 cartpole_steps_to_475=<median over seeds, or inf>``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import sys
from pathlib import Path

from craftrl.metrics import read_jsonl

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import describe_machine  # noqa: E402
from headlines import finish, headline  # noqa: E402
from seeds import add_seed_arguments, seeds_from, spread  # noqa: E402
from time_to_cows import run_once  # noqa: E402  (bench scripts are run as files, not as a package)

TARGET = 475.0
RETURN = "episodes/return_mean"


def moving_means(run_dir: Path) -> list[tuple[dict, float]]:
    """(record, mean return of the last 20 episodes) for every record of the run that has one over 20 episodes."""
    return [(record, record[RETURN]) for record in read_jsonl(run_dir / "metrics.jsonl")
            if isinstance(record.get(RETURN), (int, float)) and record.get("episodes/total", 0) >= 20]


def steps_to_target(run_dir: Path, target: float = TARGET) -> tuple[float, float, float]:
    """(env steps when the moving mean first reached ``target``, seconds since launch then, best mean)."""
    launched = float((run_dir / "launched_at").read_text())
    best = -math.inf
    for record, value in moving_means(run_dir):
        best = max(best, value)
        if value >= target:
            return float(record.get("rollout/env_steps", math.inf)), float(record["time"]) - launched, best
    return math.inf, math.inf, best


def reached_target(run_dir: Path, target: float = TARGET) -> bool:
    """Whether the run's moving mean return has reached ``target`` (a stop condition while the run goes on)."""
    return (run_dir / "metrics.jsonl").exists() and any(value >= target for _, value in moving_means(run_dir))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default="examples/cartpole.py")
    parser.add_argument("--minutes", type=float, default=10.0)
    add_seed_arguments(parser, count=3)
    parser.add_argument("--output-root", default="runs/bench_cartpole")
    parser.add_argument("--write-results", action="store_true", help="rewrite bench/results/cartpole_steps.md")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    root = Path(args.output_root).resolve()
    root.mkdir(parents=True, exist_ok=True)
    results, rows = [], []
    seeds, drawn = seeds_from(args, "cartpole_steps")
    for seed in seeds:
        run_dir = run_once(args.config, args.overrides, seed, args.minutes, root, root / f"seed{seed}.log",
                           stop_when=reached_target)
        steps, seconds, best = steps_to_target(run_dir)
        results.append(steps)
        rows.append(f"| {seed} | {steps:.0f} | {seconds:.0f} | {best:.1f} |")
        print(json.dumps({"run": str(run_dir), "seed": seed, "steps_to_475": steps, "seconds_to_475": round(seconds, 1),
                          "best_mean_return": round(best, 1)}), flush=True)
    median, first_quartile, third_quartile = spread(results)
    text = ["## CartPole to a mean return of 475 (`bench/cartpole_steps.py`, P5)", "",
                f"`python bench/cartpole_steps.py {' '.join(sys.argv[1:])}`, {datetime.date.today().isoformat()}, "
                f"{describe_machine()}. `examples/cartpole.py` through `craftrl train` (Ray, env processes, LMDB "
                "replay, trainer); env steps are those collected, trained on or not. Target: 475 within 150k steps."
                + (" The seeds were drawn at random when the run started (bench/seeds.py)." if drawn else ""),
                "", "| seed | env steps to 475 | seconds from launch | best mean return |", "|---|---:|---:|---:|",
                *rows, "", f"Median {median:.0f} env steps (IQR {first_quartile:.0f} - {third_quartile:.0f})."]
    out = Path(__file__).resolve().parent / "results" / "cartpole_steps.md"
    finish(out if args.write_results else None, "\n".join(text),
           [headline("P5", "cartpole_steps_to_475", median, 0, f"median env steps over {len(seeds)} seeds")])


if __name__ == "__main__":
    main()
