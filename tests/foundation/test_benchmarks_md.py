"""BENCHMARKS.md is generated from the results files the bench scripts write whole, every headline there is its
results file's figure within the printed rounding, and every figure of the README's results table is in the
results file its row links."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
import run_all  # noqa: E402
from headlines import read_headlines  # noqa: E402

RESULTS = sorted(run_all.RESULTS.glob("*.md"))
README_ROW = re.compile(r"^\| (?P<what>[^|]+) \| (?P<result>[^|]+) \| \[[^]]+\]\(bench/results/(?P<file>\w+)\.md\) \|$")
# a figure as the README prints it: 818, 0.27, 1.83x, 61k (thousands); not a part of a name (P3b, avx512, 1M); the
# sign is left out, so 807-837 reads as 807 and 837. A results file may write a unit right after it (20mbit).
NUMBER = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?)(k?)(?![A-Za-wyz0-9_])")
NUMBER_IN_RESULTS = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?)(k?)")


def within_rounding(shown: str, stated: str) -> bool:
    """``shown`` is ``stated`` printed to as many decimals as ``shown`` has (1.83 shows 1.8297)."""
    if "inf" in (shown, stated) or "n/a" in (shown, stated):
        return shown == stated
    decimals = len(shown.split(".")[1]) if "." in shown else 0
    return abs(float(shown) - float(stated)) <= 0.5 * 10 ** -decimals + 1e-12


def strays(benchmarks: str) -> list[str]:
    """One line per headline of ``benchmarks`` that its results file does not state, to its printed rounding."""
    problems = []
    for stem, shown in run_all.headline_entries(benchmarks):
        path = run_all.RESULTS / f"{stem}.md"
        stated = {h.name: h.value for h in read_headlines(path.read_text())} if path.exists() else {}
        if shown.name not in stated:
            problems.append(f"{shown.figure}: bench/results/{stem}.md states no {shown.name}")
        elif not within_rounding(shown.value, stated[shown.name]):
            problems.append(f"{shown.figure}: bench/results/{stem}.md states {stated[shown.name]}")
    return problems


def test_benchmarks_md_is_generated_from_the_results_files():
    assert (ROOT / "BENCHMARKS.md").read_text() == run_all.benchmarks_md(), (
        "BENCHMARKS.md differs from what bench/results builds: python bench/run_all.py --rebuild-only")


def test_every_headline_is_its_results_files_figure():
    text = (ROOT / "BENCHMARKS.md").read_text()
    assert len(run_all.headline_entries(text)) >= 10
    assert strays(text) == []


def test_a_headline_moved_past_its_printed_rounding_is_caught():
    """One unit of the last printed digit is past the rounding; so are the 0.5x and 3x slips a looser check let by."""
    text = (ROOT / "BENCHMARKS.md").read_text()
    numeric = [(stem, h) for stem, h in run_all.headline_entries(text) if h.value not in ("inf", "n/a")]
    assert numeric
    for stem, h in numeric:
        decimals = len(h.value.split(".")[1]) if "." in h.value else 0
        for moved in (float(h.value) + 10 ** -decimals, float(h.value) * 0.5, float(h.value) * 3):
            if f"{moved:.{decimals}f}" == h.value:
                continue  # 0.5x and 3x of a zero
            mutated = text.replace(f"[{stem}](bench/results/{stem}.md): {h.figure}",
                                   f"[{stem}](bench/results/{stem}.md): {h.label} {h.name}={moved:.{decimals}f}", 1)
            assert mutated != text
            assert len(strays(mutated)) == 1, (h.figure, moved)


@pytest.mark.parametrize("path", RESULTS, ids=lambda path: path.name)
def test_each_results_file_states_its_command_date_machine_and_headline(path: Path):
    text = path.read_text()
    assert re.search(r"python bench/\w+\.py", text), "no command"
    assert re.search(r"20\d\d-\d\d-\d\d", text), "no date"
    assert re.search(r"\d+ cores|H100|H200", text), "no machine"
    assert read_headlines(text), "no Headline: line (bench/headlines.py)"


def readme_rows() -> list[re.Match]:
    text = (ROOT / "README.md").read_text()
    table = text.split("## Results", 1)[1].split("\n## ", 1)[0]
    return [m for m in map(README_ROW.match, table.splitlines()) if m]


def figures(text: str, pattern: re.Pattern = NUMBER) -> list[tuple[str, float]]:
    """(as printed, value) for each number of ``text``; 61k is 61000."""
    return [(digits + k, float(digits) * (1000 if k else 1)) for digits, k in pattern.findall(text)]


def shown_in(printed: str, value: float, text: str) -> bool:
    """``text`` holds ``value``, as printed with ``printed``'s decimals (and thousands)."""
    digits = printed.rstrip("k")
    decimals = len(digits.split(".")[1]) if "." in digits else 0
    tolerance = 0.5 * 10 ** -decimals * (1000 if printed.endswith("k") else 1) + 1e-9
    return any(abs(candidate - value) <= tolerance for _, candidate in figures(text, NUMBER_IN_RESULTS))


def missing_from_linked_files(rows: list[re.Match]) -> list[str]:
    problems = []
    for row in rows:
        path = run_all.RESULTS / f"{row['file']}.md"
        text = path.read_text() if path.exists() else ""
        problems += [f"{row['what'].strip()}: {printed} is not in bench/results/{row['file']}.md"
                     for printed, value in figures(row["result"]) if not shown_in(printed, value, text)]
    return problems


def test_every_figure_of_the_readme_results_is_in_the_results_file_its_row_links():
    rows = readme_rows()
    assert 3 <= len(rows) <= 7  # a short table: the figures a reader compares tools on
    assert missing_from_linked_files(rows) == []


def test_a_readme_figure_its_results_file_does_not_hold_is_caught():
    row = readme_rows()[0]
    printed, value = figures(row["result"])[0]
    changed = re.sub(rf"(?<![\w.]){re.escape(printed)}", f"{value * 3:g}", row.string, count=1)
    assert len(missing_from_linked_files([README_ROW.match(changed)])) == 1
