"""Action heads and the value head.

Action heads turn a latent into *normalised log-probabilities* ("logits" below, always already passed
through log_softmax) and know how to sample, score, and compare them. Keeping these operations on the
head lets PPO code stay agnostic of the action space: every method returns one number per ``[B, T]``
position, summed over sub-actions.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

Logits = Any  # torch.Tensor, or a dict of tensors for multi-head actions
Action = Any  # torch.Tensor (long), or a dict of tensors


def gumbel_max_sample(logits: torch.Tensor) -> torch.Tensor:
    """Categorical sample along the last axis; one kernel, no normalisation needed."""
    uniform = torch.rand_like(logits, dtype=torch.float32).clamp_(min=1e-20, max=1.0 - 1e-7)
    return torch.argmax(logits.float() - torch.log(-torch.log(uniform)), dim=-1)


class CategoricalHead(nn.Module):
    """Linear layer + log_softmax over ``num_actions``.

    ``event_shape`` adds trailing sub-action axes before the class axis (VPT uses ``(1,)``, giving
    ``[B, T, 1, n]``); log-prob, entropy and KL are summed over them. ``temperature`` divides the raw
    scores before the softmax and therefore applies to sampling *and* scoring alike.
    """

    def __init__(self, in_features: int, num_actions: int, *, event_shape: tuple[int, ...] = (),
                 temperature: float = 1.0, init_gain: float = 0.01) -> None:
        super().__init__()
        self.num_actions = num_actions
        self.event_shape = tuple(event_shape)
        self.temperature = float(temperature)
        self.linear_layer = nn.Linear(in_features, math.prod(self.event_shape) * num_actions)
        nn.init.orthogonal_(self.linear_layer.weight, gain=init_gain)
        nn.init.zeros_(self.linear_layer.bias)

    def forward(self, latent: torch.Tensor) -> torch.Tensor:
        scores = self.linear_layer(latent)
        scores = scores.reshape(*scores.shape[:-1], *self.event_shape, self.num_actions)
        return F.log_softmax(scores.float() / self.temperature, dim=-1)

    def _reduce_event(self, per_entry: torch.Tensor) -> torch.Tensor:
        for _ in self.event_shape:
            per_entry = per_entry.sum(dim=-1)
        return per_entry

    def sample(self, logits: torch.Tensor, deterministic: bool = False) -> torch.Tensor:
        if deterministic:
            return torch.argmax(logits, dim=-1)
        return gumbel_max_sample(logits)

    def logprob(self, action: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        chosen = logits.gather(-1, action.long().unsqueeze(-1)).squeeze(-1)
        return self._reduce_event(chosen)

    def entropy(self, logits: torch.Tensor) -> torch.Tensor:
        return self._reduce_event(-(logits.exp() * logits).sum(dim=-1))

    def kl_divergence(self, logits_q: torch.Tensor, logits_p: torch.Tensor) -> torch.Tensor:
        """KL(q || p) = sum_i q_i (log q_i - log p_i)."""
        return self._reduce_event((logits_q.exp() * (logits_q - logits_p)).sum(dim=-1))


class EwmaNormalizer(nn.Module):
    """Debiased exponential moving mean/variance of value targets.

    The statistics are buffers (saved in the state_dict, invisible to the optimiser). Updates are explicit
    (``update``) rather than a side effect of ``train()`` mode, so that re-evaluating values in the trainer
    never moves them by accident. Variance is clamped at ``min_var`` and the debias term at ``epsilon``
    (VPT's constants): a fresh normaliser reports mean 0 and variance ``min_var``.
    """

    def __init__(self, beta: float = 0.99999, epsilon: float = 1e-5, min_var: float = 1e-2) -> None:
        super().__init__()
        self.beta = beta
        self.epsilon = epsilon
        self.min_var = min_var
        self.register_buffer("running_mean", torch.zeros(1))
        self.register_buffer("running_mean_sq", torch.zeros(1))
        self.register_buffer("debiasing_term", torch.zeros(()))

    @torch.no_grad()
    def reset(self) -> None:
        for statistic in (self.running_mean, self.running_mean_sq, self.debiasing_term):
            statistic.zero_()

    @torch.no_grad()
    def set_identity(self) -> None:
        """Statistics of mean 0 and variance 1, so normalise/denormalise are the identity.

        For training without value normalisation: a *fresh* normaliser is not the identity (its variance is
        clamped at ``min_var``), and these statistics travel with the weights without adding a state key.
        """
        self.running_mean.zero_()
        self.running_mean_sq.fill_(1.0)
        self.debiasing_term.fill_(1.0)

    def mean_var(self) -> tuple[torch.Tensor, torch.Tensor]:
        debias = self.debiasing_term.clamp(min=self.epsilon)
        mean = self.running_mean / debias
        var = (self.running_mean_sq / debias - mean ** 2).clamp(min=self.min_var)
        return mean[0], var[0]

    @torch.no_grad()
    def update(self, targets: torch.Tensor) -> None:
        targets = targets.detach().float().to(self.running_mean.device)
        weight = self.beta
        self.running_mean.mul_(weight).add_((1.0 - weight) * targets.mean())
        self.running_mean_sq.mul_(weight).add_((1.0 - weight) * (targets ** 2).mean())
        self.debiasing_term.mul_(weight).add_(1.0 - weight)

    def normalize(self, values: torch.Tensor) -> torch.Tensor:
        mean, var = self.mean_var()
        return (values.float() - mean) / var.sqrt()

    def denormalize(self, values: torch.Tensor) -> torch.Tensor:
        mean, var = self.mean_var()
        return values.float() * var.sqrt() + mean


class ValueHead(nn.Module):
    """Linear value predictor in *normalised* return units, with its return normaliser attached.

    ``forward`` gives ``[..., ]`` (the trailing size-1 axis is dropped). Trainers compute the loss in
    normalised space (``loss``) and turn predictions into return units with ``denormalize``.
    """

    def __init__(self, in_features: int, *, beta: float = 0.99999, init_gain: float = 1.0) -> None:
        super().__init__()
        self.linear = nn.Linear(in_features, 1)
        nn.init.orthogonal_(self.linear.weight, gain=init_gain)
        nn.init.zeros_(self.linear.bias)
        self.normalizer = EwmaNormalizer(beta=beta)

    def forward(self, latent: torch.Tensor) -> torch.Tensor:
        return self.linear(latent).squeeze(-1).float()

    def normalize(self, returns: torch.Tensor) -> torch.Tensor:
        return self.normalizer.normalize(returns)

    def denormalize(self, vpred: torch.Tensor) -> torch.Tensor:
        return self.normalizer.denormalize(vpred)

    def update(self, returns: torch.Tensor) -> None:
        """Fold a batch of return targets into the running statistics (call once per batch, before the loss)."""
        self.normalizer.update(returns)

    def loss(self, vpred: torch.Tensor, returns: torch.Tensor) -> torch.Tensor:
        """Elementwise squared error in normalised space; reduce it yourself (masking, clipping...)."""
        return (vpred.float() - self.normalize(returns).detach()) ** 2
