"""The schema accepts MineStudio's configs and rejects bad ones with a message naming path, value and expectation."""

from __future__ import annotations

import copy

import pytest
from omegaconf import OmegaConf

from craftrl.config import ConfigError, OnlineConfig, build_config
from config_fixtures import seed004


def test_empty_online_dict_takes_documented_defaults():
    config = build_config({})
    assert isinstance(config, OnlineConfig)
    assert config.trainer_name == "PPOTrainer"
    assert config.rollout_config.to_send_queue_size == 1
    assert config.rollout_config.replay_buffer_config.max_reuse == 2
    assert config.train_config.normalize_advantage_full_batch is True
    assert config.train_config.resume is None


def rocket3_online_dict() -> dict:
    """ROCKET-3's ``online_dict`` as its repository has it: the launcher fixture's with the values it marks
    ``# theirs`` put back."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "minestudio_launcher" / "online_configs" / "rocket_log.py"
    spec = importlib.util.spec_from_file_location("rocket_log_fixture", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    online = copy.deepcopy(module.online_dict)
    online["rollout_config"]["num_gpus_per_worker"] = 1.0
    online["rollout_config"]["worker_config"].update(num_envs=16, batch_size=8)
    online["train_config"].update(num_workers=6, num_gpus_per_worker=1.0, num_iterations=4000,
                                  batches_per_iteration=100)
    return online


def test_rocket3s_online_dict_validates_unchanged_and_recycles_each_of_its_16_envs_in_a_process_of_its_own():
    """restart_interval recycles an env's process, which needs one env per process: the default envs_per_process
    gives ROCKET-3's 16 envs with a 3600-s restart_interval 16 processes, and asking to share processes is refused."""
    online = rocket3_online_dict()
    config = build_config(OmegaConf.create(online))
    worker = config.rollout_config.worker_config
    assert (worker.num_envs, worker.restart_interval, worker.envs_per_process) == (16, 3600.0, 1)
    train = config.train_config
    assert (train.prefetch_batches, train.record_video_interval, train.keep_interval) == (4, 1, 40)
    assert train.enable_ref_update and train.coef_rho_decay == 0.9995
    online["rollout_config"]["worker_config"]["envs_per_process"] = 2
    with pytest.raises(ConfigError, match="restart_interval: expected None or 0 when envs_per_process > 1"):
        build_config(online)


def test_seed_004_online_dict_is_accepted_as_dict_and_as_omegaconf():
    for source in (seed004.online_dict, seed004.online_config):
        config = build_config(source)
        assert config.rollout_config.worker_config.num_envs == 12
        assert config.train_config.kl_divergence_coef_rho == pytest.approx(0.2)
        assert config.train_config.max_grad_norm == 5.0 and isinstance(config.train_config.max_grad_norm, float)
        assert config.logger_config.project == "minestudio_online"


def test_ints_are_accepted_for_floats_but_not_the_reverse():
    assert build_config({"train_config": {"learning_rate": 1}}).train_config.learning_rate == 1.0
    with pytest.raises(ConfigError, match=r"train_config.num_iterations: expected an integer, got 10.5"):
        build_config({"train_config": {"num_iterations": 10.5}})


def test_all_problems_are_reported_together():
    with pytest.raises(ConfigError) as caught:
        build_config({"train_config": {"ppo_clip": 0, "discount": 2}, "rollout_config": {"fragment_length": 0}})
    assert len(caught.value.problems) == 3


def _with(path: str, value):
    """The seed-004 dict with one key changed (path 'a.b.c'), or removed when value is DELETE."""
    data = copy.deepcopy(seed004.online_dict)
    node = data
    *parents, leaf = path.split(".")
    for part in parents:
        node = node.setdefault(part, {})
    node[leaf] = value
    return data


