"""``craftrl plot RUN_DIR... [--out curve.png]``: learning curves from ``metrics.jsonl``, runs overlaid.

Left: mean episode return against collected env steps; right: against wall time. A second row shows cows
per episode when the runs report ``episodes/cows_killed_mean``.
"""

from __future__ import annotations

from pathlib import Path

from craftrl.config.validate import ConfigError
from craftrl.metrics import read_jsonl

RETURN = "episodes/return_mean"
COWS = "episodes/cows_killed_mean"


def read_curve(run_dir: Path) -> dict[str, list[float]]:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        raise ConfigError([f"plot: {run_dir}: no metrics.jsonl (is it a craftrl run directory?)"])
    curve: dict[str, list[float]] = {"steps": [], "minutes": [], RETURN: [], COWS: []}
    for record in read_jsonl(path):
        if RETURN not in record or not isinstance(record[RETURN], (int, float)):
            continue
        curve["steps"].append(float(record.get("rollout/env_steps", record.get("step", 0))))
        curve["minutes"].append(float(record.get("train/elapsed_s", 0.0)) / 60.0)
        curve[RETURN].append(float(record[RETURN]))
        curve[COWS].append(float(record.get(COWS, float("nan"))))
    return curve


def plot_runs(run_dirs: list[Path], out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = {run_dir.name: read_curve(run_dir) for run_dir in run_dirs}
    with_cows = any(any(v == v for v in curve[COWS]) for curve in curves.values())
    rows = [RETURN, COWS] if with_cows else [RETURN]
    figure, axes = plt.subplots(len(rows), 2, figsize=(11, 3.6 * len(rows)), squeeze=False)
    for row, key in enumerate(rows):
        for name, curve in curves.items():
            axes[row][0].plot(curve["steps"], curve[key], label=name)
            axes[row][1].plot(curve["minutes"], curve[key], label=name)
        label = "mean return" if key == RETURN else "cows per episode"
        axes[row][0].set(xlabel="env steps", ylabel=label)
        axes[row][1].set(xlabel="wall time (min)", ylabel=label)
        for axis in axes[row]:
            axis.grid(alpha=0.3)
    axes[0][1].legend(fontsize=8)
    figure.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, dpi=110)
    plt.close(figure)
    return out


def plot_command(run_dirs: list[str], out: str | None) -> int:
    paths = [Path(p) for p in run_dirs]
    target = Path(out) if out else paths[0] / "curve.png"
    print(f"craftrl plot: {plot_runs(paths, target)}")
    return 0
