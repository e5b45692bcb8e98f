"""The headline figures of a benchmark: the last lines of its results file and of its output.

A script states each figure once, as a ``Headline``; ``finish`` writes the results file whole with one line per
figure at its end (``Headline: P5 cartpole_steps_to_475=51952 (median of 3 seeds)``) and prints the figures
(``P5 cartpole_steps_to_475=51952``) as the script's last lines. ``run_all.py`` builds BENCHMARKS.md's headline
list from those file lines, and ``tests/foundation/test_benchmarks_md.py`` checks that list against them.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

PREFIX = "Headline: "
FIGURE = r"(?P<label>P\d+\w*) (?P<name>\w+)=(?P<value>-?\d+(?:\.\d+)?|inf|n/a)(?: \((?P<summary>.*)\))?$"
LINE = re.compile("^" + PREFIX + FIGURE)


@dataclass(frozen=True)
class Headline:
    label: str  # the target it answers, e.g. "P2"
    name: str  # e.g. "sps_ratio_vs_best_peer"
    value: str  # as printed: "1.830", "inf" or "n/a"
    summary: str = ""  # what the figure compares, in a few words

    @property
    def figure(self) -> str:
        return f"{self.label} {self.name}={self.value}"

    @property
    def described(self) -> str:
        return self.figure + (f" ({self.summary})" if self.summary else "")

    @property
    def line(self) -> str:
        return PREFIX + self.described


def headline(label: str, name: str, value: float, digits: int, summary: str = "") -> Headline:
    """``value`` printed with ``digits`` decimals; NaN (nothing measured) is ``n/a``."""
    if math.isnan(value):
        text = "n/a"
    elif math.isinf(value):
        text = "inf"
    else:
        text = f"{value:.{digits}f}"
    return Headline(label, name, text, summary)


def with_headlines(text: str, headlines: Sequence[Headline]) -> str:
    return text.rstrip("\n") + "\n\n" + "".join(h.line + "\n" for h in headlines)


def finish(path: Path | None, text: str, headlines: Sequence[Headline]) -> None:
    """Write ``text`` and its headlines to ``path`` (unless None) and print the figures last."""
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(with_headlines(text, headlines))
    for h in headlines:
        print(h.figure, flush=True)


def read_headlines(text: str) -> list[Headline]:
    return [from_match(m) for m in map(LINE.match, text.splitlines()) if m]


def from_match(match: re.Match) -> Headline:
    return Headline(match["label"], match["name"], match["value"], match["summary"] or "")
