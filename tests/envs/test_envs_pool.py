"""EnvPool with real spawned env processes: auto-reset semantics, supervision, recycling, recording."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from craftrl.envs import EnvPool, EnvPoolError, env_generator
from craftrl.testing.scripted_env import ScriptedEnv

STEP_TIMEOUT_S = 1.5
RESET_TIMEOUT_S = 30.0


def is_running(pid: int) -> bool:
    """True if ``pid`` is in the process table and not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            state = stat.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state not in ("Z", "X")


def wait_until_gone(pids: list[int], within_s: float = 5.0) -> list[int]:
    """Pids still running after ``within_s`` (a killed orphan needs a moment to be reaped by init)."""
    give_up_at = time.monotonic() + within_s
    while time.monotonic() < give_up_at:
        alive = [pid for pid in pids if is_running(pid)]
        if not alive:
            return []
        time.sleep(0.05)
    return [pid for pid in pids if is_running(pid)]


def scripted_pool(num_envs: int = 1, **env_kwargs) -> EnvPool:
    return EnvPool(functools.partial(ScriptedEnv, **env_kwargs), num_envs,
                   step_timeout_s=STEP_TIMEOUT_S, reset_timeout_s=RESET_TIMEOUT_S)


def step_all(pool: EnvPool, results, action=0):
    pool.send([r.env_index for r in results], [action] * len(results))
    return sorted(pool.recv(len(results)), key=lambda r: r.env_index)


def test_auto_reset_exposes_final_obs_and_delivers_the_reset_obs() -> None:
    with scripted_pool(2, episode_length=3, end_with="truncated") as pool:
        pool.reset_all(seeds=[10, 11])
        results = sorted(pool.recv(2), key=lambda r: r.env_index)
        assert [(r.env_index, r.from_reset, r.first, r.reward) for r in results] == [(0, True, True, 0.0), (1, True, True, 0.0)]
        assert [r.info["seed"] for r in results] == [10, 11]
        for t in (1, 2):
            results = step_all(pool, results, action=7)
            assert all(r.obs["t"] == t and not r.first and not r.done and r.final_obs is None for r in results)
            assert results[0].info["action"] == 7
        results = step_all(pool, results)
        for result in results:
            assert (result.terminated, result.truncated, result.first, result.from_reset) == (False, True, True, False)
            assert result.reward == 1.0
            assert result.final_obs["t"] == 3  # the last observation of the ended episode
            assert result.obs["t"] == 0  # the first observation of the next one
            assert result.info["t"] == 3 and result.reset_info["t"] == 0
            assert result.reset_info["episode"] == result.info["episode"] + 1
            assert (result.episode.episode_return, result.episode.length, result.episode.restarted) == (3.0, 3, False)
            assert "env_restarted" not in result.info
        assert pool.restart_counts == [0, 0]


def test_api_misuse_is_rejected_with_clear_errors() -> None:
    with scripted_pool(2) as pool:
        pool.reset_all()
        with pytest.raises(ValueError, match="only 2 results are outstanding"):
            pool.recv(3)
        results = pool.recv(2)
        with pytest.raises(ValueError, match="2 env indices but 1 actions"):
            pool.send([0, 1], [0])
        with pytest.raises(ValueError, match="out of range"):
            pool.send([5], [0])
        pool.send([0], [0])
        with pytest.raises(RuntimeError, match="env 0 is still busy"):
            pool.send([0], [0])
        with pytest.raises(RuntimeError, match="undelivered results"):
            pool.reset_all()
        assert len(pool.recv(1)) == 1 and results
    with pytest.raises(TypeError, match="zero-argument callable"):
        EnvPool("crafter/cows", 1)


def test_recv_blocks_without_spinning_and_honours_its_timeout() -> None:
    with scripted_pool(1, step_sleep_s=1.0) as pool:
        pool.reset_all()
        pool.recv(1)
        pool.send([0], [0])
        started = time.monotonic()
        assert pool.recv(1, timeout=0.1) == []
        assert time.monotonic() - started < 0.6
        cpu_before = time.process_time()
        [result] = pool.recv(1)
        assert result.obs["t"] == 1
        assert time.process_time() - cpu_before < 0.2  # blocked in wait(), not polling


