"""Writing a recorded episode to mp4 off the rollout thread (encoding must never stall stepping)."""

from __future__ import annotations

import re
import tempfile
import threading
from pathlib import Path
from typing import Any, Callable

import numpy as np


def video_filename(label: dict[str, Any], worker_name: str) -> str:
    iteration = int(label.get("iteration", 0))
    version = int(label.get("version", -1))
    safe_worker = re.sub(r"[^A-Za-z0-9_.-]", "_", worker_name)
    return f"iter{iteration:06d}-v{version}-{safe_worker}.mp4"


def write_mp4(path: Path, frames: list[np.ndarray], fps: int) -> Path:
    import imageio.v2 as imageio

    path.parent.mkdir(parents=True, exist_ok=True)
    # macro_block_size=1 keeps small frames (e.g. 64x64 Crafter) at their size instead of padding them.
    with imageio.get_writer(str(path), fps=fps, codec="libx264", macro_block_size=1, quality=8) as writer:
        for frame in frames:
            writer.append_data(np.asarray(frame, dtype=np.uint8))
    return path


def write_mp4_in_background(path: Path, frames: list[np.ndarray], fps: int,
                            deliver: Callable[[Path, bytes], None] | None = None) -> threading.Thread:
    """Encode ``frames`` to ``path`` on a thread; with ``deliver``, encode to a temporary file on this machine
    and hand ``(path, mp4 bytes)`` to ``deliver`` instead (a worker whose disk is not the run directory's)."""
    def encode() -> None:
        if deliver is None:
            write_mp4(path, frames, fps)
            return
        with tempfile.TemporaryDirectory(prefix="craftrl-video-") as scratch:
            deliver(path, write_mp4(Path(scratch) / path.name, frames, fps).read_bytes())

    thread = threading.Thread(target=encode, name="video-writer", daemon=True)
    thread.start()
    return thread
