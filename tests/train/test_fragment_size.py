"""The fragment size bound the replay store is sized with, from one observation, action and state."""
from __future__ import annotations

import numpy as np
import torch

from craftrl.policies import default_policy_generator
from craftrl.replay.codec import encode_fragment
from craftrl.replay.config import encoded_fragment_bound
from craftrl.rollout.fragment import fragment_nbytes
from train_fragments import bandit_fragments, random_images


def test_the_size_from_one_step_is_the_raw_size_of_the_fragments_the_rollout_cuts():
    torch.manual_seed(0)
    policy = default_policy_generator(num_actions=3, image_shape=(32, 32, 3), hidden_size=16, channels=(4, 4, 4))
    rng = np.random.default_rng(0)
    fragments = bandit_fragments(policy, 2, 7, rng, obs_fn=random_images(rng, (32, 32, 3)), episode_length=4)
    predicted = fragment_nbytes({"image": np.zeros((32, 32, 3), np.uint8)}, np.int64(2), policy.initial_state(1), 7)
    assert [f.raw_nbytes() for f in fragments] == [predicted, predicted]


def test_no_encoded_fragment_exceeds_the_bound_even_of_incompressible_frames():
    torch.manual_seed(0)
    policy = default_policy_generator(num_actions=3, image_shape=(64, 64, 3), hidden_size=16, channels=(4, 4, 4))
    rng = np.random.default_rng(1)
    (fragment,) = bandit_fragments(policy, 1, 16, rng, obs_fn=random_images(rng), episode_length=5)
    for level in (1, 3, 19):
        record = encode_fragment(fragment, level)
        assert len(record) > fragment.raw_nbytes()  # random pixels do not compress: the bound is what holds
        assert len(record) <= encoded_fragment_bound(fragment.raw_nbytes())


def test_craftrl_train_sizes_the_store_only_when_the_config_leaves_it_unset():
    from craftrl.cli.train import _with_fragment_bound
    from craftrl.config import build_config

    unset = build_config({})
    assert unset.rollout_config.replay_buffer_config.database_config.max_fragment_bytes is None
    sized = _with_fragment_bound(unset, 13_000_000)
    assert sized.rollout_config.replay_buffer_config.database_config.max_fragment_bytes == \
        encoded_fragment_bound(13_000_000)
    chosen = build_config({"rollout_config": {"replay_buffer_config": {"database_config": {"max_fragment_bytes": 5}}}})
    assert _with_fragment_bound(chosen, 13_000_000) is chosen
