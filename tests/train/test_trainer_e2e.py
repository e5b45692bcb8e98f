"""The whole loop on local Ray: env processes -> rollout workers -> replay (LMDB) -> Ray Train PPO -> weights back."""

from __future__ import annotations

import json

import pytest
import torch
from config_fixtures import tiny

from craftrl.system import start_metrics_sink
from craftrl.config import build_config
from craftrl.config.loading import config_to_dict
from craftrl.system import start_rollout_system, stop_rollout_system
from craftrl.train.checkpoint import list_checkpoints, load_checkpoint
from craftrl.train.trainer import run_trainer

pytestmark = pytest.mark.ray

POLICY, ENV = tiny.policy_generator, tiny.env_generator


def tiny_config(tmp_path, **train):
    """The tiny config for 3 iterations with a video every 2nd; ``train`` changes train_config."""
    return build_config(tiny.tiny_online(
        tmp_path, rollout_config={"replay_buffer_config": {"max_chunks": 64}},
        train_config={"num_iterations": 3, "record_video_interval": 2, **train}))


def run(ray, tmp_path, config):
    sink = start_metrics_sink(str(tmp_path), config)
    handles = start_rollout_system(POLICY, ENV, config)
    try:
        run_trainer(POLICY, config_to_dict(config), storage_path=str(tmp_path / "ray_train"))
        status = ray.get(handles.manager.status.remote())
    finally:
        stop_rollout_system()
        ray.get(sink.close.remote())
        ray.kill(sink)
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    return status, records


def test_local_mode_trains_publishes_and_checkpoints(ray_session, tmp_path, monkeypatch):
    import craftrl.train.home_checkpoints

    written = []
    write = craftrl.train.home_checkpoints.write_checkpoint

    def counted(save_path, iteration, *args):
        written.append(iteration)
        return write(save_path, iteration, *args)

    monkeypatch.setattr(craftrl.train.home_checkpoints, "write_checkpoint", counted)
    config = tiny_config(tmp_path)
    status, records = run(ray_session, tmp_path, config)
    # save_interval 1: each iteration once; the final save would repeat the last iteration's (a VPT-2x one takes ~10 s)
    assert written == [1, 2, 3]
    assert [r["train/iteration"] for r in records] == [1.0, 2.0, 3.0]
    assert [r["train/version"] for r in records] == [1.0, 2.0, 3.0]
    assert all(r["data/fragments"] == 4 for r in records)
    assert records[-1]["rollout/fragments_sent"] >= 4
    assert "episodes/return_mean" in records[-1]
    episodes = [json.loads(line) for line in (tmp_path / "episodes.jsonl").read_text().splitlines()]
    # taken just after each summary, so at least every episode the last summary counted
    assert len(episodes) >= records[-1]["episodes/total"] > 0
    assert {e["length"] for e in episodes} == {6}, "ScriptedEnv(episode_length=6) episodes, one line each"
    assert [e["step"] for e in episodes] == sorted(e["step"] for e in episodes)
    checkpoints = list_checkpoints(tmp_path / "checkpoints")
    assert [i for i, _ in checkpoints] == [1, 2, 3]
    payload = load_checkpoint(checkpoints[-1][1])
    assert payload["training"].iteration == 3 and payload["training"].version == 3
    POLICY().load_state_dict(payload["model"])  # loads strictly into a fresh policy
    assert status["rollout/workers_recreated"] == 0


