"""The run directory: one place per run for its config, metrics, checkpoints and videos.

Layout (``<output_root>/<logger_config.name>-<YYYYmmdd-HHMMSS>/``)::

    config.yaml          resolved config, every key with its effective value
    config_source.*      the config file's own text (MineStudio's ``whole_config``)
    config_dir.txt       the directory that config imports its own modules from (``craftrl eval`` uses it)
    metrics.jsonl        one JSON object per logged step
    episodes.jsonl       one JSON object per finished episode (return, length, task metrics, version)
    tensorboard/         TensorBoard event files
    checkpoints/         train_config.save_path when relative
    videos/              worker_config.video_output_dir when relative
    replay_buffer/       database_config.path when relative
    logs/                a resumed run's earlier configs (config-until-iter_<N>.yaml)

Relative paths in the config resolve here rather than against whatever the current directory of a Ray
worker happens to be (MineStudio's relative paths land in a different place per process).

Resuming (``train_config.resume`` / ``craftrl train --resume``) *continues* a run rather than starting a new
one next to it: :func:`find_resume_target` picks the checkpoint and, when that checkpoint is the newest of a
run directory, that directory -- so metrics.jsonl is appended to and checkpoints/ and videos/ stay in one
place. Resolving ``save_path`` inside a brand-new run directory could never find the checkpoint to resume.
"""

from __future__ import annotations

import dataclasses
import os
import re
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from craftrl.config.loading import config_to_yaml
from craftrl.config.schema import OnlineConfig
from craftrl.config.validate import ConfigError

RESUME_LATEST = "latest"
CONFIG_DIR_FILE = "config_dir.txt"


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
        (path / "tensorboard").mkdir()
        return cls(path)

    @classmethod
    def reopen(cls, root: str | Path) -> "RunDirectory":
        """An existing run directory, to continue writing into (a resumed run)."""
        path = Path(root).expanduser().resolve()
        (path / "tensorboard").mkdir(parents=True, exist_ok=True)
        return cls(path)

    @staticmethod
    def is_run_directory(path: str | Path) -> bool:
        """True for a directory ``RunDirectory.create`` made and ``save_config`` wrote into."""
        return (Path(path) / "config.yaml").is_file()

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

    def save_config(self, config: OnlineConfig, source_text: str, origin: str, code_dir: str | None = None,
                    previous_until_iteration: int | None = None) -> None:
        """Write the resolved config, the config file's text and ``code_dir``, where that text imports its own
        modules from (the saved copy lies elsewhere than the original, beside which they are).

        A resumed run passes ``previous_until_iteration`` (the checkpoint it continues from): the config that
        produced the run so far is kept as ``logs/config-until-iter_<N>.yaml`` instead of being overwritten,
        since the resuming invocation may change keys (``num_iterations``, a learning rate, ...).
        """
        current = self.root / "config.yaml"
        if previous_until_iteration is not None and current.is_file():
            (self.root / "logs").mkdir(exist_ok=True)
            current.replace(self.root / "logs" / f"config-until-iter_{previous_until_iteration:08d}.yaml")
        current.write_text(config_to_yaml(config))
        suffix = ".yaml" if origin.endswith((".yaml", ".yml")) else ".py"
        (self.root / f"config_source{suffix}").write_text(source_text)
        if code_dir is not None:
            (self.root / CONFIG_DIR_FILE).write_text(code_dir + "\n")


def output_paths(config: OnlineConfig) -> dict[str, str]:
    """The directories a run writes into besides its run directory, by config key."""
    return {"train_config.save_path": config.train_config.save_path,
            "rollout_config.replay_buffer_config.database_config.path":
                config.rollout_config.replay_buffer_config.database_config.path,
            "rollout_config.worker_config.video_output_dir": config.rollout_config.worker_config.video_output_dir}


def unwritable_output_paths(paths: dict[str, str | Path]) -> list[str]:
    """One problem per ``{key: directory}`` where no directory can be made and written into, found before anything
    starts (a checkpoint directory that cannot be made would otherwise stop the run at its first save, and a video
    directory would lose every video without a word). Each is tried by making and removing a directory in its
    nearest existing ancestor: permission bits do not tell for root, read-only mounts or /proc."""
    problems = []
    for key, path in paths.items():
        existing = Path(path).expanduser().absolute()
        while not existing.exists() and existing != existing.parent:
            existing = existing.parent
        if not existing.is_dir():
            problems.append(f"{key}: cannot make a directory at {path}: {existing} is not a directory")
            continue
        try:
            os.rmdir(tempfile.mkdtemp(prefix=".craftrl-write-check-", dir=existing))
        except OSError as error:
            problems.append(f"{key}: cannot make a directory at {path}: {existing} is not writable "
                            f"({error.strerror or error})")
    return problems


def unwritable_output_file(key: str, path: str | Path, example: str) -> list[str]:
    """The problem, if any, with writing a file at ``path``: a directory there, or a directory for it that cannot
    be made and written (``example``: a file name to suggest inside a directory)."""
    if Path(path).is_dir():
        return [f"{key}: {path} is a directory (expected a file path such as {Path(path) / example})"]
    return unwritable_output_paths({key: Path(path).parent})


