"""Action-head and value-head properties."""
from __future__ import annotations

import torch

from craftrl.policies.heads import CategoricalHead, EwmaNormalizer, ValueHead


def _random_logits(head: CategoricalHead, seed: int, scale: float = 3.0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    scores = torch.randn(4, 5, *head.event_shape, head.num_actions, generator=gen) * scale
    return torch.log_softmax(scores, dim=-1)


def test_kl_self_is_zero_and_positive_otherwise():
    head = CategoricalHead(8, 6)
    p, q = _random_logits(head, 0), _random_logits(head, 1)
    assert torch.allclose(head.kl_divergence(p, p), torch.zeros(4, 5), atol=1e-6)
    assert float(head.kl_divergence(p, q).min()) > 0.0


def test_entropy_non_negative_and_bounded():
    head = CategoricalHead(8, 6)
    entropy = head.entropy(_random_logits(head, 2))
    assert float(entropy.min()) >= 0.0
    assert float(entropy.max()) <= torch.log(torch.tensor(6.0)) + 1e-6
    uniform = torch.full((1, 1, 6), -torch.log(torch.tensor(6.0)))
    assert torch.allclose(head.entropy(uniform), torch.log(torch.tensor(6.0)))


def test_sampled_frequencies_match_probabilities():
    torch.manual_seed(0)
    head = CategoricalHead(8, 5)
    probs = torch.tensor([0.5, 0.25, 0.15, 0.07, 0.03])
    logits = probs.log().expand(200_000, 5)
    samples = head.sample(logits)
    freq = torch.bincount(samples, minlength=5).float() / samples.numel()
    # 5 standard errors of the largest-variance cell (p=0.5) ~ 0.0056.
    assert torch.allclose(freq, probs, atol=0.006), freq
    assert torch.equal(head.sample(logits[:3], deterministic=True), torch.zeros(3, dtype=torch.long))


def test_logprob_picks_the_action_and_sums_event_axes():
    head = CategoricalHead(8, 4, event_shape=(2,))
    logits = _random_logits(head, 3)
    action = torch.randint(0, 4, (4, 5, 2))
    expected = logits.gather(-1, action[..., None])[..., 0].sum(-1)
    assert torch.allclose(head.logprob(action, logits), expected)
    assert head(torch.randn(4, 5, 8)).shape == (4, 5, 2, 4)


def test_temperature_flattens_distribution():
    torch.manual_seed(0)
    cold = CategoricalHead(8, 6, temperature=1.0, init_gain=1.0)
    hot = CategoricalHead(8, 6, temperature=4.0, init_gain=1.0)
    hot.load_state_dict(cold.state_dict())
    latent = torch.randn(3, 2, 8)
    with torch.no_grad():
        assert float((hot.entropy(hot(latent)) - cold.entropy(cold(latent))).min()) > 0


def test_ewma_normalizer_tracks_mean_and_std_and_round_trips():
    normalizer = EwmaNormalizer(beta=0.9)
    mean, var = normalizer.mean_var()
    assert float(mean) == 0.0 and abs(float(var) - 1e-2) < 1e-8
    gen = torch.Generator().manual_seed(0)
    for _ in range(200):
        normalizer.update(torch.randn(1000, generator=gen) * 3.0 + 10.0)
    mean, var = normalizer.mean_var()
    assert abs(float(mean) - 10.0) < 0.2 and abs(float(var.sqrt()) - 3.0) < 0.2
    x = torch.tensor([1.0, 10.0, 25.0])
    assert torch.allclose(normalizer.denormalize(normalizer.normalize(x)), x, atol=1e-4)


def test_value_head_loss_in_normalised_space_and_state_dict():
    head = ValueHead(4, beta=0.5)
    head.update(torch.tensor([2.0, 4.0]))
    names = set(head.state_dict())
    assert {"normalizer.running_mean", "normalizer.running_mean_sq", "normalizer.debiasing_term"} <= names
    assert head.state_dict()["normalizer.debiasing_term"].shape == ()
    returns = torch.tensor([[3.0, 5.0]])
    pred = head.normalize(returns)
    assert torch.allclose(head.loss(pred, returns), torch.zeros(1, 2), atol=1e-6)
    assert all(p.requires_grad for p in head.parameters())
    assert len(list(head.parameters())) == 2  # statistics are buffers, not optimiser parameters


def test_identity_normaliser_for_training_without_value_normalisation():
    """A fresh normaliser scales by sqrt(min_var) = 0.1; set_identity must make both directions exact no-ops."""
    from craftrl.policies.heads import ValueHead

    head = ValueHead(4)
    values = torch.tensor([-2.0, 0.0, 0.5, 3.0])
    assert not torch.allclose(head.denormalize(values), values)  # the trap set_identity exists for
    head.normalizer.set_identity()
    assert torch.equal(head.denormalize(values), values) and torch.equal(head.normalize(values), values)
    clone = ValueHead(4)
    clone.load_state_dict(head.state_dict())  # travels with the weights, no new state key
    assert torch.equal(clone.denormalize(values), values)
    assert set(head.state_dict()) == set(ValueHead(4).state_dict())
