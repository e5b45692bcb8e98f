"""The rollout loop with real env processes: every fragment field lines up with what the env did."""

from __future__ import annotations

import functools
import time

import numpy as np
import pytest
import torch

from craftrl.envs.latency import LatencyBoundEnv
from craftrl.policies.checks import PolicyContractError
from craftrl.testing.scripted_env import ScriptedEnv
from craftrl.rollout.cutter import FragmentCutter
from craftrl.testing.counting_policy import CountingPolicy
from craftrl.rollout.loop import RolloutLoop, auto_envs_per_process


def collect(env_generator, *, num_envs=2, batch_size=1, fragment_length=4, fragments=6, policy=None, **kwargs):
    """Step until every env produced ``fragments / num_envs`` fragments (env processes start at different
    speeds on a loaded machine, so a plain total could come from one env alone)."""
    out, episodes = [], []
    loop = RolloutLoop(env_generator, policy or CountingPolicy(), num_envs=num_envs, batch_size=batch_size,
                       fragment_length=fragment_length, emit=out.append, on_episode=episodes.append, **kwargs)
    per_env = -(-fragments // num_envs)
    try:
        while len(by_env(out)) < num_envs or min(len(chain) for chain in by_env(out).values()) < per_env:
            loop.step(timeout=30)
        return out, episodes, loop.stats()
    finally:
        loop.close()


def by_env(fragments):
    grouped = {}
    for fragment in fragments:
        grouped.setdefault(fragment.env_id, []).append(fragment)
    return grouped


CUDA_CASE = pytest.param(4, 2, 2, "cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"))


@pytest.mark.parametrize("num_envs, batch_size, envs_per_process, device",
                         [(2, 1, 1, "cpu"), (4, 2, 2, "cpu"), (4, 1, 2, "cpu"), (4, 2, 0, "cpu"), CUDA_CASE])
def test_fragment_fields_line_up_with_the_scripted_env(num_envs, batch_size, envs_per_process, device):
    """On CUDA the recurrent state lives on the GPU between steps and comes back to numpy per fragment."""
    env = functools.partial(ScriptedEnv, episode_length=5, end_with="terminated")
    fragments, episodes, _ = collect(env, num_envs=num_envs, batch_size=batch_size, fragment_length=4,
                                     fragments=4 * num_envs, envs_per_process=envs_per_process,
                                     policy=CountingPolicy().to(device))
    grouped = by_env(fragments)
    assert len(grouped) == num_envs
    for env_id, chain in grouped.items():
        assert [f.index for f in chain] == list(range(len(chain)))
        t = np.concatenate([f.obs["t"] for f in chain])
        # the scripted env's observation counts steps within an episode of 5 steps: 0 1 2 3 4 0 1 ...
        np.testing.assert_array_equal(t, np.arange(len(t)) % 5)
        first = np.concatenate([f.first for f in chain])
        np.testing.assert_array_equal(first, t == 0)
        terminated = np.concatenate([f.terminated for f in chain])
        np.testing.assert_array_equal(terminated, t == 4)  # the action on obs t=4 ends the episode
        assert not np.concatenate([f.truncated for f in chain]).any()
        np.testing.assert_array_equal(np.concatenate([f.reward for f in chain]), 1.0)
        # the counting policy's value is the steps since the episode began: state carried and reset right
        np.testing.assert_array_equal(np.concatenate([f.value for f in chain]), t)
        for f, following in zip(chain, chain[1:]):
            assert f.next_obs["t"] == following.obs["t"][0]
            assert f.next_first == following.first[0]
        for f in chain:
            f.validate()
            assert f.state_in.shape == (1, 1)
            # stored state_in is the state that entered step 0 (the count of the previous step)
            expected = 0 if f.index == 0 else chain[f.index - 1].value[-1] + 1
            assert f.state_in[0, 0] == expected
            np.testing.assert_allclose(f.logp, np.log(0.5), rtol=1e-6)
            assert (f.version == -1).all()
    assert all(e.episode_return == 5.0 and e.length == 5 for e in episodes)
    assert episodes[0].discounted_return == pytest.approx(sum(0.99 ** k for k in range(5)))


