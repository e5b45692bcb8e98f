"""Property tests: random interleavings of add / sample / version bumps / corrupt reports / retired writers against
the rules."""
from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from craftrl.replay.index import REMOVAL_REASONS, ReplayIndex, FragmentMeta

limits = st.fixed_dictionaries({
    "max_chunks": st.integers(1, 6),
    "max_reuse": st.integers(1, 3),
    "max_staleness": st.integers(0, 3),
    "fragments_per_chunk": st.integers(1, 3),
    "read_grace_samples": st.integers(1, 3),
    "fragments_per_report": st.integers(1, 5),
    "seed": st.integers(0, 2**32),
    "max_unsampled_chunks": st.integers(0, 4),
})
# add: env, index step (0 repeats, 1 continues, 2 skips, -1 goes back), versions behind the trainer
add_op = st.tuples(st.just("add"), st.sampled_from("abc"), st.sampled_from([1, 1, 1, 1, 1, 1, 0, 2, -1]),
                   st.sampled_from([0, 0, 0, 0, 1, 2, 4]))
sample_op = st.tuples(st.just("sample"), st.sampled_from([1, 1, 2, 3]))
version_op = st.tuples(st.just("version"), st.sampled_from([0, 1, 1, 2]))
corrupt_op = st.tuples(st.just("corrupt"), st.integers(0, 10**6))
retire_op = st.tuples(st.just("retire"), st.sampled_from("abcd"))  # env ids are their own writer prefixes; d is unused
# Weighted so that buffers fill, samples succeed and chunks age: 16 adds : 8 samples : 4 bumps : 2 corruptions : 1
# retired writer.
op_kinds = {"add": add_op, "sample": sample_op, "version": version_op, "corrupt": corrupt_op, "retire": retire_op}
weighted_kinds = st.sampled_from(["add"] * 16 + ["sample"] * 8 + ["version"] * 4 + ["corrupt"] * 2 + ["retire"])
ops = st.lists(weighted_kinds.flatmap(op_kinds.__getitem__), min_size=30, max_size=150)


def run(limit_values: dict, operations: list) -> list:
    """Apply the operations, checking every invariant after each one; return the samples drawn."""
    policy = ReplayIndex(**limit_values)
    max_chunks, max_reuse = limit_values["max_chunks"], limit_values["max_reuse"]
    max_staleness, per_chunk = limit_values["max_staleness"], limit_values["fragments_per_chunk"]
    grace = limit_values["read_grace_samples"]
    next_index = Counter()
    added_ids: list[int] = []
    times_sampled: Counter = Counter()
    sample_history: list[list] = []  # descriptors of each successful sample call
    deleted: set[int] = set()
    samples = []
    retired: set[str] = set()
    for op in operations:
        before = policy.chunk_ids()
        if op[0] == "add":
            _, env, step, lag = op
            next_index[env] += step
            fragment_id = len(added_ids)
            added_ids.append(fragment_id)
            refused_before = policy.accounting()["removed_from_retired_worker"]
            policy.add(FragmentMeta(fragment_id, env, next_index[env], policy.version - lag))
            after = policy.chunk_ids()
            evicted = [c for c in before if c not in after]
            assert evicted == before[: len(evicted)], "capacity eviction must take the oldest chunks first"
            refused = policy.accounting()["removed_from_retired_worker"] - refused_before
            assert refused == (env in retired), "a retired writer's fragments, and only theirs, are refused"
            assert not refused or after == before
        elif op[0] == "retire":
            policy.retire_worker(op[1])
            retired.add(op[1])
            assert policy.chunk_ids() == before, "retiring a writer keeps what it delivered before"
        elif op[0] == "sample":
            n = min(op[1], max_chunks)
            fresh = policy.fresh_chunk_count()
            descriptors = policy.sample(n)
            assert (descriptors is None) == (fresh < n)
            if descriptors is not None:
                sample_history.append(descriptors)
                samples.append([(d.chunk_id, d.fragment_ids) for d in descriptors])
                assert len({d.chunk_id for d in descriptors}) == n, "no chunk twice in one sample"
                for d in descriptors:
                    times_sampled[d.chunk_id] += 1
                    assert times_sampled[d.chunk_id] == d.use_count <= max_reuse
                    assert d.staleness == policy.version - min(d.versions) <= max_staleness
                    assert len(d.fragment_ids) == per_chunk and len({d.env_id}) == 1
                    assert list(d.indices) == list(range(d.indices[0], d.indices[0] + per_chunk))
        elif op[0] == "version":
            policy.update_version(policy.version + op[1])
        else:
            if added_ids:
                policy.remove_fragments([added_ids[op[1] % len(added_ids)]])
        assert policy.num_chunks <= max_chunks
        unsampled = sum(1 for chunk_id in policy.chunk_ids() if times_sampled[chunk_id] == 0)
        assert policy.unsampled_chunk_count() == unsampled
        pacing = limit_values["max_unsampled_chunks"]
        assert policy.rollout_ahead() == (pacing > 0 and unsampled >= pacing)
        assert policy.chunk_ids() == sorted(policy.chunk_ids()), "chunks stay in admission order"
        counts = policy.accounting()
        assert counts["unaccounted"] == 0
        assert counts["added"] == len(added_ids)
        assert counts["added"] == counts["in_chunks"] + counts["in_open_chunks"] + sum(
            counts[f"removed_{r}"] for r in REMOVAL_REASONS)
        # Nothing still readable by contract is handed out for deletion, and nothing twice.
        freed = policy.take_deletable()
        assert not deleted.intersection(freed) and len(set(freed)) == len(freed)
        deleted.update(freed)
        protected = {i for ds in sample_history[-grace:] for d in ds for i in d.fragment_ids}
        live = {f.fragment_id for c in policy._chunks.values() for f in c.fragments}
        assert not deleted & (protected | live)
    counts = policy.accounting()
    assert len(deleted) + counts["awaiting_delete"] + counts["in_chunks"] + counts["in_open_chunks"] == len(added_ids)
    return samples


@settings(max_examples=300, deadline=None)
@given(limits, ops)
def test_random_operation_sequences_keep_every_invariant(limit_values, operations):
    run(limit_values, operations)


@settings(max_examples=50, deadline=None)
@given(limits, ops)
def test_sampling_is_deterministic_for_a_seed(limit_values, operations):
    assert run(limit_values, operations) == run(limit_values, operations)
