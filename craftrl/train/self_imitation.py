"""Self-imitation (Oh et al., 2018): keep the learner's own steps that did better than it expected and imitate
them until the value function has caught up.

Why: on a sparse reward PPO uses each rewarded step in one iteration only. On ``crafter/cows`` a random
policy kills a cow about once in 30 episodes; one such kill moves the policy for an iteration, and the
entropy bonus has pulled it back to uniform before the next kill comes (bench/notes/learning.md, a run
without a cow in 11 minutes). Self-imitation keeps those fragments and, every iteration, raises the
log-probability of their actions in proportion to ``(R - V)+`` -- how much the return beat the current
value. As the value learns them that weight goes to 0, so a kept fragment stops mattering by itself, and
a step that did worse than expected is never imitated.

The buffer is plain data (no torch autograd, no Ray): what it keeps and what it draws is testable alone.
Fragments are kept whole, with the recurrent state the behaviour policy started them from, and their
returns as computed in the iteration that admitted them (GAE lambda-returns).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from craftrl.policies.state import merge_states


@dataclass
class ImitationSample:
    """One kept fragment: ``[1, L, ...]`` tensors on the learner's device."""

    obs: dict[str, torch.Tensor]
    first: torch.Tensor
    action: Any
    state_in: Any
    returns: torch.Tensor  # return units
    priority: float  # max over its steps of (R - V)+, with the value of when it was last looked at


def positive_advantage(returns: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """``(R - V)+``: the self-imitation weight of each step (no gradient)."""
    return (returns - values).detach().clamp_min(0.0)


class SelfImitationBuffer:
    """The ``capacity`` fragments of highest priority seen so far, drawn in proportion to their priority.

    A new fragment enters while there is room, or in place of the lowest-priority one when its priority is
    higher; a fragment whose priority has dropped to 0 (the value learnt it) is never drawn and is the first
    to go.
    """

    def __init__(self, capacity: int):
        if capacity < 1:
            raise ValueError(f"self_imitation_capacity: expected >= 1, got {capacity}")
        self.capacity = capacity
        self.samples: list[ImitationSample] = []

    def __len__(self) -> int:
        return len(self.samples)

    @property
    def total_priority(self) -> float:
        return float(sum(sample.priority for sample in self.samples))

    def offer(self, sample: ImitationSample) -> bool:
        """Keep ``sample`` if it ranks among the ``capacity`` best; returns whether it was kept."""
        if sample.priority <= 0.0:
            return False
        if len(self.samples) < self.capacity:
            self.samples.append(sample)
            return True
        lowest = min(range(len(self.samples)), key=lambda index: self.samples[index].priority)
        if self.samples[lowest].priority >= sample.priority:
            return False
        self.samples[lowest] = sample
        return True

    def draw(self, count: int, generator: torch.Generator) -> list[int]:
        """Up to ``count`` distinct indices, each drawn with probability proportional to its priority."""
        priorities = torch.tensor([sample.priority for sample in self.samples], dtype=torch.float64)
        eligible = int((priorities > 0).sum())
        if eligible == 0:
            return []
        picks = torch.multinomial(priorities, min(count, eligible), replacement=False, generator=generator)
        return picks.tolist()

    def stacked(self, indices: list[int]) -> ImitationSample:
        """The chosen fragments as one batch (rows in the order of ``indices``)."""
        chosen = [self.samples[index] for index in indices]
        return ImitationSample(
            obs={key: torch.cat([sample.obs[key] for sample in chosen]) for key in chosen[0].obs},
            first=torch.cat([sample.first for sample in chosen]),
            action=merge_states([sample.action for sample in chosen]),
            state_in=merge_states([sample.state_in for sample in chosen]),
            returns=torch.cat([sample.returns for sample in chosen]),
            priority=max(sample.priority for sample in chosen))

    def reprioritise(self, indices: list[int], priorities: list[float]) -> None:
        for index, priority in zip(indices, priorities):
            self.samples[index].priority = float(priority)
