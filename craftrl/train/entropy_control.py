"""The entropy bonus's weight as a controller on the policy's entropy (``train_config.target_entropy``).

A fixed bonus pulls a still-random policy back from the few updates its first rewards give it, and does too
little once the policy has settled on a reflex (on ``crafter/cows``: pressing `do` where it stands, the
entropy down to 0.3-0.4 nats of ln 17 = 2.83). Projected dual ascent on the constraint
``entropy >= target`` does both: the weight is the Lagrange multiplier, moved once per iteration by the
iteration's mean entropy and kept at or above 0.
"""

from __future__ import annotations


def next_entropy_coef(coef: float, entropy: float, target_entropy: float, step: float) -> float:
    """The weight for the next iteration: up by ``step`` per nat the entropy fell short of the target, down
    by as much per nat above it, never below 0."""
    return max(0.0, coef + step * (target_entropy - entropy))
