"""The MinecraftSim adapter's failure path: minestudio is not installable here, so test the errors."""

from __future__ import annotations

import sys
import textwrap

import numpy as np
import pytest

from craftrl.envs import make
from craftrl.envs.minecraft import ENGINE_JAR, MinecraftEnv, MinecraftUnavailableError, make_minecraft_sim


def test_missing_minestudio_raises_one_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "minestudio", None)  # guarantee "not importable" even if installed
    with pytest.raises(MinecraftUnavailableError) as error:
        make("minecraft/sim")
    message = str(error.value)
    assert "`minestudio` is not installed" in message and "pip install minestudio" in message
    assert "never downloads" in message


def test_missing_engine_names_the_jar_and_how_to_provide_it(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "site" / "minestudio"
    (fake / "simulator").mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "simulator" / "__init__.py").write_text(textwrap.dedent("""
        class MinecraftSim:
            def __init__(self, **kwargs):
                raise AssertionError("must not be constructed without the engine")
    """))
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.setenv("MINESTUDIO_DIR", str(tmp_path / "engine_home"))
    for name in [n for n in sys.modules if n.startswith("minestudio")]:
        monkeypatch.delitem(sys.modules, name)
    with pytest.raises(MinecraftUnavailableError) as error:
        make_minecraft_sim(obs_size=(128, 128))
    message = str(error.value)
    assert "`minestudio` is not installed" not in message
    assert str(tmp_path / "engine_home" / ENGINE_JAR) in message
    assert "CraftJarvis/SimulatorEngine" in message and "MINESTUDIO_DIR" in message


class _FakeSim:
    """Mimics MinecraftSim's quirks: mutates dict actions and sets both flags at an episode end."""

    def __init__(self, ends_at: int) -> None:
        self.ends_at, self.t = ends_at, 0

    def reset(self):
        self.t = 0
        return {"image": np.zeros((4, 4, 3), np.uint8)}, {}

    def step(self, action):
        action.pop("buttons")
        self.t += 1
        done = self.t >= self.ends_at
        return {"image": np.zeros((4, 4, 3), np.uint8)}, 1, done, done, {}

    def render(self):
        return np.zeros((4, 4, 3), np.uint8)

    def close(self):
        pass


def test_wrapper_copies_actions_and_splits_timeouts_from_endings() -> None:
    env = MinecraftEnv(_FakeSim(ends_at=3), time_limit=3)
    env.reset(seed=1)
    action = {"buttons": np.array([0]), "camera": np.array([60])}
    flags = [env.step(action)[2:4] for _ in range(3)]
    assert "buttons" in action  # not mutated
    assert flags == [(False, False), (False, False), (False, True)]
    env = MinecraftEnv(_FakeSim(ends_at=2), time_limit=600)
    env.reset()
    assert [env.step({"buttons": 0})[2:4] for _ in range(2)][-1] == (True, False)
