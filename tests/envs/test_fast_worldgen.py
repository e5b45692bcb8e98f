"""craftrl.envs.crafter.fast_worldgen: vectorised OpenSimplex noise and an exact drop-in for Crafter's
world generation (same worlds, objects and random state as ``crafter.worldgen.generate_world``)."""

from __future__ import annotations

import itertools

import crafter
import numpy as np
import opensimplex
import pytest
from crafter import constants, engine, objects, worldgen

from craftrl.envs.crafter import fast_worldgen
from craftrl.envs.crafter.fast_worldgen import generate_world, noise3_grid

SEEDS = (0, 1, 7, 2024, 2**31 - 2)


def _reference(seed: int, xs, ys, zs) -> np.ndarray:
    noise = opensimplex.OpenSimplex(seed=seed).noise3d
    return np.array([noise(float(x), float(y), float(z)) for x, y, z in zip(xs, ys, zs)])


def _worldgen_points(rng: np.random.Generator, count: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Coordinates exactly as worldgen._simplex builds them: (x / size, y / size, z), also for the
    tunnel fields whose inputs are (2 * x, y / 5) and (x / 5, 2 * y)."""
    fields = [
        (lambda x, y: (x, y), 8, 3), (lambda x, y: (x, y), 3, 15), (lambda x, y: (x, y), 3, 5),
        (lambda x, y: (x, y), 0, 15), (lambda x, y: (x, y), 0, 5), (lambda x, y: (x, y), 6, 7),
        (lambda x, y: (2 * x, y / 5), 7, 3), (lambda x, y: (x / 5, 2 * y), 7, 3),
        (lambda x, y: (x, y), 1, 8), (lambda x, y: (x, y), 2, 6), (lambda x, y: (x, y), 6, 5),
        (lambda x, y: (x, y), 4, 9), (lambda x, y: (x, y), 5, 7),
    ]
    xs, ys, zs = [], [], []
    for _ in range(count):
        inputs, z, size = fields[rng.integers(len(fields))]
        x, y = inputs(int(rng.integers(64)), int(rng.integers(64)))
        xs.append(x / size)
        ys.append(y / size)
        zs.append(z)
    return np.array(xs, float), np.array(ys, float), np.array(zs, float)


def _awkward_points() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Integer points, lattice vertices mapped back to input space (the honeycomb's own vertices,
    where the floor and the region tests sit on their boundaries), and midpoints between them."""
    ints = np.array(list(itertools.product(range(-3, 4), repeat=3)), float)
    lattice = ints + ints.sum(axis=1, keepdims=True) / 3  # undo the 3-D stretch (-1/6 per unit sum)
    mids = (lattice[:-1] + lattice[1:]) / 2
    points = np.concatenate([ints, lattice, mids, ints / 2, ints / 3])
    return points[:, 0], points[:, 1], points[:, 2]


# ---------------------------------------------------------------------------------------------
# noise3_grid
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [0, 1, 12345, -7, 2**31 - 2, 2**40 + 3])
def test_noise3_grid_matches_opensimplex(seed: int) -> None:
    rng = np.random.default_rng(seed % 1000)
    wide = rng.uniform(-60, 60, (3, 300))  # negative and positive coordinates
    small = rng.uniform(-2, 2, (3, 300))
    wx, wy, wz = _worldgen_points(rng, 300)
    ax, ay, az = _awkward_points()
    xs = np.concatenate([wide[0], small[0], wx, ax])
    ys = np.concatenate([wide[1], small[1], wy, ay])
    zs = np.concatenate([wide[2], small[2], wz, az])

    ours = noise3_grid(seed, xs, ys, zs)
    theirs = _reference(seed, xs, ys, zs)
    assert ours.shape == xs.shape
    assert np.abs(ours - theirs).max() <= 1e-9
    assert np.abs(theirs).max() > 0.3  # the comparison saw real noise, not zeros
    # Stronger than the tolerance: the float operations are done in the reference's order, so the
    # values are identical. generate_world's threshold decisions rely on this.
    mismatched = np.flatnonzero(ours != theirs)
    assert mismatched.size == 0, [(xs[i], ys[i], zs[i], ours[i], theirs[i]) for i in mismatched[:5]]