BAD_CONFIGS = [
    (_with("train_config.learnin_rate", 1e-4), "train_config.learnin_rate: unknown key; did you mean learning_rate?"),
    (_with("rollout_config.fragment_lenght", 12), "did you mean fragment_length?"),
    (_with("train_config.entropy_target", 1.0), "train_config.entropy_target: unknown key; did you mean target_entropy?"),
    (_with("rollout_config.worker_config.num_env", 3), "rollout_config.worker_config.num_env: unknown key; did you mean num_envs?"),
    (_with("completely_unrelated", 1), "completely_unrelated: unknown key; valid keys here:"),
    (_with("rollout_config.worker_config.batch_size", 13), "batch_size: expected <= worker_config.num_envs (12), got 13"),
    (_with("rollout_config.worker_config.envs_per_process", 13), "envs_per_process: expected <= worker_config.num_envs (12), got 13"),
    (_with("rollout_config.worker_config.envs_per_process", -1), "envs_per_process: expected >= 0, got -1"),
    (_with("rollout_config.worker_config.envs_per_process", 2),
     "restart_interval: expected None or 0 when envs_per_process > 1 (it is 2), got 3600"),
    (_with("rollout_config.fragment_length", 0), "rollout_config.fragment_length: expected >= 1, got 0"),
    (_with("rollout_config.replay_buffer_config.max_reuse", 0), "max_reuse: expected >= 1, got 0"),
    (_with("train_config.ppo_clip", 0.0), "train_config.ppo_clip: expected > 0, got 0.0"),
    (_with("train_config.ppo_clip", -0.1), "train_config.ppo_clip: expected > 0, got -0.1"),
    (_with("train_config.save_interval", -1), "train_config.save_interval: expected >= 0, got -1"),
    (_with("train_config.record_video_interval", -2), "record_video_interval: expected >= 0, got -2"),
    (_with("rollout_config.worker_config.restart_interval", -5), "restart_interval: expected >= 0, got -5"),
    (_with("train_config.learning_rate", "fast"), "train_config.learning_rate: expected a number, got 'fast'"),
    (_with("train_config.clip_vloss", "yes"), "train_config.clip_vloss: expected a boolean, got 'yes'"),
    (_with("rollout_config.num_rollout_workers", True), "num_rollout_workers: expected an integer, got True"),
    (_with("train_config.discount", 1.5), "train_config.discount: expected a value in [0.0, 1.0], got 1.5"),
    (_with("train_config.gae_lambda", -0.1), "gae_lambda: expected a value in [0.0, 1.0], got -0.1"),
    (_with("trainer_name", "DQNTrainer"), "trainer_name: expected one of 'PPOTrainer', got 'DQNTrainer'"),
    (_with("train_config.cpu_bf16", "yes"), "train_config.cpu_bf16: expected one of False, True, 'auto', got 'yes'"),
    (_with("train_config.cpu_bf16", 1), "train_config.cpu_bf16: expected a boolean or a string, got 1"),
    (_with("train_config.cpu_bf16", None), "train_config.cpu_bf16: expected a boolean or a string, got None"),
    ({"train_config": {"enable_ref_update": True}},
     "train_config.enable_ref_update: needs kl_divergence_coef_rho > 0, got 0; without the KL term there is no "
     "reference policy to update"),
    (_with("train_config.ref_update_rate", 1.5), "train_config.ref_update_rate: expected a value in [0.0, 1.0], got 1.5"),
    (_with("train_config.keep_interval", 25), "keep_interval: expected a multiple of save_interval (10), got 25"),
    (_with("train_config.vf_warmup", 4000), "vf_warmup: expected < num_iterations (4000), got 4000"),
    (_with("rollout_config.to_send_queue_size", 0), "to_send_queue_size: expected >= 1, got 0"),
    (_with("rollout_config.num_gpus_per_worker", -1.0), "num_gpus_per_worker: expected >= 0, got -1.0"),
    (_with("rollout_config.worker_config", [1, 2]), "rollout_config.worker_config: expected a mapping"),
    (_with("rollout_config.replay_buffer_config.database_config.num_shards", 0), "database_config.num_shards: expected >= 1, got 0"),
    (_with("train_config.batch_size_per_gpu", 3) | {"rollout_config": _with("rollout_config.replay_buffer_config.fragments_per_chunk", 2)["rollout_config"]},
     "batch_size_per_gpu: expected a multiple of replay_buffer_config.fragments_per_chunk (2), got 3"),
    (_with("rollout_config.replay_buffer_config.max_unsampled_chunks", 1),
     "replay_buffer_config.max_unsampled_chunks: expected 0 or between the chunks one iteration samples ("),
    (_with("rollout_config.replay_buffer_config.max_unsampled_chunks", 100_000),
     "max_unsampled_chunks: expected 0 or between"),
    (_with("rollout_config.replay_buffer_config.max_unsampled_chunks", -1), "max_unsampled_chunks: expected >= 0, got -1"),
    ({"rollout_config": {"synchronous_sampling": True, "replay_buffer_config": {"max_reuse": 1},
                         "worker_config": {"num_envs": 3, "batch_size": 3}}},
     "rollout_config.synchronous_sampling: expected the fragments of one iteration (32) to split evenly over the "
     "3 envs of all rollout workers"),
    ({"rollout_config": {"synchronous_sampling": True, "replay_buffer_config": {"max_reuse": 1}},
      "train_config": {"vf_warmup": 2}},
     "rollout_config.synchronous_sampling: needs train_config.vf_warmup 0, got 2"),
    ({"rollout_config": {"synchronous_sampling": True}},
     "rollout_config.synchronous_sampling: needs replay_buffer_config.max_reuse 1, got 2"),
    (_with("train_config.resume", ""), "train_config.resume: expected a checkpoint path, 'latest' or null"),
    (_with("train_config.num_iterations", None), "train_config.num_iterations: expected an integer, got None"),
    (_with("logger_config.wandb_mode", "sometimes"), "logger_config.wandb_mode: expected one of 'auto'"),
    (_with("worker_config_typo", {}), "worker_config_typo: unknown key"),
    (_with("rollout_config.worker_config.step_timeout", 0), "step_timeout: expected > 0, got 0"),
    (_with("train_config.minibatch_sequence_length", 5),
     "train_config.minibatch_sequence_length: expected a divisor of rollout_config.fragment_length (256), got 5"),
]


