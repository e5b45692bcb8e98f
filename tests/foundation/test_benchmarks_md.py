"""BENCHMARKS.md agrees with the measured sections it is built from, and each section says how it was measured."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RESULTS = sorted((ROOT / "bench" / "results").glob("*.md"))
HEADLINE = re.compile(r"^- `(?P<script>[\w.]+\.py)")
FIGURE = re.compile(r"P\d+\w* (?P<name>\w+)=(?P<value>[-\d.]+|inf|n/a)")
NUMBER = re.compile(r"(?<![\w.])-?\d+(?:\.\d+)?")


def headlines() -> list[tuple[str, str, str]]:
    """(script, figure name, value) for every figure of the headline list."""
    found = []
    for line in (ROOT / "BENCHMARKS.md").read_text().splitlines():
        match = HEADLINE.match(line)
        if match:
            found += [(match["script"], figure["name"], figure["value"]) for figure in FIGURE.finditer(line)]
    return found


def shows(text: str, value: str) -> bool:
    """``text`` holds ``value`` as written or rounded (a headline's 1072.9 is a table's 1073)."""
    if value in ("inf", "n/a"):
        return value in text or "not reached" in text or "did not reach" in text
    target = float(value)
    for number in NUMBER.findall(text):
        decimals = len(number.split(".")[1]) if "." in number else 0
        if abs(float(number) - target) <= 0.5 * 10 ** -decimals + 1e-12:
            return True
    return False


def test_every_measured_section_is_in_benchmarks_md_as_written():
    text = (ROOT / "BENCHMARKS.md").read_text()
    stale = [path.name for path in RESULTS if path.read_text().strip() not in text]
    assert not stale, f"rebuild BENCHMARKS.md (python bench/run_all.py --rebuild-only): {stale} changed"


@pytest.mark.parametrize("script, name, value", headlines(), ids=lambda item: str(item))
def test_each_headline_figure_is_what_its_section_measured(script: str, name: str, value: str):
    sections = [path.read_text() for path in RESULTS if f"bench/{script}" in path.read_text()]
    assert sections, f"headline of {script}: no section in bench/results names bench/{script}"
    assert any(shows(section, value) for section in sections), (
        f"headline {name}={value} of {script} appears in none of its sections")


def test_the_headline_list_covers_the_figures():
    assert len(headlines()) >= 10


@pytest.mark.parametrize("path", RESULTS, ids=lambda path: path.name)
def test_each_section_states_its_command_date_and_machine(path: Path):
    text = path.read_text()
    assert re.search(r"python bench/\w+\.py", text), "no command"
    assert re.search(r"20\d\d-\d\d-\d\d", text), "no date"
    assert re.search(r"\d+ cores|H100|H200|cores:", text), "no machine"
