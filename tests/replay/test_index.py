from __future__ import annotations

import pytest

from craftrl.replay.index import ReplayIndex, FragmentMeta


def meta(fragment_id: int, env_id: str = "e0", index: int | None = None, version: int = 0) -> FragmentMeta:
    return FragmentMeta(fragment_id, env_id, fragment_id if index is None else index, version)


def test_stale_chunk_behind_a_fresh_head_is_never_sampled():
    policy = ReplayIndex(max_chunks=10, max_reuse=5, max_staleness=1)
    policy.update_version(5)
    policy.add(meta(0, "fast", version=5))  # head of the queue, fresh
    policy.add(meta(1, "slow", version=4))  # admitted later, older policy
    policy._version = 6  # the trainer moved on without telling (no pruning ran): the sample-time check must hold
    assert policy.sample(2) is None
    (only,) = policy.sample(1)
    assert only.env_id == "fast" and only.staleness == 1
    assert policy.accounting()["removed_stale"] == 1


def test_chunks_group_consecutive_fragments_of_one_env_and_gaps_break_them():
    policy = ReplayIndex(max_chunks=10, fragments_per_chunk=3)
    for fragment_id, (env, index) in enumerate([("a", 0), ("b", 0), ("a", 1), ("a", 3), ("a", 4), ("b", 1),
                                                ("a", 5), ("b", 2)]):
        policy.add(meta(fragment_id, env, index))
    descriptors = sorted(policy.sample(2), key=lambda d: d.env_id)
    assert [(d.env_id, d.indices) for d in descriptors] == [("a", (3, 4, 5)), ("b", (0, 1, 2))]
    assert descriptors[0].fragment_ids == (3, 4, 6)
    counts = policy.accounting()
    assert counts["removed_gap"] == 2 and counts["in_chunks"] == 6 and counts["unaccounted"] == 0


def test_chunk_retires_after_max_reuse_and_its_records_wait_for_the_read_grace():
    policy = ReplayIndex(max_chunks=4, max_reuse=2, read_grace_samples=2)
    policy.add(meta(0))
    policy.add(meta(1))
    first = policy.sample(2)
    assert {d.use_count for d in first} == {1}
    assert policy.sample(2) is not None and policy.num_chunks == 0
    assert policy.accounting()["removed_reuse"] == 2
    assert policy.take_deletable() == []  # still readable: sampled by the last call
    policy.add(meta(2))
    policy.add(meta(3))
    policy.sample(1)
    assert policy.take_deletable() == []
    policy.sample(1)
    assert sorted(policy.take_deletable()) == [0, 1]


def test_capacity_evicts_oldest_first_and_unsampled_records_go_at_once():
    policy = ReplayIndex(max_chunks=2)
    for i in range(4):
        policy.add(meta(i, f"e{i}", 0))
    assert policy.chunk_ids() == [2, 3]
    assert policy.accounting()["removed_capacity"] == 2
    assert sorted(policy.take_deletable()) == [0, 1]


def test_stale_and_repeated_fragments_are_refused_on_arrival():
    policy = ReplayIndex(max_chunks=4, max_staleness=2)
    policy.update_version(10)
    policy.add(meta(0, index=0, version=7))
    policy.add(meta(1, index=1, version=8))
    policy.add(meta(2, index=1, version=8))
    counts = policy.accounting()
    assert (counts["removed_stale_on_arrival"], counts["removed_out_of_order"], counts["in_chunks"]) == (1, 1, 1)


def test_a_retired_worker_is_refused_from_then_on_and_what_it_delivered_before_stays():
    policy = ReplayIndex(max_chunks=8)
    policy.add(meta(0, "w1-a1.ab/env0", 0))
    policy.retire_worker("w1-a1.")
    policy.add(meta(1, "w1-a1.ab/env0", 1))  # the replaced worker delivers late
    policy.add(meta(2, "w1-a1.ab/env1", 0))
    policy.add(meta(3, "w1-c2.cd/env0", 0))  # its replacement
    policy.add(meta(4, "w1-a10.ef/env0", 0))  # another writer whose name merely begins alike
    counts = policy.accounting()
    assert (counts["removed_from_retired_worker"], counts["in_chunks"], counts["unaccounted"]) == (2, 3, 0)
    assert sorted(policy.take_deletable()) == [1, 2]
    with pytest.raises(ValueError, match="retire_worker: expected a non-empty env id prefix"):
        policy.retire_worker("")


