"""OpenAI VPT (Baker et al. 2022) under the craftrl policy contract, loading the official files strictly.

``vpt_tiny`` is the same code at CPU-test size.
"""

from __future__ import annotations

import dataclasses

from craftrl.policies.vpt.action_head import (
    NULL_CAMERA,
    NUM_BUTTON_COMBINATIONS,
    NUM_CAMERA_CLASSES,
    CameraHierarchicalHead,
    camera_meta_mask,
)
from craftrl.policies.vpt.config import VPT_1X, VPT_2X, VPT_TINY, VPTConfig
from craftrl.policies.vpt.loading import load_vpt_policy, read_vpt_model_file, save_vpt_policy, write_vpt_model_file
from craftrl.policies.vpt.policy import VPTPolicy


def vpt_tiny(temperature: float = 1.0, **config_overrides) -> VPTPolicy:
    """Randomly initialised small VPT (hidsize 128, width-1 CNN, 2 blocks, 32-frame memory, 128x128 input)."""
    if "img_shape" in config_overrides:
        config_overrides["img_shape"] = tuple(config_overrides["img_shape"])
    return VPTPolicy(dataclasses.replace(VPT_TINY, **config_overrides), temperature=temperature)


__all__ = [
    "NULL_CAMERA", "NUM_BUTTON_COMBINATIONS", "NUM_CAMERA_CLASSES", "CameraHierarchicalHead", "camera_meta_mask",
    "VPT_1X", "VPT_2X", "VPT_TINY", "VPTConfig", "VPTPolicy", "load_vpt_policy", "read_vpt_model_file",
    "save_vpt_policy", "write_vpt_model_file", "vpt_tiny",
]
