"""The Crafter score as bench/crafter_score.py computes it (P6): the paper's definition, on hand-made episodes."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import crafter_score  # noqa: E402


def episode(length: int, **unlocked: float) -> dict:
    return {"length": length, "episode_return": 0.0,
            "metrics": {f"achievements/{name}": count for name, count in unlocked.items()}}


def test_success_rate_is_the_share_of_episodes_with_the_achievement_unlocked_at_least_once():
    episodes = [episode(10, collect_wood=3), episode(10, collect_wood=0, wake_up=1), episode(10), episode(10)]
    rates = crafter_score.success_rates(episodes, ["collect_wood", "wake_up", "collect_diamond"])
    assert rates == {"collect_wood": 25.0, "wake_up": 25.0, "collect_diamond": 0.0}


def test_score_is_the_geometric_mean_of_one_plus_the_rates_minus_one():
    assert crafter_score.crafter_score({"a": 0.0, "b": 0.0}) == 0.0
    assert crafter_score.crafter_score({"a": 100.0, "b": 100.0}) == pytest.approx(100.0)
    # one rare achievement counts far more than its arithmetic share: sqrt(101 * 1) - 1, not 50
    assert crafter_score.crafter_score({"a": 100.0, "b": 0.0}) == pytest.approx(math.sqrt(101) - 1)


def test_only_the_episodes_within_the_step_budget_are_scored_in_finishing_order():
    episodes = [episode(400), episode(500), episode(200), episode(1)]
    assert [e["length"] for e in crafter_score.first_episodes_within(episodes, 1000)] == [400, 500]
    assert crafter_score.first_episodes_within(episodes, 399) == []


def test_every_crafter_achievement_is_scored():
    assert len(crafter_score.all_achievements()) == 22