def test_envs_step_independently_while_others_wait_for_actions() -> None:
    with scripted_pool(3, episode_length=100) as pool:
        pool.reset_all()
        pool.recv(3)
        pool.send([0, 1], [0, 0])  # env 2 is left waiting, as if its inference were still running
        first = pool.recv(2)
        assert sorted(r.env_index for r in first) == [0, 1]
        assert pool.idle_env_indices == [0, 1, 2]
        pool.send([2, 0], [0, 0])
        assert sorted(r.env_index for r in pool.recv(2)) == [0, 2]


FAILURES = {
    "os._exit in step": dict(fail_in="step", fail_mode="exit", fail_at=2),
    "hang in step": dict(fail_in="step", fail_mode="hang", fail_at=2),
    "raise in step": dict(fail_in="step", fail_mode="raise", fail_at=2),
    "raise in reset": dict(fail_in="reset", fail_mode="raise", fail_at=2),
    "unpicklable step reply": dict(fail_in="step", fail_mode="unpicklable", fail_at=2),
}
REASONS = {"os._exit in step": "died", "hang in step": "timeout", "raise in step": "exception",
           "raise in reset": "exception", "unpicklable step reply": "exception"}


@pytest.mark.parametrize("failure", list(FAILURES))
def test_failed_env_is_restarted_counted_and_its_episode_truncated(failure: str) -> None:
    # episode_length=2 ending in truncation: a reset failure strikes the auto-reset after step 2.
    pool = scripted_pool(1, episode_length=2, end_with="truncated", spawn_child=True, **FAILURES[failure])
    try:
        pool.reset_all()
        [result] = pool.recv(1)
        old_pids = [result.info["pid"], result.info["child_pid"]]
        assert all(is_running(pid) for pid in old_pids)
        pool.send([0], [0])
        [result] = pool.recv(1)
        assert not result.done
        pool.send([0], [0])
        started = time.monotonic()
        [result] = pool.recv(1)
        took = time.monotonic() - started
        assert result.info["env_restarted"] is True
        assert result.info["restart_reason"] == REASONS[failure]
        assert (result.terminated, result.truncated, result.first) == (False, True, True)
        assert result.obs["t"] == 0  # the fresh env's reset observation
        if failure == "raise in reset":  # the episode had ended by itself: its last step is kept
            assert result.reward == 1.0 and result.final_obs["t"] == 2
            assert result.episode.length == 2 and not result.episode.restarted
        else:  # the step died with the env: nothing to report but the truncation
            assert result.reward == 0.0 and result.final_obs is None
            assert result.episode.length == 1 and result.episode.restarted
        assert took < STEP_TIMEOUT_S + 10.0
        if failure == "hang in step":
            assert took >= STEP_TIMEOUT_S
        assert pool.restart_counts == [1]
        assert pool.stats()["restarts_by_reason"][REASONS[failure]] == 1
        assert wait_until_gone(old_pids) == [], "the old env and its child must be killed"
        pool.send([0], [0])  # the fresh env works
        [result] = pool.recv(1)
        assert result.obs["t"] == 1 and result.info["pid"] not in old_pids
        new_pids = [result.info["pid"], result.info["child_pid"]]
    finally:
        pool.close()
    assert wait_until_gone(new_pids) == [], "close() must kill every env process group"


def shared_pool(num_envs: int, envs_per_process: int, **env_kwargs) -> EnvPool:
    return EnvPool(functools.partial(ScriptedEnv, **env_kwargs), num_envs, envs_per_process=envs_per_process,
                   step_timeout_s=STEP_TIMEOUT_S, reset_timeout_s=RESET_TIMEOUT_S)


