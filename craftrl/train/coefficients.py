"""Loss coefficients that adapt to what training measured, kept apart from the learner so they test without it."""

from __future__ import annotations


def adapt_entropy_coef(coef: float, entropy: float, target: float, step: float, floor: float,
                       ceiling: float) -> float:
    """The entropy coefficient for the next iteration, given the mean policy entropy of this one.

    Why: with a sparse reward the first kills pull the policy towards the actions that got them, and a fixed
    bonus small enough to let that happen fast also lets the entropy collapse, after which the policy stops
    finding the next reward. Raising the bonus only while the entropy is below a target is meant to keep the
    fast start and bound the collapse (on the cows task, a target of 1.0 did not: bench/notes/learning.md).
    The coefficient moves by a constant factor per iteration, and never below ``floor`` -- the configured
    bonus -- so an entropy above the target costs nothing.
    """
    if entropy < target:
        coef *= step
    elif entropy > target:
        coef /= step
    return min(max(coef, floor), ceiling)
