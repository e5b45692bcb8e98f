"""Rollout worker and manager as Ray actors, with real env processes (local Ray)."""

from __future__ import annotations

import functools
import os
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from craftrl.config import build_config
from craftrl.config.loading import config_to_dict
from craftrl.testing.scripted_env import ScriptedEnv
from craftrl.rollout.manager import RolloutManager
from craftrl.rollout.worker import RolloutWorker
from craftrl.rollout.episode_stats import EpisodeStatistics
from craftrl.rollout.sinks import ActorSink
from craftrl.testing.counting_policy import CountingPolicy, counting_policy_generator
from craftrl.rollout.loop import worker_prefix
from craftrl.placement import actor_placed
from craftrl.system import EPISODE_STATISTICS

pytestmark = pytest.mark.ray


class CollectingSink:
    """A fragment sink that can be told to stall, to exercise backpressure; it refuses retired writers' fragments."""

    def __init__(self):
        self.fragments = []
        self.retired: list[str] = []
        self.open = threading.Event()
        self.open.set()

    def add_fragment(self, fragment):
        self.open.wait()
        if not any(fragment.env_id.startswith(prefix) for prefix in self.retired):
            self.fragments.append(fragment)
        return len(self.fragments)

    def retire_worker(self, prefix):
        self.retired.append(prefix)

    def retired_workers(self):
        return list(self.retired)

    def set_open(self, value: bool):
        (self.open.set if value else self.open.clear)()

    def summary(self):
        return [(f.env_id, f.index, f.version.min(), f.version.max(), f.obs["t"].copy(), f.first.copy())
                for f in self.fragments]


def online(tmp_path: Path, **rollout):
    worker = {"num_envs": 2, "batch_size": 1, "video_fps": 10, "video_output_dir": str(tmp_path / "videos")}
    worker.update(rollout.pop("worker_config", {}))
    data = {"rollout_config": {"num_rollout_workers": 1, "num_cpus_per_worker": 0, "fragment_length": 4,
                               "to_send_queue_size": 1, "worker_config": worker, **rollout},
            "train_config": {"discount": 0.5}}
    return config_to_dict(build_config(data))


def wait_until(predicate, timeout=60.0, interval=0.2):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError("condition not met in time")


def test_worker_backpressure_blocks_and_resumes_without_loss(ray_session, tmp_path):
    ray = ray_session
    sink = ray.remote(max_concurrency=4)(CollectingSink).remote()
    ray.get(sink.set_open.remote(False))
    env = functools.partial(ScriptedEnv, episode_length=5)
    worker = ray.remote(max_concurrency=4)(RolloutWorker).remote("w0", env, counting_policy_generator,
                                                                 online(tmp_path), ActorSink(sink))
    # With the sink stalled: one fragment is in the sink call, one in the queue, then the loop waits.
    status = wait_until(lambda: (s := ray.get(worker.status.remote()))["emit_wait_s"] > 1.0 and s)
    assert status["queue_fill"] == 1 and status["fragments_sent"] == 0
    steps_while_blocked = status["env_steps"]
    time.sleep(1.0)
    assert ray.get(worker.status.remote())["env_steps"] <= steps_while_blocked + 2 * 4 + 2
    ray.get(sink.set_open.remote(True))
    wait_until(lambda: len(ray.get(sink.summary.remote())) >= 12)
    ray.get(worker.stop.remote())
    received = ray.get(sink.summary.remote())
    for env_id in {r[0] for r in received}:
        indices = [r[1] for r in received if r[0] == env_id]
        assert indices == list(range(len(indices))), "a fragment was lost or reordered"
        t = np.concatenate([r[4] for r in received if r[0] == env_id])
        np.testing.assert_array_equal(t, np.arange(len(t)) % 5)


