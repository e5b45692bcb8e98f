"""``craftrl eval CHECKPOINT``: play episodes with a trained policy, print a table, optionally write an mp4.

The generators come from the run directory's saved config source (``config_source.py`` / ``.yaml``), or from
``--config`` when the checkpoint was moved. A run directory's checkpoints are where its ``config.yaml`` says
``train_config.save_path`` is: ``checkpoints/`` inside it for ``craftrl train``, the launcher's directory for a
MineStudio launcher's run with a relative ``save_path``. Episodes run in this process, one env, with the recurrent
state carried and reset exactly as in training.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from craftrl.cli.preflight import build_policy, describe_exception
from craftrl.config.loading import LoadedConfig, load_config
from craftrl.config.validate import ConfigError
from craftrl.envs.contract import (ContractError, check_env_methods, check_reset_result, check_step_result,
                                   declared_task_metrics)
from craftrl.policies.checks import REBUILD_HINT, tensor_shapes, weight_mismatch
from craftrl.rollout.loop import action_rows, obs_batch
from craftrl.run_dir import RunDirectory, saved_code_dir
from craftrl.train.checkpoint import STATE_FILE, list_checkpoints, load_checkpoint


@dataclass
class EpisodeResult:
    episode_return: float
    length: int
    ending: str  # "terminated" or "truncated"
    metrics: dict[str, float]


def find_config_source(checkpoint: Path, run: Path | None = None) -> Path | None:
    """The saved config of ``run``, else of the run holding the checkpoint: ``<run>/checkpoints/iter_N`` ->
    ``<run>/config_source.*``."""
    directories = ([run] if run is not None else []) + [checkpoint.parent.parent, checkpoint.parent]
    for directory in directories:
        for name in ("config_source.py", "config_source.yaml"):
            if (directory / name).is_file():
                return directory / name
    return None


# A run's final checkpoint is written after its last metrics line: at most this much later.
FINAL_SAVE_GRACE_S = 120.0


def checkpoints_of_run(run: Path) -> list[tuple[int, Path]]:
    """The checkpoints a run directory's run wrote, oldest first, under the ``save_path`` its ``config.yaml``
    records. A ``save_path`` outside the run directory may be shared by several runs (a MineStudio launcher's
    relative paths resolve against its working directory), so only checkpoints written between the run's start
    (its config.yaml) and its last metrics line count."""
    import yaml

    try:
        save_path = yaml.safe_load((run / "config.yaml").read_text())["train_config"]["save_path"]
    except (OSError, yaml.YAMLError, KeyError, TypeError):
        return []
    directory = RunDirectory(run).resolve(save_path)
    found = list_checkpoints(directory)
    if directory.resolve().is_relative_to(run.resolve()):
        return found
    started = (run / "config.yaml").stat().st_mtime
    metrics = run / "metrics.jsonl"
    ended = metrics.stat().st_mtime + FINAL_SAVE_GRACE_S if metrics.is_file() else float("inf")
    return [(iteration, path) for iteration, path in found
            if started <= (path / STATE_FILE).stat().st_mtime <= ended]


def locate_checkpoint(argument: str) -> tuple[Path, Path | None]:
    """A checkpoint directory, a ``checkpoints/`` directory or a run directory (its newest checkpoint), and the run
    directory when one was given."""
    path = Path(argument).expanduser()
    if not path.exists():
        raise ConfigError([f"eval: {argument} does not exist (expected a run directory, its checkpoints/ directory, "
                           f"or a checkpoint directory holding {STATE_FILE})"])
    if (path / STATE_FILE).is_file():
        return path, None
    run = path if RunDirectory.is_run_directory(path) else None
    # checkpoints/ first: a run directory copied elsewhere still finds its own, whatever its config.yaml recorded
    found = list_checkpoints(path) or list_checkpoints(path / "checkpoints") or (checkpoints_of_run(path) if run else [])
    if found:
        return found[-1][1], run
    raise ConfigError([f"eval: {argument}: no checkpoint here (expected a run directory, its checkpoints/ "
                       f"directory, or a checkpoint directory holding {STATE_FILE})"])


def load_for_eval(checkpoint: str, config_spec: str | None) -> tuple[LoadedConfig, dict[str, Any], Path]:
    path, run = locate_checkpoint(checkpoint)
    try:
        payload = load_checkpoint(path)
    except (FileNotFoundError, ValueError) as error:
        raise ConfigError([f"eval: {error}"]) from None
    if config_spec is not None:
        return load_config(config_spec), payload, path
    saved = find_config_source(path, run)
    if saved is None:
        raise ConfigError([f"eval: no config_source.py/.yaml found near {path}; pass --config CONFIG"])
    code_dir = saved_code_dir(saved.parent)
    try:  # the saved copy imports its modules from beside the original
        return load_config(str(saved), code_dir=code_dir), payload, path
    except ConfigError as error:  # a launcher's config module may need what the launcher binds (ROCKET-3's path)
        # a run submitted as a Ray job imported them from Ray's copy of its working directory, gone with the job
        gone = (f" (it imported its modules from {code_dir}, which no longer exists)"
                if code_dir and not Path(code_dir).is_dir() else "")
        raise ConfigError([f"eval: the run's saved config {problem}{gone}; pass --config CONFIG, a config whose "
                           "generators build this env and policy" for problem in error.problems]) from None


def load_eval_policy(loaded: LoadedConfig, model_state: dict[str, torch.Tensor]) -> torch.nn.Module:
    """The config's policy with the checkpoint's weights, in eval mode; a clear error when they do not fit."""
    policy = build_policy(loaded.policy_generator)
    mismatch = weight_mismatch(tensor_shapes(model_state), policy, "the checkpoint")
    if mismatch:
        raise ConfigError([f"eval: the checkpoint's weights do not fit the policy from policy_generator ({mismatch}); "
                           f"pass --config with the config it was trained with; {REBUILD_HINT}"])
    policy.load_state_dict(model_state)
    return policy.eval()


def play(loaded: LoadedConfig, model_state: dict[str, torch.Tensor], episodes: int, deterministic: bool,
         record: bool, seed: int = 0) -> tuple[list[EpisodeResult], list[np.ndarray], tuple[str, ...]]:
    """Play ``episodes`` episodes; returns their results, the frames when ``record``, and the env's declared task
    metrics (the columns of :func:`format_table`)."""
    from craftrl.rollout.loop import episode_metrics

    policy = load_eval_policy(loaded, model_state)
    env = _build_env(loaded)
    try:
        task_metrics = declared_task_metrics(env)
    except ContractError as error:
        env.close()
        raise ConfigError([str(error)]) from None
    results, frames = [], []
    try:
        for episode in range(episodes):
            obs, _ = _checked(check_reset_result, "env_generator: reset()", env.reset(seed=seed + episode))
            state, first, total, length = policy.initial_state(1), True, 0.0, 0
            if record:
                frames.append(np.asarray(env.render()))
            while True:
                with torch.no_grad():
                    out = policy.act(obs_batch([obs], policy.device), state,
                                     torch.tensor([[first]], device=policy.device), deterministic=deterministic)
                step = env.step(action_rows(out.action, 1)[0])
                obs, reward, terminated, truncated, info = _checked(check_step_result, "env_generator: step()", step)
                state, first = out.state_out, False
                total, length = total + float(reward), length + 1
                if record:
                    frames.append(np.asarray(env.render()))
                if terminated or truncated:
                    results.append(EpisodeResult(total, length, "terminated" if terminated else "truncated",
                                                 episode_metrics(info)))
                    break
    finally:
        env.close()
    return results, frames, task_metrics


def _build_env(loaded: LoadedConfig) -> Any:
    try:
        env = loaded.env_generator()
    except Exception as error:
        raise ConfigError([f"env_generator raised {describe_exception(error)}"]) from None
    try:
        check_env_methods(env)
    except ContractError as error:
        raise ConfigError([str(error)]) from None
    return env


def _checked(check: Any, where: str, result: Any) -> Any:
    """The env's reply, after the env contract check (a broken reply is bad input, not a craftrl crash)."""
    try:
        check(result, where)
    except ContractError as error:
        raise ConfigError([str(error)]) from None
    return result


