"""Weight publishing without Ray's actors: a worker that is behind loads only the newest version."""
from __future__ import annotations

import threading
import time

import pytest
import torch

from craftrl.weights import (SHARD_BYTES, NewestWeights, TensorPiece, WeightPublisher, bytes_in, publishable,
                             pull_retry_advice, received, shard_size, sharded)

SMALL_SHARD_BYTES = 4096  # splits the test policies' larger tensors into pieces


def test_a_busy_loader_skips_every_superseded_version_and_never_goes_back():
    applied: list[int] = []
    loading, release = threading.Event(), threading.Event()

    def apply(version, state_dict):
        assert float(state_dict["w"]) == version
        loading.set()
        release.wait(5)  # the first load is slow: versions 2-5 arrive meanwhile
        applied.append(version)

    weights = NewestWeights(apply)
    try:
        weights.offer(1, [{"w": torch.tensor(1.0)}])
        assert loading.wait(5)
        for version in (2, 3, 5, 4):  # 4 comes after 5: older than what is waiting, so ignored
            weights.offer(version, [{"w": torch.tensor(float(version))}])
        release.set()
        assert weights.wait_for(5, timeout=5)
        weights.offer(3, [{"w": torch.tensor(3.0)}])  # older than what is applied: ignored
        weights.offer(6, [{"w": torch.tensor(6.0)}])
        assert weights.wait_for(6, timeout=5)
    finally:
        weights.close()
    assert applied == [1, 5, 6] and weights.fetches == 3 and weights.error is None


def test_offer_returns_while_a_load_is_in_progress_and_a_failed_load_keeps_the_last_weights():
    started, release = threading.Event(), threading.Event()
    applied: list[int] = []

    def apply(version, state_dict):
        if version == 2:
            raise ValueError("shape mismatch")
        started.set()
        release.wait(5)
        applied.append(version)

    weights = NewestWeights(apply)
    try:
        weights.offer(1, [{}])
        assert started.wait(5)
        weights.offer(2, [{}])  # returns although the loader is busy
        release.set()
        assert weights.wait_for(1, timeout=5)
        assert not weights.wait_for(2, timeout=0.5)
    finally:
        weights.close()
    assert applied == [1] and weights.applied_version == 1
    assert weights.error == "loading weights version 2: ValueError: shape mismatch"


class Gate:
    """Holds a value back until told: an object that is not in the object store yet."""

    def __init__(self):
        self.open = threading.Event()

    def value_when_open(self, value):
        self.open.wait()
        return value

    def release(self):
        self.open.set()


def test_a_newer_version_fetched_beside_a_stuck_fetch_overtakes_it(ray_session):
    """Ray pulls an object from any node with a copy, and waits out a 10-s timeout on a node cut off from the
    network before it tries another: meanwhile the worker must not wait, acting with old weights, when a newer
    version is there to fetch."""
    ray = ray_session
    gate = ray.remote(max_concurrency=2)(Gate).remote()
    late = gate.value_when_open.remote({"w": torch.tensor(1.0)})
    applied: list[tuple[int, float]] = []
    weights = NewestWeights(lambda version, state_dict: applied.append((version, float(state_dict["w"]))))
    try:
        weights.offer(0, [ray.put({"w": torch.tensor(0.0)})])
        assert weights.wait_for(0, timeout=30)  # a first fetch shows how long one takes
        weights.offer(1, [late])
        time.sleep(1.0)  # the loader has taken version 1 and waits for its object
        weights.offer(2, [ray.put({"w": torch.tensor(2.0)})])
        assert weights.wait_for(2, timeout=30)
        assert not ray.wait([late], timeout=0)[0], "version 2 was applied while version 1 was still on its way"
    finally:
        weights.close()
        ray.kill(gate)
    assert applied == [(0, 0.0), (2, 2.0)] and weights.fetches == 2 and weights.fetches_overtaken == 1


def test_an_overdue_fetch_that_arrives_first_is_applied_and_then_the_newer_one_beside_it(ray_session):
    """Over a slow link the overdue fetch is the one nearer its end: it is not given up for the newer version."""
    ray = ray_session
    first, second = (ray.remote(max_concurrency=2)(Gate).remote() for _ in range(2))
    applied: list[int] = []
    weights = NewestWeights(lambda version, state_dict: applied.append(version))
    try:
        weights.offer(0, [ray.put({"w": torch.tensor(0.0)})])
        assert weights.wait_for(0, timeout=30)
        weights.offer(1, [first.value_when_open.remote({"w": torch.tensor(1.0)})])
        time.sleep(1.0)  # version 1 is overdue
        weights.offer(2, [second.value_when_open.remote({"w": torch.tensor(2.0)})])
        time.sleep(1.0)  # version 2 is on its way beside it
        ray.get(first.release.remote())
        assert weights.wait_for(1, timeout=30)
        ray.get(second.release.remote())
        assert weights.wait_for(2, timeout=30)
    finally:
        weights.close()
        for gate in (first, second):
            ray.kill(gate)
    assert applied == [0, 1, 2] and weights.fetches_overtaken == 0


