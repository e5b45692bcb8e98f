"""Settings of the replay buffer, independent of the project-wide config schema.

The schema (``craftrl.config``) owns validation of user files; these small dataclasses exist so that the
buffer can be built and tested from plain arguments, and :func:`buffer_settings_from` accepts the schema's
``rollout_config.replay_buffer_config`` section (or any object / mapping with the same keys).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

MIB = 1 << 20
RECORD_SLACK_BYTES = 64 * 1024  # record header, the pickled field layout and the fragment's info dict


def encoded_fragment_bound(raw_nbytes: int) -> int:
    """The most a fragment of ``raw_nbytes`` can take once encoded: zstd stores incompressible input with at most
    1/128 of overhead, plus the record's own fields."""
    return raw_nbytes + raw_nbytes // 128 + RECORD_SLACK_BYTES


@dataclass(frozen=True)
class StoreSettings:
    """Where the LMDB store lives and how big one encoded fragment is expected to be.

    ``max_fragment_bytes`` sizes the map and the disk check: the largest *encoded* (compressed) fragment.
    ``craftrl train`` sets it, when the config leaves it unset, to :func:`encoded_fragment_bound` of the raw size
    that the env's first observation, the policy's state and ``fragment_length`` give (Minecraft's 128x128
    fragments of 256 steps are about 13 MB raw); plain-argument use gets 4 MiB.
    """

    path: str = "replay_buffer"
    num_shards: int = 8
    max_fragment_bytes: int = 4 * MIB
    compression_level: int = 3

    def __post_init__(self) -> None:
        _require(isinstance(self.path, str) and self.path != "", "database_config.path", "a non-empty string", self.path)
        _require_int(self.num_shards, "database_config.num_shards", 1)
        _require_int(self.max_fragment_bytes, "database_config.max_fragment_bytes", 1)
        _require_int(self.compression_level, "database_config.compression_level", 1)


@dataclass(frozen=True)
class BufferSettings:
    """Capacity, reuse and staleness limits (``rollout_config.replay_buffer_config``)."""

    max_chunks: int = 4800
    max_reuse: int = 2
    max_staleness: int = 2
    fragments_per_report: int = 40
    fragments_per_chunk: int = 1
    store: StoreSettings = field(default_factory=StoreSettings)
    seed: int = 0
    # Descriptors returned by a sample call stay readable for this many further sample calls, so a trainer
    # that samples the next iteration while still reading the current one never reads a deleted record.
    read_grace_samples: int = 2
    # 0: rollout workers are answered at once. n > 0: the buffer actor takes a worker's fragments only while fewer
    # than n chunks await their first sample, so a rollout faster than its trainer waits instead of making stale data.
    max_unsampled_chunks: int = 0

    def __post_init__(self) -> None:
        _require_int(self.max_chunks, "replay_buffer_config.max_chunks", 1)
        _require_int(self.max_reuse, "replay_buffer_config.max_reuse", 1)
        _require_int(self.max_staleness, "replay_buffer_config.max_staleness", 0)
        _require_int(self.fragments_per_report, "replay_buffer_config.fragments_per_report", 1)
        _require_int(self.fragments_per_chunk, "replay_buffer_config.fragments_per_chunk", 1)
        _require_int(self.seed, "seed", 0)
        _require_int(self.read_grace_samples, "read_grace_samples", 1)
        _require_int(self.max_unsampled_chunks, "replay_buffer_config.max_unsampled_chunks", 0)
        _require(isinstance(self.store, StoreSettings), "replay_buffer_config.database_config",
                 "a StoreSettings", self.store)

    @property
    def max_live_fragments(self) -> int:
        """Fragments that can be on disk at once, for sizing: full chunks plus one read-grace window."""
        in_chunks = self.max_chunks * self.fragments_per_chunk
        return in_chunks * (1 + self.read_grace_samples)


def buffer_settings_from(section: Any, *, seed: int = 0, **overrides: Any) -> BufferSettings:
    """Build settings from the schema's ``replay_buffer_config`` (object or mapping) plus plain overrides."""
    get = _getter(section)
    database = get("database_config", None)
    store_fields = {}
    if database is not None:
        db_get = _getter(database)
        for name in ("path", "num_shards", "max_fragment_bytes", "compression_level"):
            value = db_get(name, None)
            if value is not None:
                store_fields[name] = value
    values: dict[str, Any] = {"store": StoreSettings(**store_fields), "seed": seed}
    for name in ("max_chunks", "max_reuse", "max_staleness", "fragments_per_report", "fragments_per_chunk",
                 "read_grace_samples", "max_unsampled_chunks"):
        value = get(name, None)
        if value is not None:
            values[name] = value
    values.update(overrides)
    return BufferSettings(**values)


def _getter(section: Any):
    if isinstance(section, Mapping):
        return section.get
    return lambda name, default: getattr(section, name, default)


def _require(ok: bool, name: str, expected: str, got: Any) -> None:
    if not ok:
        raise ValueError(f"{name}: expected {expected}, got {got!r}")


def _require_int(value: Any, name: str, minimum: int) -> None:
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= minimum
    _require(ok, name, f"an int >= {minimum}", value)
