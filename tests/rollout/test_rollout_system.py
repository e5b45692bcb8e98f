"""The rollout side end to end: workers -> replay buffer (LMDB) -> sampled chunks read back intact."""

from __future__ import annotations

import functools
import time

import numpy as np
import pytest

from craftrl.config import build_config
from craftrl.testing.scripted_env import ScriptedEnv
from craftrl.replay.reader import ChunkReader
from craftrl.system import start_rollout_system, stop_rollout_system
from craftrl.testing.counting_policy import counting_policy_generator
from craftrl.system import ROLLOUT_MANAGER

pytestmark = pytest.mark.ray


def test_fragments_reach_the_replay_buffer_and_read_back_chained(ray_session, tmp_path):
    ray = ray_session
    config = build_config({
        "detach_rollout_manager": False,
        "rollout_config": {
            "num_rollout_workers": 2, "num_cpus_per_worker": 0, "fragment_length": 4, "to_send_queue_size": 2,
            "worker_config": {"num_envs": 2, "batch_size": 2, "envs_per_process": 2,
                              "video_output_dir": str(tmp_path / "videos")},
            "replay_buffer_config": {"max_chunks": 50, "max_reuse": 1, "fragments_per_chunk": 2,
                                     "database_config": {"path": str(tmp_path / "replay"), "num_shards": 2}},
        },
        "train_config": {"batch_size_per_gpu": 2},
    })
    handles = start_rollout_system(counting_policy_generator, functools.partial(ScriptedEnv, episode_length=3),
                                   config)
    try:
        assert ray.get_actor(ROLLOUT_MANAGER) is not None
        descriptors = ray.get(handles.replay.sample_chunks.remote(4, timeout_s=120))
        reader = ChunkReader(ray.get(handles.replay.layout.remote()))
        for descriptor in descriptors:
            result = reader.read(descriptor)
            assert result.ok, result.error
            first, second = result.fragments
            assert (first.env_id, second.index) == (second.env_id, first.index + 1)
            assert first.next_obs["t"] == second.obs["t"][0]
            t = np.concatenate([first.obs["t"], second.obs["t"]])
            np.testing.assert_array_equal(np.diff(t) % 3, np.ones(len(t) - 1))  # 0 1 2 0 1 2 ...
        reader.close()
        deadline = time.monotonic() + 30
        while ray.get(handles.manager.status.remote())["rollout/fragments_sent"] < 8 and time.monotonic() < deadline:
            time.sleep(0.5)
        accounting = ray.get(handles.replay.accounting.remote())
        assert accounting["added"] >= 8
        status = ray.get(handles.manager.status.remote())
        # the loop's whole time bounds its named parts (bench/time_to_cows.py splits it into them)
        parts = status["rollout/inference_s"] + status["rollout/env_wait_s"] + status["rollout/emit_wait_s"]
        assert 0 < parts <= status["rollout/loop_s"]
        assert status["rollout/env_processes"] == 2  # each worker's 2 envs share one process
    finally:
        assert stop_rollout_system()
    with pytest.raises(ValueError):
        ray.get_actor(ROLLOUT_MANAGER)


def test_a_killed_rollout_manager_or_statistics_actor_is_restarted_and_rollouts_go_on(ray_session, tmp_path):
    ray = ray_session
    config = build_config({
        "detach_rollout_manager": False,
        "rollout_config": {
            "num_rollout_workers": 1, "num_cpus_per_worker": 0, "fragment_length": 4,
            "worker_config": {"num_envs": 2, "batch_size": 2, "video_output_dir": str(tmp_path / "videos")},
            "replay_buffer_config": {"max_chunks": 50, "database_config": {"path": str(tmp_path / "replay"),
                                                                           "num_shards": 1}},
        },
    })
    handles = start_rollout_system(counting_policy_generator, functools.partial(ScriptedEnv, episode_length=3),
                                   config)

    def wait_for(what, condition, timeout=90.0):
        deadline = time.monotonic() + timeout
        while not condition():
            assert time.monotonic() < deadline, what
            time.sleep(0.5)

    try:
        wait_for("fragments", lambda: ray.get(handles.manager.status.remote())["rollout/fragments_sent"] >= 2)
        ray.kill(handles.manager, no_restart=False)
        ray.kill(handles.statistics, no_restart=False)
        added = ray.get(handles.replay.accounting.remote())["added"]
        # the same handles answer again: Ray restarted both, and the new manager started a new worker
        wait_for("the restarted manager's fragments", lambda: ray.get(handles.manager.status.remote(), timeout=30)
                 ["rollout/fragments_sent"] >= 2)
        status = ray.get(handles.manager.status.remote())
        assert status["rollout/manager_restarted"] == 1.0 and len(ray.get(handles.manager.worker_handles.remote())) == 1
        assert ray.get(handles.replay.accounting.remote())["added"] >= added + 2
        wait_for("episodes reported to the restarted statistics",
                 lambda: ray.get(handles.statistics.summary.remote())["episodes/total"] > 0)
    finally:
        assert stop_rollout_system()


