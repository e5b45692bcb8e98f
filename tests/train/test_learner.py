"""The PPO learner without Ray: direction of learning, the NaN guard, recurrent batches, checkpoints."""

from __future__ import annotations

import copy
import os
import socket
import subprocess
import sys

import numpy as np
import pytest
import torch

from craftrl.config import build_config
from craftrl.policies import default_policy_generator, mlp_policy_generator
from craftrl.policies.checks import REORDERING_ULPS, mismatch_ulps
from craftrl.train.checkpoint import (TrainingState, apply_retention, checkpoints_to_delete, list_checkpoints,
                                      load_checkpoint, resolve_resume, save_checkpoint)
from craftrl.train.batch import collate, cut_sequences
from craftrl.train.entropy_control import next_entropy_coef
from craftrl.train.learner import PPOLearner
from craftrl.train.precision import PrecisionTiming, time_both_precisions
from craftrl.train.reference import make_reference, move_towards
from train_fragments import bandit_fragments, random_images

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
# The same float32 computation in another order (re-evaluated log-probs, another device) agrees to REORDERING_ULPS
# units of float32's eps, relative: ratios of re-evaluated log-probs stay that close to 1, and KL estimates,
# second order in the log-prob difference, below 1e-6.
REORDERING_RTOL = REORDERING_ULPS * torch.finfo(torch.float32).eps


def train_config(**overrides):
    base = {"learning_rate": 0.01, "batch_size_per_gpu": 4, "context_length": 4, "epochs_per_iteration": 2,
            "entropy_bonus_coef": 0.0, "max_grad_norm": 1.0, "discount": 0.9}
    base.update(overrides)
    # fragments here are 6-10 steps; the rollout's fragment length only matters to minibatch_sequence_length's check
    return build_config({"train_config": base, "rollout_config": {"fragment_length": 30}}).train_config


def action_one_probability(policy) -> float:
    obs = {"vector": torch.randn(256, 1, 4)}
    latents, _ = policy(input=obs, state_in={}, first=None)
    return float(latents["pi_logits"].exp()[..., 1].mean())


@pytest.mark.parametrize("minibatch_sequence_length", [0, 1, 5])
def test_ppo_learns_the_rewarding_action(minibatch_sequence_length):
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    policy = mlp_policy_generator(obs_dim=4, num_actions=2)
    config = train_config(minibatch_sequence_length=minibatch_sequence_length)
    learner = PPOLearner(policy, config, torch.device("cpu"))
    before = action_one_probability(policy)
    generator = torch.Generator().manual_seed(0)
    for iteration in range(8):
        fragments = bandit_fragments(policy, num_envs=8, length=10, rng=rng, version=iteration)
        metrics = learner.iteration(fragments, iteration, iteration, generator)
        assert all(np.isfinite(v) for k, v in metrics.items() if k != "ppo/explained_variance")
    after = action_one_probability(policy)
    assert before == pytest.approx(0.5, abs=0.1)
    assert after > 0.85, f"P(rewarding action) went {before:.2f} -> {after:.2f}"


def _weights_after_iterations(iterations: int, **overrides) -> tuple[torch.Tensor, list[int]]:
    """After training on the same bandit data: the policy's flattened weights and the optimiser steps taken so
    far after each iteration."""
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    policy = mlp_policy_generator(obs_dim=4, num_actions=2)
    learner = PPOLearner(policy, train_config(**overrides), torch.device("cpu"))
    generator = torch.Generator().manual_seed(0)
    steps = []
    for iteration in range(iterations):
        fragments = bandit_fragments(policy, num_envs=8, length=10, rng=rng, version=iteration)
        learner.iteration(fragments, iteration, iteration, generator)
        steps.append(int(learner.optimizer.state[policy.pi_head.linear_layer.weight]["step"]))
    return torch.cat([p.detach().reshape(-1) for p in policy.parameters()]), steps


@pytest.mark.parametrize("sequence_length", [0, 5])
def test_whole_batch_iterations_take_one_step_per_epoch_over_all_the_data(sequence_length):
    """8 fragments in batches of 4: a whole-batch iteration is 1 optimiser step per epoch, and trains exactly as
    one batch of all 8 fragments does; after it, 2 minibatches per epoch again."""
    whole, _ = _weights_after_iterations(1, whole_batch_iterations=1, minibatch_sequence_length=sequence_length)
    one_batch, _ = _weights_after_iterations(1, batch_size_per_gpu=8, minibatch_sequence_length=sequence_length)
    split, _ = _weights_after_iterations(1, minibatch_sequence_length=sequence_length)
    assert mismatch_ulps(whole, one_batch) <= REORDERING_ULPS
    assert mismatch_ulps(whole, split) > REORDERING_ULPS
    _, steps = _weights_after_iterations(2, whole_batch_iterations=1, minibatch_sequence_length=sequence_length)
    assert steps == [2, 2 + 2 * 2]  # 2 epochs: 1 step each, then 2 minibatches each


def test_target_kl_stops_the_epochs_once_the_policy_moved_past_it():
    """8 fragments in batches of 4, 2 epochs: 4 optimiser steps, unless the KL from the iteration's start passes
    1.5 x target_kl first. The first step always happens (nothing has moved before it), the next minibatch then
    measures the move and stops the iteration."""
    free, free_steps = _weights_after_iterations(1, target_kl=10.0)
    plain, _ = _weights_after_iterations(1)
    assert free_steps == [4] and torch.equal(free, plain), "a target never reached changes nothing"
    stopped, stopped_steps = _weights_after_iterations(1, target_kl=1e-6)
    assert stopped_steps == [1]
    assert not torch.equal(stopped, plain)

    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    policy = mlp_policy_generator(obs_dim=4, num_actions=2)
    learner = PPOLearner(policy, train_config(target_kl=1e-6), torch.device("cpu"))
    fragments = bandit_fragments(policy, num_envs=8, length=10, rng=rng)
    metrics = learner.iteration(fragments, 0, 0, torch.Generator().manual_seed(0))
    assert metrics["ppo/stopped_early"] == 1.0 and metrics["ppo/optimizer_steps"] == 1.0
    assert metrics["ppo/proximal_kl"] > 0.0