def test_a_worker_discards_what_the_newest_offered_version_makes_too_stale_and_counts_it(ray_session, tmp_path):
    """Fragments acted by the initial weights (version -1) wait behind a stalled sink while version 3 is offered:
    with ``max_staleness`` 2 the buffer would refuse them, so the worker does not send them, and counts them."""
    ray = ray_session
    sink = ray.remote(max_concurrency=4)(CollectingSink).remote()
    ray.get(sink.set_open.remote(False))
    env = functools.partial(ScriptedEnv, episode_length=5)
    config = online(tmp_path, to_send_queue_size=4, replay_buffer_config={"max_staleness": 2})
    worker = ray.remote(max_concurrency=4)(RolloutWorker).remote("w0", env, counting_policy_generator, config,
                                                                 ActorSink(sink))
    wait_until(lambda: ray.get(worker.status.remote())["queue_fill"] >= 2)
    ray.get(worker.update_weights.remote(3, [ray.put(CountingPolicy().state_dict())]))
    ray.get(sink.set_open.remote(True))
    wait_until(lambda: sum(r[2] == 3 for r in ray.get(sink.summary.remote())) >= 4)
    final = ray.get(worker.stop.remote())
    received = ray.get(sink.summary.remote())
    discarded = final["fragments_discarded_stale"]
    assert discarded >= 2, final
    assert final["fragments_emitted"] == final["fragments_sent"] + discarded and final["fragments_dropped"] == 0
    assert len(received) == final["fragments_sent"]
    holes = 0
    for env_id in {r[0] for r in received}:
        mine = sorted((r for r in received if r[0] == env_id), key=lambda r: r[1])
        indices, versions = [r[1] for r in mine], [r[2] for r in mine]
        holes += indices[-1] + 1 - len(indices)
        assert set(versions) <= {-1, 3} and versions == sorted(versions), list(zip(indices, versions))
        # old fragments arrive only before the first hole (those already in the sink call when 3 was offered)
        first_hole = next((i for i, index in enumerate(indices) if index != i), len(indices))
        assert all(version == 3 for version in versions[first_hole:]), list(zip(indices, versions))
    assert holes == discarded, "every fragment missing from the sink is one the worker counted as discarded"


def test_manager_broadcasts_weights_recreates_dead_workers_and_records_video(ray_session, tmp_path):
    ray = ray_session
    sink = ray.remote(max_concurrency=4)(CollectingSink).remote()
    statistics = ray.remote(EpisodeStatistics).options(name=EPISODE_STATISTICS).remote(moving_window=50)
    config = online(tmp_path, num_rollout_workers=2)
    env = functools.partial(ScriptedEnv, episode_length=5)
    manager = ray.remote(max_concurrency=8)(RolloutManager).remote(env, counting_policy_generator, config,
                                                                   ActorSink(sink), health_interval=0.5)
    assert ray.get(manager.start.remote()) == 2
    wait_until(lambda: len(ray.get(sink.summary.remote())) >= 4)

    # weights travel as a CPU state dict through the object store; every later step carries the version
    weights = CountingPolicy().state_dict()
    weights["action_scores"][:] = 0.0
    assert ray.get(manager.status.remote())["rollout/weights_fetch_s_max"] == 0.0, "no version fetched yet"
    ray.get(manager.update_weights.remote(3, [ray.put(weights)]))
    wait_until(lambda: any(r[3] == 3 for r in ray.get(sink.summary.remote())))
    wait_until(lambda: ray.get(manager.status.remote())["rollout/weights_fetch_s_max"] > 0.0)  # a status may lag
    status = ray.get(manager.status.remote())
    assert 0.0 < status["rollout/weights_shard_s_max"] <= status["rollout/weights_fetch_s_max"], "a shard: part of it"

    # a killed worker is noticed, recreated with the latest weights, and production continues
    victim = ray.get(manager.worker_handles.remote())[0]
    victim_name = ray.get(victim.status.remote())["name"]
    wait_until(lambda: any(r[0].startswith(worker_prefix(victim_name)) for r in ray.get(sink.summary.remote())))
    ray.kill(victim, no_restart=True)
    wait_until(lambda: ray.get(manager.status.remote())["rollout/workers_recreated"] >= 1)
    assert ray.get(sink.retired_workers.remote()) == [worker_prefix(victim_name)], "the sink refuses it from now on"
    assert any(r[0].startswith(worker_prefix(victim_name)) for r in ray.get(sink.summary.remote()))
    before = len(ray.get(sink.summary.remote()))
    wait_until(lambda: len(ray.get(sink.summary.remote())) >= before + 6)
    recent = ray.get(sink.summary.remote())[before:]
    assert all(r[2] == 3 for r in recent if r[0].startswith("w0-")), "the new w0 must act with version 3"

    # a requested video is written with one frame per step of the recorded episode (5 steps + reset frame)
    ray.get(manager.request_video.remote(4, 3))
    videos = wait_until(lambda: list((tmp_path / "videos").glob("iter000004-v3-*.mp4")), timeout=60)
    import imageio.v2 as imageio

    time.sleep(1.0)  # the writer thread finishes the file
    frames = imageio.mimread(str(videos[0]))
    assert len(frames) == 6 and frames[0].shape == (8, 8, 3)

    summary = ray.get(statistics.summary.remote())
    assert summary["episodes/total"] >= 2
    assert summary["episodes/return_mean"] == 5.0 and summary["episodes/length_mean"] == 5.0
    assert summary["episodes/discounted_return_mean"] == pytest.approx(sum(0.5 ** k for k in range(5)))
    ray.get(manager.shutdown.remote())
    ray.kill(statistics)  # named: gone before the next test starts a run's own


