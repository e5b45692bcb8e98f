"""The run directory: one place per run for its config, metrics, checkpoints, videos and logs.

Layout (``<output_root>/<logger_config.name>-<YYYYmmdd-HHMMSS>/``)::

    config.yaml          resolved config, every key with its effective value
    config_source.*      the config file's own text (MineStudio's ``whole_config``)
    metrics.jsonl        one JSON object per logged step
    tensorboard/         TensorBoard event files
    checkpoints/         train_config.save_path when relative
    videos/              worker_config.video_output_dir when relative
    replay_buffer/       database_config.path when relative
    logs/                process logs

Relative paths in the config resolve here rather than against whatever the current directory of a Ray
worker happens to be (MineStudio's relative paths land in a different place per process).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path

from craftrl.config.loading import config_to_yaml
from craftrl.config.schema import OnlineConfig


@dataclass(frozen=True)
class RunDirectory:
    root: Path

    @classmethod
    def create(cls, output_root: str | Path, name: str, now: float | None = None) -> "RunDirectory":
        stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
        base = Path(output_root).expanduser().resolve() / f"{name}-{stamp}"
        path, suffix = base, 1
        while path.exists():  # two runs started in the same second must not share a directory
            suffix += 1
            path = base.with_name(f"{base.name}-{suffix}")
        path.mkdir(parents=True)
        for sub in ("tensorboard", "logs"):
            (path / sub).mkdir()
        return cls(path)

    def resolve(self, path: str | Path) -> Path:
        """Absolute paths are honoured; relative ones live inside the run directory."""
        path = Path(path).expanduser()
        return path if path.is_absolute() else self.root / path

    @property
    def metrics_path(self) -> Path:
        return self.root / "metrics.jsonl"

    @property
    def tensorboard_dir(self) -> Path:
        return self.root / "tensorboard"

    def resolve_config_paths(self, config: OnlineConfig) -> OnlineConfig:
        """A copy of ``config`` with every output path made absolute (so actors anywhere agree on it)."""
        rollout = config.rollout_config
        worker = dataclasses.replace(rollout.worker_config,
                                     video_output_dir=str(self.resolve(rollout.worker_config.video_output_dir)))
        database = rollout.replay_buffer_config.database_config
        database = dataclasses.replace(database, path=str(self.resolve(database.path)))
        buffer = dataclasses.replace(rollout.replay_buffer_config, database_config=database)
        rollout = dataclasses.replace(rollout, worker_config=worker, replay_buffer_config=buffer)
        train = dataclasses.replace(config.train_config, save_path=str(self.resolve(config.train_config.save_path)))
        return dataclasses.replace(config, rollout_config=rollout, train_config=train)

    def save_config(self, config: OnlineConfig, source_text: str, origin: str) -> None:
        (self.root / "config.yaml").write_text(config_to_yaml(config))
        suffix = ".yaml" if origin.endswith((".yaml", ".yml")) else ".py"
        (self.root / f"config_source{suffix}").write_text(source_text)