def test_a_first_fetch_is_waited_for_alone(ray_session):
    """Until one fetch has shown how long a fetch takes, a slow first one is not joined by a second, which would
    share a slow link with it."""
    ray = ray_session
    gate = ray.remote(max_concurrency=2)(Gate).remote()
    applied: list[int] = []
    weights = NewestWeights(lambda version, state_dict: applied.append(version))
    try:
        weights.offer(1, [gate.value_when_open.remote({"w": torch.tensor(1.0)})])
        time.sleep(1.0)  # the loader has taken version 1 and waits for its object
        weights.offer(2, [ray.put({"w": torch.tensor(2.0)})])
        time.sleep(1.5)
        assert applied == [], "version 2 was fetched beside the first fetch"
        ray.get(gate.release.remote())
        assert weights.wait_for(2, timeout=30)
    finally:
        weights.close()
        ray.kill(gate)
    assert applied == [1, 2] and weights.fetches_overtaken == 0


class SlowLink:
    """Hands each value over a fixed time after it was asked for: every version takes that long to arrive."""

    def value_after(self, value, seconds: float):
        time.sleep(seconds)
        return value


def test_a_worker_whose_every_fetch_is_slower_than_the_learner_still_loads_one_version_after_another(ray_session):
    """Behind a slow link each version takes longer to arrive than the learner takes to publish the next. A loader
    that gave up every fetch still on its way for the newer version would load none while publishing goes on."""
    ray = ray_session
    link = ray.remote(max_concurrency=64)(SlowLink).remote()
    ray.get(link.value_after.remote(None, 0))  # the actor has started: every value takes 2.5 s from now on
    applied: list[int] = []
    weights = NewestWeights(lambda version, state_dict: applied.append(version))
    try:
        version = 0
        deadline = time.monotonic() + 12.0
        while time.monotonic() < deadline and len(applied) < 2:
            version += 1
            weights.offer(version, [link.value_after.remote({"w": torch.tensor(float(version))}, 2.5)])
            time.sleep(0.6)
    finally:
        weights.close()
        ray.kill(link)
    assert len(applied) >= 2 and applied == sorted(applied), (applied, version)
    assert weights.fetches_overtaken == 0, "no fetch was left on its way: each arrived and was applied"


def _round_trip(state_dict: dict, half_precision: frozenset[str] = frozenset()) -> dict:
    """What a worker loads of ``state_dict`` published in shards small enough to split tensors into pieces."""
    return received(sharded(publishable(state_dict, half_precision), SMALL_SHARD_BYTES))


def test_shards_hold_at_most_their_bytes_and_join_into_the_exact_tensors():
    state_dict = {"small": torch.randn(3, 5), "large": torch.randn(2, 700), "steps": torch.arange(7),
                  "half": torch.randn(900).bfloat16(), "scalar": torch.tensor(2.0), "empty": torch.zeros(0, 4)}
    for shard_bytes in (64, 1000, 4096, 1 << 20):
        shards = sharded(publishable(state_dict), shard_bytes)
        assert all(0 < bytes_in(shard) <= 2 * shard_bytes for shard in shards if shard.keys() - {"empty"})
        joined = received(shards)
        assert joined.keys() == state_dict.keys()
        for name, tensor in state_dict.items():
            assert joined[name].dtype == tensor.dtype and torch.equal(joined[name], tensor), (shard_bytes, name)
    assert len(sharded(publishable(state_dict), 1000)) == 8  # 5.6 kB of "large" alone needs 6 of them
    assert len(sharded(publishable(state_dict), 1 << 20)) == 1
    assert shard_size(16 << 20) == SHARD_BYTES and shard_size(1 << 30) == 64 << 20  # 16 shards of a VPT-2x version
    travels_whole = sharded(publishable(state_dict), 3000)  # "large" is less than twice that
    assert any(set(shard) == {"large"} and not isinstance(shard["large"], TensorPiece) for shard in travels_whole)


def test_a_version_is_applied_only_when_its_every_shard_has_arrived(ray_session):
    """A version whose last shard is still on its way is neither applied nor waited for in ``ray.get``: a newer
    version that arrives whole meanwhile is applied."""
    ray = ray_session
    gate = ray.remote(max_concurrency=2)(Gate).remote()
    publisher = WeightPublisher(None, shard_bytes=SMALL_SHARD_BYTES)
    versions = {version: {"first": torch.full((1000,), float(version)), "second": torch.randn(1000),
                          "third": torch.randn(3000)} for version in range(3)}
    applied: list[tuple[int, dict]] = []
    weights = NewestWeights(lambda version, arrived: applied.append((version, dict(arrived))))
    try:
        publisher.publish(0, versions[0])
        weights.offer(0, publisher.latest[1])
        assert len(publisher.latest[1]) == 5  # 4 kB, then 4 kB and the start of the 12 kB, whose rest fills 3 more
        assert weights.wait_for(0, timeout=30)
        publisher.publish(1, versions[1])
        *first_shards, last_shard = publisher.latest[1]
        weights.offer(1, [*first_shards, gate.value_when_open.remote(ray.get(last_shard))])
        time.sleep(1.5)  # version 1 is overdue
        assert [version for version, _ in applied] == [0], "version 1 was applied before its last shard arrived"
        publisher.publish(2, versions[2])
        weights.offer(2, publisher.latest[1])
        assert weights.wait_for(2, timeout=30), "the loader waited for version 1's last shard"
    finally:
        ray.get(gate.release.remote())
        weights.close()
        ray.kill(gate)
    assert [version for version, _ in applied] == [0, 2] and weights.fetches_overtaken == 1
    for version, arrived in applied:
        assert all(torch.equal(arrived[name], tensor) for name, tensor in versions[version].items())