@pytest.mark.parametrize("max_batch_wait", [0.0, 0.002])
def test_envs_of_different_speeds_act_in_groups_of_whoever_answered_and_every_fragment_stays_exact(max_batch_wait):
    """Steps of 1-9 ms, resets of 5-45 ms and episodes of 3-9 steps: envs drift apart and groups form from the
    envs that have answered, in every composition. Each env's chain must still be its own: observations in
    order, ``first`` exactly at episode starts, the recurrent state (the counting policy's steps since the
    episode began) carried across groups and fragments and reset at every episode start."""
    env = functools.partial(LatencyBoundEnv, step_latency_s=0.005, step_jitter=0.8, reset_latency_s=0.025,
                            reset_jitter=0.8, episode_length=6, length_jitter=0.5, obs_shape=(8, 8, 3))
    fragments, episodes, stats = collect(env, num_envs=4, batch_size=4, fragment_length=5, fragments=40,
                                         max_batch_wait=max_batch_wait, seed=3)
    assert stats["forward_passes"] > stats["env_steps"] / 4 * 1.2, "groups of whoever answered, not of all 4"
    for env_id, chain in by_env(fragments).items():
        assert [f.index for f in chain] == list(range(len(chain)))
        t = np.concatenate([f.obs["t"] for f in chain])
        first = np.concatenate([f.first for f in chain])
        truncated = np.concatenate([f.truncated for f in chain])
        np.testing.assert_array_equal(first, t == 0)
        starts = np.flatnonzero(first)
        steps_in_episode = np.arange(len(t)) - starts[np.searchsorted(starts, np.arange(len(t)), side="right") - 1]
        np.testing.assert_array_equal(t, steps_in_episode)  # no step lost, repeated or taken from another env
        np.testing.assert_array_equal(truncated[:-1], first[1:])  # each episode ends right before the next
        np.testing.assert_array_equal(np.concatenate([f.value for f in chain]), t)
        for f in chain:
            f.validate()
            # the state that entered step 0 (the policy itself resets it where first is set)
            assert f.state_in[0, 0] == (0 if f.index == 0 else chain[f.index - 1].value[-1] + 1)
            np.testing.assert_allclose(f.logp, np.log(0.5), rtol=1e-6)
    assert len(episodes) >= 8 and {e.length for e in episodes} <= set(range(3, 10))


@pytest.mark.parametrize("num_envs, batch_size, cores, recycling, expected", [
    (8, 4, 2, False, 4),  # two processes on two cores, each inference group one process
    (8, 4, 3, False, 4),  # 3 per process would split groups: the next divisor of the group size
    (8, 4, 4, False, 2),
    (8, 4, 16, False, 1),  # more cores than envs: every env alone
    (64, 4, 2, False, 32),  # more than a group per process: whole groups
    (5, 5, 2, False, 5),
    (8, 4, 2, True, 1),  # restart_interval recycles single envs
])
def test_auto_envs_per_process_gives_about_one_process_per_core(num_envs, batch_size, cores, recycling, expected):
    assert auto_envs_per_process(num_envs, batch_size, cores, recycling) == expected


def test_truncation_is_kept_apart_and_bootstrapped_with_the_final_observation_value():
    env = functools.partial(ScriptedEnv, episode_length=3, end_with="truncated")
    fragments, _, _ = collect(env, num_envs=1, batch_size=1, fragment_length=6, fragments=2)
    f = fragments[0]
    np.testing.assert_array_equal(f.obs["t"], [0, 1, 2, 0, 1, 2])
    np.testing.assert_array_equal(f.truncated, [False, False, True, False, False, True])
    assert not f.terminated.any()
    # the final observation (t=3) comes after 3 counted steps: value 3 from the carried state
    np.testing.assert_array_equal(f.final_value[[2, 5]], [3.0, 3.0])
    assert np.isnan(f.final_value[[0, 1, 3, 4]]).all()


