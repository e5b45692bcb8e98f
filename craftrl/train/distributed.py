"""The learner's collectives: no-ops in a single process, so the same code runs with and without DDP."""

from __future__ import annotations

from typing import Sequence

import torch
import torch.distributed as dist


def distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def _reduce(tensor: torch.Tensor, op_name: str) -> torch.Tensor:
    if distributed():
        dist.all_reduce(tensor, op=getattr(dist.ReduceOp, op_name))
    return tensor


def all_reduce(tensor: torch.Tensor) -> torch.Tensor:
    """Sum across ranks, in place."""
    return _reduce(tensor, "SUM")


def all_reduce_max(tensor: torch.Tensor) -> torch.Tensor:
    """Element-wise maximum across ranks, in place."""
    return _reduce(tensor, "MAX")


def all_reduce_min(tensor: torch.Tensor) -> torch.Tensor:
    """Element-wise minimum across ranks, in place."""
    return _reduce(tensor, "MIN")


def rank_mean(values: Sequence[float], device: torch.device) -> list[float]:
    """Each value averaged over all ranks (float64), so every rank acts on the same numbers."""
    world = dist.get_world_size() if distributed() else 1
    return (all_reduce(torch.tensor(list(values), dtype=torch.float64, device=device)) / world).tolist()
