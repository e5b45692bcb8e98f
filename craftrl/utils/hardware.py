"""What the CPU can do natively, for options whose benefit depends on it."""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path

NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16")


@lru_cache(maxsize=1)
def native_cpu_bf16_flags() -> tuple[str, ...]:
    """The CPU's native bfloat16 instruction sets listed in /proc/cpuinfo (Linux); empty where none or unknown,
    or where torch's oneDNN may not use them (``onednn_may_use_bf16``).

    Why not ask torch alone: it reports bf16 as supported on any AVX512 CPU, where bf16 runs emulated, and only
    native instructions made the learner faster (bench/learner_step.py)."""
    try:
        flags_line = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags"))
    except (OSError, StopIteration):
        return ()
    flags = set(flags_line.split(":", 1)[-1].split())
    native = tuple(flag for flag in NATIVE_BF16_FLAGS if flag in flags)
    return native if native and onednn_may_use_bf16() else ()


def onednn_may_use_bf16() -> bool:
    """Whether torch's oneDNN may run bfloat16 in this process.

    Why: ``ONEDNN_MAX_CPU_ISA`` (set below AVX512_CORE) forbids the CPU's bf16 instructions to oneDNN, and bf16
    passes then fall back to reference code, hundreds of times slower than float32 (bench/notes/peers.md)."""
    import torch

    check = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
    try:
        return bool(check()) if check is not None else True
    except RuntimeError:
        return True


def usable_cores() -> int:
    """CPU cores this process may run on (its affinity mask, which containers and taskset narrow)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1