@pytest.mark.parametrize("data, fragment", BAD_CONFIGS, ids=[fragment[:40] for _, fragment in BAD_CONFIGS])
def test_bad_config_is_rejected_with_a_clear_message(data, fragment):
    with pytest.raises(ConfigError) as caught:
        build_config(data)
    message = str(caught.value)
    assert fragment in message
    assert "\n" not in message, "one bad key must give exactly one line"


def test_optional_keys_accept_null():
    config = build_config(_with("rollout_config.worker_config.restart_interval", None))
    assert config.rollout_config.worker_config.restart_interval is None
    assert build_config({"train_config": {"record_video_interval": 0}}).train_config.record_video_interval == 0


def test_a_key_of_two_types_takes_either():
    assert build_config({"train_config": {"cpu_bf16": "auto"}}).train_config.cpu_bf16 == "auto"
    assert build_config({"train_config": {"cpu_bf16": True}}).train_config.cpu_bf16 is True


def test_non_mapping_online_dict_is_rejected():
    with pytest.raises(ConfigError, match="online_dict: expected a mapping"):
        build_config(OmegaConf.create([1, 2]))


def test_an_iterations_fragments_are_shared_by_the_envs_of_the_workers_that_run():
    config = build_config({"rollout_config": {"synchronous_sampling": True, "num_rollout_workers": 4,
                                              "replay_buffer_config": {"max_reuse": 1},
                                              "worker_config": {"num_envs": 2, "batch_size": 2}}})
    assert config.fragments_per_iteration() == 32
    assert config.fragments_per_env_per_version() == 4
    assert [config.fragments_per_env_per_version(n) for n in (3, 2, 1, 0)] == [6, 8, 16, 16]  # 32/6 rounded up