def test_first_iteration_on_fresh_behaviour_data_starts_at_ratio_one():
    torch.manual_seed(1)
    policy = mlp_policy_generator(obs_dim=4, num_actions=2)
    learner = PPOLearner(policy, train_config(epochs_per_iteration=1, learning_rate=1e-9), torch.device("cpu"))
    fragments = bandit_fragments(policy, 4, 8, np.random.default_rng(1))
    metrics = learner.iteration(fragments, 0, 0, torch.Generator().manual_seed(0))
    assert metrics["ppo/ratio_mean"] == pytest.approx(1.0, abs=REORDERING_RTOL)
    assert metrics["ppo/approx_kl"] == pytest.approx(0.0, abs=1e-6)
    assert metrics["ppo/clip_fraction"] == 0.0
    assert metrics["ppo/behaviour_kl"] == pytest.approx(0.0, abs=1e-6)
    assert metrics["ppo/behaviour_clip_fraction"] == 0.0


@needs_cuda
@pytest.mark.parametrize("use_amp", [False, True])
def test_ppo_learns_the_rewarding_action_on_cuda(use_amp):
    """The learner on a GPU, in float32 and with fp16 autocast and grad scaling; a CPU copy acts."""
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    actor = mlp_policy_generator(obs_dim=4, num_actions=2)
    trained = copy.deepcopy(actor).cuda()
    learner = PPOLearner(trained, train_config(use_amp=use_amp), torch.device("cuda"))
    assert learner.use_amp == use_amp
    generator = torch.Generator().manual_seed(0)
    for iteration in range(8):
        actor.load_state_dict(trained.state_dict())
        fragments = bandit_fragments(actor, num_envs=8, length=10, rng=rng, version=iteration)
        metrics = learner.iteration(fragments, iteration, iteration, generator)
        assert all(np.isfinite(v) for k, v in metrics.items() if k != "ppo/explained_variance")
    assert all(parameter.device.type == "cuda" for parameter in trained.parameters())
    actor.load_state_dict(trained.state_dict())
    assert action_one_probability(actor) > 0.85


@needs_cuda
def test_an_iteration_on_cuda_computes_what_the_cpu_computes():
    """Evaluation over windows, GAE, advantage moments and the losses agree between the devices (TF32 off,
    so both compute in float32); a step of lr 1e-9 leaves the second window's numbers comparable too."""
    torch.manual_seed(3)
    policy = default_policy_generator(num_actions=3, image_shape=(64, 64, 3), hidden_size=32, channels=(8, 8, 8))
    rng = np.random.default_rng(3)
    fragments = bandit_fragments(policy, 4, 6, rng, obs_fn=random_images(rng), episode_length=4)
    config = train_config(batch_size_per_gpu=2, epochs_per_iteration=1, learning_rate=1e-9,
                          minibatch_sequence_length=3)
    tf32 = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    try:
        metrics = {device: PPOLearner(copy.deepcopy(policy).to(device), config, torch.device(device))
                   .iteration(fragments, 0, 0, torch.Generator().manual_seed(0)) for device in ("cpu", "cuda")}
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = tf32
    assert metrics["cuda"].keys() == metrics["cpu"].keys()
    assert metrics["cpu"]["loss/value"] > 0.01 and metrics["cpu"]["ppo/grad_norm"] > 0.01
    for key, value in metrics["cpu"].items():
        assert metrics["cuda"][key] == pytest.approx(value, rel=REORDERING_RTOL, abs=1e-5), key


@needs_cuda
def test_a_checkpoint_loaded_onto_cuda_restores_its_random_state(tmp_path):
    """The trainer loads checkpoints with map_location on its device, which moves the saved generator
    states onto the GPU; restoring must still give the same random numbers on both devices."""
    from craftrl.train.checkpoint import restore_rng_state

    policy = mlp_policy_generator(obs_dim=4, num_actions=2).cuda()
    learner = PPOLearner(policy, train_config(use_amp=True), torch.device("cuda"))
    learner.iteration(bandit_fragments(copy.deepcopy(policy).cpu(), 4, 8, np.random.default_rng(4)), 0, 0,
                      torch.Generator())
    save_checkpoint(tmp_path, TrainingState(iteration=1, version=1, env_steps=32, trained_samples=32, rho=0.0),
                    model=policy.state_dict(), optimizer=learner.optimizer.state_dict(), reference=None,
                    scaler=learner.scaler.state_dict())
    expected = torch.rand(3), torch.rand(3, device="cuda")
    payload = load_checkpoint(resolve_resume("latest", tmp_path), map_location="cuda")
    assert payload["rng"]["torch"].device.type == "cuda", "the case this test is about"
    restore_rng_state(payload["rng"])
    assert torch.equal(torch.rand(3), expected[0])
    assert torch.equal(torch.rand(3, device="cuda"), expected[1])
    restored = PPOLearner(mlp_policy_generator(obs_dim=4, num_actions=2).cuda(), train_config(use_amp=True),
                          torch.device("cuda"))
    restored.optimizer.load_state_dict(payload["optimizer"])
    restored.scaler.load_state_dict(payload["scaler"])
    assert restored.scaler.get_scale() == learner.scaler.get_scale()


