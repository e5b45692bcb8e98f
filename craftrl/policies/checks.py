"""Contract checks reusable by anyone writing a policy (the built-in tests and ``craftrl train``'s preflight).

The central property: a chunked forward over ``T`` steps equals ``T`` single-step calls with the state
carried, including episode starts in the middle, up to float rounding (``chunked_vs_stepwise_mismatch``). If it
fails, trainer re-evaluation of stored fragments does not reproduce what the behaviour policy computed.

The shape checks (``check_policy_members``, ``check_forward_outputs``, ``check_act_result``) exist because a
policy that returns a wrong shape otherwise fails far from its cause -- inside a Ray actor, or silently by
broadcasting in the PPO loss. Each raises ``PolicyContractError`` with one line naming the output and what
was expected.
"""

from __future__ import annotations

from typing import Any, Mapping

import torch
from torch import nn

from craftrl.policies.base import ActResult, Policy
from craftrl.policies.state import tree_leaves, tree_map
from craftrl.utils.describe import describe_value

POLICY_EXPECTATION = "expected a torch.nn.Module subclass of craftrl.policies.Policy, see docs/policies.md"
REQUIRED_MEMBERS = ("initial_state", "act", "pi_head", "value_head")
LOG_PROB_TOLERANCE = 1e-2  # logsumexp of normalised log-probs is 0; float32 rounding stays far below this


class PolicyContractError(ValueError):
    """A policy broke the contract of docs/policies.md; the message is one line."""


# Why a worker's policy_generator may build another network than the driver's: what its node gives it.
GENERATORS_RUN_ON_NODES = (
    "generators run in each worker's process with its node's environment variables and working directory, not the "
    "driver's: read such values at the top of the config module, where the driver reads them once and they travel "
    "with the generators, and give file paths absolute (docs/cluster.md)")


# why a config's own policy_generator can build another network than the one it trained, said with every mismatch
REBUILD_HINT = ("a config that reads environment variables or files when it loads (examples/kill_cows_vpt.py reads "
                "VPT_MODEL) builds the trained policy only with them as they were")


def weight_mismatch(shapes: Mapping[str, tuple[int, ...]], policy: nn.Module, source: str,
                    target: str = "the policy") -> str | None:
    """Why a strict ``load_state_dict`` of weights of these ``shapes`` (from ``source``, e.g. "the checkpoint")
    into ``policy`` (``target`` in the message) fails, in one line; None if it fits.

    torch's own error spans many lines and leads with the class name; the first differing shapes say more.
    """
    expected = tensor_shapes(policy.state_dict())
    problems = [f"{key!r} is {list(shapes[key])} in {source} but {list(shape)} in {target}"
                for key, shape in expected.items() if key in shapes and tuple(shapes[key]) != shape]
    problems += [f"{key!r} is in {source} but not in {target}" for key in shapes if key not in expected]
    problems += [f"{key!r} is in {target} but not in {source}" for key in expected if key not in shapes]
    if not problems:
        return None
    more = f" and {len(problems) - 3} more" if len(problems) > 3 else ""
    return "; ".join(problems[:3]) + more


