"""bench/cow_behaviour.py's step classes, on hand-placed cows (Crafter's x grows rightwards, y downwards)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import cow_behaviour  # noqa: E402

PLAYER = np.array([10, 10])
FACING_RIGHT = np.array([1, 0])


@pytest.mark.parametrize("cows, action, expected", [
    ([(11, 10)], "do", ("cow adjacent, faced", True)),
    ([(11, 10)], "move_left", ("cow adjacent, faced", False)),
    ([(10, 9)], "move_up", ("cow adjacent, not faced", True)),  # moving into the cow turns the player to it
    ([(10, 9)], "do", ("cow adjacent, not faced", False)),
    ([(12, 11), (6, 10)], "move_down", ("cow in view", True)),  # the nearest cow: 3 steps away, down-right
    ([(12, 11), (6, 10)], "move_left", ("cow in view", False)),
    ([(15, 10), (10, 14)], "do", ("no cow in view", False)),  # 5 tiles right and 4 down are outside the view
])
def test_steps_are_classified_by_the_nearest_visible_cow(cows, action, expected):
    assert cow_behaviour.step_class(PLAYER, FACING_RIGHT, [np.array(c) for c in cows], action) == expected
