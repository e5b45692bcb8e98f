"""The Crafter score as bench/crafter_score.py computes it (P6): the paper's definition, on hand-made episodes."""

from __future__ import annotations

import json
import math
import statistics
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


def _run(tmp_path, name: str, episodes: list[dict], env_steps: float, elapsed_s: float):
    run_dir = tmp_path / name
    run_dir.mkdir()
    lines = [{"rollout/env_steps": env_steps / 2, "train/elapsed_s": elapsed_s / 2},
             {"rollout/env_steps": env_steps, "train/elapsed_s": elapsed_s}]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    (run_dir / "episodes.jsonl").write_text("".join(json.dumps(e) + "\n" for e in episodes))
    return run_dir


def test_results_give_each_seed_the_mean_and_spread_and_say_when_runs_stopped_short(tmp_path):
    budget = 50_000
    full = _run(tmp_path, "full", [episode(24_000, collect_wood=1), episode(24_000)], 48_000, 480.0)
    short = _run(tmp_path, "short", [episode(200, collect_wood=1), episode(100, collect_wood=1)], 300, 3.0)
    fresh = tmp_path / "fresh"  # no episode finished yet: no episodes.jsonl
    fresh.mkdir()
    results = [crafter_score.score_run(seed, run_dir, budget) for seed, run_dir in enumerate([full, short])]
    assert [len(r.episodes) for r in results] == [2, 2] and results[0].env_steps_per_s == pytest.approx(100.0)
    assert crafter_score.score_run(2, fresh, budget).episodes == []
    text = crafter_score.results_text(results, budget, "python bench/crafter_score.py --runs full short", "a.config",
                                      "a machine")
    scores = [r.score for r in results]
    assert f"{statistics.mean(scores):.1f} ± {statistics.stdev(scores):.1f}" in text and "2 seeds" in text
    assert "| 1 | `short` |" in text and "| collect_wood | 75.0 | 50.0 | 100.0 |" in text
    assert "runs stopped short" in text and "1 of the runs stopped before them (at 300 env steps)" in text
    assert "| at 200k |" not in text  # the short run never passed 200k env steps, so no seed's column is shown
    # a run whose next episode could not have finished within the budget is complete
    text = crafter_score.results_text(results[:1], budget, "python bench/crafter_score.py", "a.config", "a machine")
    assert "stopped" not in text and "one seed" in text


def test_scores_along_the_way_score_the_episodes_within_each_budget_the_run_passed(monkeypatch):
    monkeypatch.setattr(crafter_score, "ALONG_THE_WAY", (100, 300, 600))
    episodes = [episode(60, collect_wood=1), episode(60), episode(60, collect_wood=1), episode(60, collect_wood=1),
                episode(60)]  # 300 env steps in all
    scores = crafter_score.scores_along_the_way(episodes, 1000, ["collect_wood"])
    assert scores == {100: pytest.approx(100.0)}  # within 100: the first episode; 300 is not passed
    scores = crafter_score.scores_along_the_way(episodes + [episode(10)], 1000, ["collect_wood"])
    assert scores == {100: pytest.approx(100.0), 300: pytest.approx(60.0)}  # 3 of the first 5
    # a budget at or past the run's own is its score, not a point on the way
    assert crafter_score.scores_along_the_way(episodes + [episode(10)], 300, ["collect_wood"]) == {
        100: pytest.approx(100.0)}


def test_results_show_a_score_along_the_way_that_every_seed_passed(tmp_path, monkeypatch):
    monkeypatch.setattr(crafter_score, "ALONG_THE_WAY", (20_000, 40_000))
    first = _run(tmp_path, "first", [episode(24_000, collect_wood=1), episode(24_000)], 48_000, 480.0)
    second = _run(tmp_path, "second", [episode(30_000), episode(30_000)], 60_000, 600.0)
    results = [crafter_score.score_run(seed, run_dir, 100_000) for seed, run_dir in enumerate([first, second])]
    # within 20k no episode had finished; within 40k the first one, with 1 of the 22 achievements
    assert results[0].along_the_way == {20_000: 0.0, 40_000: pytest.approx(101 ** (1 / 22) - 1)}
    text = crafter_score.results_text(results, 100_000, "python bench/crafter_score.py", "a.config", "a machine")
    row = f"| 0 | `first` | {51 ** (1 / 22) - 1:.2f} | 0.00 | {101 ** (1 / 22) - 1:.2f} | 2 |"
    assert "| at 20k | at 40k |" in text and row in text


def test_late_return_is_the_mean_return_of_the_episodes_that_finished_in_the_budgets_last_window():
    def returning(length: int, value: float) -> dict:
        return {**episode(length), "episode_return": value}

    # finishing at 300, 600, 900 and 1200 env steps: within a budget of 1000 and a window of 500, the ones
    # finishing after 500 and by 1000 count
    episodes = [returning(300, 1.0), returning(300, 2.0), returning(300, 4.0), returning(300, 8.0)]
    assert crafter_score.late_return(episodes, 1000, window=500) == pytest.approx(3.0)
    assert crafter_score.late_return(episodes, 1200, window=500) == pytest.approx(6.0)
    assert math.isnan(crafter_score.late_return(episodes, 250, window=100))  # nothing finished in it
