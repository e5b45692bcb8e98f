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
    # the start asks for room for the fragments written before the full store is projected from their sizes
    create_store(tmp_path / "fits", num_shards=2, max_fragments=4800, max_fragment_bytes=16 << 20)
    with pytest.raises(ReplayStoreError, match="needs 1.06 GiB free to start .64 fragments x 17.00 MiB "
                                                "max_fragment_bytes. but the disk has 1.00 GiB free"):
        create_store(tmp_path / "short", num_shards=2, max_fragments=4800, max_fragment_bytes=17 << 20)
    assert not (tmp_path / "short" / MANIFEST).exists()


def test_map_full_is_a_clear_error(tmp_path):
    layout = create_store(tmp_path, num_shards=1, max_fragments=1, max_fragment_bytes=1024)
    with FragmentStore(layout) as store, pytest.raises(ReplayStoreError, match="max_fragment_bytes"):
        for fragment_id in range(1000):
            store.put(fragment_id, bytes(1 << 16))


def test_opening_a_missing_store_names_the_manifest(tmp_path):
    shutil.rmtree(tmp_path)
    with pytest.raises(ReplayStoreError, match=MANIFEST):
        FragmentStore.open(tmp_path)


MOUNTS = """\
/dev/vda1 / ext4 rw,relatime 0 0
server:/export /mnt/shared nfs4 rw,relatime 0 0
tmpfs /mnt/shared/scratch tmpfs rw 0 0
//host/share /mnt/my\\040share cifs rw 0 0
"""


@pytest.mark.parametrize("path, expected", [("/mnt/shared/runs/db", "nfs4"), ("/mnt/shared", "nfs4"),
                                            ("/mnt/shared/scratch/db", None), ("/home/me/runs", None),
                                            ("/mnt/sharedness/db", None), ("/mnt/my share/db", "cifs")])
def test_network_file_systems_are_recognised_by_the_mount_under_the_path(path, expected):
    assert store_module.network_filesystem(path, MOUNTS) == expected


def test_a_store_on_a_network_file_system_is_refused_naming_the_key(tmp_path, monkeypatch):
    monkeypatch.setattr(store_module, "network_filesystem", lambda path: "nfs4")
    with pytest.raises(ReplayStoreError, match=r"^database_config.path .* is on a network file system \(nfs4\)"):
        create_store(tmp_path / "db", num_shards=1, max_fragments=4, max_fragment_bytes=1024)


def test_the_store_records_its_node_and_refuses_processes_on_other_nodes(tmp_path, monkeypatch):
    layout = create_store(tmp_path / "db", num_shards=1, max_fragments=4, max_fragment_bytes=1024,
                          node_id="a" * 56)
    assert read_layout(tmp_path / "db").node_id == "a" * 56
    monkeypatch.setattr(store_module, "current_node_id", lambda: "a" * 56)
    FragmentStore(layout).close()
    monkeypatch.setattr(store_module, "current_node_id", lambda: None)  # outside Ray: tools and tests open it
    FragmentStore(layout).close()
    monkeypatch.setattr(store_module, "current_node_id", lambda: "b" * 56)
    with pytest.raises(ReplayStoreError, match=r"^database_config.path .*: the replay store is on Ray node aaaaaaaa, "
                                               r"and this process runs on node bbbbbbbb"):
        FragmentStore(layout)


def test_put_new_stores_each_record_once_and_keeps_what_is_there(tmp_path):
    layout = create_store(tmp_path / "db", num_shards=2, max_fragments=8, max_fragment_bytes=1024)
    with FragmentStore(layout) as store:
        assert store.put_new([(1, b"one"), (2, b"two"), (3, b"three")]) == 3
        assert store.put_new([(2, b"two"), (4, b"four")]) == 1  # a retried call repeats 2
        assert store.put_new([(1, b"other")]) == 0
        assert [store.get(i) for i in (1, 2, 3, 4)] == [b"one", b"two", b"three", b"four"]
