"""Reading and writing OpenAI's VPT files.

``.model``: a pickled dict; the network arguments live at ``model.args.net.args`` and the action-head
options at ``model.args.pi_head_opts`` (only ``temperature`` is used, cast with ``float``). Other keys are
ignored. ``.weights``: ``torch.save`` of the policy state_dict (``net.*``, ``value_head.*``, ``pi_head.*``),
loaded strictly here.
"""

from __future__ import annotations

import os
import pickle
from typing import Any

import torch

from craftrl.policies.vpt.config import VPTConfig
from craftrl.policies.vpt.policy import VPTPolicy

PathLike = str | os.PathLike


def read_vpt_model_file(model_path: PathLike) -> tuple[VPTConfig, float]:
    """Network config and temperature from a ``.model`` pickle (trusted input: it is a pickle)."""
    with open(model_path, "rb") as handle:
        agent = pickle.load(handle)  # noqa: S301 - official format is a pickle
    try:
        model_args = agent["model"]["args"]
        net_args = model_args["net"]["args"]
    except (KeyError, TypeError) as error:
        raise ValueError(f"{model_path}: not a VPT .model file (no model.args.net.args)") from error
    temperature = float((model_args.get("pi_head_opts") or {}).get("temperature", 1.0))
    return VPTConfig.from_net_args(net_args), temperature


def write_vpt_model_file(model_path: PathLike, config: VPTConfig, temperature: float = 2.0) -> None:
    """Write a ``.model`` pickle in the official nesting (for tests and for exporting our own checkpoints)."""
    agent: dict[str, Any] = {
        "model": {
            "args": {
                "net": {"args": config.to_net_args(), "function": "min_rec_policy", "local_args": {}},
                "pi_head_opts": {"temperature": temperature},
            },
            "function": "minecraft_agent_policy",
        },
        "version": 1,
    }
    with open(model_path, "wb") as handle:
        pickle.dump(agent, handle)


def load_vpt_policy(model_path: PathLike, weights_path: PathLike | None = None, *,
                    device: str | torch.device | None = None, strict: bool = True) -> VPTPolicy:
    """Build the network described by ``model_path`` and load ``weights_path`` into it (strictly by default).

    Without ``weights_path`` the policy keeps its random initialisation.
    """
    config, temperature = read_vpt_model_file(model_path)
    if weights_path is None:
        policy = VPTPolicy(config, temperature=temperature)
    else:
        # Skip the (slow, wasted) random init of ~70-250 M parameters: build on the meta device, then
        # take the loaded tensors as the parameters.
        with torch.device("meta"):
            policy = VPTPolicy(config, temperature=temperature)
        state_dict = torch.load(weights_path, map_location="cpu", weights_only=True)
        policy.load_state_dict(state_dict, strict=strict, assign=True)
        _materialise_leftovers(policy)
    return policy.to(device) if device is not None else policy


def _materialise_leftovers(policy: VPTPolicy) -> None:
    """Non-strict loads can leave meta tensors; non-persistent buffers are always rebuilt here."""
    from craftrl.policies.vpt.action_head import camera_meta_mask

    policy.pi_head.camera_on = camera_meta_mask()
    for name, tensor in list(policy.named_parameters()) + list(policy.named_buffers()):
        if tensor.is_meta:
            raise ValueError(f"VPT weights are missing {name} (strict=False left it uninitialised)")


def save_vpt_policy(policy: VPTPolicy, model_path: PathLike, weights_path: PathLike) -> None:
    """Write a policy as an official ``.model`` + ``.weights`` pair."""
    write_vpt_model_file(model_path, policy.config, policy.temperature)
    torch.save({key: value.detach().cpu() for key, value in policy.state_dict().items()}, weights_path)