def test_envs_sharing_a_process_answer_per_env_with_the_same_semantics() -> None:
    with shared_pool(4, 2, episode_length=3, end_with="truncated") as pool:
        assert len(pool.process_ids()) == 2 and pool.stats()["env_processes"] == 2
        pool.reset_all(seeds=[10, 11, 12, 13])
        results = sorted(pool.recv(4), key=lambda r: r.env_index)
        assert [r.info["seed"] for r in results] == [10, 11, 12, 13]
        pids = [r.info["pid"] for r in results]
        assert pids[0] == pids[1] != pids[2] == pids[3] and set(pids) == set(pool.process_ids())
        results = step_all(pool, results, action=7)
        assert [(r.obs["t"], r.info["action"], r.first) for r in results] == [(1, 7, False)] * 4
        pool.send([1], [5])  # one env of a process steps while its neighbour waits for its action
        [result] = pool.recv(1)
        assert (result.env_index, result.obs["t"], result.info["action"]) == (1, 2, 5)
        assert pool.idle_env_indices == [0, 1, 2, 3]
        pool.send([0, 2, 3, 1], [0, 0, 0, 0])
        results = sorted(pool.recv(4), key=lambda r: r.env_index)
        assert [r.obs["t"] for r in results] == [2, 0, 2, 2]  # env 1's episode ended: the reset obs
        ended = results[1]
        assert (ended.truncated, ended.first, ended.reward, ended.final_obs["t"]) == (True, True, 1.0, 3)
        assert ended.reset_info["episode"] == ended.info["episode"] + 1 and ended.episode.length == 3
        assert pool.restart_counts == [0, 0, 0, 0]


def test_a_dead_process_restarts_all_its_envs_and_a_waiting_env_loses_its_next_step() -> None:
    pool = shared_pool(2, 2, episode_length=100, fail_in="step", fail_mode="exit", fail_at=2)
    try:
        pool.reset_all()
        results = pool.recv(2)
        old_pid = results[0].info["pid"]
        results = step_all(pool, results)  # each env's first step is fine
        pool.send([0], [0])  # env 0's second step kills the process; env 1 waits for its action
        [lost] = pool.recv(1)
        assert lost.env_index == 0 and lost.info["restart_reason"] == "died"
        assert (lost.truncated, lost.reward, lost.final_obs, lost.obs["t"]) == (True, 0.0, None, 0)
        assert pool.restart_counts == [1, 1]
        assert pool.idle_env_indices == [0, 1]
        # Env 1 acts on an observation of the dead env: the pool answers with a lost step, not the new env.
        pool.send([1], [0])
        [stale] = pool.recv(1)
        assert stale.env_index == 1 and stale.info["env_restarted"] is True and stale.info["restart_reason"] == "died"
        assert (stale.terminated, stale.truncated, stale.first, stale.reward) == (False, True, True, 0.0)
        assert stale.final_obs is None and stale.obs["t"] == 0 and stale.reset_info["pid"] != old_pid
        assert (stale.episode.length, stale.episode.restarted) == (1, True)
        assert wait_until_gone([old_pid]) == []
        results = step_all(pool, [lost, stale])  # the rebuilt envs work, in one new process
        assert [r.obs["t"] for r in results] == [1, 1]
        assert results[0].info["pid"] == results[1].info["pid"] != old_pid
        assert "env_restarted" not in results[0].info
    finally:
        pool.close()


def test_a_failed_reset_keeps_the_finished_steps_of_its_process() -> None:
    """A step request is answered before any reset runs: when env 0's auto-reset raises, both envs' last steps
    (env 1 stepped after env 0) have arrived already, and both episodes end whole, reset by the rebuilt process."""
    pool = shared_pool(2, 2, episode_length=2, end_with="truncated", fail_in="reset", fail_mode="raise", fail_at=2)
    try:
        pool.reset_all()
        results = step_all(pool, pool.recv(2))
        results = step_all(pool, results)  # both end their episode, then env 0's auto-reset raises
        for result in results:
            assert (result.reward, result.final_obs["t"], result.info["restart_reason"]) == (1.0, 2, "exception")
            assert (result.episode.length, result.episode.restarted) == (2, False)
        assert all(r.truncated and r.first and r.obs["t"] == 0 for r in results)
        assert pool.restart_counts == [1, 1]
    finally:
        pool.close()


def test_envs_per_process_is_checked() -> None:
    generator = functools.partial(ScriptedEnv)
    with pytest.raises(ValueError, match=r"envs_per_process: expected an int in \[1, num_envs=2\], got 3"):
        EnvPool(generator, 2, envs_per_process=3)
    with pytest.raises(ValueError, match="restart_interval_s: expected None or 0 when envs_per_process > 1"):
        EnvPool(generator, 2, envs_per_process=2, restart_interval_s=10.0)


