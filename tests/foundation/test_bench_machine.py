"""The machine line every benchmark's results carry: figures compare only within one machine kind."""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from machine import describe_machine  # noqa: E402


def _cpuinfo(model: str, flags: str) -> str:
    return f"processor\t: 0\nmodel name\t: {model}\nflags\t\t: fpu sse2 avx avx2 {flags}\n"


def test_the_machine_line_names_the_model_and_its_native_bf16():
    line = describe_machine(_cpuinfo("AMD EPYC", "avx512f avx512_bf16"))
    assert line == f"{os.cpu_count()} cores (AMD EPYC; avx512_bf16)"
    amx = describe_machine(_cpuinfo("Intel Xeon", "amx_tile avx512f amx_bf16 avx512_bf16"))
    assert amx.endswith("(Intel Xeon; avx512_bf16, amx_bf16, amx_tile)")


def test_a_cpu_without_avx512_says_so():
    assert describe_machine(_cpuinfo("AMD EPYC", "fma")).endswith("(AMD EPYC; no avx512)")
    assert describe_machine(_cpuinfo("Intel Xeon", "avx512f")).endswith("(Intel Xeon)")
