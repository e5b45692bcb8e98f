"""VPT: strict loading of the official layout, file formats, attention semantics, resets, action head."""
from __future__ import annotations

import json
import math
import pickle
from pathlib import Path

import pytest
import torch

from broken_resets import BUGS, break_chunked_resets
from craftrl.policies.checks import REORDERING_ULPS, chunked_vs_stepwise_mismatch, mismatch_ulps
from craftrl.policies.vpt import (
    NULL_CAMERA,
    NUM_BUTTON_COMBINATIONS,
    VPT_1X,
    VPT_2X,
    VPTPolicy,
    camera_meta_mask,
    load_vpt_policy,
    read_vpt_model_file,
    save_vpt_policy,
    vpt_tiny,
)
from craftrl.policies.vpt.network import EpisodeMaskedAttention

# the parameter names and shapes of OpenAI's published VPT files, and their pickle layout, as JSON
SHARED = Path(__file__).resolve().parent / "vpt_layout"
IMAGE = 16  # tiny images keep the CNN cheap; the transformer is what these tests exercise
AUTOCAST_ULPS = 16  # an autocast pass against float32, in units of the autocast dtype's eps (see its test)


def _shared_entries(name: str) -> list[tuple[str, list[int], str]]:
    return [tuple(entry) for entry in json.loads((SHARED / name).read_text())]


@pytest.fixture(scope="module")
def small_vpt() -> VPTPolicy:
    """Memory of 6 frames so that a 10-step chunk rolls the memory over."""
    torch.manual_seed(0)
    return vpt_tiny(img_shape=(IMAGE, IMAGE, 3), attention_memory_size=14, timesteps=8, hidsize=64).eval()


