"""Reading chunks from the store without Ray, including a corrupted record the buffer must survive."""
from __future__ import annotations

from craftrl.replay.codec import encode_fragment
from craftrl.replay.index import ReplayIndex, FragmentMeta
from craftrl.replay.reader import ChunkReader, ReaderPool
from craftrl.replay.store import FragmentStore, create_store


def test_corrupted_record_is_reported_clearly_and_the_buffer_carries_on(tmp_path, make_fragment):
    layout = create_store(tmp_path, num_shards=2, max_fragments=16, max_fragment_bytes=1 << 16)
    store = FragmentStore(layout)
    policy = ReplayIndex(max_chunks=8, max_reuse=10, fragments_per_chunk=2)
    originals = {}
    for env in ("a", "b", "c"):
        for index in range(2):
            fragment = make_fragment(env_id=env, index=index, seed=len(originals))
            fragment_id = 100 + len(originals)
            originals[fragment_id] = encode_fragment(fragment)
            store.put(fragment_id, originals[fragment_id])
            policy.add(FragmentMeta(fragment_id, env, index, fragment.min_version))
    damaged = bytearray(originals[103])
    damaged[-20] ^= 0xFF
    store.put(103, bytes(damaged))

    reader = ChunkReader(layout)
    results = {r.descriptor.env_id: r for r in map(reader.read, policy.sample(3))}
    assert not results["b"].ok and results["b"].bad_fragment_id == 103
    assert "fragment 103" in results["b"].error and "checksum mismatch" in results["b"].error
    for env in ("a", "c"):
        assert results[env].ok
        assert [f.index for f in results[env].fragments] == [0, 1]
        for fragment_id, fragment in zip(results[env].descriptor.fragment_ids, results[env].fragments):
            assert encode_fragment(fragment) == originals[fragment_id]  # lossless through the store

    assert policy.remove_fragments([results["b"].bad_fragment_id]) == 2
    for _ in range(5):
        assert {d.env_id for d in policy.sample(2)} == {"a", "c"}
    assert policy.accounting()["unaccounted"] == 0

    store.delete_many([100])
    missing = reader.read(next(d for d in policy.sample(2) if d.env_id == "a"))
    assert not missing.ok and "not in the replay store" in missing.error
    reader.close()
    store.close()


def test_prefetch_batches_keeps_that_many_batches_of_reads_ahead_of_the_one_consumed(tmp_path, make_fragment):
    """MineStudio's ``prefetch_batches``: the batch being read plus this many more in flight, whatever the number of
    readers; with ROCKET-3's batch of 1 fragment and 4 ahead, 5 reads wait while the first is consumed."""
    layout = create_store(tmp_path, num_shards=1, max_fragments=64, max_fragment_bytes=1 << 16)
    store = FragmentStore(layout)
    policy = ReplayIndex(max_chunks=64, max_reuse=1, fragments_per_chunk=1)
    for index in range(40):
        store.put(index, encode_fragment(make_fragment(env_id="a", index=index, seed=index)))
        policy.add(FragmentMeta(index, "a", index, 0))
    descriptors = policy.sample(40)
    for prefetch_batches, chunks_per_batch in ((4, 1), (2, 8), (0, 3)):
        pool = ReaderPool(buffer=None, num_readers=0, prefetch_batches=prefetch_batches,
                          chunks_per_batch=chunks_per_batch, layout=layout)
        submitted = []
        read_one = pool._submit
        pool._submit = lambda position, descriptor: submitted.append(position) or read_one(position, descriptor)
        results = pool.read(descriptors)
        next(results)
        # the window of (1 + prefetch_batches) batches was full when the first result was taken; one more refills it
        assert len(submitted) == (1 + prefetch_batches) * chunks_per_batch + 1
        assert [r.descriptor for r in [*results]] == descriptors[1:]
        pool.close()
    store.close()
