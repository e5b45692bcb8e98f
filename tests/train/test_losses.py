"""Each PPO loss term against numbers computed by hand on tiny tensors."""

from __future__ import annotations

import math

import pytest
import torch

from craftrl.train.losses import (advantage_moments, clipped_policy_loss, explained_variance_from_sums,
                                  masked_mean, normalize_advantages, value_loss)

ALL = torch.ones(3, dtype=torch.bool)


def test_clipped_policy_loss_by_hand():
    behaviour = torch.log(torch.tensor([0.5, 0.5, 0.5]))
    new = torch.log(torch.tensor([0.75, 0.25, 0.55]))  # ratios 1.5, 0.5, 1.1
    adv = torch.tensor([1.0, -2.0, 3.0])
    result = clipped_policy_loss(new, behaviour, adv, ALL, clip=0.2, log_ratio_range=50)
    # per step max(-A r, -A clip(r)): max(-1.5, -1.2) = -1.2; max(1.0, 1.6) = 1.6; max(-3.3, -3.3) = -3.3
    assert result.loss.item() == pytest.approx((-1.2 + 1.6 - 3.3) / 3, abs=1e-6)
    assert result.clip_fraction.item() == pytest.approx(2 / 3)
    expected_kl = sum((r - 1) - math.log(r) for r in (1.5, 0.5, 1.1)) / 3
    assert result.approx_kl.item() == pytest.approx(expected_kl, abs=1e-6)


def test_mask_excludes_steps_and_log_ratio_is_clamped_on_both_sides():
    behaviour = torch.zeros(3)
    new = torch.tensor([100.0, -100.0, 0.0], requires_grad=True)
    adv = torch.tensor([1.0, 1.0, 1.0])
    mask = torch.tensor([False, True, True])
    result = clipped_policy_loss(new, behaviour, adv, mask, clip=0.2, log_ratio_range=5.0)
    ratio_low = math.exp(-5.0)
    # step 1: max(-r, -clip(r)) = max(-e^-5, -0.8) = -e^-5; step 2: -1
    assert result.loss.item() == pytest.approx((-ratio_low - 1.0) / 2, abs=1e-6)
    result.loss.backward()
    assert torch.isfinite(new.grad).all() and new.grad[0] == 0


def test_value_loss_plain_and_clipped():
    new = torch.tensor([1.0, 2.0, 0.0])
    old = torch.tensor([0.0, 2.0, 0.5])
    target = torch.tensor([2.0, 1.0, 0.0])
    plain = value_loss(new, old, target, ALL, clip_vloss=False, clip=0.2)
    assert plain.item() == pytest.approx(0.5 * (1 + 1 + 0) / 3)
    clipped = value_loss(new, old, target, ALL, clip_vloss=True, clip=0.2)
    # clipped values: 0.2, 2.0, 0.3 -> errors 3.24, 1, 0.09; max with plain: 3.24, 1, 0.09
    assert clipped.item() == pytest.approx(0.5 * (3.24 + 1 + 0.09) / 3)


def _explained_variance(predictions, targets):
    residual = targets - predictions
    return explained_variance_from_sums(float(targets.numel()), float(targets.sum()), float((targets ** 2).sum()),
                                        float(residual.sum()), float((residual ** 2).sum()))


def test_explained_variance_from_sums():
    target = torch.tensor([1.0, 2.0, 3.0, 4.0])
    assert _explained_variance(target, target) == pytest.approx(1.0)
    assert _explained_variance(torch.full((4,), 2.5), target) == pytest.approx(0.0)
    assert _explained_variance(target + 1.0, target) == pytest.approx(1.0)  # a constant offset explains all variance
    noisy = target + torch.tensor([0.5, -0.5, 0.5, -0.5])
    assert _explained_variance(noisy, target) == pytest.approx(1 - 0.25 / 1.25)
    assert math.isnan(_explained_variance(target, torch.ones(4)))


def test_advantage_normalisation_with_moments_summed_over_ranks_equals_the_full_batch():
    full = torch.tensor([1.0, 2.0, 3.0, 10.0, -4.0, 0.5])
    mask = torch.ones(6, dtype=torch.bool)
    rank0, rank1 = full[:2], full[2:]
    moments = advantage_moments(rank0, mask[:2]) + advantage_moments(rank1, mask[2:])
    expected = (full - full.mean()) / (full.std(unbiased=False) + 1e-8)
    joined = torch.cat([normalize_advantages(rank0, moments), normalize_advantages(rank1, moments)])
    torch.testing.assert_close(joined, expected, rtol=1e-5, atol=1e-6)


def test_masked_mean_ignores_masked_steps():
    assert masked_mean(torch.tensor([1.0, 100.0]), torch.tensor([True, False])).item() == 1.0


def test_advantage_std_floor_keeps_signal_free_batches_small():
    """A batch without reward has advantages that are only value noise: the floor stops them becoming unit-scale."""
    noise = torch.tensor([1e-3, -2e-3, 0.5e-3, 0.0])
    moments = advantage_moments(noise, torch.ones(4, dtype=torch.bool))
    plain = normalize_advantages(noise, moments)
    floored = normalize_advantages(noise, moments, std_floor=0.1)
    assert float(plain.std(unbiased=False)) == pytest.approx(1.0, rel=1e-4)
    centred = noise - noise.mean()
    assert torch.allclose(floored, centred / 0.1, atol=1e-7)
    # with real signal (std above the floor) the floor changes nothing
    signal = torch.tensor([1.0, -0.5, 0.25, 0.0])
    signal_moments = advantage_moments(signal, torch.ones(4, dtype=torch.bool))
    assert torch.allclose(normalize_advantages(signal, signal_moments, std_floor=0.1),
                          normalize_advantages(signal, signal_moments))