@pytest.mark.parametrize("device, use_amp", [("cpu", False), pytest.param("cuda", True, marks=needs_cuda)])
def test_vpt_trains_on_its_dict_actions_and_transformer_memory(device, use_amp):
    """VPT's two-part action (buttons, camera when on) and its transformer memory as the recurrent state,
    on a GPU under fp16 autocast: the learner reproduces the behaviour it starts from and moves the weights."""
    from craftrl.policies.vpt import vpt_tiny

    torch.manual_seed(5)
    actor = vpt_tiny()
    rng = np.random.default_rng(5)
    fragments = bandit_fragments(actor, 2, 6, rng, obs_fn=random_images(rng, (128, 128, 3)), episode_length=4)
    assert set(fragments[0].action) == {"buttons", "camera"}
    trained = copy.deepcopy(actor).to(device)
    learner = PPOLearner(trained, train_config(batch_size_per_gpu=2, context_length=3, epochs_per_iteration=1,
                                               use_amp=use_amp), torch.device(device))
    before = [parameter.detach().clone() for parameter in trained.parameters()]
    metrics = learner.iteration(fragments, 0, 0, torch.Generator().manual_seed(0))
    assert all(np.isfinite(v) for k, v in metrics.items() if k != "ppo/explained_variance")
    # one minibatch, measured before its step; fp16 log-probs over 8641 button combinations are coarser
    assert metrics["ppo/ratio_mean"] == pytest.approx(1.0, abs=2e-2 if use_amp else REORDERING_RTOL)
    steps = metrics["ppo/optimizer_steps"]
    for iteration in range(1, 4):  # fp16 grad scaling skips steps that overflow while it lowers its scale
        if steps or not use_amp:
            break
        steps = learner.iteration(fragments, iteration, iteration, torch.Generator())["ppo/optimizer_steps"]
    assert steps == 1.0
    assert any(not torch.equal(a, b) for a, b in zip(before, trained.parameters()))


def test_stale_behaviour_data_is_measured_and_its_clipping_starts_at_the_behaviour_policy():
    """Data acted by an older policy: the trust region against the behaviour is partly spent before the
    iteration moves, and the clip fraction says so from the first minibatch."""
    torch.manual_seed(5)
    policy = mlp_policy_generator(obs_dim=4, num_actions=2)
    fragments = bandit_fragments(policy, 8, 8, np.random.default_rng(5))
    with torch.no_grad():  # the learner has moved on since these steps were acted
        policy.pi_head.linear_layer.weight.add_(torch.randn_like(policy.pi_head.linear_layer.weight) * 3.0)
    config = train_config(epochs_per_iteration=1, learning_rate=1e-9)
    learner = PPOLearner(policy, config, torch.device("cpu"))
    metrics = learner.iteration(fragments, 0, 1, torch.Generator().manual_seed(0))
    assert metrics["ppo/behaviour_kl"] > 0.01 and metrics["ppo/behaviour_clip_fraction"] > 0.1
    assert metrics["ppo/clip_fraction"] == pytest.approx(metrics["ppo/behaviour_clip_fraction"], abs=1e-6)


def test_nan_in_the_data_skips_the_step_and_leaves_weights_untouched():
    torch.manual_seed(2)
    policy = mlp_policy_generator(obs_dim=4, num_actions=2)
    learner = PPOLearner(policy, train_config(normalize_advantage_full_batch=False, epochs_per_iteration=1,
                                              batch_size_per_gpu=8), torch.device("cpu"))
    fragments = bandit_fragments(policy, 4, 8, np.random.default_rng(2))
    fragments[0].reward[3] = np.nan
    before = {k: v.clone() for k, v in policy.state_dict().items()}
    metrics = learner.iteration(fragments, 0, 0, torch.Generator().manual_seed(0))
    assert metrics["ppo/skipped_steps"] == 1.0 and learner.skipped_steps == 1
    for name, value in policy.state_dict().items():
        if "normalizer" not in name:
            torch.testing.assert_close(value, before[name], msg=name)


def test_next_entropy_coef_rises_below_the_target_falls_above_it_and_stays_non_negative():
    assert next_entropy_coef(0.01, entropy=0.5, target_entropy=1.5, step=0.02) == pytest.approx(0.03)
    assert next_entropy_coef(0.03, entropy=2.0, target_entropy=1.5, step=0.02) == pytest.approx(0.02)
    assert next_entropy_coef(0.01, entropy=2.8, target_entropy=1.5, step=0.02) == 0.0
    assert next_entropy_coef(0.02, entropy=1.5, target_entropy=1.5, step=0.02) == pytest.approx(0.02)


@pytest.mark.parametrize("target_entropy", [None, 0.0, 5.0])
def test_target_entropy_adapts_the_entropy_weight_the_loss_uses(target_entropy):
    """Without a target the configured weight stays; with one, each iteration moves it by step * (target -
    the iteration's mean entropy), from entropy_bonus_coef, and the next iteration's loss carries it."""
    torch.manual_seed(8)
    rng = np.random.default_rng(8)
    policy = mlp_policy_generator(obs_dim=4, num_actions=2)
    config = train_config(entropy_bonus_coef=0.02, target_entropy=target_entropy, entropy_coef_step=0.1)
    learner = PPOLearner(policy, config, torch.device("cpu"))
    expected = 0.02
    for iteration in range(3):
        fragments = bandit_fragments(policy, num_envs=8, length=10, rng=rng, version=iteration)
        metrics = learner.iteration(fragments, iteration, iteration, torch.Generator().manual_seed(0))
        assert metrics["ppo/entropy_coef"] == pytest.approx(expected), "the metric is the weight this iteration used"
        if target_entropy is not None:
            expected = max(0.0, expected + 0.1 * (target_entropy - metrics["loss/entropy"]))
        assert learner.entropy_coef == pytest.approx(expected)
    if target_entropy == 0.0:
        assert learner.entropy_coef == 0.0, "a policy above the target loses its bonus"
    if target_entropy == 5.0:
        assert learner.entropy_coef > 0.02 + 3 * 0.1 * (5.0 - np.log(2)), "below the target (at most ln 2) it grows"


