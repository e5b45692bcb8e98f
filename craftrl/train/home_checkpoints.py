"""Checkpoints live on the home node's disk, whichever node the train worker that saves or loads them is on.

Ray Train may put rank 0 (which saves) on any node that has the train workers' resources, and every rank loads
the checkpoint it resumes from. ``save_path`` names a directory on the home node (the driver's, see
:mod:`craftrl.system`), so a train worker elsewhere must not touch its own disk there: it sends the serialised
``state.pt`` through Ray's object store to a task pinned to the home node, which writes it atomically and applies
the retention rule, and it reads a checkpoint back the same way. On the home node the files are written and read
in place, without the copy.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any, Callable

import torch

from craftrl.placement import current_node_id, on_node
from craftrl.train.checkpoint import (STATE_FILE, TrainingState, apply_retention, checkpoint_payload, load_checkpoint,
                                      resolve_resume, write_checkpoint)


def _write_and_retain(save_path: str, iteration: int, write_state: Callable[[Path], None], config_yaml: str,
                      keep_interval: int, keep_last: int) -> str:
    final = write_checkpoint(save_path, iteration, write_state, config_yaml)
    apply_retention(save_path, keep_interval, keep_last)
    return str(final)


def _write_on_home(save_path: str, iteration: int, state: bytes, config_yaml: str, keep_interval: int,
                   keep_last: int) -> str:
    return _write_and_retain(save_path, iteration, lambda path: path.write_bytes(state), config_yaml, keep_interval,
                             keep_last)


def _read_on_home(resume: str, save_path: str) -> tuple[str, bytes]:
    path = resolve_resume(resume, save_path)
    return str(path), (path / STATE_FILE).read_bytes()


class HomeCheckpoints:
    """Saves and loads the run's checkpoints under ``save_path`` on the home node, from any node."""

    def __init__(self, save_path: str | Path, home_node: str | None, keep_interval: int, keep_last: int):
        self.save_path = str(save_path)
        self.home_node = home_node
        self.keep_interval, self.keep_last = keep_interval, keep_last
        # None: outside Ray, or a driver that did not say (local mode, tests), so the files are this node's
        self.through_ray = home_node is not None and home_node != current_node_id()

    def save(self, training: TrainingState, *, model: dict[str, torch.Tensor], optimizer: dict[str, Any] | None,
             reference: dict[str, torch.Tensor] | None, scaler: dict[str, Any] | None = None,
             config_yaml: str = "") -> str:
        """Write one checkpoint atomically, apply the retention rule; returns its directory (on the home node)."""
        payload = checkpoint_payload(training, model=model, optimizer=optimizer, reference=reference, scaler=scaler)
        if not self.through_ray:
            return _write_and_retain(self.save_path, training.iteration, lambda path: torch.save(payload, path),
                                     config_yaml, self.keep_interval, self.keep_last)
        import ray

        buffer = io.BytesIO()
        torch.save(payload, buffer)
        write = ray.remote(_write_on_home).options(num_cpus=0, max_retries=3, **on_node(self.home_node))
        return ray.get(write.remote(self.save_path, training.iteration, buffer.getbuffer().tobytes(), config_yaml,
                                    self.keep_interval, self.keep_last))

    def load(self, resume: str, map_location: str | torch.device = "cpu") -> tuple[str, dict[str, Any]]:
        """The checkpoint ``resume`` names (``latest`` or a directory) and its payload."""
        if not self.through_ray:
            path = resolve_resume(resume, self.save_path)
            return str(path), load_checkpoint(path, map_location=map_location)
        import ray

        read = ray.remote(_read_on_home).options(num_cpus=0, max_retries=3, **on_node(self.home_node))
        path, state = ray.get(read.remote(resume, self.save_path))
        return path, load_checkpoint(path, map_location=map_location, data=state)