def test_paced_rollouts_stop_stepping_until_the_trainer_samples_and_still_stop_cleanly(ray_session, tmp_path):
    """max_unsampled_chunks 4: with no trainer sampling, the worker stops cutting fragments after about that many
    (plus what its queue and the held registration carry); a sample lets it go on; the stop releases it, and
    every fragment it cut is delivered."""
    ray = ray_session
    config = build_config({
        "detach_rollout_manager": False,
        "rollout_config": {
            "num_rollout_workers": 1, "num_cpus_per_worker": 0, "fragment_length": 4, "to_send_queue_size": 1,
            "worker_config": {"num_envs": 2, "batch_size": 2, "envs_per_process": 2,
                              "video_output_dir": str(tmp_path / "videos")},
            "replay_buffer_config": {"max_chunks": 50, "max_reuse": 1, "max_staleness": 100,
                                     "max_unsampled_chunks": 4,
                                     "database_config": {"path": str(tmp_path / "replay"), "num_shards": 1}},
        },
        "train_config": {"batch_size_per_gpu": 2, "batches_per_iteration": 2},
    })
    handles = start_rollout_system(counting_policy_generator, functools.partial(ScriptedEnv, episode_length=3),
                                   config)

    def emitted() -> int:
        return int(ray.get(handles.manager.status.remote())["rollout/fragments_emitted"])

    def settled() -> int:
        """Fragments cut once the count stops moving for 2 s."""
        last, deadline = -1, time.monotonic() + 60
        while time.monotonic() < deadline:
            now = emitted()
            if now == last:
                return now
            last = now
            time.sleep(2.0)
        raise AssertionError(f"the paced worker kept cutting fragments: {last}")

    try:
        held_back = settled()
        # 4 taken by the buffer; the held call's 2 (a group's), the 2 the sender has ready behind it, 1 in the send
        # queue and up to 2 in the loop wait
        assert 4 <= held_back <= 11, held_back
        assert ray.get(handles.replay.metrics.remote())["replay/unsampled_chunks"] == 4
        ray.get(handles.replay.sample_chunks.remote(4, timeout_s=10))
        assert settled() > held_back
    finally:
        accounting = stop_rollout_system(timeout=40.0)
    assert accounting["rollout/fragments_dropped"] == 0
    assert accounting["rollout/fragments_sent"] == accounting["rollout/fragments_emitted"]
    assert accounting["stop/rollout_manager_s"] < 20.0  # released, not drained to the 30 s timeout


def test_a_replay_buffer_that_died_starting_is_named_once_in_one_line_at_the_stop(ray_session, tmp_path, caplog):
    """The run's own error line carries the reason in full; the stop adds one line, not the actor's error twice."""
    (tmp_path / "a_file").write_text("not a directory")
    config = build_config({
        "detach_rollout_manager": False,
        "rollout_config": {
            "num_rollout_workers": 1, "num_cpus_per_worker": 0, "fragment_length": 4,
            "worker_config": {"num_envs": 2, "batch_size": 2, "video_output_dir": str(tmp_path / "videos")},
            "replay_buffer_config": {"database_config": {"path": str(tmp_path / "a_file" / "replay")}},
        },
        "train_config": {"batch_size_per_gpu": 2},
    })
    with pytest.raises(ray_session.exceptions.RayActorError):  # the manager asks the buffer for its store's layout
        start_rollout_system(counting_policy_generator, functools.partial(ScriptedEnv, episode_length=3), config)
    with caplog.at_level("WARNING", logger="craftrl.system"):
        stop_rollout_system()
    lines = [line for record in caplog.records for line in record.getMessage().splitlines()]
    assert len(lines) == 1 and lines[0].startswith("replay_buffer had died: "), lines
    assert "a_file" in lines[0], lines