def test_the_entropy_weight_is_the_one_the_loss_subtracts():
    """Two learners on the same data and weights, one with an entropy weight of 0 and one of 1: their losses
    differ by exactly the policy's entropy."""
    torch.manual_seed(9)
    policy = mlp_policy_generator(obs_dim=4, num_actions=2)
    fragments = bandit_fragments(policy, num_envs=4, length=6, rng=np.random.default_rng(9), version=0)
    losses = []
    for weight in (0.0, 1.0):
        learner = PPOLearner(copy.deepcopy(policy), train_config(), torch.device("cpu"))
        learner.entropy_coef = weight
        batch = learner.prepare(fragments)[0]
        loss, terms, _, _ = learner._slice_loss(batch, 0, batch.length, batch.state_in, batch.state_in, False)
        losses.append((float(loss), float(terms["loss/entropy"])))
    assert losses[0][0] - losses[1][0] == pytest.approx(losses[0][1], rel=1e-5)


def _flat(module: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in module.parameters()])


@pytest.mark.parametrize("rate", [0.0, 0.5, 1.0])
def test_enable_ref_update_moves_the_reference_by_its_rate_after_each_iteration(rate):
    """Rate 0 leaves the reference at the initial policy, rate 1 makes it the policy at the iteration's end, and
    0.5 takes it half-way, iteration after iteration; the KL term then sees the moved reference."""
    torch.manual_seed(6)
    rng = np.random.default_rng(6)
    policy = mlp_policy_generator(obs_dim=4, num_actions=2)
    reference = make_reference(policy)
    config = train_config(kl_divergence_coef_rho=0.5, enable_ref_update=True, ref_update_rate=rate)
    learner = PPOLearner(policy, config, torch.device("cpu"), reference=reference)
    expected = make_reference(policy)
    initial = _flat(policy)
    kls = []
    for iteration in range(3):
        fragments = bandit_fragments(policy, num_envs=8, length=10, rng=rng, version=iteration)
        kls.append(learner.iteration(fragments, iteration, iteration, torch.Generator().manual_seed(0))
                   ["loss/kl_reference"])
        assert not torch.equal(_flat(policy), initial), "the policy trained"
        expected_flat = _flat(expected).lerp(_flat(policy), rate)
        torch.nn.utils.vector_to_parameters(expected_flat, expected.parameters())
        torch.testing.assert_close(_flat(reference), expected_flat, rtol=0, atol=0)
    if rate == 0.0:
        assert torch.equal(_flat(reference), initial)
    if rate == 1.0:
        assert torch.equal(_flat(reference), _flat(policy))
        assert kls[0] > 0 and kls[1] < kls[0], "each iteration starts at its reference: only one iteration's move"


def test_coef_rho_decay_shrinks_the_kl_weight_the_loss_uses_after_every_iteration_with_a_moving_reference():
    """ROCKET-3's values (rho 0.2, decay 0.9995, enable_ref_update): iteration k reports and uses rho 0.2 * 0.9995^k,
    and the loss it would take next differs from a KL-free one by exactly that weight times the KL to the moved
    reference."""
    torch.manual_seed(8)
    rng = np.random.default_rng(8)
    policy = mlp_policy_generator(obs_dim=4, num_actions=2)
    reference = make_reference(policy)
    config = train_config(kl_divergence_coef_rho=0.2, coef_rho_decay=0.9995, enable_ref_update=True)
    learner = PPOLearner(policy, config, torch.device("cpu"), reference=reference)
    reported = []
    for iteration in range(3):
        fragments = bandit_fragments(policy, num_envs=4, length=6, rng=rng, version=iteration)
        reported.append(learner.iteration(fragments, iteration, iteration, torch.Generator().manual_seed(0))["ppo/rho"])
    assert reported == pytest.approx([0.2, 0.2 * 0.9995, 0.2 * 0.9995 ** 2], rel=1e-12)
    assert learner.rho == pytest.approx(0.2 * 0.9995 ** 3, rel=1e-12)
    batch = learner.prepare(bandit_fragments(policy, num_envs=4, length=6, rng=rng, version=3))[0]
    with_kl, terms, _, _ = learner._slice_loss(batch, 0, batch.length, batch.state_in, batch.state_in, False)
    learner.rho = 0.0
    without_kl, _, _, _ = learner._slice_loss(batch, 0, batch.length, batch.state_in, batch.state_in, False)
    assert float(terms["loss/kl_reference"]) > 0, "the reference moved only part of the way: there is a KL"
    kl_weight = float(with_kl.detach() - without_kl.detach()) / float(terms["loss/kl_reference"])
    assert kl_weight == pytest.approx(0.2 * 0.9995 ** 3, rel=1e-4)


def test_move_towards_interpolates_float_tensors_and_copies_the_others():
    def module(weight: float, count: int) -> torch.nn.Module:
        layer = torch.nn.Linear(2, 1)
        torch.nn.init.constant_(layer.weight, weight)
        layer.register_buffer("scale", torch.tensor([weight]))
        layer.register_buffer("count", torch.tensor([count]))
        return layer

    reference, policy = make_reference(module(1.0, 3)), module(5.0, 7)
    move_towards(reference, policy, 0.25)
    assert torch.equal(reference.weight, torch.full((1, 2), 2.0)) and torch.equal(reference.scale, torch.tensor([2.0]))
    assert torch.equal(reference.count, torch.tensor([7]))
    assert not reference.weight.requires_grad and policy.weight.requires_grad


@pytest.mark.parametrize("minibatch_sequence_length", [0, 2, 3])
def test_recurrent_policy_trains_on_image_fragments_in_sequences(minibatch_sequence_length):
    torch.manual_seed(3)
    policy = default_policy_generator(num_actions=3, image_shape=(64, 64, 3), hidden_size=32, channels=(8, 8, 8))
    rng = np.random.default_rng(3)
    frag = bandit_fragments(policy, 2, 6, rng, obs_fn=random_images(rng),
                            episode_length=4)
    learner = PPOLearner(policy, train_config(batch_size_per_gpu=2, context_length=4, epochs_per_iteration=1,
                                              kl_divergence_coef_rho=0.1,
                                              minibatch_sequence_length=minibatch_sequence_length),
                         torch.device("cpu"), reference=make_reference(policy))
    before = [p.clone() for p in policy.parameters()]
    metrics = learner.iteration(frag, 0, 0, torch.Generator().manual_seed(0))
    # sequences cut at any step start from the recorded state, so they reproduce the behaviour too
    assert metrics["ppo/ratio_mean"] == pytest.approx(1.0, abs=REORDERING_RTOL), "re-evaluation reproduces behaviour"
    # the proximal log-probs, evaluated over L+1 steps in windows, line up with the actions that were taken
    assert metrics["ppo/behaviour_kl"] == pytest.approx(0.0, abs=1e-6)
    assert metrics["loss/kl_reference"] == pytest.approx(0.0, abs=1e-6)
    assert any(not torch.equal(a, b) for a, b in zip(before, policy.parameters()))
    assert learner.rho == pytest.approx(0.1 * 0.9995)


