"""The examples stay runnable: valid configs, generators that build what they promise."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from craftrl.config import load_config

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.py"))


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_is_a_valid_config(path):
    loaded = load_config(str(path))
    assert callable(loaded.env_generator) and callable(loaded.policy_generator)


def _act_once(loaded):
    env, policy = loaded.env_generator(), loaded.policy_generator()
    obs, _ = env.reset(seed=0)
    from craftrl.rollout.worker import action_rows, obs_batch

    out = policy.act(obs_batch([obs], policy.device), policy.initial_state(1), torch.ones(1, 1, dtype=torch.bool))
    _, reward, terminated, truncated, _ = env.step(action_rows(out.action, 1)[0])
    env.close()
    return float(reward), terminated, truncated


@pytest.mark.parametrize("name", ["kill_cows", "kill_cows_vpt", "cartpole"])
def test_example_policy_acts_in_its_env(name):
    reward, terminated, truncated = _act_once(load_config(str(EXAMPLES[0].parent / f"{name}.py")))
    assert reward >= 0.0 and not (terminated and truncated)


def test_minecraft_example_fails_with_one_clear_error_without_minestudio():
    from craftrl.envs.minecraft import MinecraftUnavailableError

    loaded = load_config(str(EXAMPLES[0].parent / "minecraft_kill_cows.py"))
    with pytest.raises(MinecraftUnavailableError, match="craftrl never downloads"):
        loaded.env_generator()


def test_default_config_is_valid_and_its_policy_acts():
    """`make run` trains craftrl.configs.default: it must validate and its policy must act in its env."""
    loaded = load_config("craftrl.configs.default")
    assert loaded.online.train_config.advantage_std_floor > 0 and not loaded.online.train_config.use_normalized_vf
    reward, terminated, truncated = _act_once(loaded)
    assert reward >= 0.0 and not (terminated and truncated)


def test_crafter_score_config_is_the_default_on_the_full_game():
    """bench/crafter_score.py (P6) trains craftrl.configs.crafter_score: the default's PPO settings, with the
    policy, minibatching and learning rate of the run that produced the recorded score."""
    loaded = load_config("craftrl.configs.crafter_score")
    default = load_config("craftrl.configs.default")
    assert loaded.online.train_config.entropy_bonus_coef == default.online.train_config.entropy_bonus_coef
    assert loaded.online.train_config.advantage_std_floor == default.online.train_config.advantage_std_floor
    assert loaded.online.train_config.learning_rate == 5e-4
    assert loaded.online.train_config.num_iterations * 1024 >= 1_000_000
    assert (loaded.online.train_config.batch_size_per_gpu, loaded.online.train_config.batches_per_iteration) == (2, 8)
    assert (loaded.online.train_config.minibatch_sequence_length, loaded.online.train_config.whole_batch_iterations) == (0, 0)
    assert not loaded.online.train_config.cpu_bf16 and loaded.online.train_config.target_kl is None
    assert type(loaded.policy_generator().encoder).__name__ == "NatureEncoder"
    env = loaded.env_generator()
    _, info = env.reset(seed=0)
    assert len(info["achievements"]) == 22  # the full game, with every achievement counted
    reward, terminated, truncated = _act_once(loaded)
    assert not (terminated and truncated)