def saved_code_dir(directory: Path) -> str | None:
    """The ``code_dir`` that :meth:`RunDirectory.save_config` recorded in ``directory``, if it did."""
    recorded = directory / CONFIG_DIR_FILE
    return recorded.read_text().strip() if recorded.is_file() else None


@dataclass(frozen=True)
class ResumeTarget:
    """Where a resumed run continues: the checkpoint it loads and the run directory it writes into."""

    checkpoint: Path
    iteration: int | None  # from the checkpoint's directory name; None when it is not named iter_<N>
    run_dir: RunDirectory | None  # None: the checkpoint belongs to no run it should continue; start a new one


def _run_name_pattern(name: str) -> re.Pattern[str]:
    """``<name>-YYYYmmdd-HHMMSS`` with the ``-N`` suffix of a second run started in the same second."""
    return re.compile(rf"^{re.escape(name)}-\d{{8}}-\d{{6}}(-\d+)?$")


def _owning_run(checkpoint: Path, save_path: str) -> RunDirectory | None:
    """The run directory whose relative ``save_path`` holds ``checkpoint``, if any.

    An absolute ``save_path`` is shared by every run, so its checkpoints belong to none of them.
    """
    relative = Path(save_path).expanduser()
    if relative.is_absolute():
        return None
    candidate = checkpoint.parent
    for _ in relative.parts:
        candidate = candidate.parent
    run = RunDirectory(candidate)
    if run.resolve(relative).resolve() != checkpoint.parent.resolve() or not RunDirectory.is_run_directory(candidate):
        return None
    return run


def _continue_or_branch(checkpoint: Path, iteration: int | None, save_path: str) -> ResumeTarget:
    """Continue the owning run when ``checkpoint`` is its newest; an older one starts a new run directory.

    Resuming an older checkpoint inside its own run would append iterations the run's metrics already hold and
    let checkpoint retention delete the newer checkpoints; as a branch, the original run stays as it was.
    """
    from craftrl.train.checkpoint import list_checkpoints

    run = _owning_run(checkpoint, save_path)
    if run is not None:
        newest = list_checkpoints(checkpoint.parent)
        if not newest or newest[-1][1].resolve() != checkpoint.resolve():
            run = None
    return ResumeTarget(checkpoint.resolve(), iteration, None if run is None else RunDirectory.reopen(run.root))


def find_resume_target(resume: str, output_root: str | Path, name: str, save_path: str) -> ResumeTarget:
    """Resolve ``train_config.resume`` before anything is created; raise ``ConfigError`` (one line) if it fails.

    * ``'latest'``: among the run directories ``<output_root>/<name>-<stamp>`` whose ``save_path`` holds a
      checkpoint, the one whose newest checkpoint was written last -- continued in place. With an absolute
      ``save_path``, the newest checkpoint there, in a new run directory.
    * a checkpoint directory (holding ``state.pt``): that checkpoint; its run is continued when it is that
      run's newest checkpoint, otherwise a new run directory starts from it.
    * a run directory, or a directory of ``iter_*`` checkpoints: its newest checkpoint, continued in place.
    """
    from craftrl.train.checkpoint import CHECKPOINT_PATTERN, STATE_FILE, list_checkpoints

    if resume == RESUME_LATEST:
        relative = Path(save_path).expanduser()
        if relative.is_absolute():
            found = list_checkpoints(relative)
            if not found:
                raise ConfigError([f"train_config.resume=latest: no checkpoint under {relative} (expected "
                                   f"iter_NNNNNNNN/{STATE_FILE} there)"])
            return ResumeTarget(found[-1][1].resolve(), found[-1][0], None)
        root = Path(output_root).expanduser().resolve()
        pattern = _run_name_pattern(name)
        candidates = []
        runs = sorted(p for p in root.iterdir() if p.is_dir() and pattern.match(p.name)) if root.is_dir() else []
        for run in runs:
            found = list_checkpoints(RunDirectory(run).resolve(relative))
            if found:
                iteration, newest = found[-1]
                candidates.append(((newest / STATE_FILE).stat().st_mtime, run.name, iteration, newest))
        if not candidates:
            raise ConfigError([f"train_config.resume=latest: none of the {len(runs)} run directories named "
                               f"{name}-* under {root} holds a checkpoint in {relative}/ (pass --resume with a "
                               "checkpoint or run directory to name one)"])
        _, _, iteration, newest = max(candidates)
        return _continue_or_branch(newest, iteration, save_path)

    path = Path(resume).expanduser()
    if not path.exists():
        raise ConfigError([f"train_config.resume: {resume} does not exist (expected 'latest', a checkpoint "
                           f"directory holding {STATE_FILE}, or a run directory)"])
    if (path / STATE_FILE).is_file():
        match = CHECKPOINT_PATTERN.match(path.resolve().name)
        return _continue_or_branch(path, int(match.group(1)) if match else None, save_path)
    found = list_checkpoints(path) or (list_checkpoints(RunDirectory(path).resolve(save_path))
                                       if not Path(save_path).expanduser().is_absolute() else [])
    if not found:
        raise ConfigError([f"train_config.resume: {resume} holds no checkpoint (expected a checkpoint directory "
                           f"holding {STATE_FILE}, or a run directory with one under {save_path}/)"])
    return _continue_or_branch(found[-1][1], found[-1][0], save_path)
