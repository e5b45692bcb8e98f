"""Built-in default policies: contract shapes, chunked == step-by-step, resets, init, save/load."""
from __future__ import annotations

import io

import numpy as np
import pytest
import torch

from craftrl.policies import (
    default_policy_generator,
    make_policy_generator,
    merge_states,
    mlp_policy_generator,
    split_state,
    state_from_numpy,
    state_to_numpy,
)
from craftrl.policies.checks import REORDERING_ULPS, chunked_vs_stepwise_mismatch, mismatch_ulps
from craftrl.policies.state import tree_leaves
from broken_resets import BUGS, break_chunked_resets

BATCH, TIME = 3, 7


def _first_with_mid_episode_starts() -> torch.Tensor:
    first = torch.zeros(BATCH, TIME, dtype=torch.bool)
    first[0, 0] = True
    first[0, 4] = True
    first[1, 2] = True
    first[2, 5] = True
    first[2, 6] = True
    return first


def _images(seed: int = 0, size: int = 64) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {"image": torch.randint(0, 256, (BATCH, TIME, size, size, 3), dtype=torch.uint8, generator=gen)}


RECURRENT_VARIANTS = [("impala", "lstm", (16, 32, 32), False), ("impala", "gru", (16, 32, 32), False),
                      ("nature", "lstm", (32, 64, 64), False), ("nature", "gru", (16, 32, 32), False),
                      ("nature", "lstm", (16, 32, 32), True), ("tiles", "lstm", (32, 32), False)]


@pytest.fixture(scope="module", params=RECURRENT_VARIANTS,
                ids=["-".join(v[:2]) + ("-norm" if v[3] else "") for v in RECURRENT_VARIANTS])
def impala_policy(request):
    encoder, recurrent, channels, feature_norm = request.param
    torch.manual_seed(0)
    policy = default_policy_generator(recurrent=recurrent, encoder=encoder, channels=channels,
                                      feature_norm=feature_norm).eval()
    policy.build_kwargs = {"recurrent": recurrent, "encoder": encoder, "channels": channels,
                           "feature_norm": feature_norm}
    return policy


@pytest.mark.parametrize("feature_norm", [False, True])
def test_feature_norm_makes_the_core_blind_to_the_feature_scale(feature_norm):
    """The failure it guards against: features grown 10x saturate the LSTM's gates. With the norm, scaling
    the MLP's output by 10 changes nothing the core sees; without it, the outputs change."""
    torch.manual_seed(0)
    policy = default_policy_generator(encoder="nature", feature_norm=feature_norm).eval()
    images, first = _images(), _first_with_mid_episode_starts()
    before, _ = policy(input=images, state_in=policy.initial_state(BATCH), first=first)
    with torch.no_grad():
        policy.mlp.weight.mul_(10.0)
        policy.mlp.bias.mul_(10.0)
    after, _ = policy(input=images, state_in=policy.initial_state(BATCH), first=first)
    same = torch.allclose(before["latent"], after["latent"], atol=1e-4)
    assert same == feature_norm


def test_impala_parameter_count_in_range():
    count = sum(p.numel() for p in default_policy_generator().parameters())
    assert 1_000_000 <= count <= 3_000_000, count


def test_nature_encoder_is_the_papers_strided_cnn():
    policy = default_policy_generator(encoder="nature", channels=(32, 64, 64))
    convs = policy.encoder.convs
    assert [(c.kernel_size[0], c.stride[0], c.out_channels) for c in convs] == [(8, 4, 32), (4, 2, 64), (3, 1, 64)]
    # 64x64 -> 15x15 -> 6x6 -> 4x4 feature maps
    assert policy.encoder.dense.in_features == 64 * 4 * 4
    count = sum(p.numel() for p in policy.parameters())
    assert 500_000 <= count <= 1_200_000, count


