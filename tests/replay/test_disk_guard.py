"""The replay store's disk check: projected from the encoded sizes written, first after 64 fragments and again
at each doubling; at start only the first fragments' room is asked for."""
from __future__ import annotations

import subprocess
import uuid

import pytest

from craftrl.replay.disk_guard import FIRST_CHECK_AFTER, STORE_OVERHEAD, DiskGuard, store_disk_bytes
from craftrl.replay.store import FragmentStore, create_store

MIB = 1 << 20


def _guard(free: int, used: int = 0, live: int = 1000) -> DiskGuard:
    return DiskGuard("/runs/replay_buffer", live, free_bytes=lambda: free, used_bytes=lambda: used)


def test_the_full_store_is_projected_from_the_mean_encoded_size_once_enough_fragments_are_written():
    # 1000 live fragments of a mean 1 MiB need 1000 * 1.1 MiB; 1100 MiB fit exactly, 1099 do not
    fits = _guard(free=1000 * MIB, used=100 * MIB)
    fits.written([MIB // 2, 3 * MIB // 2] * (FIRST_CHECK_AFTER // 2))
    assert fits.fragments == FIRST_CHECK_AFTER and fits.error is None
    short = _guard(free=1000 * MIB, used=99 * MIB)
    short.written([MIB] * (FIRST_CHECK_AFTER - 1))
    assert short.error is None, "no projection before the first check"
    short.written([MIB])
    assert short.error is not None
    assert "1.1 GiB when full (1000 fragments of 1.00 MiB, the mean encoded size of the 64 written so far)" \
        in short.error and "1.1 GiB for it" in short.error and "max_chunks" in short.error
    assert STORE_OVERHEAD == 1.1


def test_checks_come_again_at_each_doubling_so_a_mean_that_grows_is_caught():
    checks = []
    guard = _guard(free=10 * 1000 * MIB)
    guard.check = lambda: checks.append(guard.fragments)  # type: ignore[method-assign]
    for _ in range(600):
        guard.written([MIB])
    assert checks == [64, 128, 256, 512]
    growing = _guard(free=1200 * MIB)
    growing.written([MIB // 2] * 64)  # projects 550 MiB: fits
    growing.written([4 * MIB] * 63)
    assert growing.error is None, "the next check is at 128 fragments"
    growing.written([4 * MIB])
    assert growing.error is not None and "2.25 MiB" in growing.error


def test_store_disk_bytes_counts_allocated_blocks_of_the_sparse_map(tmp_path):
    layout = create_store(tmp_path / "db", num_shards=2, max_fragments=10_000, max_fragment_bytes=4 * MIB)
    empty = store_disk_bytes(layout.path)
    assert empty < MIB, "the 80 GB map takes no disk"
    with FragmentStore(layout) as store:
        for fragment_id in range(20):
            store.put(fragment_id, bytes(range(256)) * 1024)  # 256 KiB each
    written = store_disk_bytes(layout.path) - empty
    assert 20 * 256 * 1024 <= written <= 20 * 256 * 1024 * STORE_OVERHEAD


@pytest.fixture
def small_disk(tmp_path):
    """A 4 MiB tmpfs: a real disk that a buffer configured for thousands of fragments cannot fill."""
    mount = tmp_path / "small"
    mount.mkdir()
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)], capture_output=True,
                            text=True)
    if result.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {result.stderr.strip()[:120]}")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


@pytest.mark.ray
def test_a_buffer_whose_full_store_would_not_fit_stops_the_trainer_with_one_line(ray_session, small_disk,
                                                                                make_fragment):
    from craftrl.replay.actor import start_replay_buffer
    from craftrl.replay.client import ReplayWriter
    from craftrl.replay.config import BufferSettings, StoreSettings
    from craftrl.replay.store import ReplayStoreError

    ray = ray_session
    outcomes = {}
    for max_chunks in (8, 2000):  # 24 live fragments fit on 4 MiB; 6000 of the same size do not
        settings = BufferSettings(max_chunks=max_chunks, max_reuse=1, max_staleness=100, fragments_per_report=1000,
                                  store=StoreSettings(path=str(small_disk / f"db{max_chunks}"), num_shards=1,
                                                      max_fragment_bytes=32 * 1024))
        name = f"replay-{uuid.uuid4().hex[:8]}"
        buffer = start_replay_buffer(settings, name=name)
        writer = ReplayWriter(ray.get_actor(name))
        for index in range(FIRST_CHECK_AFTER // 2):
            writer.add_fragments([make_fragment(env_id=env, index=index, seed=index) for env in ("a", "b")])
        writer.flush()
        try:
            ray.get(buffer.sample_chunks.remote(1, timeout_s=5))
            outcomes[max_chunks] = "sampled"
        except ReplayStoreError as error:
            outcomes[max_chunks] = str(error)
        writer.close()
        ray.kill(buffer)
    assert outcomes[8] == "sampled"
    assert "6000 fragments of" in outcomes[2000] and "the mean encoded size of the 64 written so far" \
        in outcomes[2000] and "lower replay_buffer_config.max_chunks" in outcomes[2000], outcomes


def test_the_cli_reports_a_store_error_raised_in_the_buffer_actor_as_one_line():
    from ray.exceptions import RayTaskError

    from craftrl.cli.train import _run_failure
    from craftrl.replay.store import ReplayStoreError

    cause = ReplayStoreError("replay store at /x will need about 9.0 GiB when full")
    raised = RayTaskError("ReplayBufferActor.sample_chunks", "Traceback (most recent call last):\n  ...", cause)
    wrapped = RuntimeError("training failed")
    wrapped.__cause__ = raised.as_instanceof_cause()
    assert _run_failure(wrapped) == "replay: replay store at /x will need about 9.0 GiB when full"
    text_only = RuntimeError("Training failed:\n  File ...\ncraftrl.replay.store.ReplayStoreError: disk short\nmore")
    assert _run_failure(text_only) == "replay: disk short"
    assert _run_failure(ValueError("something else")) is None
