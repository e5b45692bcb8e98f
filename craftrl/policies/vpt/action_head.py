"""VPT's hierarchical action head: a joint button choice, and a camera choice that only counts when the
button choice switches the camera on.

Button combinations are ordered as the product of the groups hotbar(10) x fore/back(3) x left/right(3) x
sprint/sneak(3) x use(2) x drop(2) x attack(2) x jump(2) x camera-meta(2), the camera meta-action varying
fastest, then one extra "inventory" combination: 8641 classes. So a combination has the camera on exactly
when its index is odd and below 8640. Inventory does not carry the meta-action, so its camera is ignored.
Camera classes are 11 x 11 (pitch bin, yaw bin); index 60 is the null camera.
"""

from __future__ import annotations

import torch
from torch import nn

from craftrl.policies.heads import CategoricalHead

NUM_BUTTON_COMBINATIONS = 10 * 3 * 3 * 3 * 2 ** 5 + 1
NUM_CAMERA_BINS = 11
NUM_CAMERA_CLASSES = NUM_CAMERA_BINS * NUM_CAMERA_BINS
NULL_CAMERA = (NUM_CAMERA_BINS // 2) * NUM_CAMERA_BINS + NUM_CAMERA_BINS // 2
INVENTORY_BUTTON = NUM_BUTTON_COMBINATIONS - 1


def camera_meta_mask(num_buttons: int = NUM_BUTTON_COMBINATIONS) -> torch.Tensor:
    """Bool ``[num_buttons]``: True where the button combination turns the camera on."""
    index = torch.arange(num_buttons)
    return (index % 2 == 1) & (index < num_buttons - 1)


class CameraHierarchicalHead(nn.Module):
    """``forward`` -> ``{"camera": [B, T, 1, 121], "buttons": [B, T, 1, 8641]}`` log-probs.

    Scores treat the action as the pair (buttons, camera-if-on): log p = log p_b + on(b) log p_c; entropy
    and KL are those of that joint distribution, i.e. the camera term weighted by the probability that
    the camera is on. Sampled cameras are set to the null class where the camera is off.
    """

    def __init__(self, in_features: int, temperature: float = 1.0) -> None:
        super().__init__()
        # Registration order = state_dict order of the official weights (camera first).
        self.camera = CategoricalHead(in_features, NUM_CAMERA_CLASSES, event_shape=(1,), temperature=temperature)
        self.buttons = CategoricalHead(in_features, NUM_BUTTON_COMBINATIONS, event_shape=(1,),
                                       temperature=temperature)
        self.register_buffer("camera_on", camera_meta_mask(), persistent=False)

    @property
    def temperature(self) -> float:
        return self.buttons.temperature

    def forward(self, latent: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"camera": self.camera(latent), "buttons": self.buttons(latent)}

    def _camera_on_probability(self, logits: dict[str, torch.Tensor]) -> torch.Tensor:
        return (logits["buttons"].exp() * self.camera_on.to(logits["buttons"].dtype)).sum(-1)  # [..., 1]

    def sample(self, logits: dict[str, torch.Tensor], deterministic: bool = False) -> dict[str, torch.Tensor]:
        buttons = self.buttons.sample(logits["buttons"], deterministic)
        camera = self.camera.sample(logits["camera"], deterministic)
        camera = torch.where(self.camera_on[buttons], camera, torch.full_like(camera, NULL_CAMERA))
        return {"buttons": buttons, "camera": camera}

    def logprob(self, action: dict[str, torch.Tensor], logits: dict[str, torch.Tensor]) -> torch.Tensor:
        buttons = action["buttons"].long()
        button_lp = logits["buttons"].gather(-1, buttons.unsqueeze(-1)).squeeze(-1)
        camera_lp = logits["camera"].gather(-1, action["camera"].long().unsqueeze(-1)).squeeze(-1)
        camera_lp = torch.where(self.camera_on[buttons], camera_lp, torch.zeros_like(camera_lp))
        return (button_lp + camera_lp).sum(-1)

    def entropy(self, logits: dict[str, torch.Tensor]) -> torch.Tensor:
        button_entropy = -(logits["buttons"].exp() * logits["buttons"]).sum(-1)
        camera_entropy = -(logits["camera"].exp() * logits["camera"]).sum(-1)
        return (button_entropy + self._camera_on_probability(logits) * camera_entropy).sum(-1)

    def kl_divergence(self, logits_q: dict[str, torch.Tensor], logits_p: dict[str, torch.Tensor]) -> torch.Tensor:
        """KL(q || p) of the joint (buttons, camera-if-on) distributions."""
        button_kl = (logits_q["buttons"].exp() * (logits_q["buttons"] - logits_p["buttons"])).sum(-1)
        camera_kl = (logits_q["camera"].exp() * (logits_q["camera"] - logits_p["camera"])).sum(-1)
        return (button_kl + self._camera_on_probability(logits_q) * camera_kl).sum(-1)
