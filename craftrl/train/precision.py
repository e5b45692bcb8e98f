"""``train_config.cpu_bf16="auto"``: time the learner's pass in float32 and in bfloat16 autocast, keep the faster.

Why measure: native bf16 instructions alone do not say bf16 is faster. On some CPUs with them it halves the
learner's time, on others it is slower than float32 (bench/notes/crafter_score.md); the policy's layer sizes and
the batch decide as much as the CPU does.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

# bf16 rounds activations to 8 bits of mantissa; it has to pay for that with at least this much speed.
BF16_MIN_GAIN = 0.05


@dataclass(frozen=True)
class PrecisionTiming:
    """The fastest seconds of one forward + backward pass in each precision."""

    float32_seconds: float
    bf16_seconds: float

    @property
    def bf16_faster(self) -> bool:
        return self.bf16_seconds < (1.0 - BF16_MIN_GAIN) * self.float32_seconds


def time_both_precisions(run_pass: Callable[[bool], None], rounds: int = 5,
                         clock: Callable[[], float] = time.perf_counter) -> PrecisionTiming:
    """Fastest of ``rounds`` timed calls of ``run_pass(bf16)`` for each precision, the two interleaved so a
    neighbour's burst of CPU use hits both alike, after one untimed call of each (kernel set-up, allocator)."""
    if rounds < 1:
        raise ValueError(f"rounds: expected >= 1, got {rounds}")
    run_pass(False)
    run_pass(True)
    best = {False: float("inf"), True: float("inf")}
    for _ in range(rounds):
        for bf16 in (False, True):
            start = clock()
            run_pass(bf16)
            best[bf16] = min(best[bf16], clock() - start)
    return PrecisionTiming(float32_seconds=best[False], bf16_seconds=best[True])
