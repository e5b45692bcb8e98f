"""Lossless, compressed byte encoding of a :class:`Fragment`.

Why not pickle: a pickle names classes by import path and runs arbitrary code on load, so a half-written or
bit-flipped record could do anything. This format is a checksummed zstd frame holding a JSON description of
the fragment's tree (dicts, lists, tuples, scalars) and one blob with every array's bytes. Only values that
are neither arrays nor plain scalars (rare objects in ``info``) fall back to pickle, inside the checksum.

Record layout::

    b"CRFR" | format u8 | 3 reserved bytes | crc32(body) u32 | decompressed size u64 | body (zstd frame)
    body, decompressed: header size u32 | header JSON | zero padding to 16 | array blob (each array 16-aligned)

Game frames compress well because consecutive frames share most tiles (bench/results/replay.md has the ratio),
which is why no per-array transform (frame deltas, planar layout) is applied: neither beat zstd alone
(bench/notes/code_figures.md).
"""

from __future__ import annotations

import dataclasses
import json
import pickle
import struct
import zlib
from typing import Any

import numpy as np
import zstandard

from craftrl.rollout.fragment import Fragment

MAGIC = b"CRFR"
FORMAT_VERSION = 2
_PREFIX = struct.Struct("<4sB3xIQ")
_HEADER_SIZE = struct.Struct("<I")
_ALIGN = 16
_FIELD_NAMES = tuple(f.name for f in dataclasses.fields(Fragment))


class CorruptRecordError(ValueError):
    """A stored record cannot be decoded: truncated, bit-flipped, or not a fragment record at all."""


def encode_fragment(fragment: Fragment, level: int = 3) -> bytes:
    """Serialise every field of ``fragment`` into one compressed, checksummed record."""
    if not isinstance(fragment, Fragment):
        raise TypeError(f"encode_fragment: expected a Fragment, got {type(fragment).__name__}")
    arrays: list[np.ndarray] = []
    tree = {name: _encode_node(getattr(fragment, name), arrays, name) for name in _FIELD_NAMES}
    specs = []
    offset = 0
    for array in arrays:
        offset = _aligned(offset)
        specs.append([array.dtype.str, list(array.shape), offset])
        offset += array.nbytes
    header = json.dumps({"tree": tree, "arrays": specs}, separators=(",", ":")).encode()
    blob_start = _aligned(_HEADER_SIZE.size + len(header))
    body = bytearray(blob_start + offset)
    _HEADER_SIZE.pack_into(body, 0, len(header))
    body[_HEADER_SIZE.size:_HEADER_SIZE.size + len(header)] = header
    for array, (_, _, array_offset) in zip(arrays, specs):
        start = blob_start + array_offset
        body[start:start + array.nbytes] = array.reshape(-1).view(np.uint8).data if array.nbytes else b""
    compressed = _compressor(level).compress(body)
    return _PREFIX.pack(MAGIC, FORMAT_VERSION, zlib.crc32(compressed), len(body)) + compressed


def decode_fragment(record: bytes | memoryview) -> Fragment:
    """Rebuild the fragment; raise :class:`CorruptRecordError` naming what is wrong with a bad record."""
    record = memoryview(record)
    if len(record) < _PREFIX.size:
        raise CorruptRecordError(f"record of {len(record)} bytes is shorter than its {_PREFIX.size}-byte prefix")
    magic, version, crc, size = _PREFIX.unpack_from(record, 0)
    if magic != MAGIC:
        raise CorruptRecordError(f"bad magic {bytes(magic)!r}, expected {MAGIC!r}")
    if version != FORMAT_VERSION:
        raise CorruptRecordError(f"record format {version}, this reader understands {FORMAT_VERSION}")
    compressed = record[_PREFIX.size:]
    if zlib.crc32(compressed) != crc:
        raise CorruptRecordError("checksum mismatch: the record was modified or truncated")
    try:
        body = bytearray(zstandard.ZstdDecompressor().decompress(compressed, max_output_size=size))
        (header_size,) = _HEADER_SIZE.unpack_from(body, 0)
        header = json.loads(bytes(body[_HEADER_SIZE.size:_HEADER_SIZE.size + header_size]))
        blob_start = _aligned(_HEADER_SIZE.size + header_size)
        arrays = [_array_view(body, blob_start, spec) for spec in header["arrays"]]
        fields = {name: _decode_node(node, arrays) for name, node in header["tree"].items()}
        return Fragment(**fields)
    except CorruptRecordError:
        raise
    except Exception as error:  # a checksummed record that still fails to parse is corrupt all the same
        raise CorruptRecordError(f"cannot decode record: {type(error).__name__}: {error}") from error


