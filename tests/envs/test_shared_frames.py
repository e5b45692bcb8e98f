"""Large observation arrays through shared memory: exact copies, per env and kind of reply, regions that grow
and go away with the pool; small ones stay in the pickled reply."""

from __future__ import annotations

import functools
import multiprocessing

import numpy as np
import pytest

from craftrl.envs import EnvPool
from craftrl.envs.env_process import receive_message, send_message
from craftrl.envs.shared_frames import SHARE_MIN_BYTES, SHARING_AVAILABLE, FrameReceiver, FrameSender, SharedObs
from craftrl.testing.scripted_env import ScriptedEnv

pytestmark = pytest.mark.skipif(not SHARING_AVAILABLE, reason="needs os.memfd_create (Linux)")

LARGE_SIDE = 160  # 160 x 160 x 3 = 76.8 kB, over SHARE_MIN_BYTES


def pipe_pair():
    """A sender and a receiver on the two ends of one duplex pipe (a Unix socket pair), in this process."""
    child_end, parent_end = multiprocessing.Pipe(duplex=True)
    return FrameSender(child_end, lambda message: send_message(child_end, message)), FrameReceiver(), parent_end


def receive_regions(receiver: FrameReceiver, conn) -> int:
    count = 0
    while conn.poll():
        message = receive_message(conn)
        assert message[0] == "region"
        receiver.add_region(conn, *message[1:])
        count += 1
    return count


def test_large_arrays_cross_as_exact_independent_copies_and_small_ones_stay_in_the_reply() -> None:
    sender, receiver, conn = pipe_pair()
    rng = np.random.default_rng(0)
    image = rng.integers(0, 256, (200, 300, 3), dtype=np.uint8)
    obs = {"t": np.int64(4), "image": image, "depth": rng.random((300, 200), dtype=np.float32).T,  # not contiguous
           "inventory": np.arange(5), "name": "x"}
    small = {"image": np.zeros((64, 64, 3), np.uint8), "t": 1}
    assert small["image"].nbytes < SHARE_MIN_BYTES
    assert sender.pack(0, "step", small) is small

    packed = sender.pack(0, "step", obs)
    assert isinstance(packed, SharedObs) and set(packed.layout) == {"image", "depth"}
    assert receive_regions(receiver, conn) == 1
    restored = receiver.unpack(0, packed)
    assert list(restored) == list(obs)
    for key in ("image", "depth"):
        np.testing.assert_array_equal(restored[key], obs[key])
        assert restored[key].dtype == obs[key].dtype and restored[key].flags.writeable
    assert restored["t"] == 4 and restored["name"] == "x" and restored["inventory"] is packed.rest["inventory"]

    sender.pack(0, "step", {"image": np.zeros_like(image), "depth": np.zeros((200, 300), np.float32)})
    np.testing.assert_array_equal(restored["image"], image)  # a copy: the env's next write does not reach it
    receiver.close()


def test_each_env_and_kind_has_its_own_region_and_a_larger_observation_gets_a_new_one() -> None:
    sender, receiver, conn = pipe_pair()
    frames = {key: np.full((LARGE_SIDE, LARGE_SIDE, 3), value, np.uint8)
              for key, value in (((0, "step"), 1), ((0, "reset"), 2), ((1, "step"), 3))}
    packed = {key: sender.pack(key[0], key[1], {"image": frame}) for key, frame in frames.items()}
    assert receive_regions(receiver, conn) == 3
    for (index, _), shared in packed.items():  # all three in flight at once, none overwrote another
        assert receiver.unpack(index, shared)["image"][0, 0, 0] == frames[(index, shared.kind)][0, 0, 0]

    bigger = np.full((2 * LARGE_SIDE, LARGE_SIDE, 3), 9, np.uint8)
    shared = sender.pack(0, "step", {"image": bigger})
    assert receive_regions(receiver, conn) == 1
    np.testing.assert_array_equal(receiver.unpack(0, shared)["image"], bigger)
    assert len(receiver.regions) == 3
    shared = sender.pack(0, "step", {"image": frames[(0, "step")]})  # smaller again: the same region serves
    assert receive_regions(receiver, conn) == 0
    np.testing.assert_array_equal(receiver.unpack(0, shared)["image"], frames[(0, "step")])
    receiver.close()


def frame_mappings() -> list[str]:
    with open("/proc/self/maps") as maps:
        return [line for line in maps if "craftrl-frames" in line]


@pytest.mark.parametrize("envs_per_process", [1, 3])
def test_pool_with_large_frames_keeps_every_env_s_chain_exact(envs_per_process: int) -> None:
    """Envs out of step, episodes ending (the last step and the next first observation in flight together),
    regions growing each episode: every observation is the env's own, in order."""
    generator = functools.partial(ScriptedEnv, episode_length=4, end_with="truncated", image_side=LARGE_SIDE,
                                  image_growth=8)
    with EnvPool(generator, 3, step_timeout_s=10, reset_timeout_s=30, envs_per_process=envs_per_process) as pool:
        pool.reset_all()
        ready = {r.env_index: r for r in pool.recv(3)}
        expected_t = dict.fromkeys(range(3), 0)
        episodes = dict.fromkeys(range(3), 1)
        for round_ in range(30):
            acting = [0] if round_ < 2 else sorted(ready)  # env 0 alone first: the envs' counts part
            pool.send(acting, [0] * len(acting))
            for env_index in acting:
                ready.pop(env_index)
            for result in pool.recv(len(acting)):
                env_index, side = result.env_index, LARGE_SIDE + 8 * (episodes[result.env_index] - 1)
                expected_t[env_index] += 1
                if result.done:
                    assert result.final_obs["image"].shape == (side, side, 3)
                    assert int(result.final_obs["t"]) == expected_t[env_index] == 4
                    assert np.all(result.final_obs["image"] == 4)
                    expected_t[env_index], episodes[env_index] = 0, episodes[env_index] + 1
                    side += 8
                assert int(result.obs["t"]) == expected_t[env_index] and result.first == (expected_t[env_index] == 0)
                assert result.obs["image"].shape == (side, side, 3) and np.all(result.obs["image"] == expected_t[env_index])
                ready[env_index] = result
        assert min(episodes.values()) >= 5
        processes = [host.process for host in pool._hosts]
        assert all(("step" in {kind for _, kind in p.shared.regions}) for p in processes)
        assert frame_mappings()
    assert not frame_mappings()  # the pool's mappings went with it


def test_a_rebuilt_env_process_shares_through_new_regions() -> None:
    generator = functools.partial(ScriptedEnv, episode_length=50, fail_in="step", fail_mode="exit", fail_at=3,
                                  image_side=LARGE_SIDE)
    with EnvPool(generator, 1, step_timeout_s=10, reset_timeout_s=30) as pool:
        pool.reset_all()
        results = pool.recv(1)
        for _ in range(8):
            pool.send([0], [0])
            results = pool.recv(1)
            assert np.all(results[0].obs["image"] == int(results[0].obs["t"]))
        assert pool.restart_counts == [2]  # the 3rd step of each fresh process dies


def test_without_shared_memory_the_pipe_carries_everything(monkeypatch) -> None:
    def no_memfd(*args):
        raise OSError(38, "Function not implemented")

    monkeypatch.setattr("os.memfd_create", no_memfd)
    sender, receiver, conn = pipe_pair()
    obs = {"image": np.ones((LARGE_SIDE, LARGE_SIDE, 3), np.uint8)}
    assert sender.pack(0, "step", obs) is obs and not sender.enabled
    assert receive_regions(receiver, conn) == 0  # nothing announced: the parent waits for no descriptor
