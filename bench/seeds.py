"""Seeds for learning figures, drawn at run time so that no setting was chosen on them, and their spread.

Every seed below ``HELD_OUT_FROM`` has been used in this repository to choose a setting or screen an idea
(bench/notes/seeds.md lists which); a learning figure comes from seeds drawn at or above it, at random, when the
benchmark runs. ``--seeds`` still names seeds by hand, for a rerun of a reported set or for screening.
"""

from __future__ import annotations

import argparse
import math
import random
from typing import Sequence

HELD_OUT_FROM = 1000
SEED_LIMIT = 2 ** 31 - 1  # what every system's seed argument takes


def draw_seeds(count: int, rng: random.Random | None = None) -> list[int]:
    """``count`` distinct seeds in [HELD_OUT_FROM, SEED_LIMIT), from the operating system's randomness."""
    rng = rng or random.SystemRandom()
    return rng.sample(range(HELD_OUT_FROM, SEED_LIMIT), count)


def add_seed_arguments(parser: argparse.ArgumentParser, count: int, *aliases: str) -> None:
    parser.add_argument("--seeds", *aliases, type=int, nargs="+", default=None,
                        help=f"seeds to run (default: --num-seeds seeds drawn at random from {HELD_OUT_FROM} up, "
                             "printed and saved with the results)")
    parser.add_argument("--num-seeds", type=int, default=count, help="how many seeds to draw without --seeds")


def seeds_from(args: argparse.Namespace, script: str) -> tuple[list[int], bool]:
    """The seeds to run and whether they were drawn (True) or named with ``--seeds`` (False); ``script`` prints
    them, so that a run's log says which seeds its figures come from."""
    seeds, drawn = (list(args.seeds), False) if args.seeds else (draw_seeds(args.num_seeds), True)
    print(f"{script}: seeds {' '.join(map(str, seeds))} ({'drawn at random now' if drawn else 'named by --seeds'})",
          flush=True)
    return seeds, drawn


def quantile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile of ``values`` by linear interpolation between order statistics (numpy's default);
    ``inf`` (a run that never got there) sorts last, and a quantile that reaches into it is ``inf``."""
    ordered = sorted(values)
    if not ordered:
        return math.nan
    position = q * (len(ordered) - 1)
    low, high = math.floor(position), math.ceil(position)
    if low == high or ordered[low] == ordered[high]:
        return ordered[low]
    if math.isinf(ordered[high]):
        return math.inf
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def spread(values: Sequence[float]) -> tuple[float, float, float]:
    """(median, first quartile, third quartile)."""
    return quantile(values, 0.5), quantile(values, 0.25), quantile(values, 0.75)
