"""The policy contract every craftrl policy implements (see docs/policies.md).

Episode starts are part of ``forward``: ``first[b, t]`` means the recurrent state is reset *before* step
``t`` of row ``b``, at any ``t``. That makes one chunked call over ``T`` steps identical to ``T`` single-step
calls with the state carried, which is what lets the trainer re-evaluate stored fragments faithfully.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Any, Sequence

import torch
from torch import nn

from craftrl.policies.heads import Action, ValueHead
from craftrl.policies import state as state_lib
from craftrl.policies.state import State


@dataclass
class ActResult:
    """What a rollout step needs: everything ``[B, T]`` (or a dict of such for multi-head actions)."""

    action: Action
    logp: torch.Tensor
    value: torch.Tensor  # in return units (the value head's normalised ``vpred``, denormalised)
    state_out: State
    latents: dict[str, Any]


class Policy(nn.Module, abc.ABC):
    """Base class: subclasses set ``self.pi_head`` and ``self.value_head`` and implement the two abstract methods."""

    pi_head: nn.Module
    value_head: ValueHead

    @abc.abstractmethod
    def forward(self, input: dict[str, torch.Tensor], state_in: State,  # noqa: A002 - contract name
                first: torch.Tensor) -> tuple[dict[str, Any], State]:
        """``input``: dict of ``[B, T, ...]`` tensors; ``first``: bool ``[B, T]``.

        Returns ``(latents, state_out)`` with ``latents["pi_logits"]`` (head output, normalised log-probs)
        and ``latents["vpred"]`` (``[B, T]``, normalised value space).
        """

    @abc.abstractmethod
    def initial_state(self, batch_size: int) -> State:
        """Zero state for ``batch_size`` rows on the policy's device."""

    @property
    def device(self) -> torch.device:
        for tensor in self.parameters():
            return tensor.device
        return torch.device("cpu")

    @torch.no_grad()
    def act(self, input: dict[str, torch.Tensor], state_in: State, first: torch.Tensor,  # noqa: A002
            deterministic: bool = False) -> ActResult:
        """Sample an action and score it: the one call a rollout worker makes per step."""
        latents, state_out = self(input=input, state_in=state_in, first=first)
        logits = latents["pi_logits"]
        action = self.pi_head.sample(logits, deterministic=deterministic)
        return ActResult(
            action=action,
            logp=self.pi_head.logprob(action, logits),
            value=self.value_head.denormalize(latents["vpred"]),
            state_out=state_out,
            latents=latents,
        )

    # State helpers, also available as functions in craftrl.policies.state.
    @staticmethod
    def merge_state(states: Sequence[State]) -> State:
        return state_lib.merge_states(states)

    @staticmethod
    def split_state(state: State, batch_size: int | None = None) -> list[State]:
        return state_lib.split_state(state, batch_size)

    def state_to_device(self, state: State) -> State:
        return state_lib.state_from_numpy(state, self.device)

    @staticmethod
    def state_to_numpy(state: State) -> State:
        return state_lib.state_to_numpy(state)


def as_first(first: torch.Tensor | None, batch: int, time: int, device: torch.device) -> torch.Tensor:
    """Normalise the ``first`` argument to a bool ``[B, T]`` tensor on ``device`` (None = no resets)."""
    if first is None:
        return torch.zeros(batch, time, dtype=torch.bool, device=device)
    first = torch.as_tensor(first, device=device).bool()
    if first.shape != (batch, time):
        raise ValueError(f"first: expected shape ({batch}, {time}), got {tuple(first.shape)}")
    return first