def test_a_feed_forward_policy_is_evaluated_in_context_slices_and_cut_into_single_steps(monkeypatch):
    """Sequences of 1 step (feed-forward PPO's shuffled samples) need no recorded state from a policy without
    one: evaluation runs ceil((L + 1) / context_length) forward passes per batch, not one per step, and the
    re-evaluation still reproduces the behaviour log-probs exactly."""
    torch.manual_seed(7)
    policy = default_policy_generator(num_actions=3, image_shape=(64, 64, 3), hidden_size=16, channels=(4, 4, 4),
                                      recurrent="none")
    rng = np.random.default_rng(7)
    fragments = bandit_fragments(policy, 4, 6, rng, episode_length=4, obs_fn=random_images(rng))
    learner = PPOLearner(policy, train_config(batch_size_per_gpu=2, context_length=4, minibatch_sequence_length=1),
                         torch.device("cpu"))
    calls = []
    original = type(policy).forward
    monkeypatch.setattr(type(policy), "forward", lambda self, *a, **k: calls.append(1) or original(self, *a, **k))
    batches = learner.prepare(fragments)
    assert len(calls) == len(batches) * 2, "7 observations in slices of 4"
    assert all(batch.sequence_states == [{}] * 6 for batch in batches)
    sequences = cut_sequences(batches, 1)
    assert sequences.obs["image"].shape[:2] == (4 * 6, 1)
    monkeypatch.setattr(type(policy), "forward", original)
    metrics = learner.iteration(fragments, 0, 0, torch.Generator().manual_seed(0))
    assert metrics["ppo/behaviour_kl"] == pytest.approx(0.0, abs=1e-6)


@pytest.mark.parametrize("minibatch_sequence_length", [0, 1])
def test_lock_step_fragments_give_what_evaluating_every_step_gives(minibatch_sequence_length, monkeypatch):
    """Fragments acted by the very weights about to be trained (lock-step), sent exactly, a float32 learner and a
    feed-forward image policy whose value normaliser has moved: the learner takes the fragments' values and
    log-probs and evaluates only the observations after their last steps, and prepares the same advantages,
    returns, old values and log-probs as a learner that evaluates every step."""
    torch.manual_seed(11)
    rng = np.random.default_rng(11)
    policy = default_policy_generator(num_actions=3, image_shape=(64, 64, 3), hidden_size=16, channels=(4, 4, 4),
                                      recurrent="none")
    config = train_config(batch_size_per_gpu=2, use_normalized_vf=True,
                          minibatch_sequence_length=minibatch_sequence_length)
    trainer = PPOLearner(policy, config, torch.device("cpu"), acted_with_exact_weights=True)
    for version in range(2):  # the weights and the return normaliser move away from their start
        trainer.iteration(bandit_fragments(policy, 4, 6, rng, version=version, obs_fn=random_images(rng)), version,
                          version, torch.Generator().manual_seed(version))
    assert float(policy.value_head.denormalize(torch.ones(1))) != pytest.approx(1.0, abs=1e-3)
    fragments = bandit_fragments(policy, 4, 6, rng, version=2, episode_length=4, obs_fn=random_images(rng))
    reusing = PPOLearner(copy.deepcopy(policy), config, torch.device("cpu"), acted_with_exact_weights=True)
    evaluating = PPOLearner(copy.deepcopy(policy), config, torch.device("cpu"))
    calls = []
    original = type(policy).forward
    monkeypatch.setattr(type(policy), "forward", lambda self, *a, **k: calls.append(1) or original(self, *a, **k))
    reused = reusing.prepare(fragments, version=2)
    assert len(calls) == len(reused), "one forward pass per batch, over the step after the last"
    monkeypatch.setattr(type(policy), "forward", original)
    evaluated = evaluating.prepare(fragments, version=2)
    for mine, theirs in zip(reused, evaluated):
        for name in ("advantages", "returns", "old_values", "proximal_logp"):
            torch.testing.assert_close(getattr(mine, name), getattr(theirs, name), rtol=1e-5, atol=1e-5, msg=name)
        assert mine.sequence_states == theirs.sequence_states
        assert mine.reference_sequence_states == theirs.reference_sequence_states


def test_the_learner_evaluates_every_step_where_the_fragments_may_not_hold_its_outputs():
    """Outside lock-step, with weights sent in float16, with a bf16 learner or with a recurrent policy (whose
    sequence states need the pass), the fragments' values and log-probs are not what evaluating gives."""
    torch.manual_seed(12)
    rng = np.random.default_rng(12)
    feed_forward = default_policy_generator(num_actions=3, image_shape=(64, 64, 3), hidden_size=16,
                                            channels=(4, 4, 4), recurrent="none")
    recurrent = default_policy_generator(num_actions=3, image_shape=(64, 64, 3), hidden_size=16, channels=(4, 4, 4))
    config = train_config(batch_size_per_gpu=2)

    def holds(policy, version: int, exact: bool = True, bf16: bool = False) -> bool:
        learner = PPOLearner(policy, config, torch.device("cpu"), acted_with_exact_weights=exact)
        learner.use_cpu_bf16 = bf16
        fragments = bandit_fragments(policy, 2, 4, rng, version=3, obs_fn=random_images(rng))
        return learner.behaviour_outputs_hold(collate(fragments, np.arange(2), torch.device("cpu")), version)

    assert holds(feed_forward, version=3)
    assert not holds(feed_forward, version=4), "acted one version before the weights being trained"
    assert not holds(feed_forward, version=3, exact=False), "weights sent in float16"
    assert not holds(feed_forward, version=3, bf16=True), "the learner computes in bf16, the rollout in float32"
    assert not holds(recurrent, version=3)


