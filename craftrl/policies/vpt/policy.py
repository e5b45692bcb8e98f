"""The VPT policy (network + hierarchical action head + normalised value head) under the craftrl contract."""

from __future__ import annotations

from typing import Any

import torch

from craftrl.policies.base import Policy, as_first
from craftrl.policies.heads import ValueHead
from craftrl.policies.state import State
from craftrl.policies.vpt.action_head import CameraHierarchicalHead
from craftrl.policies.vpt.config import VPTConfig
from craftrl.policies.vpt.network import VPTNet

# VPT's value normaliser: EWMA with beta 0.99999 per update, variance >= 1e-2, debias term >= 1e-5.
VPT_VALUE_BETA = 0.99999


class VPTPolicy(Policy):
    """Input ``{"image": uint8 [B, T, H, W, 3]}`` (128x128 for the official models).

    Action: ``{"buttons": long [B, T, 1], "camera": long [B, T, 1]}``. State: flat list of
    ``3 * n_recurrence_layers`` tensors ``[valid, keys, values]`` per transformer block.
    """

    def __init__(self, config: VPTConfig, temperature: float = 1.0, image_key: str = "image") -> None:
        super().__init__()
        self.config = config
        self.image_key = image_key
        self.net = VPTNet(config)
        self.value_head = ValueHead(config.hidsize, beta=VPT_VALUE_BETA)
        self.pi_head = CameraHierarchicalHead(config.hidsize, temperature=temperature)

    @property
    def temperature(self) -> float:
        return self.pi_head.temperature

    def initial_state(self, batch_size: int) -> State:
        reference = self.net.final_ln.weight
        return self.net.initial_state(batch_size, reference.device, reference.dtype)

    def forward(self, input: dict[str, torch.Tensor], state_in: State,  # noqa: A002
                first: torch.Tensor | None = None) -> tuple[dict[str, Any], State]:
        images = input[self.image_key]
        batch, time = images.shape[:2]
        first = as_first(first, batch, time, images.device)
        latent, state_out = self.net(images, first, list(state_in))
        return {"pi_logits": self.pi_head(latent), "vpred": self.value_head(latent), "latent": latent}, state_out