def test_new_weights_apply_between_forward_passes_and_are_stamped():
    fragments = []
    loop = RolloutLoop(functools.partial(ScriptedEnv, episode_length=50), CountingPolicy(), num_envs=2,
                       batch_size=2, fragment_length=3, emit=fragments.append)
    try:
        for _ in range(3):
            loop.step(timeout=30)
        weights = dict(CountingPolicy().state_dict(), action_scores=torch.tensor([0.0, 50.0]))  # ~always action 1
        loop.set_weights(7, weights)
        for _ in range(9):
            loop.step(timeout=30)
    finally:
        loop.close()
    versions = np.concatenate([f.version for f in fragments])
    assert set(versions.tolist()) == {-1, 7}
    actions = np.concatenate([f.action for f in fragments])
    assert (actions[versions == 7] == 1).all()
    # versions never go back in time within a chain
    for f in fragments:
        assert (np.diff(f.version) >= 0).all()


def test_weights_of_another_network_stop_the_loop_in_one_line_naming_the_tensor():
    """A worker whose policy_generator built another network than the learner's (on a cluster: a setting read from
    the node's environment, docs/cluster.md) neither loads the learner's weights nor acts on."""
    loop = RolloutLoop(functools.partial(ScriptedEnv, episode_length=50), CountingPolicy(), num_envs=2,
                       batch_size=2, fragment_length=3, emit=lambda fragment: None)
    try:
        loop.step(timeout=30)
        loop.set_weights(1, CountingPolicy(num_actions=5).state_dict())
        with pytest.raises(PolicyContractError) as raised:
            for _ in range(3):
                loop.step(timeout=30)
        assert loop.version == -1
    finally:
        loop.close()
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith("policy_generator built another network in this rollout worker than in the learner "
                              "('action_scores' is [5] in the learner's but [2] in this rollout worker's; ")
    assert "node's environment variables and working directory" in message and "docs/cluster.md" in message


def test_env_restart_closes_the_episode_as_truncated():
    env = functools.partial(ScriptedEnv, episode_length=100, fail_in="step", fail_mode="raise", fail_at=3)
    fragments, episodes, stats = collect(env, num_envs=1, batch_size=1, fragment_length=4, fragments=2)
    steps = np.concatenate([f.truncated for f in fragments])
    assert steps[2], "the step whose env raised must close the episode as truncated"
    assert stats["restarts"] >= 1
    assert episodes[0].env_restarted
    assert fragments[0].final_value[2] == fragments[0].value[2]  # no final obs: fall back to V(o_t)


def test_cutter_refuses_out_of_order_events():
    cutter = FragmentCutter("e", 2)
    with pytest.raises(RuntimeError, match="end_step without a pending action"):
        cutter.end_step(0.0, False, False)
    cutter.begin_step({"x": np.zeros(1)}, True, 0, 0.0, 0.0, 0, state_in=None)
    with pytest.raises(RuntimeError, match="before the previous step's env result"):
        cutter.begin_step({"x": np.zeros(1)}, False, 0, 0.0, 0.0, 0, state_in=None)