def test_sequence_minibatches_cover_every_step_once_per_epoch_and_mix_fragments():
    torch.manual_seed(6)
    policy = default_policy_generator(num_actions=3, image_shape=(64, 64, 3), hidden_size=16, channels=(4, 4, 4))
    rng = np.random.default_rng(6)
    fragments = bandit_fragments(policy, 8, 6, rng, episode_length=4,
                                 obs_fn=random_images(rng))
    learner = PPOLearner(policy, train_config(batch_size_per_gpu=2, minibatch_sequence_length=2), torch.device("cpu"))
    batches = learner.prepare(fragments)
    sequences = cut_sequences(batches, 2)
    assert len(sequences.rows) == 8 * 3 and sequences.obs["image"].shape[:2] == (24, 2)
    epoch = learner.epoch_batches(batches, sequences, torch.Generator().manual_seed(0))
    assert len(epoch) == len(batches) == 4, "as many optimiser steps as with whole fragments"
    seen = torch.cat([b.advantages.reshape(-1) for b in epoch]).sort().values
    torch.testing.assert_close(seen, torch.cat([b.advantages.reshape(-1) for b in batches]).sort().values)
    assert any(len(set(b.rows.tolist())) > 1 for b in epoch), "minibatches mix sequences of different fragments"


def test_checkpoint_round_trip_restores_everything(tmp_path):
    torch.manual_seed(4)
    policy = mlp_policy_generator(obs_dim=4, num_actions=2)
    learner = PPOLearner(policy, train_config(), torch.device("cpu"))
    learner.iteration(bandit_fragments(policy, 4, 8, np.random.default_rng(4)), 0, 0, torch.Generator())
    training = TrainingState(iteration=7, version=6, env_steps=1234, trained_samples=99, rho=0.05,
                             entropy_coef=0.03)
    path = save_checkpoint(tmp_path, training, model=policy.state_dict(), optimizer=learner.optimizer.state_dict(),
                           reference=None, config_yaml="a: 1\n")
    assert path.name == "iter_00000007" and (path / "config.yaml").read_text() == "a: 1\n"
    expected_random = torch.rand(3)

    restored_policy = mlp_policy_generator(obs_dim=4, num_actions=2)
    restored = PPOLearner(restored_policy, train_config(), torch.device("cpu"))
    payload = load_checkpoint(resolve_resume("latest", tmp_path))
    restored_policy.load_state_dict(payload["model"])
    restored.optimizer.load_state_dict(payload["optimizer"])
    for a, b in zip(policy.state_dict().values(), restored_policy.state_dict().values()):
        torch.testing.assert_close(a, b)
    state_a, state_b = learner.optimizer.state_dict()["state"], restored.optimizer.state_dict()["state"]
    for key in state_a:
        torch.testing.assert_close(state_a[key]["exp_avg"], state_b[key]["exp_avg"])
    assert payload["training"] == training
    from craftrl.train.checkpoint import restore_rng_state

    restore_rng_state(payload["rng"])
    torch.testing.assert_close(torch.rand(3), expected_random)


def test_the_optimiser_is_fused_and_resumes_the_unfused_optimisers_checkpoints():
    """Checkpoints written before the optimiser was fused hold the per-tensor AdamW's state; a fused learner
    must load them and continue with the same update."""
    torch.manual_seed(5)
    policy = mlp_policy_generator(obs_dim=4, num_actions=2)
    config = train_config()
    learner = PPOLearner(policy, config, torch.device("cpu"))
    fused = learner.optimizer
    assert fused.defaults["fused"] is True

    old_policy = copy.deepcopy(policy)
    old = torch.optim.AdamW(old_policy.parameters(), lr=config.learning_rate, weight_decay=config.weight_decay,
                            eps=config.adam_eps)
    gradients = [[torch.randn_like(p) for p in policy.parameters()] for _ in range(6)]

    def step(optimizer, parameters, grads):
        for parameter, grad in zip(parameters, grads):
            parameter.grad = grad.clone()
        optimizer.step()

    for grads in gradients[:3]:
        step(old, list(old_policy.parameters()), grads)
    policy.load_state_dict(old_policy.state_dict())
    learner.load_optimizer_state(copy.deepcopy(old.state_dict()))  # as from a file: no tensors shared with `old`
    assert fused.param_groups[0]["fused"] is True  # the saved groups said None
    for grads in gradients[3:]:
        step(old, list(old_policy.parameters()), grads)
        step(fused, list(policy.parameters()), grads)
    mismatch = [mismatch_ulps(a, b) for a, b in zip(policy.parameters(), old_policy.parameters())]
    assert max(mismatch) <= REORDERING_ULPS, mismatch
    assert all(float(state["step"]) == 6 for state in fused.state.values())


def test_retention_keeps_multiples_of_keep_interval_and_the_newest():
    assert checkpoints_to_delete([10, 20, 30, 40, 50, 60, 70, 80, 90], keep_interval=40, keep_last=3) == \
        [10, 20, 30, 50, 60]
    assert checkpoints_to_delete([5, 10, 15], keep_interval=0, keep_last=1) == [5, 10]


def test_retention_on_disk_and_atomic_layout(tmp_path):
    for iteration in (10, 20, 30, 40, 50):
        save_checkpoint(tmp_path, TrainingState(iteration=iteration), model={}, optimizer=None, reference=None)
    (tmp_path / ".tmp-iter_00000060-1").mkdir()  # a crashed save: never listed, never resumed
    assert apply_retention(tmp_path, keep_interval=20, keep_last=2) == [10, 30]
    assert [i for i, _ in list_checkpoints(tmp_path)] == [20, 40, 50]
    assert resolve_resume("latest", tmp_path).name == "iter_00000050"


