"""Fixtures shared by the env tests."""

from __future__ import annotations

import pytest

from craftrl.envs.crafter import reproducible


@pytest.fixture
def deterministic_object_hashes() -> None:
    """Make two Crafter envs with the same seed play identically, whatever generator built them: objects hash by
    their creation number in their world (``craftrl.envs.crafter.reproducible``, which every CrafterSim installs)
    instead of by address, which decides the order of Crafter's chunk sets and so which creature despawns."""
    reproducible.install()