def test_generator_that_always_fails_raises_one_clear_error() -> None:
    pool = EnvPool(functools.partial(ScriptedEnv, end_with="never"), 1, step_timeout_s=STEP_TIMEOUT_S,
                   reset_timeout_s=RESET_TIMEOUT_S, max_start_failures=2)
    try:
        pool.reset_all()
        with pytest.raises(EnvPoolError, match="end_with: expected 'terminated' or 'truncated'"):
            pool.recv(1)
        assert pool.restart_counts == [2]
    finally:
        pool.close()


def test_restart_interval_recycles_at_an_episode_boundary() -> None:
    pool = EnvPool(functools.partial(ScriptedEnv, episode_length=3, step_sleep_s=0.05), 1,
                   step_timeout_s=STEP_TIMEOUT_S, reset_timeout_s=RESET_TIMEOUT_S, restart_interval_s=0.05)
    try:
        pool.reset_all()
        [result] = pool.recv(1)
        first_pid = result.info["pid"]
        for t in (1, 2):  # the interval has passed, but recycling waits for the episode to end
            pool.send([0], [0])
            [result] = pool.recv(1)
            assert result.obs["t"] == t and result.info["pid"] == first_pid
        pool.send([0], [0])
        [result] = pool.recv(1)
        assert (result.terminated, result.truncated, result.reward) == (True, False, 1.0)
        assert "env_restarted" not in result.info and result.final_obs["t"] == 3
        assert result.reset_info["pid"] != first_pid
        assert pool.recycle_counts == [1] and pool.restart_counts == [0]
        assert wait_until_gone([first_pid]) == []
    finally:
        pool.close()


def test_record_episode_returns_the_rendered_frames() -> None:
    with scripted_pool(2, episode_length=4) as pool:
        pool.record_episode(1)
        pool.reset_all()
        results = pool.recv(2)
        for _ in range(4):
            results = step_all(pool, results)
        assert results[0].frames is None
        frames = results[1].frames
        assert [int(frame[0, 0, 0]) for frame in frames] == [0, 1, 2, 3, 4]
        results = step_all(pool, results)  # recording stops after one episode
        for _ in range(3):
            results = step_all(pool, results)
        assert results[1].done and results[1].frames is None


def test_crafter_cows_in_env_processes() -> None:
    with EnvPool(env_generator("crafter/cows", seed=3), 2, step_timeout_s=30, reset_timeout_s=60) as pool:
        pool.reset_all()
        results = pool.recv(2)
        pids = pool.process_ids()
        assert len(pids) == 2 and os.getpid() not in pids
        rng = np.random.default_rng(0)
        for _ in range(20):
            pool.send([r.env_index for r in results], list(rng.integers(0, 17, size=len(results))))
            results = pool.recv(1)
            for result in results:
                assert result.obs["image"].shape == (64, 64, 3) and result.obs["image"].dtype == np.uint8
                assert result.info["cows_killed"] >= 0
    assert wait_until_gone(pids) == []


ORPHAN_SCRIPT = """
import functools, os, sys
from craftrl.envs import EnvPool
from craftrl.testing.scripted_env import ScriptedEnv

if __name__ == "__main__":
    pool = EnvPool(functools.partial(ScriptedEnv, fail_in="step", fail_mode="hang", spawn_child=True), 2)
    pool.reset_all()
    results = pool.recv(2)
    pool.send([0], [0])  # env 0 now hangs inside step; env 1 idles
    pids = [pid for r in results for pid in (r.info["pid"], r.info["child_pid"])]
    print(" ".join(map(str, pids)), flush=True)
    {ending}
"""


@pytest.mark.parametrize("ending", ["os._exit(0)", "sys.exit(0)"])
def test_no_env_process_outlives_its_parent(tmp_path, ending: str) -> None:
    """A rollout worker that dies (os._exit) or exits without close() leaves no env or child behind."""
    import subprocess
    import sys

    script = tmp_path / "orphan.py"
    script.write_text(ORPHAN_SCRIPT.format(ending=ending))
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    pids = [int(pid) for pid in result.stdout.split()]
    assert len(pids) == 4, result.stderr
    assert wait_until_gone(pids, within_s=8.0) == []