WRITER_THAT_HANGS = """
import sys, time
from craftrl.train.checkpoint import write_checkpoint
def write_half(path):
    path.write_bytes(b"x" * 1000)
    print("writing", flush=True)
    time.sleep(600)
write_checkpoint(sys.argv[1], int(sys.argv[2]), write_half)
"""


def test_a_save_cut_short_leaves_its_staging_directory_only_until_the_next_save(tmp_path):
    """What `ray job stop` does to a run still writing its final checkpoint when the SIGKILL comes."""
    writers = [subprocess.Popen([sys.executable, "-c", WRITER_THAT_HANGS, str(tmp_path), str(iteration)],
                                stdout=subprocess.PIPE, text=True) for iteration in (7, 8)]
    try:
        for writer in writers:
            assert writer.stdout.readline() == "writing\n"
        killed, running = writers
        killed.kill()
        killed.wait()
        assert len(list(tmp_path.glob(".tmp-*"))) == 2
        save_checkpoint(tmp_path, TrainingState(iteration=9), model={}, optimizer=None, reference=None)
        left = [entry.name for entry in tmp_path.iterdir()]
        assert sorted(left) == sorted(["iter_00000009", f".tmp-iter_00000008-{socket.gethostname()}-{running.pid}"])
    finally:
        for writer in writers:
            writer.kill()
            writer.wait()


def test_unreadable_and_missing_checkpoints_give_clear_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="no checkpoint under"):
        resolve_resume("latest", tmp_path)
    with pytest.raises(FileNotFoundError, match="is not a checkpoint directory"):
        resolve_resume(str(tmp_path / "nope"), tmp_path)
    bad = tmp_path / "iter_00000001"
    bad.mkdir()
    (bad / "state.pt").write_bytes(b"garbage")
    with pytest.raises(ValueError, match="unreadable checkpoint"):
        load_checkpoint(bad)


def test_cpu_bf16_runs_the_passes_in_bfloat16_and_still_learns(monkeypatch):
    """cpu_bf16: the recurrent image policy's convolutions and LSTM compute in bf16, its first pass still
    reproduces the float32 behaviour to bf16 rounding, and PPO still learns the bandit's rewarding action.
    (The test pretends the CPU is native, whatever CI has. torch runs bf16 convolutions on any CPU, natively or
    emulated, but its LSTM only where oneDNN has bf16 kernels -- AVX512 and up, which every CPU with the native
    flags has; on an AVX2-only CPU autocast leaves the LSTM in float32, so there only the convolution is checked.)"""
    from craftrl.utils.hardware import onednn_may_use_bf16

    monkeypatch.setattr("craftrl.train.learner.native_cpu_bf16_flags", lambda: ("avx512_bf16",))
    torch.manual_seed(3)
    policy = default_policy_generator(num_actions=3, image_shape=(64, 64, 3), hidden_size=32, channels=(8, 8),
                                      encoder="tiles")
    dtypes = set()
    policy.encoder.tile.register_forward_hook(lambda module, args, out: dtypes.add(("conv", out.dtype)))
    policy.core.rnn.register_forward_hook(lambda module, args, out: dtypes.add(("lstm", out[0].dtype)))
    rng = np.random.default_rng(3)
    fragments = bandit_fragments(policy, 4, 6, rng, episode_length=4,
                                 obs_fn=random_images(rng))
    dtypes.clear()  # the rollout's float32 acting above is not the learner's
    learner = PPOLearner(policy, train_config(batch_size_per_gpu=2, context_length=4, epochs_per_iteration=1,
                                              learning_rate=1e-9, cpu_bf16=True), torch.device("cpu"))
    metrics = learner.iteration(fragments, 0, 0, torch.Generator().manual_seed(0))
    lstm_in_bf16 = onednn_may_use_bf16()
    assert dtypes == {("conv", torch.bfloat16), ("lstm", torch.bfloat16 if lstm_in_bf16 else torch.float32)}
    assert metrics["ppo/ratio_mean"] == pytest.approx(1.0, abs=0.02)  # bf16 logits: ~3 significant digits
    assert metrics["ppo/approx_kl"] < 1e-3

    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    bandit = mlp_policy_generator(obs_dim=4, num_actions=2)
    learner = PPOLearner(bandit, train_config(cpu_bf16=True), torch.device("cpu"))
    for iteration in range(8):
        learner.iteration(bandit_fragments(bandit, num_envs=8, length=10, rng=rng, version=iteration), iteration,
                          iteration, torch.Generator().manual_seed(iteration))
    assert action_one_probability(bandit) > 0.85


def test_cpu_bf16_is_ignored_with_a_warning_on_a_cpu_without_native_bf16(monkeypatch, caplog):
    """Without native bf16 instructions (where bf16 runs emulated, unmeasured) the option is off."""
    monkeypatch.setattr("craftrl.train.learner.native_cpu_bf16_flags", lambda: ())
    policy = mlp_policy_generator(obs_dim=4, num_actions=2)
    with caplog.at_level("WARNING", logger="craftrl.train.learner"):
        learner = PPOLearner(policy, train_config(cpu_bf16=True), torch.device("cpu"))
    assert not learner.use_cpu_bf16
    assert "cpu_bf16=True: float32, as this CPU has no native bfloat16 instructions" in caplog.text
    auto = PPOLearner(policy, train_config(cpu_bf16="auto"), torch.device("cpu"))
    assert not auto.use_cpu_bf16 and not auto.precision_probe_pending  # nothing to measure: float32
    monkeypatch.setattr("craftrl.train.learner.native_cpu_bf16_flags", lambda: ("amx_bf16",))
    assert PPOLearner(policy, train_config(cpu_bf16=True), torch.device("cpu")).use_cpu_bf16


