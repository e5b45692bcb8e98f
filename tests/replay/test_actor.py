"""The buffer as a named Ray actor with a writer and reader actors: one end-to-end pass, kept short."""
from __future__ import annotations

import uuid

import pytest

from craftrl.replay.actor import start_replay_buffer
from craftrl.replay.client import ReplayWriter
from craftrl.replay.codec import encode_fragment
from craftrl.replay.index import FragmentMeta
from craftrl.replay.config import BufferSettings, StoreSettings
from craftrl.replay.reader import ReaderPool
from craftrl.replay.store import FragmentStore

pytestmark = pytest.mark.ray


def test_write_sample_read_version_and_corruption_through_the_actor(ray_session, tmp_path, make_fragment):
    ray = ray_session
    settings = BufferSettings(max_chunks=4, max_reuse=2, max_staleness=1, fragments_per_chunk=2,
                              fragments_per_report=3, read_grace_samples=1,
                              store=StoreSettings(path=str(tmp_path / "db"), num_shards=2,
                                                  max_fragment_bytes=1 << 16))
    name = f"replay-{uuid.uuid4().hex[:8]}"
    buffer = start_replay_buffer(settings, name=name)
    with pytest.raises(ValueError, match="already exists"):
        start_replay_buffer(settings, name=name)

    with pytest.raises(TimeoutError, match="only 0 fresh chunks"):
        ray.get(buffer.sample_chunks.remote(1, timeout_s=0.2))

    writer = ReplayWriter(ray.get_actor(name))
    originals = {}
    for env in ("a", "b", "c"):
        for index in range(2):
            fragment = make_fragment(env_id=env, index=index, seed=len(originals))
            originals[(env, index)] = encode_fragment(fragment)
            writer.add_fragment(fragment)
    writer.flush()
    assert ray.get(buffer.latest_report.remote())["replay/added"] == 6

    descriptors = ray.get(buffer.sample_chunks.remote(3, timeout_s=5))
    pool = ReaderPool(buffer, num_readers=2, num_cpus_per_reader=0, prefetch_batches=1)
    results = list(pool.read(descriptors))
    assert [r.descriptor for r in results] == descriptors  # in order
    for result in results:
        assert result.ok, result.error
        for index, fragment in zip(result.descriptor.indices, result.fragments):
            assert (fragment.env_id, fragment.index) == (result.descriptor.env_id, index)
            assert encode_fragment(fragment) == originals[(fragment.env_id, index)]

    # Damage one record of a live chunk: its read fails clearly, the buffer drops it, the rest carries on.
    layout = ray.get(buffer.layout.remote())
    victim = descriptors[0]
    with FragmentStore(layout) as store:
        store.put(victim.fragment_ids[1], b"CRFR garbage")
    (damaged,) = list(pool.read([victim]))
    assert not damaged.ok and "bad magic" not in damaged.error and "fragment" in damaged.error
    counts = ray.get(buffer.accounting.remote())
    assert counts["removed_corrupt"] == 2 and pool.failed_reads == 1
    remaining = ray.get(buffer.sample_chunks.remote(2, timeout_s=5))
    assert victim.chunk_id not in {d.chunk_id for d in remaining}

    ray.get(buffer.update_version.remote(3))  # everything is now more than max_staleness=1 behind
    ray.get(buffer.flush_deletes.remote())
    counts = ray.get(buffer.accounting.remote())
    assert counts["in_chunks"] == 0 and counts["unaccounted"] == 0
    assert counts["store_records"] == counts["awaiting_delete"]
    assert counts["added"] == sum(counts[k] for k in counts if k.startswith("removed_"))
    pool.close()
    writer.close()
    ray.kill(buffer)


def _small_buffer(tmp_path) -> tuple[str, object]:
    """A buffer of 8 chunks of one fragment each, used once, under a name of its own; returns (name, handle)."""
    settings = BufferSettings(max_chunks=8, max_reuse=1, max_staleness=4, fragments_per_report=100,
                              store=StoreSettings(path=str(tmp_path / "db"), num_shards=2,
                                                  max_fragment_bytes=1 << 16))
    name = f"replay-{uuid.uuid4().hex[:8]}"
    return name, start_replay_buffer(settings, name=name)


def test_a_batch_of_fragments_is_registered_in_one_call_in_its_order(ray_session, tmp_path, make_fragment):
    """Consecutive fragments of one env in one batch must all be accepted: the buffer refuses an index that
    arrives after a later one of the same env, so a batch registered out of order would lose fragments."""
    ray = ray_session
    name, buffer = _small_buffer(tmp_path)
    writer = ReplayWriter(ray.get_actor(name))
    calls = []
    handle_method = writer._buffer.add_fragments

    class CountingMethod:
        def remote(self, metas):
            calls.append([(m.env_id, m.index) for m in metas])
            return handle_method.remote(metas)

    writer._buffer = type("Handle", (), {"add_fragments": CountingMethod()})()
    fragments = [make_fragment(env_id=env, index=index, seed=index) for index in range(3) for env in ("a", "b")]
    metas = writer.add_fragments(fragments)
    writer.flush()
    assert calls == [[(f.env_id, f.index) for f in fragments]]
    assert [(m.env_id, m.index) for m in metas] == calls[0]
    counts = ray.get(buffer.accounting.remote())
    assert counts["added"] == 6 and counts["in_chunks"] == 6, counts
    writer.close()
    ray.kill(buffer)