def test_while_one_env_resets_for_seconds_the_others_of_its_worker_keep_stepping():
    """batch_size == num_envs, as in MineStudio's examples: an env in a 1.5 s reset must not hold the group.
    Every reset here takes 1.5 s and episodes 1-3 s (steps of 5 ms); for each reset, the other envs that were
    playing throughout it must have kept stepping (hundreds of steps each; the test asks for 20)."""
    reset_s = 1.5
    env = functools.partial(LatencyBoundEnv, step_latency_s=0.005, step_jitter=0.0, reset_latency_s=reset_s,
                            reset_jitter=0.0, episode_length=400, length_jitter=0.5, obs_shape=(8, 8, 3))
    loop = RolloutLoop(env, CountingPolicy(), num_envs=4, batch_size=4, fragment_length=8, emit=lambda f: None,
                       seed=1)
    arrivals = []  # (time, env_index, ended an episode): an episode's end arrives with the reset that followed it
    receive = loop.pool.recv

    def logged_recv(*args, **kwargs):
        results = receive(*args, **kwargs)
        arrivals.extend((time.monotonic(), r.env_index, r.done) for r in results)
        return results

    loop.pool.recv = logged_recv
    try:
        deadline = time.monotonic() + 15.0
        while time.monotonic() < deadline:
            loop.step(timeout=1.0)
        stopped = time.monotonic()
    finally:
        loop.close()
    resets = [(at - reset_s, at, env_index) for at, env_index, done in arrivals if done]
    checked = 0
    # a reset is known only when it ends: windows close enough to the stop that another env's reset begun within
    # them may still have been running (unrecorded) at the stop are not judged
    for start, end, env_index in [r for r in resets if r[1] + reset_s + 0.5 < stopped]:
        playing = {other for other in range(4) if other != env_index} - {
            other for other_start, other_end, other in resets if other_start < end and other_end > start}
        for other in playing:
            steps = sum(1 for at, who, _ in arrivals if who == other and start < at < end)
            assert steps >= 20, f"env {env_index}'s reset held env {other}: {steps} steps in its {reset_s} s"
            checked += 1
    assert checked >= 3, (checked, resets)


def test_the_preflight_probe_tells_an_env_that_waits_from_one_that_computes():
    """Measured steps in the preflight's env process: the synthetic Minecraft-timed env sleeps 20 ms and gets
    one env per process; Crafter computes its step and keeps sharing processes."""
    from craftrl.cli.preflight import EnvProbe
    from craftrl.cli.train import _with_envs_per_process
    from craftrl.cli.preflight import Probe
    from craftrl.config import build_config
    from craftrl.envs import env_generator
    from craftrl.rollout.loop import waits_more_than_computes

    measured = {}
    for name, kwargs in (("synthetic/latency", dict(step_latency_s=0.02, step_jitter=0.0, reset_latency_s=0.0)),
                         ("crafter/cows", {})):
        with EnvProbe(env_generator(name, **kwargs), seed=0, reset_timeout=60, step_timeout=60) as env:
            declared = env.wait_for_reset().task_metrics
            measured[name] = env.steps([0, 1, 2])
        assert declared == {"synthetic/latency": (), "crafter/cows": ("cows_killed",)}[name]  # for the progress line
    assert waits_more_than_computes(*measured["synthetic/latency"]), measured
    assert not waits_more_than_computes(*measured["crafter/cows"]), measured

    auto = build_config({"rollout_config": {"worker_config": {"envs_per_process": 0}}})
    waiting, computing = Probe(1, *measured["synthetic/latency"]), Probe(1, *measured["crafter/cows"])
    assert _with_envs_per_process(auto, waiting).rollout_config.worker_config.envs_per_process == 1
    assert _with_envs_per_process(auto, computing) is auto
    chosen = build_config({"rollout_config": {"worker_config": {"envs_per_process": 2, "num_envs": 4}}})
    assert _with_envs_per_process(chosen, waiting) is chosen


def step_until(loop, done, budget_s=60.0):
    deadline = time.monotonic() + budget_s
    while not done():
        assert time.monotonic() < deadline, "the loop did not get there in time"
        loop.step(timeout=1.0)


def step_idle(loop, times: int) -> None:
    """``times`` short steps, in which a loop whose envs all wait for a new version must not act."""
    for _ in range(times):
        loop.step(timeout=0.2)