def _aligned(offset: int) -> int:
    return -(-offset // _ALIGN) * _ALIGN


# One compressor per level for the whole process: only one thread per process encodes (a rollout worker's sender).
# A ZstdCompressor used by two threads at once can crash the process; threads that encode need one each.
_COMPRESSORS: dict[int, zstandard.ZstdCompressor] = {}


def _compressor(level: int) -> zstandard.ZstdCompressor:
    if level not in _COMPRESSORS:
        _COMPRESSORS[level] = zstandard.ZstdCompressor(level=level, write_checksum=True, write_content_size=True)
    return _COMPRESSORS[level]


def _plain_array(value: Any) -> bool:
    return type(value) is np.ndarray and not value.dtype.hasobject and value.dtype.fields is None


def _encode_node(value: Any, arrays: list[np.ndarray], path: str) -> Any:
    """JSON for one tree node; arrays (and pickled odd values) are appended to ``arrays``."""
    if value is None or type(value) in (bool, int, str):
        return value
    if type(value) is float:
        return {"f": value.hex()}
    if _plain_array(value):
        # not np.ascontiguousarray: it turns 0-d arrays (scalar observations) into shape (1,)
        arrays.append(value if value.flags.c_contiguous else value.copy(order="C"))
        return {"a": len(arrays) - 1}
    if isinstance(value, np.generic) and _plain_array(np.asarray(value)):
        arrays.append(np.asarray(value).reshape(()))
        return {"g": len(arrays) - 1}
    if type(value) is bytes:
        arrays.append(np.frombuffer(value, dtype=np.uint8))
        return {"y": len(arrays) - 1}
    if type(value) is dict:
        return {"d": [[_encode_node(k, arrays, path), _encode_node(v, arrays, f"{path}.{k}")]
                      for k, v in value.items()]}
    if type(value) is list:
        return {"l": [_encode_node(v, arrays, f"{path}[{i}]") for i, v in enumerate(value)]}
    if type(value) is tuple:
        return {"t": [_encode_node(v, arrays, f"{path}[{i}]") for i, v in enumerate(value)]}
    try:
        pickled = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as error:
        raise TypeError(f"fragment.{path}: cannot serialise a {type(value).__name__}: {error}") from error
    arrays.append(np.frombuffer(pickled, dtype=np.uint8))
    return {"p": len(arrays) - 1}


def _array_view(body: bytearray, blob_start: int, spec: list) -> np.ndarray:
    dtype_str, shape, offset = spec
    dtype = np.dtype(dtype_str)
    count = int(np.prod(shape, dtype=np.int64))
    start = blob_start + offset
    if start + count * dtype.itemsize > len(body):
        raise CorruptRecordError(f"array of shape {shape} runs past the end of the record")
    # A view into the record's own writable buffer: no copy, and the caller may modify it in place.
    return np.frombuffer(body, dtype=dtype, count=count, offset=start).reshape(shape)


def _decode_node(node: Any, arrays: list[np.ndarray]) -> Any:
    if node is None or isinstance(node, (bool, int, str)):
        return node
    if isinstance(node, dict) and len(node) == 1:
        ((tag, payload),) = node.items()
        if tag == "f":
            return float.fromhex(payload)
        if tag == "a":
            return arrays[payload]
        if tag == "g":
            return arrays[payload][()]
        if tag == "y":
            return arrays[payload].tobytes()
        if tag == "p":
            return pickle.loads(arrays[payload].tobytes())
        if tag == "d":
            return {_decode_node(k, arrays): _decode_node(v, arrays) for k, v in payload}
        if tag == "l":
            return [_decode_node(v, arrays) for v in payload]
        if tag == "t":
            return tuple(_decode_node(v, arrays) for v in payload)
    raise CorruptRecordError(f"unknown tree node {node!r}")
