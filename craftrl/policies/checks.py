"""Contract checks reusable by anyone writing a policy (the built-in tests use them).

The central property: a chunked forward over ``T`` steps equals ``T`` single-step calls with the state
carried, including episode starts in the middle. If it fails, trainer re-evaluation of stored fragments
does not reproduce what the behaviour policy computed.
"""

from __future__ import annotations

import torch

from craftrl.policies.base import Policy
from craftrl.policies.state import tree_leaves, tree_map


def _slice_time(tree, t: int):
    return tree_map(lambda leaf: leaf[:, t:t + 1], tree)


def _cat_time(trees):
    first = trees[0]
    if isinstance(first, dict):
        return {key: _cat_time([tree[key] for tree in trees]) for key in first}
    return torch.cat(trees, dim=1)


@torch.no_grad()
def chunked_vs_stepwise_max_diff(policy: Policy, inputs: dict[str, torch.Tensor], first: torch.Tensor,
                                 state_in=None) -> float:
    """Largest absolute difference over logits, values and final state between the two execution modes."""
    batch, time = first.shape
    state_in = policy.initial_state(batch) if state_in is None else state_in
    chunk_latents, chunk_state = policy(input=inputs, state_in=state_in, first=first)

    step_logits, step_values, state = [], [], state_in
    for t in range(time):
        latents, state = policy(input=_slice_time(inputs, t), state_in=state, first=first[:, t:t + 1])
        step_logits.append(latents["pi_logits"])
        step_values.append(latents["vpred"])

    pairs = list(zip(tree_leaves(chunk_latents["pi_logits"]), tree_leaves(_cat_time(step_logits))))
    pairs.append((chunk_latents["vpred"], torch.cat(step_values, dim=1)))
    pairs += list(zip(tree_leaves(chunk_state), tree_leaves(state)))
    worst = 0.0
    for chunked, stepped in pairs:
        if chunked.shape != stepped.shape:
            raise AssertionError(f"shape mismatch: chunked {tuple(chunked.shape)} vs step {tuple(stepped.shape)}")
        if chunked.dtype == torch.bool:
            worst = max(worst, float((chunked != stepped).any()))
        else:
            worst = max(worst, float((chunked.float() - stepped.float()).abs().max()))
    return worst