def test_tile_encoder_sees_one_crafter_tile_per_position():
    """Crafter draws 7-pixel tiles from pixel 0 (a 9x9 grid in 64x64; the last row and column stay blank):
    a pixel changed inside tile (row 2, column 5) changes the first layer's output there and nowhere else."""
    torch.manual_seed(0)
    policy = default_policy_generator(encoder="tiles", channels=(8, 8))
    assert policy.encoder.dense.in_features == 8 * 9 * 9
    images = torch.randint(0, 256, (1, 64, 64, 3), dtype=torch.uint8)
    changed = images.clone()
    changed[0, 2 * 7 + 6, 5 * 7, :] = 255 - changed[0, 2 * 7 + 6, 5 * 7, :]  # the tile's last row, first column

    def tile_outputs(x: torch.Tensor) -> torch.Tensor:
        return policy.encoder.tile(x.permute(0, 3, 1, 2).float() / 255.0)[0].detach()

    moved = (tile_outputs(changed) - tile_outputs(images)).abs().amax(dim=0) > 0
    expected = torch.zeros(9, 9, dtype=torch.bool)
    expected[2, 5] = True
    assert torch.equal(moved, expected)


def _encoder_output_before_and_after_scaling(policy, layer: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    """The encoder's features for fixed frames, then again after ``layer``'s weight and bias are scaled 10x."""
    images = _images()["image"][:, 0]
    before = policy.encoder(images)
    with torch.no_grad():
        layer.weight.mul_(10.0)
        layer.bias.mul_(10.0)
    return policy.encoder(images), before


def _moon_et_als_parameter_count(channels: tuple[int, ...], features: int, hidden: int, actions: int) -> int:
    """Their PPOModel's parameters, layer by layer from their configuration: per stack a GroupNorm before the first
    convolution but the image's, that convolution (a bias only without a norm before it), a GroupNorm after the
    pool and two residual blocks of two GroupNorm + convolution units without bias; a LayerNorm + dense layer
    without bias; a LayerNorm + 1024-wide layer without bias; the two heads."""
    count, in_channels, side = 0, 3, 64
    for index, out in enumerate(channels):
        count += (2 * in_channels if index else 0) + 9 * in_channels * out + (0 if index else out)
        count += 2 * out + 4 * (2 * out + 9 * out * out)
        in_channels, side = out, (side + 1) // 2
    flat = in_channels * side * side
    count += 2 * flat + flat * features + 2 * features + features * hidden
    return count + hidden * actions + actions + hidden + 1


def test_encoder_norm_is_moon_et_als_impala_cnn_and_ignores_the_image_scale_past_the_first_convolution():
    """Moon et al.'s Crafter PPO: norm -> convolution -> ReLU units, residual branches that add a non-negative
    term, weights started at their row norms, and their model's parameter count at their sizes."""
    moon = default_policy_generator(channels=(64, 128, 128), encoder_features=256, hidden_size=1024,
                                    recurrent="none", encoder_norm=True)
    assert sum(p.numel() for p in moon.parameters()) == _moon_et_als_parameter_count((64, 128, 128), 256, 1024, 17)

    torch.manual_seed(0)
    policy = default_policy_generator(channels=(8, 16, 16), encoder_features=32, hidden_size=64, recurrent="none",
                                      encoder_norm=True).eval()
    cnn = policy.encoder.cnn
    assert cnn.stacks[0].firstconv.norm is None and cnn.stacks[0].firstconv.layer.bias is not None
    units = [stack.firstconv for stack in cnn.stacks[1:]] + [unit for stack in cnn.stacks for block in stack.blocks
                                                           for unit in (block.conv0, block.conv1)]
    assert all(isinstance(unit.norm, torch.nn.GroupNorm) and unit.norm.num_groups == 1 and unit.layer.bias is None
               for unit in units)

    def row_norms(layer: torch.nn.Module) -> torch.Tensor:
        return layer.weight.detach().flatten(1).norm(dim=1)

    branch = (3 * 2) ** -0.25  # their residual branches: (1 / sqrt(stacks * blocks)) ** (1/2); VPT's are larger
    for layer, expected in [*[(stack.firstconv.layer, 1.0) for stack in cnn.stacks],
                            *[(unit.layer, branch) for unit in units[2:]], (cnn.dense.layer, 1.4), (policy.mlp, 1.0)]:
        torch.testing.assert_close(row_norms(layer), torch.full_like(row_norms(layer), expected))

    images = _images()["image"][:, 0]
    added, dense_input = [], []
    hooks = [block.register_forward_hook(lambda _, inputs, output: added.append(output - inputs[0]))
             for stack in cnn.stacks for block in stack.blocks]
    hooks.append(cnn.dense.register_forward_hook(lambda _, inputs, output: dense_input.append(inputs[0])))
    policy.encoder(images)
    for hook in hooks:
        hook.remove()
    assert len(added) == 6 and all(bool((term >= 0).all()) and bool((term > 0).any()) for term in added)
    assert bool((dense_input[0] < 0).any())  # the stacks' output reaches the LayerNorm unrectified

    # what the norms buy: the first stack's output scaled 10x leaves the features unchanged but for the norms' eps
    # (without them: changed)
    torch.testing.assert_close(*_encoder_output_before_and_after_scaling(policy, cnn.stacks[0].firstconv.layer),
                               atol=1e-3, rtol=1e-3)
    plain = default_policy_generator(channels=(8, 16, 16), encoder_features=32, hidden_size=64, recurrent="none")
    assert not torch.allclose(*_encoder_output_before_and_after_scaling(plain, plain.encoder.stacks[0].conv),
                              atol=1e-2)


def test_tile_encoder_norm_ignores_the_scale_of_the_per_tile_features():
    """``encoder_norm`` on the tile encoder: a one-group GroupNorm between the per-tile and the neighbourhood
    convolutions and a LayerNorm before the dense layer, so the per-tile layer's scale does not reach the rest."""
    torch.manual_seed(0)
    policy = default_policy_generator(encoder="tiles", channels=(8, 16), encoder_features=32, hidden_size=64,
                                      recurrent="none", encoder_norm=True).eval()
    assert policy.encoder.neighbourhood_norm.num_groups == 1 and isinstance(policy.mlp_norm, torch.nn.LayerNorm)
    torch.testing.assert_close(*_encoder_output_before_and_after_scaling(policy, policy.encoder.tile), atol=1e-4,
                               rtol=1e-4)
    plain = default_policy_generator(encoder="tiles", channels=(8, 16), encoder_features=32, hidden_size=64,
                                     recurrent="none")
    assert isinstance(plain.encoder.neighbourhood_norm, torch.nn.Identity)
    assert not torch.allclose(*_encoder_output_before_and_after_scaling(plain, plain.encoder.tile), atol=1e-2)


def test_feed_forward_variant_has_empty_state_and_independent_steps():
    torch.manual_seed(0)
    policy = default_policy_generator(encoder="nature", channels=(16, 32, 32), recurrent="none").eval()
    assert policy.initial_state(BATCH) == {}
    images, first = _images(), _first_with_mid_episode_starts()
    chunked, state = policy(input=images, state_in={}, first=first)
    assert state == {}
    single, _ = policy(input={"image": images["image"][:, 4:5]}, state_in={}, first=first[:, 4:5])
    assert mismatch_ulps(chunked["pi_logits"][:, 4:5], single["pi_logits"]) <= REORDERING_ULPS


@pytest.mark.parametrize("kwargs, message", [({"encoder": "resnet"}, "encoder"), ({"recurrent": "rnn"}, "recurrent"),
                                             ({"encoder": "nature", "channels": (8, 8)}, "3 values"),
                                             ({"encoder": "tiles", "channels": (8, 8, 8)}, "2 values"),
                                             ({"encoder": "tiles", "channels": (8, 8), "tile_size": 65},
                                              "smaller than one 65-pixel tile"),
                                             ({"encoder": "nature", "encoder_norm": True}, "encoder_norm")])
def test_bad_policy_options_name_the_option(kwargs, message):
    with pytest.raises(ValueError, match=message):
        default_policy_generator(**kwargs)


def test_impala_output_contract(impala_policy):
    latents, state = impala_policy(input=_images(), state_in=impala_policy.initial_state(BATCH),
                                   first=torch.zeros(BATCH, TIME, dtype=torch.bool))
    assert latents["pi_logits"].shape == (BATCH, TIME, 17)
    assert latents["vpred"].shape == (BATCH, TIME)
    assert torch.allclose(latents["pi_logits"].exp().sum(-1), torch.ones(BATCH, TIME), atol=1e-5)
    assert all(v.shape[0] == BATCH for v in state.values())


def _random_state(policy) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    return {k: torch.randn(v.shape, generator=gen) for k, v in policy.initial_state(BATCH).items()}


def test_impala_chunked_equals_stepwise_with_mid_episode_starts(impala_policy):
    mismatch = chunked_vs_stepwise_mismatch(impala_policy, _images(), _first_with_mid_episode_starts(),
                                            _random_state(impala_policy))
    assert max(mismatch.values()) <= REORDERING_ULPS, mismatch


@pytest.mark.parametrize("bug", BUGS, ids=lambda bug: bug.__name__)
def test_chunked_vs_stepwise_tolerance_still_catches_a_broken_reset(impala_policy, bug, monkeypatch):
    """The rounding allowance must not hide what the check exists for: a chunked call that misses episode
    starts after its first step, or applies each start one step late, fails it in every output."""
    break_chunked_resets(impala_policy, bug, monkeypatch)
    mismatch = chunked_vs_stepwise_mismatch(impala_policy, _images(), _first_with_mid_episode_starts(),
                                            _random_state(impala_policy))
    assert min(mismatch.values()) > REORDERING_ULPS, mismatch


def test_impala_first_resets_state(impala_policy):
    """A start must erase history: outputs after a reset don't depend on what came before."""
    images = _images()
    first = torch.zeros(BATCH, TIME, dtype=torch.bool)
    first[:, 3] = True
    out_a, _ = impala_policy(input=images, state_in=impala_policy.initial_state(BATCH), first=first)
    other = _images(seed=5)
    other["image"][:, 3:] = images["image"][:, 3:]
    out_b, _ = impala_policy(input=other, state_in=impala_policy.initial_state(BATCH), first=first)
    assert torch.allclose(out_a["pi_logits"][:, 3:], out_b["pi_logits"][:, 3:], atol=1e-6)
    assert not torch.allclose(out_a["pi_logits"][:, :3], out_b["pi_logits"][:, :3], atol=1e-6)


def test_impala_batch_rows_independent(impala_policy):
    images, first = _images(), _first_with_mid_episode_starts()
    full, _ = impala_policy(input=images, state_in=impala_policy.initial_state(BATCH), first=first)
    row, _ = impala_policy(input={"image": images["image"][1:2]}, state_in=impala_policy.initial_state(1),
                           first=first[1:2])
    assert mismatch_ulps(full["pi_logits"][1:2], row["pi_logits"]) <= REORDERING_ULPS


def test_initialisation_follows_ppo_recipe():
    policy = default_policy_generator()
    head_weight = policy.pi_head.linear_layer.weight
    # Orthogonal rows scaled by the gain: each row norm equals the gain when out <= in.
    assert torch.allclose(head_weight.norm(dim=1), torch.full((17,), 0.01), atol=1e-5)
    assert torch.allclose(policy.value_head.linear.weight.norm(), torch.tensor(1.0), atol=1e-5)
    assert float(policy.pi_head.linear_layer.bias.detach().abs().max()) == 0.0
    # Near-uniform initial policy.
    with torch.no_grad():
        latents, _ = policy(input=_images(), state_in=policy.initial_state(BATCH), first=None)
    assert float(policy.pi_head.entropy(latents["pi_logits"]).min()) > np.log(17) - 0.01


def test_act_returns_consistent_logp_and_denormalised_value(impala_policy):
    policy = impala_policy
    policy.value_head.normalizer.running_mean.fill_(5.0)
    policy.value_head.normalizer.running_mean_sq.fill_(29.0)
    policy.value_head.normalizer.debiasing_term.fill_(1.0)
    try:
        result = policy.act(_images(), policy.initial_state(BATCH), torch.zeros(BATCH, TIME, dtype=torch.bool))
        assert result.action.shape == (BATCH, TIME) and result.action.dtype == torch.long
        expected = policy.pi_head.logprob(result.action, result.latents["pi_logits"])
        assert torch.equal(result.logp, expected)
        torch.testing.assert_close(result.value, result.latents["vpred"] * 2.0 + 5.0)
    finally:
        policy.value_head.normalizer.reset()


def test_state_numpy_round_trip_and_merge_split(impala_policy):
    state = {k: torch.randn(v.shape) for k, v in impala_policy.initial_state(BATCH).items()}
    per_row = split_state(state_to_numpy(state))
    assert len(per_row) == BATCH and per_row[0]["h"].shape == (1, 256)
    assert isinstance(per_row[0]["h"], np.ndarray)
    merged = state_from_numpy(merge_states(per_row), impala_policy.device)
    assert all(torch.equal(merged[k], state[k]) for k in state)


def test_save_load_round_trip(impala_policy):
    buffer = io.BytesIO()
    impala_policy.value_head.update(torch.tensor([1.0, 2.0, 3.0]))
    torch.save(impala_policy.state_dict(), buffer)
    buffer.seek(0)
    clone = default_policy_generator(**impala_policy.build_kwargs)
    clone.load_state_dict(torch.load(buffer), strict=True)
    clone.eval()
    assert "value_head.normalizer.running_mean" in impala_policy.state_dict()
    images, first = _images(), _first_with_mid_episode_starts()
    a, _ = impala_policy(input=images, state_in=impala_policy.initial_state(BATCH), first=first)
    b, _ = clone(input=images, state_in=clone.initial_state(BATCH), first=first)
    assert torch.equal(a["pi_logits"], b["pi_logits"]) and torch.equal(a["vpred"], b["vpred"])
    assert torch.equal(impala_policy.value_head.denormalize(a["vpred"]), clone.value_head.denormalize(b["vpred"]))
    impala_policy.value_head.normalizer.reset()


def test_mlp_policy_contract_and_chunking():
    policy = mlp_policy_generator(obs_dim=4, num_actions=2)
    vector = {"vector": torch.randn(BATCH, TIME, 4)}
    latents, state = policy(input=vector, state_in=policy.initial_state(BATCH), first=None)
    assert latents["pi_logits"].shape == (BATCH, TIME, 2) and latents["vpred"].shape == (BATCH, TIME)
    assert state == {}
    assert max(chunked_vs_stepwise_mismatch(policy, vector, _first_with_mid_episode_starts()).values()) \
        <= REORDERING_ULPS
    assert split_state(state, BATCH) == [{}, {}, {}]


def test_generators_are_zero_argument_and_picklable():
    import pickle

    generator = make_policy_generator("default", recurrent="gru", hidden_size=64)
    policy = pickle.loads(pickle.dumps(generator))()
    assert policy.core.kind == "gru" and policy.core.hidden_size == 64
    assert mlp_policy_generator().pi_head.num_actions == 2
    with pytest.raises(KeyError):
        make_policy_generator("nope")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("name, kwargs", [
    ("default", {}), ("mlp", {}), ("vpt_tiny", {}),
    # the default config's policy
    ("default", {"encoder": "tiles", "channels": (16, 16), "hidden_size": 128, "recurrent": "lstm"}),
    # craftrl.configs.crafter_resnet's policy
    ("default", {"channels": (64, 128, 128), "encoder_features": 256, "hidden_size": 1024, "recurrent": "none",
                 "encoder_norm": True}),
])
def test_policies_run_on_cuda_with_state_on_device(name, kwargs):
    policy = make_policy_generator(name, device="cuda", **kwargs)()
    if name == "mlp":
        obs = {"vector": torch.randn(2, 3, 4, device="cuda")}
    else:
        size = 64 if name == "default" else 128
        obs = {"image": torch.randint(0, 256, (2, 3, size, size, 3), dtype=torch.uint8, device="cuda")}
    first = torch.zeros(2, 3, dtype=torch.bool, device="cuda")
    first[1, 1] = True
    result = policy.act(obs, policy.initial_state(2), first)
    assert all(leaf.device.type == "cuda" for leaf in tree_leaves(result.state_out))
    restored = policy.state_to_device(split_state(state_to_numpy(result.state_out), 2)[1])
    assert all(leaf.device.type == "cuda" for leaf in tree_leaves(restored))
    # cuDNN's default TF32 convolutions round inputs to 10 mantissa bits, so sequence and step calls drift
    # ~1e-2 apart (an H200, the default policy): compare in float32, where a wrong state would still show.
    tf32 = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    try:
        mismatch = chunked_vs_stepwise_mismatch(policy, obs, first)
        assert max(mismatch.values()) <= REORDERING_ULPS, mismatch
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = tf32


def test_value_beta_sets_how_fast_the_return_normaliser_follows_a_new_return_scale():
    """After settling on returns near 1, a jump to 10: the faster normaliser (lower beta) moves most of the way
    in three updates, the default one (still near an equal-weight average) about a twentieth of it."""
    means = {}
    for beta in (0.5, 0.999):
        head = default_policy_generator(encoder="tiles", channels=(8, 8), hidden_size=32, recurrent="none",
                                        value_beta=beta).value_head
        assert head.normalizer.beta == beta
        for returns in [torch.ones(4)] * 50 + [torch.full((4,), 10.0)] * 3:
            head.update(returns)
        means[beta] = head.normalizer.mean_var()[0].item()
    assert means[0.5] > 8.0 and means[0.999] < 2.0
