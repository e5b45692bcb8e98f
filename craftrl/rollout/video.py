"""Writing a recorded episode to mp4 off the rollout thread (encoding must never stall stepping)."""

from __future__ import annotations

import re
import threading
from pathlib import Path
from typing import Any

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


def write_mp4_in_background(path: Path, frames: list[np.ndarray], fps: int) -> threading.Thread:
    thread = threading.Thread(target=write_mp4, args=(path, frames, fps), name="video-writer", daemon=True)
    thread.start()
    return thread