def test_noise3_grid_broadcasts_a_scalar_z_and_keeps_the_shape() -> None:
    xs, ys = np.meshgrid(np.arange(-6, 6) / 3, np.arange(5) / 5, indexing="ij")
    grid = noise3_grid(99, xs, ys, 7)
    assert grid.shape == (12, 5)
    expected = _reference(99, xs.ravel(), ys.ravel(), np.full(xs.size, 7.0)).reshape(xs.shape)
    assert np.array_equal(grid, expected)
    assert np.array_equal(noise3_grid(99, np.float64(1.5), -2.25, 3.0),
                          _reference(99, [1.5], [-2.25], [3.0])[0])


# ---------------------------------------------------------------------------------------------
# generate_world against crafter's own generator
# ---------------------------------------------------------------------------------------------


@pytest.fixture
def crafter_worldgen(monkeypatch: pytest.MonkeyPatch):
    """Crafter's original generator; whatever crafter.worldgen held before is restored afterwards."""
    monkeypatch.setattr(worldgen, "generate_world", worldgen.generate_world)
    fast_worldgen.uninstall()
    original = worldgen.generate_world
    assert original is not generate_world and original.__module__ == "crafter.worldgen"
    return original


def _use(fast: bool) -> None:
    if fast:
        fast_worldgen.install()
        assert worldgen.generate_world is generate_world
    else:
        fast_worldgen.uninstall()
        assert worldgen.generate_world is not generate_world


def _same(a, b) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return np.array_equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def _assert_same_world(env_a: crafter.Env, env_b: crafter.Env) -> None:
    wa, wb = env_a._world, env_b._world
    assert np.array_equal(wa._mat_map, wb._mat_map)
    assert np.array_equal(wa._obj_map, wb._obj_map)
    def describe(world) -> list:
        return [(type(o).__name__, tuple(int(v) for v in o.pos), o.health) for o in world.objects]

    assert describe(wa) == describe(wb)
    assert _same(wa.random.get_state(), wb.random.get_state())


def _reset_pair(seed: int, area=(64, 64)) -> tuple[crafter.Env, crafter.Env, np.ndarray, np.ndarray]:
    slow = crafter.Env(area=area, view=(9, 9), size=(64, 64), seed=seed)
    fast = crafter.Env(area=area, view=(9, 9), size=(64, 64), seed=seed)
    _use(False)
    obs_slow = slow.reset()
    _use(True)
    obs_fast = fast.reset()
    return slow, fast, obs_slow, obs_fast


@pytest.mark.parametrize("seed", SEEDS)
def test_fast_world_is_identical_and_plays_identically(crafter_worldgen, deterministic_object_hashes,
                                                      seed: int) -> None:
    slow, fast, obs_slow, obs_fast = _reset_pair(seed)
    _assert_same_world(slow, fast)
    assert np.array_equal(obs_slow, obs_fast)
    # A non-trivial world: several materials and some creatures.
    assert len(np.unique(slow._world._mat_map)) >= 5
    assert any(isinstance(o, objects.Cow) for o in slow._world.objects)

    actions = np.random.default_rng(seed).integers(len(constants.actions), size=50)
    for action in actions.tolist():
        step_slow, step_fast = slow.step(action), fast.step(action)
        assert _same(step_slow, step_fast)  # obs, reward, done, info (incl. the semantic map)
    _assert_same_world(slow, fast)
    assert np.array_equal(slow._world.random.uniform(size=5), fast._world.random.uniform(size=5))