def test_num_readers_zero_reads_in_the_trainer_process_only_on_the_buffers_node(ray_session, tmp_path, caplog):
    import logging
    from types import SimpleNamespace

    from craftrl.train.trainer import reader_actors

    ray = ray_session
    settings = BufferSettings(max_chunks=4, store=StoreSettings(path=str(tmp_path / "db"), num_shards=1,
                                                                max_fragment_bytes=1 << 16))
    buffer = start_replay_buffer(settings, name=f"replay-{uuid.uuid4().hex[:8]}")
    try:
        assert ray.get(buffer.node_id.remote()) == ray.get_runtime_context().get_node_id()
        assert reader_actors(0, buffer) == 0, "same node: read in this process"
        assert reader_actors(3, buffer) == 3
    finally:
        ray.kill(buffer)
    # a buffer on another node (a simulated cluster is tests/reliability/test_multinode.py's business)
    elsewhere = SimpleNamespace(node_id=SimpleNamespace(remote=lambda: ray.put("f" * 56)))
    with caplog.at_level(logging.WARNING, logger="craftrl.train.trainer"):
        assert reader_actors(0, elsewhere) == 1
    assert "reading through 1 reader actor" in caplog.text


def test_a_writer_off_the_stores_node_sends_its_records_through_the_actor(ray_session, tmp_path, make_fragment):
    """The path of a rollout worker on another node: no LMDB handle in the writer, the buffer actor stores the
    records it is sent and registers them; a retried call stores and counts nothing twice."""
    ray = ray_session
    name, buffer = _small_buffer(tmp_path)
    layout = ray.get(buffer.layout.remote())
    assert layout.node_id == ray.get_runtime_context().get_node_id()
    local = ReplayWriter(ray.get_actor(name))
    assert local.direct, "a writer on the store's node writes LMDB itself"
    writer = ReplayWriter(ray.get_actor(name), direct=False)
    assert writer._store is None
    fragments = [make_fragment(env_id=env, index=index, seed=index) for index in range(2) for env in ("a", "b")]
    metas = writer.add_fragments(fragments)
    writer.flush()
    ray.get(buffer.write_fragments.remote(metas, [encode_fragment(f, layout.compression_level) for f in fragments]))
    counts = ray.get(buffer.accounting.remote())
    assert counts["added"] == 4 and counts["in_chunks"] == 4 and counts["store_records"] == 4, counts
    assert ray.get(buffer.metrics.remote())["replay/duplicate_registrations"] == 4.0
    descriptors = ray.get(buffer.sample_chunks.remote(4, timeout_s=5))
    read = {(f.env_id, f.index): f for result in ReaderPool(buffer, num_readers=0).read(descriptors)
            for f in result.fragments}
    for fragment in fragments:
        assert encode_fragment(read[(fragment.env_id, fragment.index)]) == encode_fragment(fragment)
    writer.close()
    local.close()
    ray.kill(buffer)


def test_paced_writers_wait_for_the_trainer_and_are_released_at_stop(ray_session, tmp_path):
    """max_unsampled_chunks 2: a fragment is taken only while fewer than 2 chunks await their first sample, and a
    call is answered once all of its fragments are taken; a sample, a version update that leaves chunks stale, or
    release_workers lets held calls go on."""
    ray = ray_session
    settings = BufferSettings(max_chunks=8, max_reuse=1, max_staleness=1, max_unsampled_chunks=2,
                              store=StoreSettings(path=str(tmp_path / "db"), num_shards=1, max_fragment_bytes=1 << 16))
    buffer = start_replay_buffer(settings, name=f"replay-{uuid.uuid4().hex[:8]}")

    def register(*fragments: tuple[int, str], version: int = 0):
        return buffer.add_fragments.remote([FragmentMeta(fid, env, 0, version) for fid, env in fragments])

    def answered(call, within: float) -> bool:
        return bool(ray.wait([call], timeout=within)[0])

    def unsampled() -> int:
        return int(ray.get(buffer.metrics.remote())["replay/unsampled_chunks"])

    held = register((1, "a"), (2, "b"), (3, "c"))
    assert not answered(held, 0.5)
    assert unsampled() == 2  # the third fragment waits: the buffer never holds more than 2 unsampled chunks
    assert len(ray.get(buffer.sample_chunks.remote(2, timeout_s=5))) == 2
    assert answered(held, 5.0) and unsampled() == 1

    assert answered(register((4, "d")), 5.0)
    held = register((5, "e"))
    assert not answered(held, 0.5)
    ray.get(buffer.update_version.remote(2))  # both unsampled chunks are now stale
    assert answered(held, 5.0) and unsampled() == 0  # "e" was stale on arrival

    assert answered(register((6, "f"), (7, "g"), version=2), 5.0)
    held = register((8, "h"), version=2)
    assert not answered(held, 0.5)
    ray.get(buffer.release_workers.remote())
    assert answered(held, 5.0)
    assert answered(register((9, "i"), version=2), 5.0)  # released for good
    metrics = ray.get(buffer.metrics.remote())
    assert metrics["replay/unsampled_chunks"] == 4 and metrics["replay/worker_wait_s"] >= 1.5
    counts = ray.get(buffer.accounting.remote())
    assert counts["added"] == 9 and counts["unaccounted"] == 0
    ray.kill(buffer)
