"""PPO loss terms as plain tensor functions, each testable against hand-computed numbers.

All take a boolean ``mask`` of valid steps (padding and steps to ignore are False) and average over the
valid steps only, so a batch of fragments of unequal usefulness is weighted per step, not per fragment.

The policy ratio is taken against the **behaviour** log-probability stored with each step (the weights
that actually acted), not against the learner's weights at the start of the iteration as MineStudio does:
with asynchronous collection the two differ by up to ``max_staleness`` versions, and only the behaviour
ratio makes the clipped objective the trust region it is meant to be.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    mask = mask.to(x.dtype)
    return (x * mask).sum() / mask.sum().clamp_min(1.0)


@dataclass
class PolicyLossResult:
    loss: torch.Tensor
    approx_kl: torch.Tensor  # E[(r - 1) - log r], the low-variance estimator of KL(behaviour || new)
    clip_fraction: torch.Tensor
    ratio_mean: torch.Tensor


def clipped_policy_loss(new_logp: torch.Tensor, behaviour_logp: torch.Tensor, advantages: torch.Tensor,
                        mask: torch.Tensor, clip: float, log_ratio_range: float) -> PolicyLossResult:
    """PPO's clipped surrogate, as a loss to minimise; the ratio is ``pi / pi_behaviour``.

    The log-ratio is clamped on both sides to ``+-log_ratio_range`` before ``exp`` (MineStudio clamps only the
    upper side, so a collapsed probability still yields ratio 0 and a NaN-prone gradient path).
    """
    log_ratio = (new_logp - behaviour_logp).clamp(-log_ratio_range, log_ratio_range)
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip, 1.0 + clip)
    surrogate = torch.maximum(unclipped, clipped)
    loss = masked_mean(surrogate, mask)
    with torch.no_grad():
        approx_kl = masked_mean((ratio - 1.0) - log_ratio, mask)
        clip_fraction = masked_mean(((ratio - 1.0).abs() > clip).float(), mask)
        ratio_mean = masked_mean(ratio, mask)
    return PolicyLossResult(loss, approx_kl, clip_fraction, ratio_mean)


def value_loss(new_values: torch.Tensor, old_values: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor,
               clip_vloss: bool, clip: float) -> torch.Tensor:
    """0.5 * squared error; with ``clip_vloss`` the pessimistic max of the clipped and unclipped errors.

    All three value tensors must be in the same space (normalised when ``use_normalized_vf``).
    """
    error = (new_values - targets) ** 2
    if clip_vloss:
        clipped_values = old_values + (new_values - old_values).clamp(-clip, clip)
        error = torch.maximum(error, (clipped_values - targets) ** 2)
    return 0.5 * masked_mean(error, mask)


def explained_variance_from_sums(count: float, target_sum: float, target_sq: float, residual_sum: float,
                                 residual_sq: float) -> float:
    """1 - Var[target - prediction] / Var[target] from sums (which ranks can all-reduce); NaN for constant targets."""
    target_var = target_sq / count - (target_sum / count) ** 2
    residual_var = residual_sq / count - (residual_sum / count) ** 2
    return 1.0 - residual_var / target_var if target_var > 1e-12 else float("nan")


def advantage_moments(advantages: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``[count, sum, sum of squares]`` in float64: the sufficient statistics to all-reduce across ranks."""
    mask = mask.bool()
    valid = advantages[mask].double()
    count = torch.tensor(float(valid.numel()), dtype=torch.float64, device=valid.device)
    return torch.stack([count, valid.sum(), (valid ** 2).sum()])


def normalize_advantages(advantages: torch.Tensor, moments: torch.Tensor, eps: float = 1e-8,
                         std_floor: float = 0.0) -> torch.Tensor:
    """Standardise with global moments (summed over every rank's ``advantage_moments``).

    The divisor is ``max(std, std_floor)``: when a batch holds no reward signal its advantages are only value
    noise, and dividing by their tiny std would turn that noise into unit-scale policy updates.
    """
    count, total, total_sq = moments.tolist()
    mean = total / max(count, 1.0)
    variance = max(total_sq / max(count, 1.0) - mean ** 2, 0.0)
    return (advantages - mean) / (max(variance ** 0.5, std_floor) + eps)
