"""Self-imitation: what the buffer keeps and draws, and that the learner learns from kept fragments alone."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from craftrl.policies import default_policy_generator, mlp_policy_generator
from craftrl.policies.checks import REORDERING_ULPS, mismatch_ulps
from craftrl.policies.state import tree_map
from craftrl.train.learner import PPOLearner
from craftrl.train.self_imitation import ImitationSample, SelfImitationBuffer, positive_advantage
from test_learner import action_one_probability, train_config
from train_fragments import bandit_fragments, random_images


def sample(priority: float, tag: int = 0) -> ImitationSample:
    return ImitationSample(obs={"vector": torch.full((1, 3, 4), float(tag))}, first=torch.zeros(1, 3, dtype=torch.bool),
                           action=torch.full((1, 3), tag), state_in={}, returns=torch.ones(1, 3), priority=priority)


def test_positive_advantage_keeps_only_returns_above_the_value():
    returns = torch.tensor([[1.0, 0.5, -1.0]])
    values = torch.tensor([[0.25, 0.75, -2.0]], requires_grad=True)
    weight = positive_advantage(returns, values)
    assert weight.tolist() == [[0.75, 0.0, 1.0]]
    assert not weight.requires_grad


def test_buffer_keeps_the_highest_priorities_and_refuses_zero():
    buffer = SelfImitationBuffer(capacity=2)
    assert not buffer.offer(sample(0.0))
    assert buffer.offer(sample(0.5, tag=1)) and buffer.offer(sample(0.2, tag=2))
    assert not buffer.offer(sample(0.1, tag=3)), "lower than everything kept"
    assert buffer.offer(sample(0.9, tag=4)), "replaces the lowest"
    assert sorted(s.priority for s in buffer.samples) == [0.5, 0.9]
    stacked = buffer.stacked([1, 0])
    assert stacked.action[:, 0].tolist() == [4, 1] and stacked.obs["vector"].shape == (2, 3, 4)


def test_draws_follow_priority_and_skip_fragments_the_value_has_learnt():
    buffer = SelfImitationBuffer(capacity=3)
    for priority in (0.1, 0.3, 0.6):
        buffer.offer(sample(priority))
    buffer.reprioritise([0], [0.0])
    generator = torch.Generator().manual_seed(0)
    counts = np.bincount([buffer.draw(1, generator)[0] for _ in range(3000)], minlength=3)
    assert counts[0] == 0
    assert counts[2] / counts[1] == pytest.approx(2.0, rel=0.15)
    assert sorted(buffer.draw(5, generator)) == [1, 2], "distinct, and only the eligible ones"
    buffer.reprioritise([1, 2], [0.0, 0.0])
    assert buffer.draw(2, generator) == [] and buffer.total_priority == 0.0


@pytest.mark.parametrize("self_imitation_coef, device", [
    (0.0, "cpu"), (1.0, "cpu"),
    pytest.param(1.0, "cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"))])
def test_learner_learns_the_rewarding_action_from_kept_fragments_without_ppo(self_imitation_coef, device):
    """PPO's policy loss is off: only self-imitation can move the policy, from one iteration of data."""
    torch.manual_seed(0)
    policy = mlp_policy_generator(obs_dim=4, num_actions=2)
    config = train_config(ppo_policy_coef=0.0, self_imitation_coef=self_imitation_coef, self_imitation_updates=20,
                          self_imitation_batch_size=4, learning_rate=0.02)
    fragments = bandit_fragments(policy, num_envs=8, length=10, rng=np.random.default_rng(0))
    before = action_one_probability(policy)
    learner = PPOLearner(policy.to(device), config, torch.device(device))
    metrics = learner.iteration(fragments, 0, 0, torch.Generator().manual_seed(0))
    after = action_one_probability(policy.cpu())
    assert before == pytest.approx(0.5, abs=0.1)
    if self_imitation_coef == 0.0:
        assert learner.imitation is None and "self_imitation/steps" not in metrics
        assert after == pytest.approx(before, abs=0.02)
        return
    assert metrics["self_imitation/steps"] == 20
    assert 0 < metrics["self_imitation/fragments"] <= 8
    assert 0 < metrics["self_imitation/imitated_fraction"] < 1, "action 0 paid nothing: those steps are not imitated"
    assert after > 0.8, f"P(rewarding action) went {before:.2f} -> {after:.2f}"


def test_kept_recurrent_fragments_replay_from_their_own_state():
    """Each kept row carries its own recurrent state: replayed alone it reproduces the iteration's log-probs."""
    torch.manual_seed(3)
    policy = default_policy_generator(num_actions=3, image_shape=(64, 64, 3), hidden_size=32, channels=(8, 8, 8))
    rng = np.random.default_rng(3)
    fragments = bandit_fragments(policy, 8, 6, rng, episode_length=4,
                                 obs_fn=random_images(rng))
    for fragment in fragments:  # a different state per row, used from step 0, so a row given another's state shows
        fragment.state_in = tree_map(lambda leaf: rng.normal(size=leaf.shape).astype(leaf.dtype), fragment.state_in)
        fragment.first[0] = False
    learner = PPOLearner(policy, train_config(batch_size_per_gpu=2, context_length=4, self_imitation_coef=1.0,
                                              self_imitation_capacity=8), torch.device("cpu"))
    batches = learner.prepare(fragments)
    learner.keep_for_imitation(batches)
    assert len(learner.imitation) > 2
    rows = [(batch, row) for batch in batches for row in range(len(batch.rows))]
    for kept in learner.imitation.samples:
        batch, row = next((b, r) for b, r in rows if torch.equal(b.returns[r:r + 1], kept.returns))
        with torch.no_grad():
            latents, _ = policy(input=kept.obs, state_in=kept.state_in, first=kept.first)
            logp = policy.pi_head.logprob(kept.action, latents["pi_logits"])
        assert mismatch_ulps(logp, batch.proximal_logp[row:row + 1]) <= REORDERING_ULPS
        assert kept.priority == pytest.approx(float((batch.returns[row] - batch.old_values[row]).max()))