def test_workers_no_node_can_host_are_found_in_one_check_and_hold_up_neither_status_nor_videos(ray_session, tmp_path):
    """Three workers of 3 CPUs on Ray's 4: one runs, and one health check (one status timeout, not one per worker)
    finds the other two waiting for a node. The manager's status then does not wait for their answers, nor for the
    running one's once it stops answering, and a video requested in a waiting position's turn is recorded by the
    worker that runs."""
    ray = ray_session
    sink = ray.remote(CollectingSink).remote()
    config = online(tmp_path, num_rollout_workers=3, num_cpus_per_worker=3)
    env = functools.partial(ScriptedEnv, episode_length=5)
    manager = ray.remote(max_concurrency=8)(RolloutManager).remote(env, counting_policy_generator, config,
                                                                   ActorSink(sink), health_interval=0.5)
    stopped = None
    try:
        assert ray.get(manager.start.remote()) == 3
        seen: set[float] = set()
        deadline = time.monotonic() + 60
        while 2 not in seen and time.monotonic() < deadline:
            seen.add(ray.get(manager.status.remote(fresh=False))["rollout/workers_waiting_for_node"])
            time.sleep(0.2)
        assert seen == {0, 2}, f"the waiting workers were found one check after another: {sorted(seen)}"
        started = time.monotonic()
        status = ray.get(manager.status.remote())  # fresh: asks the worker that runs
        assert time.monotonic() - started < 2.5, "the status waited out its 5-s timeout on the waiting workers"
        assert status["rollout/workers_waiting_for_node"] == 2
        ray.get(manager.request_video.remote(1, 0))  # position 1's turn, and position 1 waits for a node
        assert wait_until(lambda: list((tmp_path / "videos").glob("iter000001-v0-*.mp4")), timeout=30)

        # the running worker stops answering (a hung node): once a health check has missed it (10 s), the status
        # skips it too, long before it is replaced (after 3 missed checks)
        running = next(worker for worker in ray.get(manager.worker_handles.remote()) if actor_placed(worker))
        stopped = ray.get(running.__ray_call__.remote(lambda actor: os.getpid()))
        os.kill(stopped, signal.SIGSTOP)
        deadline, prompt = time.monotonic() + 25, False
        while not prompt and time.monotonic() < deadline:
            started = time.monotonic()
            ray.get(manager.status.remote())
            prompt = time.monotonic() - started < 2.5
        assert prompt, "every status waited out its timeout on the worker that stopped answering"
    finally:
        if stopped:
            os.kill(stopped, signal.SIGCONT)
        ray.get(manager.shutdown.remote())


class SlowToStart:
    def __init__(self, seconds: float):
        time.sleep(seconds)

    def ready(self) -> bool:
        return True


def test_actor_placed_tells_a_starting_actor_from_one_no_node_can_host(ray_session):
    """What lets synchronous sampling share a missing worker's fragments without taking a slow constructor (a
    1 GB policy loading) for a missing node."""
    ray = ray_session
    starting = ray.remote(SlowToStart).options(num_cpus=0).remote(3.0)
    unplaceable = ray.remote(SlowToStart).options(num_cpus=0, resources={"no_such_node": 1}).remote(0.0)
    try:
        deadline = time.monotonic() + 2.5
        while not actor_placed(starting) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert actor_placed(starting) is True  # placed while its constructor still runs
        assert not ray.wait([starting.ready.remote()], timeout=0)[0]
        assert actor_placed(unplaceable) is False
    finally:
        ray.kill(starting)
        ray.kill(unplaceable)
