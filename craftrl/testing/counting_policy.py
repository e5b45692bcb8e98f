"""A transparent recurrent policy for testing rollout and training plumbing without learning anything.

``CountingPolicy``'s recurrent state counts the steps since the episode started (reset by ``first``), and
its value prediction *is* that count, so a test can read from a fragment's ``value`` whether the state
was carried and reset at exactly the right steps. Its action distribution is a learnable 2-way softmax.
"""

from __future__ import annotations

import torch
from torch import nn

from craftrl.policies.base import Policy, as_first
from craftrl.policies.heads import CategoricalHead


class _IdentityValue(nn.Module):
    def denormalize(self, values: torch.Tensor) -> torch.Tensor:
        return values

    def normalize(self, values: torch.Tensor) -> torch.Tensor:
        return values


class CountingPolicy(Policy):
    def __init__(self, num_actions: int = 2) -> None:
        super().__init__()
        self.action_scores = nn.Parameter(torch.zeros(num_actions))
        self.pi_head = CategoricalHead(1, num_actions)
        self.value_head = _IdentityValue()

    def initial_state(self, batch_size: int) -> torch.Tensor:
        return torch.zeros(batch_size, 1, device=self.action_scores.device)

    def forward(self, input, state_in, first):  # noqa: A002 - contract name
        image = input["image"]
        batch, time = image.shape[:2]
        first = as_first(first, batch, time, self.action_scores.device)
        count = state_in[:, 0]
        values = []
        for t in range(time):
            count = torch.where(first[:, t], torch.zeros_like(count), count) + 1
            values.append(count)
        vpred = torch.stack(values, dim=1) - 1  # 0 on an episode's first observation
        logits = torch.log_softmax(self.action_scores, dim=-1).expand(batch, time, -1)
        return {"pi_logits": logits, "vpred": vpred}, count.unsqueeze(1)


def counting_policy_generator() -> CountingPolicy:
    return CountingPolicy()
