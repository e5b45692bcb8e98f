"""The journaled index: a buffer rebuilt after its process died must be the buffer it was, call for call."""
from __future__ import annotations

import pickle
import tempfile
from collections import Counter
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from craftrl.replay.journal import JOURNAL_PREFIX, JournaledIndex
from craftrl.replay.index import ReplayIndex, FragmentMeta

from test_index_properties import limits, ops


def apply(policy, operation, next_index: Counter, counter: list[int]):
    """One operation on a ReplayIndex or a JournaledIndex (same call shapes but for ``add``)."""
    kind = operation[0]
    if kind == "add":
        _, env, step, lag = operation
        next_index[env] += step
        meta = FragmentMeta(counter[0], env, next_index[env], max(0, _version(policy) - lag))
        counter[0] += 1
        return policy.add([meta]) if isinstance(policy, JournaledIndex) else policy.add(meta)
    if kind == "sample":
        return policy.sample(min(operation[1], _settings(policy).max_chunks))
    if kind == "version":
        return policy.update_version(_version(policy) + operation[1])
    if kind == "retire":
        return policy.retire_worker(operation[1])
    return policy.remove_fragments([operation[1] % max(counter[0], 1)], "corrupt")


def _version(policy) -> int:
    return (policy.index if isinstance(policy, JournaledIndex) else policy).version


def _settings(policy):
    return (policy.index if isinstance(policy, JournaledIndex) else policy).settings


def _state(policy: ReplayIndex) -> tuple:
    return policy.accounting(), policy.chunk_ids(), policy.version, policy.fresh_chunk_count()


@settings(max_examples=60, deadline=None)
@given(limits, ops, st.floats(0, 1), st.integers(2, 40), st.booleans())
def test_recovered_index_matches_an_uninterrupted_one(limit_values, operations, cut_fraction, compact_every,
                                                      restart_twice):
    cut = int(len(operations) * cut_fraction)
    reference = ReplayIndex(**limit_values)
    with tempfile.TemporaryDirectory() as directory:
        journaled = JournaledIndex.create(ReplayIndex(**limit_values), directory, compact_every=compact_every)
        ref_index, ref_counter, index, counter = Counter(), [0], Counter(), [0]
        for operation in operations[:cut]:
            expected = apply(reference, operation, ref_index, ref_counter)
            got = apply(journaled, operation, index, counter)
            if operation[0] == "sample":
                assert got == expected
        # The process dies here: no close, no final snapshot. A new one rebuilds from the files alone.
        recovered = JournaledIndex.recover(directory, compact_every=compact_every)
        if restart_twice:
            recovered = JournaledIndex.recover(directory, compact_every=compact_every)
        assert _state(recovered.index) == _state(reference)
        assert recovered.restarts == 1 + restart_twice
        for operation in operations[cut:]:
            expected = apply(reference, operation, ref_index, ref_counter)
            got = apply(recovered, operation, index, counter)
            if operation[0] == "sample":
                assert got == expected, "the rebuilt index samples differently from the original"
        assert _state(recovered.index) == _state(reference)
        assert recovered.accounting()["unaccounted"] == 0
        journals = [p.name for p in Path(directory).iterdir() if p.name.startswith(JOURNAL_PREFIX)]
        assert len(journals) == 1, f"compaction left old journals behind: {journals}"
        recovered.close()


def test_a_repeated_registration_is_counted_once(tmp_path):
    journaled = JournaledIndex.create(ReplayIndex(max_chunks=4), tmp_path)
    meta = FragmentMeta(7, "w0/e0", 0, 0)
    journaled.add([meta])
    journaled.add([meta])  # a retried call whose first answer was lost
    counts = journaled.accounting()
    assert counts["added"] == 1 and counts["duplicate_registrations"] == 1 and counts["removed_out_of_order"] == 0
    recovered = JournaledIndex.recover(tmp_path)
    assert recovered.accounting()["added"] == 1 and recovered.accounting()["duplicate_registrations"] == 1


def test_a_torn_last_entry_is_ignored(tmp_path):
    journaled = JournaledIndex.create(ReplayIndex(max_chunks=4), tmp_path)
    journaled.add([FragmentMeta(1, "w0/e0", 0, 0)])
    journal = next(p for p in tmp_path.iterdir() if p.name.startswith(JOURNAL_PREFIX))
    entry = pickle.dumps(("add", (FragmentMeta(2, "w0/e0", 1, 0),)))
    with journal.open("ab") as file:
        file.write(entry[: len(entry) // 2])  # killed in the middle of an append
    recovered = JournaledIndex.recover(tmp_path)
    assert recovered.accounting()["added"] == 1


JOURNAL_WITH_A_FILE_SIZE_LIMIT = """
import resource, signal, sys
from craftrl.replay.index import ReplayIndex
from craftrl.replay.journal import JournaledIndex
from craftrl.replay.store import ReplayStoreError
journaled = JournaledIndex.create(ReplayIndex(max_chunks=4), sys.argv[1])
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead of killing us
resource.setrlimit(resource.RLIMIT_FSIZE, (2000, 2000))
try:
    for version in range(1, 10_000):
        journaled.update_version(version)
except ReplayStoreError as error:
    print(f"at version {version}: {error}")
"""


def test_a_journal_that_cannot_be_written_is_a_replay_store_error_naming_the_store(tmp_path: Path):
    """What stops a run in one line when the replay store's disk fills (a file size limit fails the writes as a
    full disk does), rather than an OSError from inside the buffer actor."""
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-c", JOURNAL_WITH_A_FILE_SIZE_LIMIT, str(tmp_path)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.startswith("at version "), result.stdout
    assert f"replay store at {tmp_path}: cannot write its journal (File too large); free space on its disk" in \
        result.stdout
