"""craftrl.envs.crafter.fast_step: exact drop-ins for Crafter's step loop and renderers. Pairs of envs,
one on Crafter's own code and one patched, must agree byte for byte, step by step."""

from __future__ import annotations

import multiprocessing
import pickle

import crafter
import numpy as np
import pytest
from crafter import constants, engine, env as crafter_env, objects, worldgen

from craftrl.envs.crafter import fast_step, fast_worldgen

SEEDS = (0, 1, 7, 2024)
ACTIONS = {name: index for index, name in enumerate(constants.actions)}
PATCHED = [(engine.LocalView, "__call__"), (engine.ItemView, "__call__"), (engine.SemanticView, "__call__"),
           (crafter_env.Env, "step"), (crafter_env.Env, "render")]


@pytest.fixture
def crafter_original(monkeypatch: pytest.MonkeyPatch) -> None:
    """Start from Crafter's own step and renderers; whatever crafter held before is restored after.
    World generation is fast_worldgen's for both envs of a pair (it builds the same worlds)."""
    for klass, attr in PATCHED:
        monkeypatch.setattr(klass, attr, klass.__dict__[attr])
    monkeypatch.setattr(worldgen, "generate_world", worldgen.generate_world)
    fast_step.uninstall()
    assert not fast_step.is_installed()
    assert all(klass.__dict__[attr].__module__.startswith("crafter.") for klass, attr in PATCHED)
    fast_worldgen.install()


def _use(fast: bool) -> None:
    if fast:
        fast_step.install()
        assert fast_step.is_installed()
    else:
        fast_step.uninstall()
        assert not fast_step.is_installed()


def _same(a, b) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return (isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.dtype == b.dtype
                and a.shape == b.shape and np.array_equal(a, b))
    if isinstance(a, dict):
        return isinstance(b, dict) and list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def _describe(world) -> list:
    return [(type(o).__name__, tuple(o.pos.tolist()), o.health, o.removed) for o in world.objects]


def _assert_same_state(slow: crafter.Env, fast: crafter.Env) -> None:
    ws, wf = slow._world, fast._world
    assert np.array_equal(ws._mat_map, wf._mat_map)
    assert np.array_equal(ws._obj_map, wf._obj_map)
    assert _describe(ws) == _describe(wf)
    assert _same(ws.random.get_state(), wf.random.get_state())
    assert slow._step == fast._step and ws.daylight == wf.daylight


class _Pair:
    """Two envs built alike: ``slow`` runs Crafter's code, ``fast`` the patched code."""

    def __init__(self, **kwargs) -> None:
        self.slow, self.fast = crafter.Env(**kwargs), crafter.Env(**kwargs)
        self.nights = self.resets = self.sleeping = self.steps = 0

    def call(self, method: str, *args):
        _use(False)
        result_slow = getattr(self.slow, method)(*args)
        _use(True)
        result_fast = getattr(self.fast, method)(*args)
        assert _same(result_slow, result_fast), f"{method}{args} differs at step {self.slow._step}"
        frame = result_fast[0] if method == "step" else result_fast
        if isinstance(frame, np.ndarray):  # the drop-in render lays frames out row-major; Crafter does not
            assert frame.flags.c_contiguous, f"{method}{args}: frame strides {frame.strides}"
        _assert_same_state(self.slow, self.fast)
        return result_slow

    def reset(self, start_step: int = 0) -> None:
        obs = self.call("reset")
        assert obs.dtype == np.uint8 and obs.shape == (*self.slow._size[::-1], 3)
        for env in (self.slow, self.fast):  # start later in the day cycle, e.g. just before night
            env._step = start_step
            env._update_time()
        self.resets += 1

    def play(self, actions, start_step: int = 0) -> None:
        for action in actions:
            _, _, done, _ = self.call("step", int(action))
            self.steps += 1
            self.nights += self.slow._world.daylight < 0.5
            self.sleeping += self.slow._player.sleeping
            if done:
                self.reset(start_step)


