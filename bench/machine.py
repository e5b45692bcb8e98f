"""The machine a benchmark ran on, for its results header (figures compare only within one machine), and how busy
its cores were."""

from __future__ import annotations

import os
import platform
from pathlib import Path


def describe_machine(cpuinfo: str | None = None) -> str:
    """``2 cores (AMD EPYC; avx512_bf16)``: core count, CPU model and the flags that change our kernels; a CPU
    without AVX-512 says ``no avx512``, since torch's kernels and oneDNN's bf16 path differ most there."""
    model, flags = platform.processor() or platform.machine(), []
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            cpuinfo = ""
    for line in cpuinfo.splitlines():
        if line.startswith("model name"):
            model = line.split(":", 1)[1].strip()
        elif line.startswith("flags"):
            present = line.split(":", 1)[1].split()
            flags = [f for f in ("avx512_bf16", "amx_bf16", "amx_tile") if f in present]
            if "avx512f" not in present:
                flags.append("no avx512")
            break
    return f"{os.cpu_count()} cores ({model}{'; ' + ', '.join(flags) if flags else ''})"


def machine_busy_seconds() -> float:
    """CPU seconds all cores spent outside idle and iowait since boot (/proc/stat)."""
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    return (sum(values) - values[3] - values[4]) / os.sysconf("SC_CLK_TCK")
