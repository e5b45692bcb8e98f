"""``craftrl plot RUN_DIR... [--metric NAME] [--out curve.png]``: learning curves from ``metrics.jsonl``, overlaid.

Left: mean episode return against collected env steps; right: against wall time. Each task metric named below
it (``craftrl train`` names the env's declared ``task_metrics``) gets a row of its episode mean.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from craftrl.config.validate import ConfigError
from craftrl.metrics import read_jsonl

RETURN = "episodes/return_mean"


def episode_mean_key(task_metric: str) -> str:
    """The metrics.jsonl key of a task metric's moving episode mean (``episodes/cows_killed_mean``)."""
    return f"episodes/{task_metric}_mean"


def read_curve(run_dir: Path, keys: Sequence[str] = (RETURN,)) -> dict[str, list[float]]:
    """``steps``, ``minutes`` and each of ``keys`` (NaN where a record lacks it), one entry per record with a return."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        raise ConfigError([f"plot: {run_dir}: no metrics.jsonl (is it a craftrl run directory?)"])
    curve: dict[str, list[float]] = {"steps": [], "minutes": [], **{key: [] for key in keys}}
    for record in read_jsonl(path):
        if not isinstance(record.get(RETURN), (int, float)):
            continue
        curve["steps"].append(float(record.get("rollout/env_steps", record.get("step", 0))))
        curve["minutes"].append(float(record.get("train/elapsed_s", 0.0)) / 60.0)
        for key in keys:
            curve[key].append(float(record.get(key, float("nan"))))
    return curve


def plotted_rows(curves: dict[str, dict[str, list[float]]], task_metrics: Sequence[str]) -> list[str]:
    """The return, then each task metric that at least one run reports."""
    keys = [episode_mean_key(name) for name in task_metrics]
    return [RETURN] + [key for key in keys if any(v == v for curve in curves.values() for v in curve.get(key, ()))]


def env_steps_tick(value: float, _position: object = None) -> str:
    """An env-step axis label short enough that neighbouring ticks never run into each other: 150k, 1.2M."""
    if abs(value) >= 1e6:
        return f"{value / 1e6:.3g}M"
    if abs(value) >= 1e3:
        return f"{value / 1e3:.3g}k"
    return f"{value:.0f}"


def plot_runs(run_dirs: list[Path], out: Path, task_metrics: Sequence[str] = ()) -> Path:
    return save_curves(read_curves(run_dirs, task_metrics), out, task_metrics)


def read_curves(run_dirs: list[Path], task_metrics: Sequence[str] = ()) -> dict[str, dict[str, list[float]]]:
    """:func:`read_curve` of each run, with the return and the episode mean of each of ``task_metrics``."""
    keys = [RETURN] + [episode_mean_key(name) for name in task_metrics]
    return {run_dir.name: read_curve(run_dir, keys) for run_dir in run_dirs}


def save_curves(curves: dict[str, dict[str, list[float]]], out: Path, task_metrics: Sequence[str] = ()) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure = draw_curves(curves, plotted_rows(curves, task_metrics))
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, dpi=110)
    plt.close(figure)
    return out


def draw_curves(curves: dict[str, dict[str, list[float]]], rows: Sequence[str]) -> Any:
    """A matplotlib figure: one row per key of ``rows``, against env steps (left) and wall time (right)."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    figure, axes = plt.subplots(len(rows), 2, figsize=(11, 3.6 * len(rows)), squeeze=False)
    for row, key in enumerate(rows):
        for name, curve in curves.items():
            axes[row][0].plot(curve["steps"], curve[key], label=name)
            axes[row][1].plot(curve["minutes"], curve[key], label=name)
        label = "mean return" if key == RETURN else f"{key.removeprefix('episodes/').removesuffix('_mean')} per episode"
        axes[row][0].set(xlabel="env steps", ylabel=label)
        axes[row][0].xaxis.set_major_formatter(FuncFormatter(env_steps_tick))
        axes[row][1].set(xlabel="wall time (min)", ylabel=label)
        for axis in axes[row]:
            axis.grid(alpha=0.3)
    axes[0][1].legend(fontsize=8)
    figure.tight_layout()
    return figure


def logged_episode_means(run_dir: Path) -> set[str]:
    """The names whose episode means a run logged (``cows_killed`` for ``episodes/cows_killed_mean``)."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return set()
    return {key.removeprefix("episodes/").removesuffix("_mean") for record in read_jsonl(path) for key in record
            if key.startswith("episodes/") and key.endswith("_mean")}


def plot_command(run_dirs: list[str], out: str | None, task_metrics: Sequence[str] = ()) -> int:
    paths = [Path(p) for p in run_dirs]
    target = Path(out) if out else paths[0] / "curve.png"
    curves = read_curves(paths, task_metrics)
    rows = plotted_rows(curves, task_metrics)
    without_row = [name for name in task_metrics if episode_mean_key(name) not in rows]
    if without_row:  # a misspelt name, say: what the runs do log, read in full only here
        logged = set().union(*(logged_episode_means(path) for path in paths))
        unknown = [name for name in without_row if name not in logged]
        if unknown and logged:
            raise ConfigError([f"plot: --metric {name}: no run logs its episode mean; they log "
                               f"{', '.join(sorted(logged))}" for name in unknown])
    print(f"craftrl plot: {save_curves(curves, target, task_metrics)}")
    return 0