@pytest.mark.parametrize("envs_per_process", [1, 2])
def test_a_reset_longer_than_step_timeout_but_within_reset_timeout_is_not_killed(envs_per_process) -> None:
    """The reset after an episode is the env's own reply under reset_timeout: 2 s outlives the 0.5 s step
    timeout, and both envs' episodes still end normally, without a restart."""
    pool = EnvPool(functools.partial(ScriptedEnv, episode_length=2, later_reset_sleep_s=2.0), 2,
                   step_timeout_s=0.5, reset_timeout_s=5.0, envs_per_process=envs_per_process)
    try:
        pool.reset_all()
        results = step_all(pool, pool.recv(2))
        started = time.monotonic()
        results = step_all(pool, results)  # the last steps; the resets take 2 s (one after the other when shared)
        assert time.monotonic() - started >= 2.0
        assert all(r.done and r.first and r.obs["t"] == 0 and r.final_obs["t"] == 2 for r in results)
        assert not any(r.info.get("env_restarted") for r in results) and pool.restart_counts == [0, 0]
    finally:
        pool.close()


def test_a_reset_that_outlives_reset_timeout_is_killed_and_the_env_rebuilt() -> None:
    """Reported like any hang: the ended episode's last step is kept, the env is rebuilt (its first reset is
    fast) and the result says why."""
    pool = EnvPool(functools.partial(ScriptedEnv, episode_length=2, later_reset_sleep_s=60.0), 1,
                   step_timeout_s=0.5, reset_timeout_s=4.0)  # room for building the env on a loaded machine
    try:
        pool.reset_all()
        results = step_all(pool, pool.recv(1))
        (result,) = step_all(pool, results)
        assert (result.reward, result.final_obs["t"], result.obs["t"], result.first) == (1.0, 2, 0, True)
        assert result.info["env_restarted"] and result.info["restart_reason"] == "timeout"
        assert pool.stats()["restarts_by_reason"]["timeout"] == 1
    finally:
        pool.close()


@pytest.mark.parametrize("envs_per_process", [1, 2])
def test_a_shared_process_delivers_its_envs_together_while_one_of_them_resets(envs_per_process) -> None:
    """Envs of one process cannot step again before their neighbour's reset is done, so their results wait for
    it and the process's envs keep answering as one group; envs of their own process answer at once."""
    pool = EnvPool(functools.partial(ScriptedEnv, episode_length=2, later_reset_sleep_s=1.0), 2,
                   step_timeout_s=STEP_TIMEOUT_S, reset_timeout_s=RESET_TIMEOUT_S, envs_per_process=envs_per_process)
    try:
        pool.reset_all()
        pool.recv(2)
        pool.send([0], [0])
        pool.recv(1)  # env 0 is now one step ahead of env 1
        pool.send([0, 1], [0, 0])  # env 0 ends its episode and resets for 1 s; env 1 takes its first step
        started = time.monotonic()
        first = pool.recv(1)
        if envs_per_process == 1:
            assert [r.env_index for r in first] == [1] and time.monotonic() - started < 0.9
            first += pool.recv(1)
        else:
            assert sorted(r.env_index for r in first) == [0, 1] and time.monotonic() - started >= 1.0
        by_env = {r.env_index: r for r in first}
        assert by_env[0].done and by_env[0].first and by_env[1].obs["t"] == 1 and not by_env[1].done
    finally:
        pool.close()


MAIN_SCRIPT = """
import os
import sys

if __name__ != "__main__":  # re-run in a child as __mp_main__
    with open(os.environ["CRAFTRL_TEST_MARKER"], "a") as marker:
        marker.write(__name__ + "\\n")


def make_env():  # defined in __main__: the env processes get it by value
    from craftrl.testing.scripted_env import ScriptedEnv

    return ScriptedEnv(episode_length=3)


if __name__ == "__main__":
    from craftrl.envs import EnvPool

    with EnvPool(make_env, 2, envs_per_process=1) as pool:
        pool.reset_all()
        results = pool.recv(2)
        pool.send([r.env_index for r in results], [0, 0])
        print(sorted(int(r.obs["t"]) for r in pool.recv(2)))
"""


def test_env_processes_do_not_rerun_the_parents_main_module(tmp_path) -> None:
    """A Ray worker's ``__main__`` is Ray's; a user's script may train at import: env processes run neither."""
    script, marker = tmp_path / "train_script.py", tmp_path / "imports.txt"
    script.write_text(MAIN_SCRIPT)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "CRAFTRL_TEST_MARKER": str(marker)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[1, 1]"
    assert not marker.exists(), f"the main module ran in env processes: {marker.read_text()!r}"
