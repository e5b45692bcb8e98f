from __future__ import annotations

import shutil
from collections import namedtuple

import pytest

from craftrl.replay import store as store_module
from craftrl.replay.codec import decode_fragment, encode_fragment
from craftrl.replay.store import (
    MANIFEST, FragmentStore, MissingRecordError, ReplayStoreError, create_store, read_layout,
)


def test_reopening_the_store_returns_identical_bytes(tmp_path, make_fragment):
    layout = create_store(tmp_path / "db", num_shards=3, max_fragments=64, max_fragment_bytes=1 << 16)
    records = {fragment_id: encode_fragment(make_fragment(index=i, seed=i))
               for i, fragment_id in enumerate([5, 6, 7, 2**63 + 11, 0])}
    with FragmentStore(layout) as store:
        for fragment_id, record in records.items():
            store.put(fragment_id, record)
        assert store.count() == len(records)
    with FragmentStore.open(tmp_path / "db") as reopened:
        assert sorted(reopened.ids()) == sorted(records)
        for fragment_id, record in records.items():
            assert reopened.get(fragment_id) == record
        assert decode_fragment(reopened.get(6)).index == 1


def test_delete_and_missing_record(tmp_path):
    layout = create_store(tmp_path, num_shards=2, max_fragments=8, max_fragment_bytes=1024)
    with FragmentStore(layout) as store:
        store.put(1, b"one")
        store.put(2, b"two")
        assert store.delete_many([1, 2, 3]) == 2
        with pytest.raises(MissingRecordError, match="fragment 1 is not in the replay store"):
            store.get(1)


def test_create_clears_an_earlier_store_but_not_foreign_data(tmp_path):
    layout = create_store(tmp_path / "db", num_shards=2, max_fragments=8, max_fragment_bytes=1024)
    with FragmentStore(layout) as store:
        store.put(9, b"old run")
    layout = create_store(tmp_path / "db", num_shards=4, max_fragments=8, max_fragment_bytes=1024)
    assert read_layout(tmp_path / "db").num_shards == 4
    with FragmentStore(layout) as store:
        assert store.count() == 0
    foreign = tmp_path / "photos"
    foreign.mkdir()
    (foreign / "cat.jpg").write_bytes(b"meow")
    with pytest.raises(ReplayStoreError, match="refusing to clear"):
        create_store(foreign, num_shards=1, max_fragments=1, max_fragment_bytes=1)
    assert (foreign / "cat.jpg").exists()


def test_disk_too_small_is_a_clear_error(tmp_path, monkeypatch):
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(store_module.shutil, "disk_usage", lambda _: usage(10 << 30, 9 << 30, 1 << 30))
    with pytest.raises(ReplayStoreError, match="needs 4.69 GiB .*4800 fragments.*max_chunks"):
        create_store(tmp_path, num_shards=2, max_fragments=4800, max_fragment_bytes=1 << 20)
    assert not (tmp_path / MANIFEST).exists()


def test_map_full_is_a_clear_error(tmp_path):
    layout = create_store(tmp_path, num_shards=1, max_fragments=1, max_fragment_bytes=1024)
    with FragmentStore(layout) as store, pytest.raises(ReplayStoreError, match="max_fragment_bytes"):
        for fragment_id in range(1000):
            store.put(fragment_id, bytes(1 << 16))


def test_opening_a_missing_store_names_the_manifest(tmp_path):
    shutil.rmtree(tmp_path)
    with pytest.raises(ReplayStoreError, match=MANIFEST):
        FragmentStore.open(tmp_path)