def format_table(results: list[EpisodeResult], metric_keys: tuple[str, ...] = ()) -> str:
    """One row per episode: return, length, each of ``metric_keys`` the episodes report, how it ended."""
    keys = [k for k in metric_keys if any(k in r.metrics for r in results)]
    header = ["episode", "return", "length", *keys, "ending"]
    rows = [[str(i + 1), f"{r.episode_return:.2f}", str(r.length), *[f"{r.metrics.get(k, float('nan')):g}" for k in keys],
             r.ending] for i, r in enumerate(results)]
    if results:
        rows.append(["mean", f"{np.mean([r.episode_return for r in results]):.2f}",
                     f"{np.mean([r.length for r in results]):.1f}",
                     *[f"{np.mean([r.metrics.get(k, np.nan) for r in results]):.2f}" for k in keys], ""])
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(cell.rjust(width) for cell, width in zip(row, widths)) for row in [header, *rows]]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(lines)


def eval_command(checkpoint: str, episodes: int, video: str | None, deterministic: bool,
                 config_spec: str | None) -> int:
    loaded, payload, path = load_for_eval(checkpoint, config_spec)
    training = payload["training"]
    print(f"craftrl eval: {path} (iteration {training.iteration}, version {training.version}), "
          f"{episodes} episode(s), {'deterministic' if deterministic else 'sampled'} actions")
    results, frames, task_metrics = play(loaded, payload["model"], episodes, deterministic, record=video is not None)
    print(format_table(results, task_metrics))
    if video is not None:
        from craftrl.rollout.video import write_mp4

        fps = loaded.online.rollout_config.worker_config.video_fps
        print(f"craftrl eval: video {write_mp4(Path(video), frames, fps)} ({len(frames)} frames at {fps} fps)")
    return 0
