"""The examples stay runnable: valid configs, generators that build what they promise."""

from __future__ import annotations

import dataclasses

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
    from craftrl.rollout.loop import action_rows, obs_batch

    out = policy.act(obs_batch([obs], policy.device), policy.initial_state(1), torch.ones(1, 1, dtype=torch.bool))
    _, reward, terminated, truncated, _ = env.step(action_rows(out.action, 1)[0])
    env.close()
    return float(reward), terminated, truncated


@pytest.mark.parametrize("name", ["kill_cows", "kill_cows_vpt", "cartpole"])
def test_example_policy_acts_in_its_env(name):
    reward, terminated, truncated = _act_once(load_config(str(EXAMPLES[0].parent / f"{name}.py")))
    assert reward >= 0.0 and not (terminated and truncated)


def test_vpt_example_acts_with_a_published_models_128_pixel_frames(tmp_path, monkeypatch):
    """OpenAI's .model files take 128x128 frames and Crafter draws 64x64 ones; the example bridges the two."""
    from craftrl.policies.vpt import save_vpt_policy, vpt_tiny

    model, weights = tmp_path / "tiny.model", tmp_path / "tiny.weights"
    save_vpt_policy(vpt_tiny(img_shape=(128, 128, 3)), model, weights)
    monkeypatch.setenv("VPT_MODEL", str(model))
    monkeypatch.setenv("VPT_WEIGHTS", str(weights))
    loaded = load_config(str(EXAMPLES[0].parent / "kill_cows_vpt.py"))  # reads the variables when it loads
    assert loaded.policy_generator().vpt.config.img_shape == (128, 128, 3)
    reward, terminated, truncated = _act_once(loaded)
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
    # what its docstring says: a feed-forward policy trained in lock-step on shuffled single steps
    assert loaded.online.rollout_config.synchronous_sampling and loaded.online.fragments_per_env_per_version() == 2
    assert loaded.online.train_config.minibatch_sequence_length == 1
    assert loaded.policy_generator().initial_state(1) == {}
    reward, terminated, truncated = _act_once(loaded)
    assert reward >= 0.0 and not (terminated and truncated)


def _flat(tree, path=""):
    """A nested dict as {dotted path: leaf value}."""
    if not isinstance(tree, dict):
        return {path: tree}
    return {leaf: value for key, sub in tree.items() for leaf, value in _flat(sub, f"{path}.{key}".lstrip(".")).items()}


def _differences_from_default(loaded) -> set[str]:
    """The resolved config keys whose values differ from craftrl.configs.default's, and "policy" when the policy's
    parameter shapes do."""
    default = load_config("craftrl.configs.default")
    ours, theirs = (_flat(dataclasses.asdict(c.online)) for c in (loaded, default))
    differing = {path for path in ours if ours[path] != theirs[path]}
    shapes = [{k: v.shape for k, v in c.policy_generator().state_dict().items()} for c in (loaded, default)]
    return differing | ({"policy"} if shapes[0] != shapes[1] else set())


def test_kill_cows_example_learns_with_the_default_configs_settings():
    """examples/kill_cows.py writes out MineStudio's keys with craftrl.configs.default's values, the ones that learn
    the sparse cows reward on a laptop; its env declares the task metric the progress line shows."""
    example = load_config(str(EXAMPLES[0].parent / "kill_cows.py"))
    assert _differences_from_default(example) == {"logger_config.name", "train_config.num_iterations"}
    env = example.env_generator()
    assert env.task_metrics == ("cows_killed",)
    env.close()


def test_readme_config_is_the_default_configs_settings_under_another_name(tmp_path):
    """The README's "Bring your own task" config starts from craftrl.configs.default's settings; the schema's
    defaults alone do not learn the cows task on a few cores (bench/notes/default_config.md)."""
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = readme[readme.index("## Bring your own task"):]
    code = section[section.index("```python\n") + len("```python\n"):section.index("\n```\n")]
    (tmp_path / "my_config.py").write_text(code)
    mine = load_config(str(tmp_path / "my_config.py"))
    assert _differences_from_default(mine) == {"logger_config.name", "train_config.num_iterations"}


def test_crafter_score_config_is_moon_et_als_settings_with_a_wide_tile_policy_in_lock_step_on_a_cpu():
    """bench/crafter_score.py (P6) trains craftrl.configs.crafter_score: crafter_resnet's PPO settings on the full
    game, a feed-forward tile policy 64 + 128 wide that a CPU can train, collected in lock-step with the learner."""
    loaded = load_config("craftrl.configs.crafter_score")
    moon = load_config("craftrl.configs.crafter_resnet")
    train, moon_train = (dataclasses.asdict(c.online.train_config) for c in (loaded, moon))
    assert {key for key in train if train[key] != moon_train[key]} == {"num_gpus_per_worker", "num_cpus_per_worker",
                                                                       "cpu_bf16"}
    assert train["num_gpus_per_worker"] == 0 and train["num_workers"] == 0  # the learner's threads: outside Ray
    rollout = loaded.online.rollout_config
    assert rollout.num_gpus_per_worker == 0 and rollout.synchronous_sampling
    assert loaded.online.fragments_per_env_per_version() == 2  # 32 fragments of 128 steps from 16 envs
    policy = loaded.policy_generator()
    assert type(policy.encoder).__name__ == "TileEncoder" and policy.initial_state(1) == {}
    assert (policy.encoder.tile.out_channels, policy.encoder.neighbourhood.out_channels) == (64, 128)
    assert isinstance(policy.encoder.neighbourhood_norm, torch.nn.GroupNorm)  # Moon et al.'s norms
    env = loaded.env_generator()
    _, info = env.reset(seed=0)
    assert len(info["achievements"]) == 22  # the full game, with every achievement counted
    reward, terminated, truncated = _act_once(loaded)
    assert not (terminated and truncated)


def test_crafter_resnet_config_is_moon_et_als_ppo_on_the_full_game():
    """craftrl.configs.crafter_resnet: their policy (~4 M parameters, feed-forward) and 4096 env steps per
    iteration shuffled into 8 minibatches of 512 single steps, 3 epochs, over 1M env steps."""
    loaded = load_config("craftrl.configs.crafter_resnet")
    rollout, train = loaded.online.rollout_config, loaded.online.train_config
    steps_per_iteration = train.batch_size_per_gpu * train.batches_per_iteration * rollout.fragment_length
    assert steps_per_iteration == 4096 and steps_per_iteration // train.batches_per_iteration == 512
    assert train.num_iterations * steps_per_iteration >= 1_000_000 and train.minibatch_sequence_length == 1
    assert (train.epochs_per_iteration, train.learning_rate, train.discount, train.gae_lambda) == (3, 3e-4, 0.95, 0.65)
    assert train.use_normalized_vf and train.target_kl is None and train.whole_batch_iterations == 0
    policy = loaded.policy_generator()
    assert policy.initial_state(1) == {} and 3_500_000 <= sum(p.numel() for p in policy.parameters()) <= 4_500_000
    assert [stack.firstconv.layer.out_channels for stack in policy.encoder.cnn.stacks] == [64, 128, 128]
    reward, terminated, truncated = _act_once(loaded)
    assert not (terminated and truncated)
