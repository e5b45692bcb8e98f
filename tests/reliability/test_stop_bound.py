"""A stop is bounded: actors that never answer their shutdown calls are killed when the stop's time is up.

Ctrl-C must not hang on one wedged actor (docs/reliability.md promises a bound). The hung actors here are real
Ray actors registered under the rollout system's names, so ``stop_rollout_system`` finds and stops them exactly
as it would the real ones.
"""
from __future__ import annotations

import time

import pytest

from craftrl.system import REPLAY_BUFFER, REPLAY_FINAL_S, ROLLOUT_MANAGER, stop_rollout_system

pytestmark = pytest.mark.ray

BOUND_S = 4.0  # the stop's whole time limit in this test (75 s in a real run)


class HungActor:
    """Answers ``ping``; every call the stop makes never returns."""

    def ping(self) -> bool:
        return True

    def shutdown(self, timeout: float) -> dict:
        time.sleep(3600)
        return {}  # never reached

    def flush_deletes(self) -> None:
        time.sleep(3600)


@pytest.mark.timeout(120)  # an unbounded stop would wait on the hung calls for an hour
def test_a_stop_kills_actors_that_never_answer_within_its_bound(ray_session):
    ray = ray_session
    hung = ray.remote(HungActor)
    manager = hung.options(name=ROLLOUT_MANAGER, max_concurrency=4).remote()
    replay = hung.options(name=REPLAY_BUFFER, max_concurrency=4).remote()
    ray.get([manager.ping.remote(), replay.ping.remote()])

    started = time.monotonic()
    accounting = stop_rollout_system(timeout=BOUND_S)
    elapsed = time.monotonic() - started

    # the manager gets the whole bound, the replay buffer its final few seconds after it, and no more
    assert BOUND_S - 0.5 <= accounting["stop/rollout_manager_s"] <= BOUND_S + 3.0, accounting
    assert REPLAY_FINAL_S - 0.5 <= accounting["stop/replay_buffer_s"] <= REPLAY_FINAL_S + 3.0, accounting
    assert elapsed <= BOUND_S + REPLAY_FINAL_S + 5.0  # slack for a loaded CI machine
    for actor in (manager, replay):  # ray.kill is asynchronous: a ping may still be answered while it lands
        deadline = time.monotonic() + 30
        with pytest.raises(ray.exceptions.RayActorError):
            while time.monotonic() < deadline:
                ray.get(actor.ping.remote(), timeout=30)
                time.sleep(0.2)
    for name in (ROLLOUT_MANAGER, REPLAY_BUFFER):
        with pytest.raises(ValueError):
            ray.get_actor(name)
