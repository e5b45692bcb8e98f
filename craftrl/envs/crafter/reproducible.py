"""Crafter episodes that a seed fixes from the first step to the last, not only the world they start in.

Crafter keeps each chunk's objects in a set, and its chunk balancing (every 10th step) picks the creature to
despawn by index into that set's iteration order, which follows ``id()``-based hashes, that is memory addresses.
Two envs with the same seed and the same actions then part ways at the first balancing step that despawns (seen
for seeds 0, 7 and 2024, with and without the cows task's summoned cows). Here every object hashes by its creation
number in its world instead, which the same seed and actions reproduce; the rule itself (which index is drawn) is
Crafter's.
"""

from __future__ import annotations


def install() -> None:
    """Number Crafter's objects per world at creation and hash them by that number (idempotent)."""
    from crafter import objects

    if getattr(objects.Object, "_craftrl_numbered", False):
        return
    original_init = objects.Object.__init__

    def numbered_init(self, world, pos) -> None:
        original_init(self, world, pos)
        world._craftrl_objects_made = getattr(world, "_craftrl_objects_made", 0) + 1
        self._craftrl_number = world._craftrl_objects_made

    objects.Object.__init__ = numbered_init
    objects.Object.__hash__ = lambda self: self._craftrl_number
    objects.Object._craftrl_numbered = True
