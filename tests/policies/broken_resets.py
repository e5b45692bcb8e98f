"""Deliberate reset bugs for checking that the chunked-vs-stepwise tolerance still catches what it exists for."""
from __future__ import annotations

from typing import Callable

import pytest
import torch


def ignore_mid_chunk_starts(first: torch.Tensor) -> torch.Tensor:
    """Episode starts after a chunk's first step are lost: the state runs on across them."""
    return torch.cat([first[:, :1], torch.zeros_like(first[:, 1:])], dim=1)


def starts_one_step_late(first: torch.Tensor) -> torch.Tensor:
    """Each start after the chunk's first step resets the state one step too late."""
    return torch.cat([first[:, :1], first[:, :-1]], dim=1)


BUGS = [ignore_mid_chunk_starts, starts_one_step_late]


def break_chunked_resets(policy, bug: Callable[[torch.Tensor], torch.Tensor], monkeypatch: pytest.MonkeyPatch) -> None:
    """Make ``policy``'s chunked calls apply ``bug`` to ``first``; its single-step calls stay right."""
    forward = policy.forward

    def buggy_forward(input, state_in, first):
        if first is not None and first.shape[1] > 1:
            first = bug(first)
        return forward(input=input, state_in=state_in, first=first)

    monkeypatch.setattr(policy, "forward", buggy_forward)
