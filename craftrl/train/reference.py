"""The KL reference policy: a frozen copy of the policy, or with ``enable_ref_update`` a slower-moving one.

The KL term ``rho * KL(pi || reference)`` holds the policy near its reference. A frozen reference (the initial,
e.g. pretrained, policy) keeps it near where it started for the whole run; an exponential moving average of the
policy keeps it near where it recently was, so the term limits how fast the policy moves without pulling it back
to its start.
"""

from __future__ import annotations

import copy

import torch


def make_reference(policy: torch.nn.Module) -> torch.nn.Module:
    """A copy of ``policy`` in eval mode whose parameters take no gradients."""
    reference = copy.deepcopy(policy).eval()
    for parameter in reference.parameters():
        parameter.requires_grad_(False)
    return reference


@torch.no_grad()
def move_towards(reference: torch.nn.Module, policy: torch.nn.Module, rate: float) -> None:
    """``reference <- (1 - rate) * reference + rate * policy`` for every floating-point parameter and buffer;
    other buffers (counters, flags) are copied. Rate 0 leaves the reference as it is, rate 1 makes it ``policy``."""
    targets = dict(reference.named_parameters()) | dict(reference.named_buffers())
    sources = dict(policy.named_parameters()) | dict(policy.named_buffers())
    for name, target in targets.items():
        source = sources[name]
        if target.is_floating_point():
            target.lerp_(source.to(target.dtype), rate)
        else:
            target.copy_(source)