def _log_prob_change(policy, half_names: set[str], image_shape, batch: int, time: int) -> float:
    """Largest change of the log-probs of sampled actions when ``policy`` loads its own weights as published
    with ``half_names`` in float16."""
    import copy

    loaded = copy.deepcopy(policy)
    loaded.load_state_dict(_round_trip(policy.state_dict(), frozenset(half_names)))
    generator = torch.Generator().manual_seed(0)
    images = {"image": torch.randint(0, 256, (batch, time, *image_shape), dtype=torch.uint8, generator=generator)}
    first = torch.zeros(batch, time, dtype=torch.bool)
    first[:, 0] = True
    with torch.no_grad():
        exact, _ = policy(input=images, state_in=policy.initial_state(batch), first=first)
        rounded, _ = loaded(input=images, state_in=loaded.initial_state(batch), first=first)
        torch.manual_seed(1)
        actions = policy.pi_head.sample(exact["pi_logits"])
        change = (policy.pi_head.logprob(actions, exact["pi_logits"])
                  - policy.pi_head.logprob(actions, rounded["pi_logits"]))
    return float(change.abs().max())


def test_half_precision_weights_publish_parameters_as_float16_and_keep_buffers():
    from craftrl.policies import default_policy_generator

    policy = default_policy_generator(encoder="tiles", channels=(16, 16), hidden_size=128, recurrent="lstm")
    parameters = {name for name, _ in policy.named_parameters()}
    sent = _round_trip(policy.state_dict(), frozenset(parameters))
    assert all(sent[name].dtype == torch.float16 for name in parameters)
    buffers = set(sent) - parameters
    assert buffers and all(sent[name].dtype == policy.state_dict()[name].dtype for name in buffers)
    assert all(value.dtype == torch.float32 for value in _round_trip(policy.state_dict()).values()
               if value.is_floating_point())


def test_half_precision_weights_move_the_rollouts_log_probs_less_than_the_stated_tolerance():
    """The default config's policy with a peaked action head (as a trained one has) and a small VPT."""
    from craftrl.policies import default_policy_generator
    from craftrl.policies.vpt import vpt_tiny
    from craftrl.weights import HALF_PRECISION_LOGP_TOLERANCE

    torch.manual_seed(0)
    default = default_policy_generator(encoder="tiles", channels=(16, 16), hidden_size=128, recurrent="lstm").eval()
    with torch.no_grad():
        default.pi_head.linear_layer.weight.mul_(100.0)
    vpt = vpt_tiny().eval()
    for policy, shape, batch, steps in ((default, (64, 64, 3), 8, 16), (vpt, (128, 128, 3), 4, 8)):
        names = {name for name, _ in policy.named_parameters()}
        change = _log_prob_change(policy, names, shape, batch, steps)
        assert 0 < change <= HALF_PRECISION_LOGP_TOLERANCE, change


def test_a_shard_slower_than_rays_pull_timeout_calls_for_the_head_setting_that_stops_the_resends():
    assert pull_retry_advice({"rollout/weights_shard_s_max": 9.9}, pull_timeout_ms=10_000) is None
    assert pull_retry_advice({"rollout/weights_shard_s_max": 14.0}, pull_timeout_ms=60_000) is None
    assert pull_retry_advice({"replay/added": 5.0}, pull_timeout_ms=10_000) is None  # another component's record
    assert pull_retry_advice({"rollout/weights_fetch_s_max": 40.0, "rollout/weights_shard_s_max": 2.0},
                             pull_timeout_ms=10_000) is None, "a slow version in quick shards is not resent"
    line = pull_retry_advice({"rollout/weights_shard_s_max": 14.1}, pull_timeout_ms=10_000)
    assert line is not None and "14.1 s" in line and "(10000 ms)" in line
    assert "--system-config '{\"object_manager_pull_timeout_ms\": 60000}'" in line


@pytest.mark.ray
def test_the_pull_timeout_read_is_the_one_the_ray_instance_was_started_with():
    import subprocess
    import sys

    program = ("import ray\n"
               "from craftrl.weights import ray_pull_timeout_ms\n"
               "ray.init(num_cpus=1, include_dashboard=False,\n"
               "         _system_config={'object_manager_pull_timeout_ms': 43210})\n"
               "print(ray_pull_timeout_ms())\n")
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[-1] == "43210"
