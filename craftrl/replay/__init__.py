"""Replay buffer: LMDB-backed fragment store, pure replay index, and the thin Ray actor around them.

Rollout workers: ``ReplayWriter(buffer).add_fragment(fragment)``. Trainer: ``buffer.sample_chunks.remote(n)``,
``ReaderPool(buffer, ...).read(descriptors)``, ``buffer.update_version.remote(v)``. See docs/replay.md.
"""

from craftrl.replay.config import BufferSettings, StoreSettings, buffer_settings_from
from craftrl.replay.index import REMOVAL_REASONS, ReplayIndex, ChunkDescriptor, FragmentMeta

__all__ = [
    "ReplayIndex", "BufferSettings", "ChunkDescriptor", "FragmentMeta", "REMOVAL_REASONS", "StoreSettings",
    "buffer_settings_from",
]
