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


def scheduled_gae_lambda(iteration: int, final: float, initial: float | None, hold: int, ramp: int) -> float:
    """GAE lambda for ``iteration``: ``initial`` for ``hold`` iterations, then linear to ``final`` over ``ramp``.

    Why: on the cows task a short credit horizon (lambda 0.65) finds the first kills twice as fast as 0.95,
    but its policy then settles on pressing `do` where it stands; the long horizon is what credits walking up
    to a cow. A schedule starts short and ends long. ``initial`` None is no schedule.
    """
    if initial is None or iteration >= hold + ramp:
        return final
    if iteration < hold:
        return initial
    return initial + (final - initial) * (iteration - hold) / ramp