def test_consecutive_resets_stay_identical(crafter_worldgen, deterministic_object_hashes) -> None:
    slow = crafter.Env(area=(64, 64), view=(9, 9), size=(64, 64), seed=31)
    fast = crafter.Env(area=(64, 64), view=(9, 9), size=(64, 64), seed=31)
    maps = []
    for _ in range(3):  # the episode counter changes each world's seed
        _use(False)
        obs_slow = slow.reset()
        _use(True)
        obs_fast = fast.reset()
        _assert_same_world(slow, fast)
        assert np.array_equal(obs_slow, obs_fast)
        maps.append(slow._world._mat_map.copy())
        for action in (1, 3, 5, 2):
            assert _same(slow.step(action), fast.step(action))
    assert not np.array_equal(maps[0], maps[1]) and not np.array_equal(maps[1], maps[2])


@pytest.mark.parametrize("area", [(32, 48), (48, 20)])
def test_other_area_sizes_are_identical(crafter_worldgen, area: tuple[int, int]) -> None:
    for seed in (3, 4):
        slow, fast, obs_slow, obs_fast = _reset_pair(seed, area)
        assert slow._world._mat_map.shape == area
        _assert_same_world(slow, fast)
        assert np.array_equal(obs_slow, obs_fast)


class _OtherRandomState(np.random.RandomState):
    """Not exactly np.random.RandomState: generate_world must then draw one uniform() at a time."""


def test_generic_generator_path_and_off_centre_player(crafter_worldgen) -> None:
    def build(generator, rng_type):
        world = engine.World((40, 40), constants.materials, (12, 12))
        world.reset(seed=5)
        world.random = rng_type(5)
        player = objects.Player(world, (9, 30))
        world.add(player)
        generator(world, player)
        return world

    for rng_type in (np.random.RandomState, _OtherRandomState):
        ours, theirs = build(generate_world, rng_type), build(crafter_worldgen, rng_type)
        assert np.array_equal(ours._mat_map, theirs._mat_map)
        assert [(type(o).__name__, tuple(o.pos)) for o in ours.objects] == \
               [(type(o).__name__, tuple(o.pos)) for o in theirs.objects]
        assert _same(ours.random.get_state(), theirs.random.get_state())


def test_start_guard_recomputes_tiles_on_a_threshold_the_scalar_way() -> None:
    # Crafter's sigmoid is a scalar np.exp per tile; generate_world uses the array np.exp and redoes
    # only tiles close enough to a threshold that a last-bit difference could matter.
    raw = np.array([0.0, 3.0, -2.5])  # tile 0: start == 0.5 exactly
    exact = np.array([1 / (1 + np.exp(-np.float64(v))) for v in raw])
    nudged = exact + np.array([1e-16, 1e-16, 1e-16])
    zeros = np.zeros(3)
    guarded = fast_worldgen._guard_start(raw, nudged, zeros + 5, zeros - 5)
    assert guarded[0] == exact[0] and guarded[1] == nudged[1] and guarded[2] == nudged[2]


# ---------------------------------------------------------------------------------------------
# install()
# ---------------------------------------------------------------------------------------------


def test_install_routes_crafter_env_through_the_fast_generator(crafter_worldgen, monkeypatch) -> None:
    calls = []
    real = fast_worldgen.noise3_grid
    monkeypatch.setattr(fast_worldgen, "noise3_grid", lambda *args: calls.append(1) or real(*args))
    env = crafter.Env(area=(24, 24), seed=0)

    env.reset()
    assert not calls  # not installed: crafter's own generator ran

    fast_worldgen.install()
    fast_worldgen.install()  # idempotent
    assert fast_worldgen.is_installed() and worldgen.generate_world is generate_world
    calls.clear()  # install() may have run its self-check
    env.reset()
    assert calls

    fast_worldgen.uninstall()
    assert worldgen.generate_world is crafter_worldgen and not fast_worldgen.is_installed()
    fast_worldgen.uninstall()  # no-op when not installed
    assert worldgen.generate_world is crafter_worldgen
