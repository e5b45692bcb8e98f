from __future__ import annotations

import math

import numpy as np
import pytest

from craftrl.replay.codec import CorruptRecordError, decode_fragment, encode_fragment


def assert_same_tree(a, b, path="fragment"):
    assert type(a) is type(b), f"{path}: {type(a).__name__} != {type(b).__name__}"
    if isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape, path
        np.testing.assert_array_equal(a, b, err_msg=path)  # NaNs compare equal here
    elif isinstance(a, dict):
        assert list(a) == list(b), path
        for key in a:
            assert_same_tree(a[key], b[key], f"{path}.{key}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same_tree(x, y, f"{path}[{i}]")
    elif isinstance(a, float) and math.isnan(a):
        assert math.isnan(b), path
    elif isinstance(a, float):
        assert a.hex() == b.hex(), path  # keeps -0.0 apart from 0.0
    else:
        assert a == b, path


def assert_same_fragment(a, b):
    for name in vars(a):
        assert_same_tree(getattr(a, name), getattr(b, name), name)


def test_round_trip_keeps_every_field_type_and_value(make_fragment):
    fragment = make_fragment(length=12)
    decoded = decode_fragment(encode_fragment(fragment))
    assert_same_fragment(fragment, decoded)
    decoded.validate()
    decoded.obs["image"][0, 0, 0, 0] += 1  # decoded arrays are writable
    assert decoded.info["slot"] == slice(1, 4)  # odd objects go through the pickle fallback


def test_array_action_non_contiguous_and_zero_sized_arrays_round_trip(make_fragment):
    fragment = make_fragment(length=6)
    fragment.action = np.asfortranarray(np.arange(12, dtype=np.int64).reshape(6, 2))
    fragment.obs["empty"] = np.zeros((6, 0), np.float32)
    fragment.obs["strided"] = np.arange(24, dtype=np.uint16).reshape(6, 4)[:, ::2]
    decoded = decode_fragment(encode_fragment(fragment))
    assert_same_fragment(fragment, decoded)


def test_zero_dimensional_arrays_keep_their_shape(make_fragment):
    fragment = make_fragment(length=4)
    fragment.next_obs["t"] = np.asarray(np.int64(7))  # a scalar observation entry
    fragment.state_in = [np.asarray(np.float32(0.5))]
    decoded = decode_fragment(encode_fragment(fragment))
    assert decoded.next_obs["t"].shape == () and decoded.state_in[0].shape == ()
    assert_same_fragment(fragment, decoded)


def test_game_frames_compress(make_fragment):
    fragment = make_fragment(length=64, image_size=32)
    fragment.obs["image"][:] = fragment.obs["image"][:1]  # a static scene: frames repeat
    assert len(encode_fragment(fragment)) < 0.1 * fragment.raw_nbytes()


@pytest.mark.parametrize("damage", ["flip", "truncate", "magic", "empty"])
def test_damaged_record_raises_a_clear_error(make_fragment, damage):
    record = bytearray(encode_fragment(make_fragment()))
    if damage == "flip":
        record[len(record) // 2] ^= 0x40
    elif damage == "truncate":
        record = record[: len(record) - 7]
    elif damage == "magic":
        record[:4] = b"XXXX"
    else:
        record = bytearray()
    with pytest.raises(CorruptRecordError):
        decode_fragment(bytes(record))


def test_rejects_non_fragment():
    with pytest.raises(TypeError, match="expected a Fragment"):
        encode_fragment({"obs": 1})