def test_synchronous_sampling_cuts_each_envs_share_with_one_version_then_waits_for_the_next():
    fragments = []
    loop = RolloutLoop(functools.partial(ScriptedEnv, episode_length=5), CountingPolicy(), num_envs=3, batch_size=2,
                       fragment_length=3, emit=fragments.append, fragments_per_version=2)
    try:
        step_idle(loop, 3)  # no version yet: nothing acts
        assert loop.stats()["env_steps"] == 0 and not fragments
        loop.set_weights(0, CountingPolicy().state_dict())
        step_until(loop, lambda: len(fragments) == 6)
        step_idle(loop, 5)  # each env has cut its 2 fragments: the loop waits for weights, not for envs
        assert len(fragments) == 6 and loop.stats()["env_steps"] == 18
        assert loop.stats()["weights_wait_s"] >= 0.8
        loop.set_weights(1, dict(CountingPolicy().state_dict(), action_scores=torch.tensor([0.0, 50.0])))
        step_until(loop, lambda: len(fragments) == 12)
        step_idle(loop, 3)
    finally:
        loop.close()
    assert len(fragments) == 12
    for env_id, chain in by_env(fragments).items():
        assert [f.index for f in chain] == [0, 1, 2, 3], env_id
        assert [set(f.version.tolist()) for f in chain] == [{0}, {0}, {1}, {1}]
        assert (np.concatenate([f.action for f in chain[2:]]) == 1).all()
        t = np.concatenate([f.obs["t"] for f in chain])
        np.testing.assert_array_equal(t, np.arange(12) % 5)  # no step lost or repeated across the wait
        np.testing.assert_array_equal(np.concatenate([f.value for f in chain]), t)  # state carried across it
        for f, following in zip(chain, chain[1:]):
            assert f.next_obs["t"] == following.obs["t"][0]
            assert following.state_in[0, 0] == f.value[-1] + 1  # the state that entered its first step


def test_a_larger_share_releases_the_held_envs_for_more_fragments_of_the_same_version():
    """What the manager does while a rollout worker is missing: the envs that cut their share and wait cut more of
    this version at once; a smaller share again holds them after what they have cut."""
    fragments = []
    loop = RolloutLoop(functools.partial(ScriptedEnv, episode_length=5), CountingPolicy(), num_envs=2, batch_size=2,
                       fragment_length=3, emit=fragments.append, fragments_per_version=1)
    try:
        loop.set_weights(0, CountingPolicy().state_dict())
        step_until(loop, lambda: len(fragments) == 2)
        step_idle(loop, 3)
        assert len(fragments) == 2
        loop.set_fragments_per_version(3)
        step_until(loop, lambda: len(fragments) == 6)
        loop.set_fragments_per_version(1)
        step_idle(loop, 5)
        assert len(fragments) == 6 and loop.stats()["env_steps"] == 18
        loop.set_weights(1, CountingPolicy().state_dict())
        step_until(loop, lambda: len(fragments) == 8)
        step_idle(loop, 3)
    finally:
        loop.close()
    assert len(fragments) == 8
    for env_id, chain in by_env(fragments).items():
        assert [f.index for f in chain] == [0, 1, 2, 3], env_id
        assert [set(f.version.tolist()) for f in chain] == [{0}, {0}, {0}, {1}]
        np.testing.assert_array_equal(np.concatenate([f.obs["t"] for f in chain]), np.arange(12) % 5)
    with pytest.raises(ValueError, match="set_fragments_per_version"):
        loop.set_fragments_per_version(0)


def test_the_cutter_closes_a_complete_fragment_without_the_next_action():
    cutter = FragmentCutter("e", 2)
    obs = [{"x": np.full(1, k)} for k in range(3)]
    assert cutter.close_if_full(obs[0], False) is None
    for k in range(2):
        cutter.begin_step(obs[k], k == 0, 0, 0.0, 0.0, 0, state_in=None)
        assert cutter.close_if_full(obs[k + 1], False) is None  # the step's env result is still outstanding
        cutter.end_step(1.0, False, False)
    fragment = cutter.close_if_full(obs[2], False)
    assert fragment is not None and fragment.next_obs["x"][0] == 2 and fragment.length == 2
    assert cutter.begin_step(obs[2], False, 0, 0.0, 0.0, 1, state_in=None) is None  # already closed
    assert cutter.num_steps == 1 and cutter.next_index == 1