@pytest.mark.parametrize("seed", SEEDS)
def test_steps_match_crafter_through_night_and_resets(crafter_original, deterministic_object_hashes,
                                                      seed: int) -> None:
    pair = _Pair(area=(64, 64), view=(9, 9), size=(64, 64), seed=seed, length=260)
    pair.reset(start_step=100)  # night (daylight < 0.5) is about steps 147-273 of the 300-step day
    rng = np.random.default_rng(seed)
    pair.play(rng.integers(len(constants.actions), size=340), start_step=100)
    assert pair.steps == 340 and pair.nights >= 60 and pair.resets >= 2
    # A tail of draws from world.random agrees too.
    assert np.array_equal(pair.slow._world.random.uniform(size=4), pair.fast._world.random.uniform(size=4))


@pytest.mark.parametrize("kwargs", [
    dict(area=(64, 64), view=(9, 9), size=(96, 96)),
    dict(area=(24, 20), view=(9, 9), size=(80, 48)),  # non-square unit; the view crosses the border
    dict(area=(32, 48), view=(7, 11), size=(64, 90)),
])
def test_other_sizes_views_and_areas_match(crafter_original, deterministic_object_hashes, kwargs) -> None:
    pair = _Pair(seed=11, length=260, **kwargs)
    pair.reset(start_step=140)
    pair.play(np.random.default_rng(5).integers(len(constants.actions), size=160), start_step=140)
    assert pair.nights > 50 and pair.resets >= 2
    for size in ((50, 70), (27, 33)):  # render() at other sizes
        pair.call("render", size)


def test_sleep_objects_at_the_border_and_crafting_match(crafter_original, deterministic_object_hashes) -> None:
    pair = _Pair(area=(64, 64), seed=3, length=1000)
    pair.reset(start_step=150)
    for env in (pair.slow, pair.fast):
        env._player.inventory.update(energy=2, sapling=3, wood=9, stone=5)
    pair.play([ACTIONS["sleep"]] * 40)  # asleep at night: the sleep filter over the night noise
    assert pair.sleeping >= 30
    pair.play([ACTIONS["place_table"], ACTIONS["make_wood_pickaxe"], ACTIONS["place_plant"],
               ACTIONS["move_left"], ACTIONS["place_stone"], ACTIONS["do"], ACTIONS["noop"]] * 4)
    # Walk to the world's corner: the view then shows outside tiles, with objects at its edge.
    pair.play([ACTIONS["move_left"], ACTIONS["move_up"]] * 40 + [ACTIONS["noop"]] * 5)
    assert min(pair.slow._player.pos) < 4 or pair.resets