def _images(batch: int, time: int, seed: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {"image": torch.randint(0, 256, (batch, time, IMAGE, IMAGE, 3), dtype=torch.uint8, generator=gen)}


# --- official layout -------------------------------------------------------------------------------

def test_strict_load_of_1x_state_dict_built_from_shared_names():
    entries = _shared_entries("vpt_1x_state_dict.json")
    with torch.device("meta"):
        policy = VPTPolicy(VPT_1X, temperature=2.0)
    gen = torch.Generator().manual_seed(0)
    state_dict = {name: torch.randn(shape, generator=gen) if shape else torch.tensor(0.5)
                  for name, shape, _ in entries}
    policy.load_state_dict(state_dict, strict=True, assign=True)
    assert list(policy.state_dict()) == [name for name, _, _ in entries]  # same order as the official file
    assert torch.equal(policy.net.final_ln.weight, state_dict["net.final_ln.weight"])
    assert sum(p.numel() for p in policy.state_dict().values()) == 70_998_654


def test_2x_names_and_shapes_match_shared_list():
    entries = _shared_entries("vpt_2x_state_dict.json")
    with torch.device("meta"):
        policy = VPTPolicy(VPT_2X)
    assert [(name, list(t.shape)) for name, t in policy.state_dict().items()] == \
        [(name, list(shape)) for name, shape, _ in entries]


def test_strict_load_rejects_missing_and_unexpected_keys(small_vpt):
    state_dict = dict(small_vpt.state_dict())
    state_dict.pop("net.final_ln.bias")
    with pytest.raises(RuntimeError, match="final_ln.bias"):
        vpt_tiny(img_shape=(IMAGE, IMAGE, 3), attention_memory_size=14, timesteps=8, hidsize=64) \
            .load_state_dict(state_dict, strict=True)


def test_model_file_in_official_layout_is_read(tmp_path):
    spec = json.loads((SHARED / "model_file_format.json").read_text())
    net_args = {key: item["value"] for key, item in spec["net_args_1x"].items()}
    agent = {"version": 3, "model": {"function": "x", "args": {
        "net": {"function": "y", "local_args": {"z": 1}, "args": net_args},
        "pi_head_opts": {"temperature": 2}}}}  # int temperature: the loader casts with float()
    path = tmp_path / "foundation-model-1x.model"
    path.write_bytes(pickle.dumps(agent))
    config, temperature = read_vpt_model_file(path)
    assert config == VPT_1X and temperature == 2.0 and isinstance(temperature, float)
    assert config.memory_len == 128 and config.cnn_channels == (64, 128, 128)


def test_unsupported_net_args_are_refused(tmp_path):
    from craftrl.policies.vpt import VPTConfig

    with pytest.raises(NotImplementedError):
        VPTConfig.from_net_args({**VPT_1X.to_net_args(), "recurrence_type": "multi_layer_lstm"})


def test_save_load_round_trip_through_official_files(small_vpt, tmp_path):
    small_vpt.value_head.update(torch.tensor([3.0, 7.0]))
    save_vpt_policy(small_vpt, tmp_path / "p.model", tmp_path / "p.weights")
    loaded = load_vpt_policy(tmp_path / "p.model", tmp_path / "p.weights").eval()
    assert loaded.config == small_vpt.config and loaded.temperature == small_vpt.temperature
    assert all(p.requires_grad and not p.is_meta for p in loaded.parameters())  # trainable after meta build
    assert int(loaded.pi_head.camera_on.sum()) == 4320
    images, first = _images(2, 3), torch.zeros(2, 3, dtype=torch.bool)
    with torch.no_grad():
        a, _ = small_vpt(input=images, state_in=small_vpt.initial_state(2), first=first)
        b, _ = loaded(input=images, state_in=loaded.initial_state(2), first=first)
    assert torch.equal(a["pi_logits"]["buttons"], b["pi_logits"]["buttons"])
    assert torch.equal(small_vpt.value_head.denormalize(a["vpred"]), loaded.value_head.denormalize(b["vpred"]))
    small_vpt.value_head.normalizer.reset()


# --- recurrence ------------------------------------------------------------------------------------

def _chunk_mismatch_after_warm_up(policy) -> dict[str, float]:
    batch, time = 3, 10  # memory holds 6 frames, so the chunk overflows it
    first = torch.zeros(batch, time, dtype=torch.bool)
    first[0, 0] = first[0, 7] = True
    first[1, 3] = first[1, 4] = True
    warm_images = _images(batch, 4, seed=3)
    with torch.no_grad():
        _, state = policy(input=warm_images, state_in=policy.initial_state(batch),
                          first=torch.zeros(batch, 4, dtype=torch.bool))
    return chunked_vs_stepwise_mismatch(policy, _images(batch, time), first, state)


def test_chunked_equals_stepwise_with_mid_chunk_starts_and_memory_rollover(small_vpt):
    mismatch = _chunk_mismatch_after_warm_up(small_vpt)
    assert max(mismatch.values()) <= REORDERING_ULPS, mismatch


@pytest.mark.parametrize("bug", BUGS, ids=lambda bug: bug.__name__)
def test_chunked_vs_stepwise_tolerance_still_catches_a_broken_memory_reset(small_vpt, bug, monkeypatch):
    """Attention that sees across a missed (or late) episode start moves the values and the kept memory by
    millions of units of rounding, far past the allowance."""
    break_chunked_resets(small_vpt, bug, monkeypatch)
    mismatch = _chunk_mismatch_after_warm_up(small_vpt)
    assert mismatch["vpred"] > 1000 * REORDERING_ULPS, mismatch


def _two_pasts_one_new_episode() -> tuple[dict, dict, torch.Tensor]:
    """Two image sequences that differ in their first 3 steps only, and ``first`` starting an episode at step 3."""
    images = _images(2, 6)
    other = _images(2, 6, seed=9)
    other["image"][:, 3:] = images["image"][:, 3:]
    first = torch.zeros(2, 6, dtype=torch.bool)
    first[:, 3] = True
    return images, other, first


def test_episode_start_erases_memory_and_rows_are_independent(small_vpt):
    images, other, first = _two_pasts_one_new_episode()
    with torch.no_grad():
        a, _ = small_vpt(input=images, state_in=small_vpt.initial_state(2), first=first)
        b, _ = small_vpt(input=other, state_in=small_vpt.initial_state(2), first=first)
        row, _ = small_vpt(input={"image": images["image"][1:]}, state_in=small_vpt.initial_state(1),
                           first=first[1:])
    assert torch.allclose(a["vpred"][:, 3:], b["vpred"][:, 3:], atol=1e-6)
    assert not torch.allclose(a["vpred"][:, :3], b["vpred"][:, :3], atol=1e-6)
    assert mismatch_ulps(a["pi_logits"]["camera"][1:], row["pi_logits"]["camera"]) <= REORDERING_ULPS


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_attention_runs_under_autocast_and_still_masks_other_episodes(small_vpt, dtype):
    """``use_amp`` (fp16) and ``cpu_bf16`` run the policy under autocast. Its attention scores must stay float32:
    in fp16 the mask value overflowed (the learner crashed on a GPU)."""
    images, other, first = _two_pasts_one_new_episode()
    with torch.no_grad():
        exact, _ = small_vpt(input=images, state_in=small_vpt.initial_state(2), first=first)
        with torch.autocast("cpu", dtype=dtype):
            a, _ = small_vpt(input=images, state_in=small_vpt.initial_state(2), first=first)
            b, _ = small_vpt(input=other, state_in=small_vpt.initial_state(2), first=first)
    # autocast rounds each layer's inputs to `dtype`; through the network that stays within a few units of its eps
    # (bf16 keeps 8 significant bits, fp16 11): 7 and 4 units here
    assert mismatch_ulps(a["vpred"], exact["vpred"], precision=dtype) <= AUTOCAST_ULPS
    assert torch.equal(a["vpred"][:, 3:], b["vpred"][:, 3:]), "the new episode must not see the old one"


def test_attention_matches_definition_from_the_vpt_paper_code():
    """Vectorised attention vs a per-query loop written straight from the published semantics:
    logits = q.k / head_dim + sum_n r_n b[n, distance]; window of M frames including the current one;
    no attention across an episode start; output = x + proj(attention)."""
    torch.manual_seed(1)
    hidsize, heads, memory, time = 16, 2, 4, 7
    layer = EpisodeMaskedAttention(hidsize, heads, memory, init_scale=1.0)
    x = torch.randn(1, time, hidsize)
    first = torch.tensor([[False, False, False, True, False, False, False]])
    with torch.no_grad():
        got, _ = layer(x, first, layer.initial_state(1, torch.device("cpu"), torch.float32))
        block, head_dim = layer.orc_block, hidsize // heads
        q, k, v = block.q_layer(x[0]), block.k_layer(x[0]), block.v_layer(x[0])
        r = block.r_layer(x[0]).reshape(time, heads, -1)
        episode_start = [max(s for s in range(t + 1) if s == 0 or first[0, s]) for t in range(time)]
        expected = []
        for t in range(time):
            visible = [j for j in range(max(episode_start[t], t - memory + 1), t + 1)]
            per_head = []
            for h in range(heads):
                sl = slice(h * head_dim, (h + 1) * head_dim)
                logits = torch.stack([q[t, sl] @ k[j, sl] / head_dim + r[t, h] @ block.b_nd[:, t - j]
                                      for j in visible])
                weights = torch.softmax(logits, dim=0)
                per_head.append(sum(w * v[j, sl] for w, j in zip(weights, visible)))
            expected.append(x[0, t] + block.proj_layer(torch.cat(per_head)))
    assert mismatch_ulps(got[0], torch.stack(expected)) <= REORDERING_ULPS


# --- hierarchical action head ----------------------------------------------------------------------

@pytest.fixture(scope="module")
def head_and_logits(small_vpt):
    torch.manual_seed(2)
    head = small_vpt.pi_head
    with torch.no_grad():
        q = head(torch.randn(2, 1, 64) * 3)
        p = head(torch.randn(2, 1, 64) * 3)
    return head, q, p


def test_camera_meta_mask_layout():
    mask = camera_meta_mask()
    assert mask.shape == (NUM_BUTTON_COMBINATIONS,) == (8641,)
    assert int(mask.sum()) == 4320 and not bool(mask[0]) and bool(mask[1]) and not bool(mask[8640])
    assert NULL_CAMERA == 60


def test_camera_ignored_when_meta_action_off(head_and_logits):
    head, q, _ = head_and_logits
    off = {"buttons": torch.zeros(2, 1, 1, dtype=torch.long), "camera": torch.full((2, 1, 1), 3)}
    off_other = {"buttons": off["buttons"], "camera": torch.full((2, 1, 1), 100)}
    on = {"buttons": torch.ones(2, 1, 1, dtype=torch.long), "camera": torch.full((2, 1, 1), 3)}
    on_other = {"buttons": on["buttons"], "camera": torch.full((2, 1, 1), 100)}
    assert torch.equal(head.logprob(off, q), head.logprob(off_other, q))
    assert torch.equal(head.logprob(off, q), q["buttons"][..., 0, 0])
    assert not torch.allclose(head.logprob(on, q), head.logprob(on_other, q))
    samples = head.sample({k: v[:1].expand(2000, 1, 1, -1) for k, v in q.items()})
    off_rows = ~camera_meta_mask()[samples["buttons"]]
    assert bool((samples["camera"][off_rows] == NULL_CAMERA).all())


def test_head_kl_entropy_consistent_with_samples(head_and_logits):
    head, q, p = head_and_logits
    assert torch.allclose(head.kl_divergence(q, q), torch.zeros(2, 1), atol=1e-5)
    assert float(head.kl_divergence(q, p).min()) > 0 and float(head.entropy(q).min()) >= 0
    torch.manual_seed(3)
    n = 4_000
    q1 = {k: v[:1].expand(n, 1, 1, -1) for k, v in q.items()}
    p1 = {k: v[:1].expand(n, 1, 1, -1) for k, v in p.items()}
    samples = head.sample(q1)
    logp_q, logp_p = head.logprob(samples, q1), head.logprob(samples, p1)
    for estimate, exact in ((-logp_q, head.entropy(q)[0]), (logp_q - logp_p, head.kl_divergence(q, p)[0])):
        stderr = float(estimate.std()) / math.sqrt(n)
        assert abs(float(estimate.mean()) - float(exact)) < 5 * stderr + 1e-4


def test_temperature_divides_scores(small_vpt):
    hot = vpt_tiny(img_shape=(IMAGE, IMAGE, 3), attention_memory_size=14, timesteps=8, hidsize=64, temperature=2.0)
    hot.load_state_dict(small_vpt.state_dict())
    latent = torch.randn(1, 1, 64)
    with torch.no_grad():
        raw = small_vpt.pi_head.buttons.linear_layer(latent)
        torch.testing.assert_close(hot.pi_head(latent)["buttons"][..., 0, :], torch.log_softmax(raw / 2.0, -1))


def test_vpt_tiny_default_size_and_output_shapes():
    policy = vpt_tiny()
    params = sum(p.numel() for p in policy.parameters())
    assert 1_000_000 < params < 10_000_000
    obs = {"image": torch.zeros(2, 1, 128, 128, 3, dtype=torch.uint8)}
    with torch.no_grad():
        result = policy.act(obs, policy.initial_state(2), torch.ones(2, 1, dtype=torch.bool))
    assert result.action["buttons"].shape == (2, 1, 1) and result.logp.shape == (2, 1)
    assert result.latents["pi_logits"]["buttons"].shape == (2, 1, 1, 8641) and result.value.shape == (2, 1)
    assert len(result.state_out) == 3 * 2 and result.state_out[0].dtype == torch.bool