def test_reports_are_due_every_fragments_per_report_and_metrics_are_named():
    policy = ReplayIndex(max_chunks=4, fragments_per_report=3)
    due = [policy.add(meta(i, f"e{i}", 0)) for i in range(7)]
    assert due == [False, False, True, False, False, True, False]
    policy.sample(2)
    metrics = policy.metrics()
    for name in ("replay/size_chunks", "replay/trainer_version", "replay/added", "replay/removed_capacity",
                 "replay/removed_reuse", "replay/sampled_staleness_mean", "replay/sampled_use_count_mean",
                 "replay/unaccounted"):
        assert name in metrics, name
    assert metrics["replay/size_chunks"] == 4 and metrics["replay/removed_capacity"] == 3
    assert "replay/sampled_staleness_mean" not in policy.metrics()  # the window restarts after a report


def test_corrupt_fragment_evicts_its_chunk_once():
    policy = ReplayIndex(max_chunks=4, fragments_per_chunk=2)
    for i in range(4):
        policy.add(meta(i))
    assert policy.remove_fragments([1]) == 2
    assert policy.remove_fragments([0, 1]) == 0
    assert policy.accounting()["removed_corrupt"] == 2 and policy.num_chunks == 1


def test_same_seed_same_samples_other_seed_other_samples():
    def draw(seed):
        policy = ReplayIndex(max_chunks=50, max_reuse=3, seed=seed)
        for i in range(50):
            policy.add(meta(i, f"e{i}", 0))
        return [d.chunk_id for _ in range(3) for d in policy.sample(10)]

    assert draw(1) == draw(1)
    assert draw(1) != draw(2)


def test_rollout_is_ahead_while_max_unsampled_chunks_await_a_first_sample():
    policy = ReplayIndex(max_chunks=8, max_reuse=2, max_staleness=1, max_unsampled_chunks=2)
    policy.add(meta(0, "a", 0))
    assert policy.unsampled_chunk_count() == 1 and not policy.rollout_ahead()
    policy.add(meta(1, "b", 0))
    assert policy.rollout_ahead()
    policy.sample(1)  # one of them trained on once: it no longer counts, though it may be sampled again
    assert policy.unsampled_chunk_count() == 1 and not policy.rollout_ahead()
    policy.add(meta(2, "c", 0))
    assert policy.rollout_ahead()
    policy.update_version(2)  # everything stale: nothing is ahead any more
    assert policy.unsampled_chunk_count() == 0 and not policy.rollout_ahead()
    assert policy.metrics()["replay/unsampled_chunks"] == 0


def test_without_max_unsampled_chunks_the_rollout_is_never_ahead():
    policy = ReplayIndex(max_chunks=8)
    for i in range(8):
        policy.add(meta(i, f"e{i}", 0))
    assert policy.unsampled_chunk_count() == 8 and not policy.rollout_ahead()


@pytest.mark.parametrize("bad", [{"max_chunks": 0}, {"max_chunks": 2, "max_reuse": 0},
                                 {"max_chunks": 2, "max_staleness": -1}, {"max_chunks": 2.5},
                                 {"max_chunks": 2, "max_unsampled_chunks": -1}])
def test_bad_limits_name_the_key(bad):
    with pytest.raises(ValueError, match="expected an int >="):
        ReplayIndex(**bad)


def test_bad_calls_raise_clear_errors():
    policy = ReplayIndex(max_chunks=3)
    policy.update_version(2)
    with pytest.raises(ValueError, match="current version 2"):
        policy.update_version(1)
    with pytest.raises(ValueError, match="n_chunks <= max_chunks=3"):
        policy.sample(4)
    with pytest.raises(TypeError, match="FragmentMeta"):
        policy.add({"fragment_id": 1})
