"""The plot and the eval table show the task metrics an env declares, not one task's names."""

from __future__ import annotations

import json
from pathlib import Path

from craftrl.cli.evaluate import EpisodeResult, format_table
import pytest

from craftrl.cli.plot import (RETURN, draw_curves, env_steps_tick, plot_command, plot_runs, plotted_rows,
                              read_curve)
from craftrl.config.validate import ConfigError


def write_run(root: Path, name: str, records: list[dict[str, float]]) -> Path:
    run = root / name
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps(record) + "\n" for record in records))
    return run


def test_the_plot_has_a_row_for_each_named_task_metric_some_run_reports(tmp_path: Path):
    cows = write_run(tmp_path, "cows", [{RETURN: 0.5, "rollout/env_steps": 100, "episodes/cows_killed_mean": 0.2},
                                        {"train/loss": 1.0},  # no episode finished yet: not a point
                                        {RETURN: 1.5, "rollout/env_steps": 200, "episodes/cows_killed_mean": 1.0}])
    wood = write_run(tmp_path, "wood", [{RETURN: 2.0, "rollout/env_steps": 100, "episodes/wood_mean": 3.0}])
    keys = [RETURN, "episodes/cows_killed_mean", "episodes/wood_mean"]
    curves = {run.name: read_curve(run, keys) for run in (cows, wood)}
    assert curves["cows"]["steps"] == [100.0, 200.0]
    assert curves["cows"]["episodes/cows_killed_mean"] == [0.2, 1.0]
    assert plotted_rows(curves, ("cows_killed", "wood", "diamonds")) == keys
    assert plotted_rows(curves, ()) == [RETURN]
    out = plot_runs([cows, wood], tmp_path / "curve.png", ("cows_killed",))
    assert out.stat().st_size > 10_000


def test_plot_names_a_metric_no_run_logs_and_what_they_log(tmp_path: Path):
    """``craftrl plot --metric cow_killed``: a misspelt name is one error line, not a plot without its row."""
    cows = write_run(tmp_path, "cows", [{RETURN: 0.5, "rollout/env_steps": 100, "episodes/cows_killed_mean": 0.2}])
    with pytest.raises(ConfigError) as raised:
        plot_command([str(cows)], str(tmp_path / "curve.png"), ["cow_killed"])
    assert raised.value.problems == ["plot: --metric cow_killed: no run logs its episode mean; they log cows_killed, "
                                     "return"]
    assert not (tmp_path / "curve.png").exists()
    assert plot_command([str(cows)], str(tmp_path / "curve.png"), ["cows_killed"]) == 0


def test_the_env_step_axis_reads_in_thousands_and_millions():
    """Six-digit tick labels ran into each other at the figure's width (100000150000200000...)."""
    assert [env_steps_tick(v) for v in (0, 500, 50_000, 150_000, 410_000, 1_000_000, 1_250_000, 12_500_000)] == \
        ["0", "500", "50k", "150k", "410k", "1M", "1.25M", "12.5M"]
    curve = {"steps": [0.0, 400_000.0], "minutes": [0.0, 6.0], RETURN: [0.0, 5.0]}
    figure = draw_curves({"run": curve}, [RETURN])
    steps_axis, minutes_axis = figure.axes
    assert steps_axis.xaxis.get_major_formatter()(150_000, 0) == "150k"
    assert minutes_axis.get_xlabel() == "wall time (min)"
    import matplotlib.pyplot as plt

    plt.close(figure)


def test_the_eval_table_has_a_column_for_each_declared_task_metric():
    results = [EpisodeResult(2.0, 10, "terminated", {"cows_killed": 2.0, "wood": 1.0}),
               EpisodeResult(4.0, 12, "truncated", {"cows_killed": 1.0, "wood": 0.0})]
    header = format_table(results, ("wood",)).splitlines()[0].split()
    assert header == ["episode", "return", "length", "wood", "ending"]
    assert format_table(results).splitlines()[0].split() == ["episode", "return", "length", "ending"]
    assert format_table(results, ("cows_killed",)).splitlines()[-1].split() == ["mean", "3.00", "11.0", "1.50"]
