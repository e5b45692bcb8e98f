"""docs/policies.md's table of built-in policies states each one's parameter count; building each row's policy
from the expression in its first cell must give that count, so the page cannot drift from the code."""

from __future__ import annotations

import re
from pathlib import Path

from craftrl.policies.default import ImpalaRecurrentPolicy, MLPPolicy
from craftrl.policies.vpt import vpt_tiny

DOC = Path(__file__).resolve().parents[2] / "docs" / "policies.md"
ROW = re.compile(r"^\| `(?P<expr>(ImpalaRecurrentPolicy|MLPPolicy|vpt_tiny)\([^`]*\))`.*\| (?P<millions>[0-9.]+) M \|$")


def _documented_counts() -> list[tuple[str, float]]:
    return [(match["expr"], float(match["millions"]))
            for match in map(ROW.match, DOC.read_text().splitlines()) if match]


def test_the_table_lists_the_policies_the_configs_use():
    expressions = [expr for expr, _ in _documented_counts()]
    assert len(expressions) >= 9, expressions
    assert any("channels=(64,128)" in expr for expr in expressions)  # craftrl.configs.crafter_score
    assert any("channels=(16,16)" in expr and 'recurrent="none"' in expr for expr in expressions)  # the default


def test_every_documented_parameter_count_is_what_the_row_builds():
    names = {"ImpalaRecurrentPolicy": ImpalaRecurrentPolicy, "MLPPolicy": MLPPolicy, "vpt_tiny": vpt_tiny}
    for expr, millions in _documented_counts():
        policy = eval(expr, {"__builtins__": {}}, names)  # the page's own constructor calls, nothing else in scope
        built = sum(parameter.numel() for parameter in policy.parameters()) / 1e6
        assert round(built, 2) == millions, f"docs/policies.md: {expr} has {built:.3f} M parameters, not {millions} M"