def test_time_both_precisions_interleaves_after_an_untimed_warm_up_and_keeps_the_fastest():
    calls = []
    seconds = {False: iter([5.0, 3.0, 4.0]), True: iter([9.0, 2.0, 6.0])}  # per timed call, in order
    now = [0.0]

    def run_pass(bf16):
        calls.append(bf16)
        if len(calls) > 2:  # the first call of each is the warm-up and is not timed
            now[0] += next(seconds[bf16])

    timing = time_both_precisions(run_pass, rounds=3, clock=lambda: now[0])
    assert calls == [False, True] + [False, True] * 3
    assert (timing.float32_seconds, timing.bf16_seconds) == (3.0, 2.0)
    assert timing.bf16_faster
    assert not PrecisionTiming(float32_seconds=1.0, bf16_seconds=0.96).bf16_faster  # within BF16_MIN_GAIN
    assert PrecisionTiming(float32_seconds=1.0, bf16_seconds=0.94).bf16_faster


@pytest.mark.parametrize("bf16_seconds, expect_bf16", [(0.5, True), (1.5, False)])
def test_cpu_bf16_auto_computes_in_the_precision_that_timed_faster(monkeypatch, bf16_seconds, expect_bf16):
    monkeypatch.setattr("craftrl.train.learner.native_cpu_bf16_flags", lambda: ("avx512_bf16",))
    measured = []

    def timed(run_pass):
        for bf16 in (False, True):
            run_pass(bf16)
            measured.append(bf16)
        return PrecisionTiming(float32_seconds=1.0, bf16_seconds=bf16_seconds)

    monkeypatch.setattr("craftrl.train.learner.time_both_precisions", timed)
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    policy = mlp_policy_generator(obs_dim=4, num_actions=2)
    learner = PPOLearner(policy, train_config(cpu_bf16="auto"), torch.device("cpu"))
    assert not learner.use_cpu_bf16 and learner.precision_probe_pending
    for iteration in range(2):
        fragments = bandit_fragments(policy, num_envs=8, length=10, rng=rng, version=iteration)
        metrics = learner.iteration(fragments, iteration, iteration, torch.Generator().manual_seed(iteration))
        assert metrics["ppo/cpu_bf16"] == float(expect_bf16)
    assert measured == [False, True]  # measured once, on the first iteration
    assert learner.use_cpu_bf16 is expect_bf16


def test_the_precision_probe_times_real_passes_and_moves_no_weight(monkeypatch):
    """The probe's passes leave no gradient behind and step nothing, so the gradient passes after it start from
    the weights and optimiser state they would have had without it."""
    monkeypatch.setattr("craftrl.train.learner.native_cpu_bf16_flags", lambda: ("avx512_bf16",))
    torch.manual_seed(3)
    policy = default_policy_generator(num_actions=3, image_shape=(64, 64, 3), hidden_size=32, channels=(8, 8),
                                      encoder="tiles")
    rng = np.random.default_rng(3)
    fragments = bandit_fragments(policy, 4, 6, rng, episode_length=4, obs_fn=random_images(rng))
    learner = PPOLearner(policy, train_config(batch_size_per_gpu=2, cpu_bf16="auto"), torch.device("cpu"))
    batch = learner.prepare(fragments)[0]  # which moves the value normaliser's statistics
    before = copy.deepcopy(policy.state_dict())
    in_bf16 = []  # whether each pass the probe timed ran under CPU bf16 autocast
    slice_loss = learner._slice_loss

    def recording_slice_loss(*args, **kwargs):
        in_bf16.append(torch.is_autocast_enabled("cpu"))
        return slice_loss(*args, **kwargs)

    monkeypatch.setattr(learner, "_slice_loss", recording_slice_loss)
    timing = learner.choose_cpu_precision(batch)
    assert timing.float32_seconds > 0 and timing.bf16_seconds > 0
    assert in_bf16.count(True) == in_bf16.count(False) >= 2, in_bf16  # each precision warmed up, then timed
    assert learner.use_cpu_bf16 is timing.bf16_faster and not learner.precision_probe_pending
    assert all(p.grad is None for p in policy.parameters())
    assert all(torch.equal(before[name], value) for name, value in policy.state_dict().items())
    assert not learner.optimizer.state  # no optimiser step was taken


def test_native_bf16_flags_come_from_the_cpu_flags_line(tmp_path, monkeypatch):
    from craftrl.utils import hardware

    cpuinfo = tmp_path / "cpuinfo"
    monkeypatch.setattr(hardware, "Path", lambda _: cpuinfo)
    monkeypatch.setattr(hardware, "onednn_may_use_bf16", lambda: True)  # whatever this CPU lets torch do
    for text, expected in (("flags\t\t: fpu avx512f avx512_bf16 sse\n", ("avx512_bf16",)),
                           ("flags\t\t: fpu avx512f avx512bw\n", ()),  # AVX512 alone: torch emulates bf16
                           ("model name\t: no flags line\n", ())):
        cpuinfo.write_text(text)
        hardware.native_cpu_bf16_flags.cache_clear()
        assert hardware.native_cpu_bf16_flags() == expected
    cpuinfo.write_text("flags\t\t: fpu avx512f avx512_bf16 amx_bf16\n")
    monkeypatch.setattr(hardware, "onednn_may_use_bf16", lambda: False)
    hardware.native_cpu_bf16_flags.cache_clear()
    assert hardware.native_cpu_bf16_flags() == ()  # the CPU has them, torch may not use them
    hardware.native_cpu_bf16_flags.cache_clear()


def test_onednn_restricted_below_bf16_counts_as_no_native_bf16():
    """A real torch in a process started with ONEDNN_MAX_CPU_ISA=AVX2: its bf16 passes would run reference code."""
    import subprocess
    import sys

    probe = ("from craftrl.utils import hardware; "
             "print(hardware.onednn_may_use_bf16(), hardware.native_cpu_bf16_flags())")
    result = subprocess.run([sys.executable, "-c", probe], env={**os.environ, "ONEDNN_MAX_CPU_ISA": "AVX2"},
                            capture_output=True, text=True, timeout=120, check=True)
    assert result.stdout.split("\n")[0] == "False ()", result.stdout + result.stderr