def test_resume_latest_continues_the_counters_the_moving_reference_and_the_entropy_weight(ray_session, tmp_path):
    """Also the in-process reading of the store (num_readers 0) that the default config uses, a KL reference
    that follows the policy (enable_ref_update) and an entropy weight adapted towards a target: the resumed run
    moves on from the checkpoint's reference and weight."""
    moving_reference = {"num_readers": 0, "kl_divergence_coef_rho": 0.1, "enable_ref_update": True,
                        "ref_update_rate": 0.5, "target_entropy": 10.0, "entropy_coef_step": 0.01}
    run(ray_session, tmp_path, tiny_config(tmp_path, num_iterations=2, **moving_reference))
    (tmp_path / "metrics.jsonl").unlink()
    _, records = run(ray_session, tmp_path, tiny_config(tmp_path, num_iterations=4, resume="latest",
                                                        **moving_reference))
    assert [r["train/iteration"] for r in records] == [3.0, 4.0]
    assert [r["train/version"] for r in records] == [3.0, 4.0]
    checkpoints = dict(list_checkpoints(tmp_path / "checkpoints"))
    saved, resumed = load_checkpoint(checkpoints[2]), load_checkpoint(checkpoints[3])
    for name, reference in resumed["reference"].items():
        if reference.is_floating_point():  # half-way from iteration 2's reference to iteration 3's policy
            expected = saved["reference"][name].lerp(resumed["model"][name], 0.5)
            torch.testing.assert_close(reference, expected, rtol=0, atol=0, msg=name)
    assert any(not torch.equal(saved["reference"][name], saved["model"][name]) for name in saved["model"])
    saved_weight = saved["training"].entropy_coef
    assert saved_weight > tiny_config(tmp_path).train_config.entropy_bonus_coef, "grew towards the target"
    assert records[0]["ppo/entropy_coef"] == pytest.approx(saved_weight), "the resumed run uses the saved weight"


def test_two_ray_train_workers_run_ddp(ray_session, tmp_path):
    config = tiny_config(tmp_path, num_workers=2, num_iterations=2, num_cpus_per_worker=1)
    _, records = run(ray_session, tmp_path, config)
    assert [r["train/iteration"] for r in records] == [1.0, 2.0]
    assert all(r["data/fragments"] == 8 for r in records), "fragments are counted over both ranks"


def test_synchronous_sampling_trains_every_iteration_on_the_version_it_updates(ray_session, tmp_path):
    """Each of the 2 envs cuts 2 of the 4 fragments an iteration samples with one version, then waits for the next:
    the learner never trains on older data although max_staleness (3) would accept it."""
    config = build_config(tiny.tiny_online(
        tmp_path, rollout_config={"synchronous_sampling": True,
                                  "replay_buffer_config": {"max_chunks": 64, "max_reuse": 1}},
        train_config={"num_iterations": 4}))
    _, records = run(ray_session, tmp_path, config)
    assert [r["train/iteration"] for r in records] == [1.0, 2.0, 3.0, 4.0]
    assert all(r["data/fragments"] == 4 for r in records)
    assert [r["data/version_lag_max"] for r in records] == [0.0] * 4
    rollout_records = [r for r in records if "rollout/weights_wait_s" in r]  # a late manager leaves its keys out
    assert rollout_records and rollout_records[-1]["rollout/weights_wait_s"] > 0
    assert rollout_records[-1]["rollout/fragments_per_env_per_version"] == 2


def test_synchronous_sampling_fills_each_iteration_with_the_rollout_workers_that_run(ray_session, tmp_path):
    """Two rollout workers of 3 CPUs on Ray's 4: the second waits for a node that never joins, and the first one's
    envs cut both workers' shares of each iteration rather than leave the learner waiting for the rest."""
    config = build_config(tiny.tiny_online(
        tmp_path, rollout_config={"synchronous_sampling": True, "num_rollout_workers": 2, "num_cpus_per_worker": 3,
                                  "replay_buffer_config": {"max_chunks": 64, "max_reuse": 1}},
        train_config={"num_iterations": 3}))
    assert config.fragments_per_env_per_version() == 1
    status, records = run(ray_session, tmp_path, config)
    assert [r["train/iteration"] for r in records] == [1.0, 2.0, 3.0]
    assert all(r["data/fragments"] == 4 for r in records)
    assert status["rollout/workers_waiting_for_node"] == 1
    assert status["rollout/fragments_per_env_per_version"] == 2
    assert [r["data/version_lag_max"] for r in records] == [0.0] * 3
    # the manager's status, which each record asks for, does not wait out its 5-s timeout on the waiting worker
    assert max(r["time/statistics_s"] for r in records) < 2.5, [r["time/statistics_s"] for r in records]
