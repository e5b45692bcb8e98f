"""Checkpoints: atomic writes, a retention rule you can state in one sentence, and lossless resume.

Layout: ``<save_path>/iter_<NNNNNNNN>/`` holding ``state.pt`` (everything below) and ``config.yaml``.

* Atomic: a checkpoint is written into ``.tmp-iter_<N>-<host>-<pid>`` and renamed into place, so a crash never
  leaves a half-written ``iter_*`` directory that ``resume latest`` would pick. A save cut short (``ray job
  stop`` kills a run 3 s after asking it to stop, and a VPT-2x checkpoint takes ~10 s to write) leaves its
  staging directory behind, as large as a checkpoint; the next save into ``save_path`` on that host (a resumed
  run's) removes those whose writer has exited.
* Retention: after each save, a checkpoint is kept if its iteration is a multiple of ``keep_interval``, or if
  it is among the ``keep_last`` newest; every other one is deleted. (``keep_interval`` 0 keeps only the
  newest.) MineStudio's version of this had a sign error and deleted the wrong ones.
* Contents: model, optimiser, grad scaler, iteration, model version, env steps, trained samples, current
  rho and adapted entropy weight, the KL reference policy, RNG states and the resolved config -- what
  ``resume`` needs to continue with identical counters. MineStudio inferred the iteration from the learning
  rate instead.
"""

from __future__ import annotations

import io
import os
import random
import re
import shutil
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

CHECKPOINT_PATTERN = re.compile(r"^iter_(\d{8})$")
STAGING_PATTERN = re.compile(r"^\.tmp-iter_\d{8}-(?P<host>.+)-(?P<pid>\d+)$")
STATE_FILE = "state.pt"


class CheckpointWriteError(RuntimeError):
    """A checkpoint could not be written (a full disk, mostly); the run stops rather than train on unsaved."""


@dataclass
class TrainingState:
    """Everything that must survive a restart besides the tensors of the networks."""

    iteration: int = 0  # completed training iterations
    version: int = 0  # published policy version
    env_steps: int = 0  # env steps collected by the rollout side when the checkpoint was taken
    trained_samples: int = 0  # env steps consumed by the learner (counting reuse)
    rho: float = 0.0
    entropy_coef: float | None = None  # the entropy bonus's weight (a resume with target_entropy continues from it)
    extra: dict[str, Any] = field(default_factory=dict)


def checkpoint_dir(save_path: str | Path, iteration: int) -> Path:
    return Path(save_path) / f"iter_{iteration:08d}"


def list_checkpoints(save_path: str | Path) -> list[tuple[int, Path]]:
    root = Path(save_path)
    if not root.is_dir():
        return []
    found = []
    for entry in root.iterdir():
        match = CHECKPOINT_PATTERN.match(entry.name)
        if match and (entry / STATE_FILE).is_file():
            found.append((int(match.group(1)), entry))
    return sorted(found)


def rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    """Generators take their state as CPU byte tensors only, but a checkpoint loaded with
    ``map_location="cuda"`` (as the trainer loads it on a GPU) holds them on the GPU: bring them back.
    A checkpoint from a machine with more GPUs restores the generators of the GPUs this one has."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"].cpu())
    if "cuda" in state and torch.cuda.is_available():
        cuda_states = state["cuda"][:torch.cuda.device_count()]
        torch.cuda.set_rng_state_all([generator_state.cpu() for generator_state in cuda_states])


def checkpoint_payload(training: TrainingState, *, model: dict[str, torch.Tensor],
                       optimizer: dict[str, Any] | None, reference: dict[str, torch.Tensor] | None,
                       scaler: dict[str, Any] | None = None) -> dict[str, Any]:
    """What ``state.pt`` holds (the RNG states are this process's, taken now)."""
    return {"training": training.__dict__, "model": model, "optimizer": optimizer, "reference": reference,
            "scaler": scaler, "rng": rng_state()}


def _process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        pass
    return True


def remove_abandoned_staging(save_path: str | Path) -> None:
    """Delete the staging directories of saves on this host whose writing process no longer exists."""
    host = socket.gethostname()
    for entry in Path(save_path).iterdir():
        match = STAGING_PATTERN.match(entry.name)
        if match and match["host"] == host and not _process_exists(int(match["pid"])):
            shutil.rmtree(entry, ignore_errors=True)


def write_checkpoint(save_path: str | Path, iteration: int, write_state: Callable[[Path], None],
                     config_yaml: str = "") -> Path:
    """Write one checkpoint directory atomically (``write_state`` writes ``state.pt`` at the path it is given)
    and return it."""
    root = Path(save_path)
    root.mkdir(parents=True, exist_ok=True)
    remove_abandoned_staging(root)
    final = checkpoint_dir(root, iteration)
    staging = root / f".tmp-{final.name}-{socket.gethostname()}-{os.getpid()}"
    if staging.exists():
        shutil.rmtree(staging)
    staging.mkdir()
    try:
        write_state(staging / STATE_FILE)
        (staging / "config.yaml").write_text(config_yaml)
    except (OSError, RuntimeError) as error:  # torch.save reports a full disk as a RuntimeError
        free = shutil.disk_usage(root).free
        shutil.rmtree(staging, ignore_errors=True)
        reason = (str(error).strip().splitlines() or [""])[0]
        raise CheckpointWriteError(
            f"train_config.save_path: writing {final.name} under {root} failed with {free / 2**20:.1f} MiB free on "
            f"its disk ({type(error).__name__}: {reason}); the checkpoints before it are intact") from error
    if final.exists():  # re-saving an iteration (a run resumed from it and stopped before it trained)
        shutil.rmtree(final)
    os.replace(staging, final)
    return final


def save_checkpoint(save_path: str | Path, training: TrainingState, *, model: dict[str, torch.Tensor],
                    optimizer: dict[str, Any] | None, reference: dict[str, torch.Tensor] | None,
                    scaler: dict[str, Any] | None = None, config_yaml: str = "") -> Path:
    """Write one checkpoint atomically and return its directory."""
    payload = checkpoint_payload(training, model=model, optimizer=optimizer, reference=reference, scaler=scaler)
    return write_checkpoint(save_path, training.iteration, lambda path: torch.save(payload, path), config_yaml)


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu", *,
                    data: bytes | None = None) -> dict[str, Any]:
    """Read a checkpoint directory (or its ``state.pt``); raise ``FileNotFoundError``/``ValueError`` clearly.
    ``data``: the bytes of its ``state.pt``, read on the node that has it (``path`` then only names it)."""
    path = Path(path)
    state_file = path / STATE_FILE if data is not None or path.is_dir() else path
    if data is None and not state_file.is_file():
        raise FileNotFoundError(f"{path}: no checkpoint here (expected a directory holding {STATE_FILE})")
    try:
        payload = torch.load(io.BytesIO(data) if data is not None else state_file, map_location=map_location,
                             weights_only=False)
    except Exception as error:
        raise ValueError(f"{state_file}: unreadable checkpoint ({type(error).__name__}: {error})") from None
    if not isinstance(payload, dict) or "model" not in payload or "training" not in payload:
        raise ValueError(f"{state_file}: not a craftrl checkpoint (missing model/training entries)")
    payload["training"] = TrainingState(**payload["training"])
    return payload


def resolve_resume(resume: str, save_path: str | Path) -> Path:
    """``'latest'`` -> the newest complete checkpoint under ``save_path``; a path -> that checkpoint."""
    if resume == "latest":
        found = list_checkpoints(save_path)
        if not found:
            raise FileNotFoundError(f"train_config.resume=latest: no checkpoint under {save_path} (expected "
                                    "iter_NNNNNNNN/state.pt there; pass --resume CHECKPOINT_DIR to name one)")
        return found[-1][1]
    path = Path(resume).expanduser()
    if not (path / STATE_FILE).is_file():
        raise FileNotFoundError(f"train_config.resume: {resume} is not a checkpoint directory "
                                f"(expected {path / STATE_FILE})")
    return path


def checkpoints_to_delete(iterations: list[int], keep_interval: int, keep_last: int) -> list[int]:
    """The retention rule, as a pure function of the saved iterations."""
    newest = set(sorted(iterations)[-keep_last:]) if keep_last > 0 else set()
    return [i for i in sorted(iterations)
            if i not in newest and not (keep_interval > 0 and i % keep_interval == 0)]


def apply_retention(save_path: str | Path, keep_interval: int, keep_last: int = 3) -> list[int]:
    found = dict(list_checkpoints(save_path))
    doomed = checkpoints_to_delete(list(found), keep_interval, keep_last)
    for iteration in doomed:
        shutil.rmtree(found[iteration], ignore_errors=True)
    return doomed