def tensor_shapes(state_dict: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    """Name -> shape of each tensor of a state dict (what :func:`weight_mismatch` compares)."""
    return {key: tuple(value.shape) for key, value in state_dict.items() if hasattr(value, "shape")}


def check_policy_members(policy: Any) -> None:
    """Raise unless ``policy`` is an ``nn.Module`` with the members rollout workers and the trainer call."""
    if not isinstance(policy, nn.Module):
        raise PolicyContractError(f"returned {describe_value(policy)} ({POLICY_EXPECTATION})")
    missing = [name for name in REQUIRED_MEMBERS if getattr(policy, name, None) is None]
    if missing:
        raise PolicyContractError(f"returned {type(policy).__name__}, which has no {', '.join(missing)} "
                                  f"({POLICY_EXPECTATION})")


def check_forward_outputs(outputs: Any, batch: int, time: int, num_actions: int | None = None) -> None:
    """Raise unless ``policy(input=..., state_in=..., first=...)`` returned ``(latents, state_out)`` as documented.

    ``num_actions``: when the env declares a discrete action space, a single-tensor ``pi_logits`` must
    have that many classes in its last axis (a mismatch samples actions the env cannot take).
    """
    expected_bt = f"[B, T] = [{batch}, {time}]"
    if not isinstance(outputs, tuple) or len(outputs) != 2:
        raise PolicyContractError(f"forward() returned {describe_value(outputs)} (expected a tuple (latents, state_out))")
    latents, _ = outputs
    if not isinstance(latents, dict):
        raise PolicyContractError(f"forward() returned latents as {describe_value(latents)} "
                                  "(expected a dict with 'pi_logits' and 'vpred')")
    for name in ("pi_logits", "vpred"):
        if name not in latents:
            keys = ", ".join(repr(key) for key in latents) or "none"
            raise PolicyContractError(f"forward() returned latents without {name!r} (keys: {keys}; "
                                      "expected 'pi_logits' and 'vpred')")
    vpred = latents["vpred"]
    if not isinstance(vpred, torch.Tensor) or not vpred.is_floating_point() or tuple(vpred.shape) != (batch, time):
        raise PolicyContractError(f"forward() returned vpred as {describe_value(vpred)} (expected a float tensor of "
                                  f"shape {expected_bt})")
    logits = latents["pi_logits"]
    named = logits.items() if isinstance(logits, dict) else [("", logits)]
    for key, leaf in named:
        name = f"pi_logits[{key!r}]" if key else "pi_logits"
        if not isinstance(leaf, torch.Tensor) or not leaf.is_floating_point() or leaf.ndim < 3 \
                or tuple(leaf.shape[:2]) != (batch, time):
            raise PolicyContractError(f"forward() returned {name} as {describe_value(leaf)} (expected a float tensor "
                                      f"of shape [B, T, ..., num_actions] with {expected_bt})")
        if torch.isnan(leaf).any():
            raise PolicyContractError(f"forward() returned {name} with NaN entries (expected log-probabilities)")
        worst = float(torch.logsumexp(leaf.detach().float(), dim=-1).abs().max())
        if worst > LOG_PROB_TOLERANCE:
            raise PolicyContractError(f"forward() returned {name} that are not normalised log-probabilities "
                                      f"(logsumexp over the last axis is off 0 by {worst:.3g}; expected the output "
                                      "of log_softmax, as policy.pi_head gives)")
    if num_actions is not None and isinstance(logits, torch.Tensor) and logits.shape[-1] != num_actions:
        raise PolicyContractError(f"forward() returned pi_logits for {logits.shape[-1]} actions (expected "
                                  f"{num_actions}, the env's action_space.n)")


def check_act_result(result: Any, batch: int, time: int) -> None:
    """Raise unless ``policy.act`` returned an ``ActResult`` whose ``logp`` and ``value`` are ``[B, T]``."""
    if not isinstance(result, ActResult):
        raise PolicyContractError(f"act() returned {describe_value(result)} (expected a craftrl.policies.ActResult)")
    for name in ("logp", "value"):
        value = getattr(result, name)
        if not isinstance(value, torch.Tensor) or tuple(value.shape) != (batch, time):
            raise PolicyContractError(f"act() returned {name} as {describe_value(value)} (expected shape "
                                      f"[B, T] = [{batch}, {time}]; check pi_head.logprob and value_head)")


def _slice_time(tree, t: int):
    return tree_map(lambda leaf: leaf[:, t:t + 1], tree)


def _cat_time(trees):
    first = trees[0]
    if isinstance(first, dict):
        return {key: _cat_time([tree[key] for tree in trees]) for key in first}
    return torch.cat(trees, dim=1)


# Two float32 computations of the same quantity that differ only in the order of their operations (a chunked call
# against step-by-step calls, another batch size, another kernel) drift apart by rounding alone. Summing K terms in
# another order moves the result by up to about K units of float32's precision (eps = 2**-23) of the terms'
# magnitude, typically sqrt(K); the built-in policies sum at most a few thousand terms per output through a handful
# of layers and recurrent steps. 1024 units of eps at the compared tensor's largest magnitude (1.2e-4 of it) leave
# room for any CPU's or GPU's kernels while a logic error -- a state not reset at an episode start, an off-by-one in
# time -- moves the outputs by thousands to millions of such units (tests/policies measure both).
REORDERING_ULPS = 1024


def mismatch_ulps(actual: torch.Tensor, expected: torch.Tensor, precision: torch.dtype | None = None) -> float:
    """Largest ``|actual - expected|`` in units of ``precision``'s eps at ``expected``'s largest magnitude.

    ``precision`` is the dtype the two were computed in (default: the less precise of the two tensors' dtypes).
    Scaling by the tensor's largest magnitude rather than by each element keeps an element that is near zero
    by cancellation from counting as a large relative error. Bool tensors compare exactly (``inf`` if not).
    """
    if actual.shape != expected.shape:
        raise AssertionError(f"shape mismatch: {tuple(actual.shape)} vs {tuple(expected.shape)}")
    if not expected.is_floating_point():
        return 0.0 if torch.equal(actual.cpu(), expected.cpu()) else float("inf")
    if precision is None:
        precision = min(actual.dtype, expected.dtype, key=lambda dtype: torch.finfo(dtype).bits)
    actual, expected = actual.detach().double().cpu(), expected.detach().double().cpu()
    diff = float((actual - expected).abs().max()) if actual.numel() else 0.0
    if diff == 0.0:
        return 0.0
    scale = float(expected.abs().max()) or float(actual.abs().max())
    return diff / (torch.finfo(precision).eps * scale)


@torch.no_grad()
def chunked_vs_stepwise_mismatch(policy: Policy, inputs: dict[str, torch.Tensor], first: torch.Tensor,
                                 state_in=None) -> dict[str, float]:
    """Per output (``pi_logits``, each ``pi_logits`` key, ``vpred``, each state leaf), the mismatch between one
    chunked call over ``T`` steps and ``T`` single-step calls with the state carried, in :func:`mismatch_ulps`.

    A policy honours the contract when every value is at most :data:`REORDERING_ULPS`.
    """
    batch, time = first.shape
    state_in = policy.initial_state(batch) if state_in is None else state_in
    chunk_latents, chunk_state = policy(input=inputs, state_in=state_in, first=first)

    step_logits, step_values, state = [], [], state_in
    for t in range(time):
        latents, state = policy(input=_slice_time(inputs, t), state_in=state, first=first[:, t:t + 1])
        step_logits.append(latents["pi_logits"])
        step_values.append(latents["vpred"])

    named = list(zip(_leaf_names("pi_logits", chunk_latents["pi_logits"]), tree_leaves(chunk_latents["pi_logits"]),
                     tree_leaves(_cat_time(step_logits))))
    named.append(("vpred", chunk_latents["vpred"], torch.cat(step_values, dim=1)))
    named += list(zip(_leaf_names("state", chunk_state), tree_leaves(chunk_state), tree_leaves(state)))
    return {name: mismatch_ulps(chunked, stepped) for name, chunked, stepped in named}


def _leaf_names(prefix: str, tree) -> list[str]:
    """Names of ``tree``'s leaves in ``tree_leaves`` order: ``prefix[key][...]``."""
    if tree is None:
        return []
    if isinstance(tree, dict):
        return [name for key, value in tree.items() for name in _leaf_names(f"{prefix}[{key!r}]", value)]
    if isinstance(tree, (list, tuple)):
        return [name for index, value in enumerate(tree) for name in _leaf_names(f"{prefix}[{index}]", value)]
    return [prefix]
