"""The machine a benchmark ran on, for its results header (figures compare only within one machine), and how busy
its cores were."""

from __future__ import annotations

import os
import platform
from pathlib import Path


def describe_machine() -> str:
    """``2 cores (AMD EPYC; avx512_bf16)``: core count, CPU model and the flags that change our kernels."""
    model, flags = platform.processor() or platform.machine(), []
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
            elif line.startswith("flags"):
                flags = [f for f in line.split(":", 1)[1].split() if f in ("avx512_bf16", "amx_bf16", "amx_tile")]
                break
    except OSError:
        pass
    return f"{os.cpu_count()} cores ({model}{'; ' + ', '.join(flags) if flags else ''})"


def machine_busy_seconds() -> float:
    """CPU seconds all cores spent outside idle and iowait since boot (/proc/stat)."""
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    return (sum(values) - values[3] - values[4]) / os.sysconf("SC_CLK_TCK")