def test_fallbacks_for_foreign_objects_and_far_moves(crafter_original, deterministic_object_hashes,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    class PushyCow(objects.Cow):
        """Not one of Crafter's own classes: it moves another object (the player)."""

        def update(self):
            super().update()
            target = self.world._objects[1].pos + (1, 0)
            if self.world[target][1] is None and self.world[target][0] in constants.walkable:
                self.world.move(self.world._objects[1], target)

    def jump(self, direction):  # the player moves three tiles: beyond the one-tile margin
        directions = dict(left=(-1, 0), right=(+1, 0), up=(0, -1), down=(0, +1))
        self.facing = directions[direction]
        for _ in range(3):
            self.move(self.facing)

    tails = []
    real_tail = fast_step._update_tail
    monkeypatch.setattr(fast_step, "_update_tail", lambda env, snapshot, start: tails.append(start) or
                        real_tail(env, snapshot, start))
    pair = _Pair(area=(64, 64), seed=9, length=1000)
    pair.reset()
    for env in (pair.slow, pair.fast):
        env._sem_view._obj_ids[PushyCow] = max(env._sem_view._obj_ids.values()) + 1
        x, y = env._player.pos
        for pos in ((x + 2, y + 3), (x - 4, y + 1), (x + 6, y - 5)):
            if env._world[pos][1] is None:
                env._world[pos] = "grass"
                env._world.add(PushyCow(env._world, pos))
    moves = [ACTIONS[f"move_{d}"] for d in ("left", "right", "up", "down")]
    rng = np.random.default_rng(2)
    pair.play(rng.choice(moves, size=40))
    assert len(tails) >= 20  # the fast loop handed over to Crafter's at the foreign objects
    for env in (pair.slow, pair.fast):
        for obj in env._world.objects:
            if isinstance(obj, PushyCow):
                env._world.remove(obj)
    tails.clear()
    monkeypatch.setattr(objects.Player, "_move", jump)
    pair.play(rng.choice(moves, size=40))
    assert tails and all(start == 2 for start in tails)  # right after the player (index 1)


def _chunk_contents(world) -> dict:
    return {key: sorted(tuple(obj.pos.tolist()) for obj in members) for key, members in world._chunks.items()}


def test_crowded_cows_on_a_small_world_match_crafter(crafter_original, deterministic_object_hashes,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Cows have their own fast update: crowd them around the player as the cows task does, on a world
    small enough that they walk into its border and across chunks, some with no health left (removed on
    their next update, after which they still draw), and compare every step and the chunk sets."""
    moved, balanced = [], []
    real_cow_update, real_balance = fast_step._cow_update, fast_step._balance_chunks
    monkeypatch.setattr(fast_step, "_cow_update", lambda cow: moved.append(cow) or real_cow_update(cow))
    monkeypatch.setattr(fast_step, "_balance_chunks", lambda env: balanced.append(env) or real_balance(env))
    pair = _Pair(area=(20, 18), view=(9, 9), size=(64, 64), seed=11, length=400)
    pair.reset(start_step=150)  # at night, when zombies spawn
    for env in (pair.slow, pair.fast):
        world, rng = env._world, np.random.default_rng(3)
        for number, (x, y) in enumerate(rng.integers((0, 0), world.area, size=(120, 2)).tolist()):
            if world[(x, y)][1] is None and world[(x, y)][0] in constants.walkable:
                cow = objects.Cow(world, (x, y))
                world.add(cow)
                if number % 9 == 0:
                    cow.health = 0
                    cow.start = tuple(cow.pos.tolist())
    assert sum(isinstance(obj, objects.Cow) for obj in pair.fast._world.objects) >= 40
    made_before = pair.fast._world._craftrl_objects_made
    rng = np.random.default_rng(4)
    for action in rng.integers(len(constants.actions), size=150):
        pair.call("step", int(action))
        assert _chunk_contents(pair.slow._world) == _chunk_contents(pair.fast._world)
    assert len(moved) >= 2000 and any(cow.removed for cow in moved)
    # balancing ran the fast way every 10th step, despawned cows (too many) and spawned zombies
    assert len(balanced) == 15 and all(env is pair.fast for env in balanced)
    despawned = [cow for cow in moved if cow.removed and not hasattr(cow, "start") and cow.health > 0]
    zombies = [obj for obj in pair.fast._world.objects
               if isinstance(obj, objects.Zombie) and obj._craftrl_number > made_before]
    assert despawned and zombies, (len(despawned), len(zombies))
    dead = [cow for cow in moved if hasattr(cow, "start")]
    assert dead and all(cow.removed and tuple(cow.pos.tolist()) == cow.start for cow in dead), "the dead stay"
    xs, ys = zip(*(cow.pos.tolist() for cow in moved))
    assert {min(xs), min(ys)} == {0} and max(xs) == 19 and max(ys) == 17, "cows reached every border"


def test_pickled_env_keeps_working_and_spawned_children_can_install(crafter_original) -> None:
    _use(True)
    env = crafter.Env(seed=4)
    env.reset()
    for action in (1, 2, 3, 5):
        env.step(action)
    clone = pickle.loads(pickle.dumps(env))  # the caches it carries are plain data
    assert _same(clone.render(), env.render())
    for action in (3, 4, 5, 1, 5):  # before the first chunk balancing (step 10)
        assert _same(clone.step(action), env.step(action))

    # A spawned process (how env workers start) imports crafter afresh and installs there.
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    child = context.Process(target=exec, args=(_CHILD, {"queue": queue}))
    child.start()
    installed, digests = queue.get(timeout=60)
    child.join(timeout=60)
    assert child.exitcode == 0 and installed
    _use(False)
    env = crafter.Env(seed=4)
    expected = [_digest(env.reset())] + [_digest(env.step(action)[0]) for action in (1, 2, 3, 5, 1, 5, 0, 2, 3)]
    assert digests == expected


def _digest(image: np.ndarray) -> str:
    import hashlib

    return hashlib.sha256(np.ascontiguousarray(image).tobytes()).hexdigest()


_CHILD = """
import hashlib
import numpy as np
import crafter
from craftrl.envs.crafter import fast_step, fast_worldgen
fast_worldgen.install()
fast_step.install()
env = crafter.Env(seed=4)
images = [env.reset()] + [env.step(action)[0] for action in (1, 2, 3, 5, 1, 5, 0, 2, 3)]
queue.put((fast_step.is_installed(),
           [hashlib.sha256(np.ascontiguousarray(image).tobytes()).hexdigest() for image in images]))
"""


def test_install_is_idempotent_and_uninstall_restores(crafter_original) -> None:
    originals = {(klass, attr): klass.__dict__[attr] for klass, attr in PATCHED}
    fast_step.install()
    fast_step.install()
    assert fast_step.is_installed()
    assert all(klass.__dict__[attr] is not originals[klass, attr] for klass, attr in PATCHED)
    fast_step.uninstall()
    fast_step.uninstall()
    assert not fast_step.is_installed()
    assert all(klass.__dict__[attr] is originals[klass, attr] for klass, attr in PATCHED)


def test_install_refuses_a_crafter_whose_code_differs(crafter_original, monkeypatch) -> None:
    monkeypatch.setitem(fast_step._REFERENCE_SOURCES, "objects.Cow.update", "0" * 16)
    fast_step._check_reference.cache_clear()
    try:
        with pytest.raises(RuntimeError, match="Cow.update"):
            fast_step.install()
        assert not fast_step.is_installed()
    finally:
        fast_step._check_reference.cache_clear()


@pytest.mark.parametrize("factor", [0.4, 0.0])  # Crafter's night and sleep filters
def test_colour_filter_tables_match_pil_on_every_colour(factor: float) -> None:
    from PIL import Image, ImageEnhance

    assert fast_step._pil_color_matches()
    reds = np.arange(256, dtype=np.uint8)
    for red_block in np.split(reds, 16):  # 16 x 65536 colours per image, every colour once
        greens, blues = np.meshgrid(reds, reds, indexing="ij")
        image = np.stack(np.broadcast_arrays(red_block[:, None, None], greens[None], blues[None]), axis=-1)
        image = np.ascontiguousarray(image.reshape(len(red_block) * 256, 256, 3))
        expected = np.array(ImageEnhance.Color(Image.fromarray(image)).enhance(factor))
        assert np.array_equal(fast_step._pil_color(image, factor), expected)


def test_daylight_tiles_are_lit_like_the_whole_canvas(crafter_original) -> None:
    """Lighting only the distinct tiles in view, asleep or awake, gives Crafter's floats for the whole view;
    a view class that lights its own way, or night noise, gets Crafter's path."""
    fast_step.install()
    env = crafter.Env(seed=5)
    env.reset()
    view = env._local_view
    tiles = fast_step._tiles_for(view, 7, 7)
    for material in (1, 2, 3):  # a few object-over-material tiles too
        assert tiles.blend("cow", material) is not None
    rng = np.random.default_rng(0)
    for daylight in (0.5, 0.61, 0.999, 1.0):
        for sleeping in (False, True):
            ids = rng.integers(0, len(tiles.tiles), size=(9, 7))
            expected = view._light(fast_step._layout(tiles.tiles, ids), daylight)
            if sleeping:
                expected = view._sleep(expected)
            assert _same(fast_step._lit_view(view, tiles, ids, daylight, sleeping), expected)

    class Brighter(engine.LocalView):
        def _light(self, canvas, daylight):
            return canvas * 2.0

    own = Brighter(env._world, env._textures, [9, 7])
    assert not fast_step._own_lighting(own) and fast_step._own_lighting(view)
    ids = rng.integers(0, len(tiles.tiles), size=(9, 7))
    assert _same(fast_step._lit_view(own, tiles, ids, 0.9, False), fast_step._layout(tiles.tiles, ids) * 2.0)
    state = env._world.random.get_state()
    night = fast_step._lit_view(view, tiles, ids, 0.2, False)
    env._world.random.set_state(state)
    assert _same(night, view._light(fast_step._layout(tiles.tiles, ids), 0.2))
