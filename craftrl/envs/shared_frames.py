"""Large observation arrays go from an env process to its parent through shared memory, not the pipe.

A 360x640x3 Minecraft frame is 691 kB. Through the pipe it is pickled, written in 64 kB pieces, read back
piece by piece and unpickled, every process waking up for each piece; with dozens of Minecraft-sized envs that
moving alone can take more CPU than a small machine has (bench/notes/sampler.md, "Frames of 360x640"). Here the env
process copies each array of at least ``SHARE_MIN_BYTES`` into a shared region of its env and sends only where it
lies; the parent copies it out when the reply arrives. Smaller arrays (Crafter's 64x64 frames) stay in the pickled
reply, which is cheaper for them.

Regions: one per env and kind of reply (``"step"``, ``"reset"``), an anonymous ``memfd`` whose file descriptor
travels over the process's Unix socket right after a ``("region", index, kind, size)`` message. Nothing is
named in ``/dev/shm``, so a killed env process leaks nothing: the memory goes with the last mapping.

Why a region can be rewritten safely: an env's step region is written again only when the env steps again,
which it does only when the parent sends it an action; the parent does that only after it delivered the env's
last result, so after it copied every array of the env's earlier replies. The same holds for the reset region
(its next reset follows a later step or a new ``reset`` request). Step and reset replies use separate regions
because an episode's last step and the next episode's first observation are both in flight at once.
"""

from __future__ import annotations

import mmap
import os
from multiprocessing.connection import Connection
from multiprocessing.reduction import recv_handle, send_handle
from typing import Any, Callable

import numpy as np

SHARE_MIN_BYTES = 64 * 1024  # a pipe's buffer: a larger array takes several writes and wake-ups to cross it
SHARING_AVAILABLE = hasattr(os, "memfd_create")
_ALIGN = 64


def _aligned(nbytes: int) -> int:
    return -(-nbytes // _ALIGN) * _ALIGN


class SharedObs:
    """An observation whose large arrays wait in the env's ``kind`` region: ``layout`` maps each such key to
    ``(offset, shape, dtype)``; ``rest`` holds the other keys; ``keys`` keeps the observation's key order."""

    __slots__ = ("kind", "layout", "rest", "keys")

    def __init__(self, kind: str, layout: dict[str, tuple[int, tuple[int, ...], str]], rest: dict[str, Any],
                 keys: list[str]) -> None:
        self.kind, self.layout, self.rest, self.keys = kind, layout, rest, keys

    def __reduce__(self) -> tuple:
        return SharedObs, (self.kind, self.layout, self.rest, self.keys)


class FrameSender:
    """Env-process side: moves an observation's large arrays into its env's region before the reply is sent.

    ``announce(message)`` sends a message over the pipe; a new region's descriptor follows it on ``conn``.
    """

    def __init__(self, conn: Connection, announce: Callable[[tuple], None]) -> None:
        self.conn = conn
        self.announce = announce
        self.regions: dict[tuple[int, str], mmap.mmap] = {}
        self.enabled = SHARING_AVAILABLE

    def pack(self, index: int, kind: str, obs: dict[str, Any]) -> dict[str, Any] | SharedObs:
        """``obs`` itself if nothing in it is large (or shared memory cannot be had here), else a ``SharedObs``
        whose arrays are in the region."""
        if not self.enabled:
            return obs
        large = [key for key, value in obs.items() if isinstance(value, np.ndarray)
                 and value.nbytes >= SHARE_MIN_BYTES and not value.dtype.hasobject]
        if not large:
            return obs
        region = self._region(index, kind, sum(_aligned(obs[key].nbytes) for key in large))
        if region is None:
            return obs
        layout, offset = {}, 0
        for key in large:
            array = obs[key]
            np.copyto(np.ndarray(array.shape, array.dtype, buffer=region, offset=offset), array, casting="no")
            layout[key] = (offset, array.shape, array.dtype.str)
            offset += _aligned(array.nbytes)
        rest = {key: value for key, value in obs.items() if key not in layout}
        return SharedObs(kind, layout, rest, list(obs))

    def _region(self, index: int, kind: str, size: int) -> mmap.mmap | None:
        """The env's region for ``kind``, grown to ``size``; None (and no sharing from now on) where no shared
        memory can be had (a sandbox without memfd, no memory left): the pipe then carries everything."""
        region = self.regions.get((index, kind))
        if region is not None and len(region) >= size:
            return region
        size = -(-size // mmap.PAGESIZE) * mmap.PAGESIZE
        try:
            fd = os.memfd_create(f"craftrl-frames-{index}-{kind}")
        except OSError:
            self.enabled = False
            return None
        try:
            try:
                os.ftruncate(fd, size)
                new_region = mmap.mmap(fd, size)
            except OSError:
                self.enabled = False
                return None
            self.announce(("region", index, kind, size))  # from here on the parent expects the descriptor
            send_handle(self.conn, fd, os.getppid())
        finally:
            os.close(fd)
        if region is not None:
            region.close()
        self.regions[(index, kind)] = new_region
        return new_region


class FrameReceiver:
    """Parent side: maps the regions an env process announces and copies shared arrays out of them."""

    def __init__(self) -> None:
        self.regions: dict[tuple[int, str], mmap.mmap] = {}

    def add_region(self, conn: Connection, index: int, kind: str, size: int) -> None:
        """Map the region announced for ``(index, kind)``; its descriptor is the next thing on ``conn``."""
        fd = recv_handle(conn)
        try:
            region = mmap.mmap(fd, size, access=mmap.ACCESS_READ)
        finally:
            os.close(fd)
        old = self.regions.pop((index, kind), None)
        if old is not None:
            old.close()
        self.regions[(index, kind)] = region

    def unpack(self, index: int, obs: dict[str, Any] | SharedObs) -> dict[str, Any]:
        """The observation with its shared arrays copied out (the env may overwrite the region on its next step)."""
        if type(obs) is not SharedObs:
            return obs
        region = self.regions[(index, obs.kind)]
        restored = {}
        for key in obs.keys:
            if key in obs.layout:
                offset, shape, dtype = obs.layout[key]
                restored[key] = np.ndarray(shape, np.dtype(dtype), buffer=region, offset=offset).copy()
            else:
                restored[key] = obs.rest[key]
        return restored

    def close(self) -> None:
        for region in self.regions.values():
            region.close()
        self.regions.clear()
