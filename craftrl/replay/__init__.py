"""Replay buffer: LMDB-backed fragment store, pure buffer policy, and the thin Ray actor around them.

Rollout workers: ``ReplayWriter.connect().add_fragment(fragment)``. Trainer: ``buffer.sample_chunks.remote(n)``,
``ReaderPool(buffer, ...).read(descriptors)``, ``buffer.update_version.remote(v)``. See docs/replay.md.
"""

from craftrl.replay.config import BufferSettings, StoreSettings, buffer_settings_from
from craftrl.replay.policy import REMOVAL_REASONS, BufferPolicy, ChunkDescriptor, FragmentMeta

__all__ = [
    "BufferPolicy", "BufferSettings", "ChunkDescriptor", "FragmentMeta", "REMOVAL_REASONS", "StoreSettings",
    "buffer_settings_from",
]
