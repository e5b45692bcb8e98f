"""Faster Crafter stepping and rendering with bit-identical results.

After ``fast_worldgen`` made resets cheap, ``crafter.Env.step`` dominates an env's CPU time. Most of it is
Python overhead in code that does little work per call:

* ``LocalView.__call__`` draws the 9x7 tiles of the local view one ``World.__getitem__`` and one
  ``_draw`` at a time, then walks every object of the world (tens to hundreds) to alpha-draw the
  few in view;
* ``ItemView.__call__`` alpha-blends two textures per held item, every step, although the
  inventory rarely changes;
* ``SemanticView.__call__`` writes every object into a copy of the material map one by one;
* ``Env.step`` computes ``player.distance(obj)`` (a few numpy calls) for every object of the world
  to decide which ones to update;
* ``LocalView._light`` (every step) and ``_sleep`` pass the canvas through PIL and back.

This module replaces those four methods with drop-ins that compute the same bytes with fewer Python
operations:

* the tile layer is one fancy index into a per-unit stack of tiles, built by Crafter's own
  ``Textures.get`` and ``_draw``, laid out with one transpose/reshape;
* the objects in view are read from the world's object map (``World._obj_map``, the index of the
  object on each tile) instead of by scanning all objects. An object covers exactly its own tile and
  no two objects share a tile, so what Crafter's ``_draw_alpha`` leaves there depends only on the
  material underneath and the object's texture: that tile is drawn once with Crafter's
  ``_draw_alpha``, appended to the stack, and indexed like a material from then on;
* lighting and the sleep filter do Crafter's ``_light`` / ``_sleep`` / ``_tint`` arithmetic in the same
  order, night noise (and its draws from ``world.random``) is Crafter's own ``_noise``, and PIL's
  colour filter (``ImageEnhance.Color``: an image -> array round trip) is two table lookups: PIL's
  integer RGB -> L formula and a 256 x 256 table of its blend, made by PIL itself and checked against
  PIL once per process. Each of these acts on every pixel alone except the noise, so in daylight
  (no noise) only the few distinct tiles in view are lit, then laid out;
* the item view is a pure function of the unit and the inventory's items in order: rendered by
  Crafter's own ``ItemView.__call__`` on first sight of an inventory, then served from a cache;
* the semantic map writes all objects at once through the object map and a per-index table of the
  objects' semantic ids (an index always names the same object, so its type never changes; the table
  is rebuilt when the world is reset or ``SemanticView._obj_ids`` is replaced, not when that dict is
  edited in place after objects of a class it maps were seen);
* ``Env.step`` updates the same objects in the same order: those within Manhattan distance
  ``2 * max(view)`` of the player *when their turn comes*, in ascending index order (the order of
  ``World.objects``). The candidates are found with numpy in the object map around the player's
  position before the loop, with a margin of one tile because the player (normally the first object)
  moves at most one tile in its own update; each candidate is then tested exactly as Crafter tests it.
  This relies on Crafter's objects moving only themselves, so it is used only for objects whose class
  is one of Crafter's own with Crafter's own ``update``; on any other object, or should the player
  move more than one tile, the rest of the step falls back to Crafter's loop over the snapshot taken at
  the start of the step, so the result stays Crafter's;
* in that loop, a cow (exactly Crafter's ``Cow``) is updated by ``_cow_update``: Crafter's update with the
  same draws from ``world.random`` (``random_sample`` for ``uniform``: the same double) and its move done
  on Python ints. Cows are most of the objects the cows task updates each step;
* the creature balancing of every 10th step (``_balance_chunks``) counts each chunk's grass and path tiles
  with one ``reduceat`` per material instead of a numpy mask and sum in each of its 75 calls, and is
  otherwise Crafter's code with the same draws. It is used when the env's
  class has Crafter's own ``_balance_chunk`` and ``_balance_object``.

Everything else in ``Env.step`` is Crafter's code, unchanged.

``Env.render`` is replaced too, for the layout of its result rather than its speed: Crafter returns a
transposed view of a (width, height) canvas, the drop-in the same pixels in a row-major (height, width)
array (``_env_render``), so consumers downstream (inference, fragment encoding) read contiguous frames.

The caches are per renderer instance (in its ``__dict__``), plain data that pickles with the env.

``install()`` patches these five methods on crafter's classes (process-local, idempotent); it first
checks that the installed crafter's versions of the code it replaces and relies on are the ones it was
written against (crafter 1.8.3) and refuses with ``RuntimeError`` otherwise. ``uninstall()`` restores
them. tests/envs/test_fast_step.py compares patched and unpatched envs step by step.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
from typing import Any, Callable

import numpy as np

__all__ = ["install", "is_installed", "uninstall"]

# Per-instance caches live in the instance's __dict__ under this name.
_CACHE = "_craftrl_fast_step"
# Item-view renders kept per ItemView; the cache is emptied when it grows past this many.
_ITEM_CACHE_SIZE = 512


# ---------------------------------------------------------------------------------------------
# LocalView
# ---------------------------------------------------------------------------------------------


class _Tiles:
    """One unit size's tiles as Crafter draws them: each material's, then each object-over-material seen so far.

    ``tiles[i]`` is one tile; ``i < outside`` is a material id, ``outside`` the grey of positions outside the
    world, and higher indices are objects drawn over a material (``blend``)."""

    def __init__(self, view: Any, u0: int, u1: int) -> None:
        from crafter import engine

        self.textures = view._textures
        self.names = view._world._mat_names
        self.unit = np.array((u0, u1))
        self.ok = True
        count = max(self.names) + 1 if self.names else 0
        # Index ``count`` is the tile left for positions outside the world (Crafter's 127 grey).
        stack = np.zeros((count + 1, u0, u1, 3), np.uint8) + 127
        for index in range(count):
            if index not in self.names:  # Crafter would raise a KeyError: leave it to Crafter
                self.ok = False
                break
            texture = self.textures.get(self.names[index], self.unit)
            if texture.shape[:2] != (u0, u1):
                self.ok = False
                break
            engine._draw(stack[index], (0, 0), texture)
        self.tiles = stack
        self.outside = count
        self.blends: dict[tuple[Any, int], int] = {}

    def blend(self, name: Any, material: int) -> int | None:
        """The index of the tile Crafter's ``_draw_alpha`` leaves when drawing ``name`` over ``material``'s tile."""
        key = (name, material)
        index = self.blends.get(key)
        if index is None:
            from crafter import engine

            texture = self.textures.get(name, self.unit)
            tile = self.tiles[material].copy()
            if texture.shape[:2] != tile.shape[:2]:
                return None
            engine._draw_alpha(tile, (0, 0), texture)
            index = self.blends[key] = len(self.tiles)
            self.tiles = np.concatenate([self.tiles, tile[None]])
        return index


def _tiles_for(view: Any, u0: int, u1: int) -> _Tiles:
    caches = view.__dict__.get(_CACHE)
    if caches is None:
        caches = view.__dict__[_CACHE] = {}
    tiles = caches.get((u0, u1))
    if tiles is None or tiles.textures is not view._textures or tiles.names is not view._world._mat_names:
        tiles = caches[(u0, u1)] = _Tiles(view, u0, u1)
    return tiles


def _local_view_call(self, player, unit):
    """Drop-in for ``crafter.engine.LocalView.__call__``."""
    unit_arr = np.array(unit)
    world = self._world
    if (unit_arr.shape != (2,) or unit_arr.dtype.kind not in "iu" or unit_arr.min() < 1
            or self._grid.shape != (2,) or tuple(self._area.tolist()) != world._mat_map.shape):
        return _original("LocalView.__call__")(self, player, unit)
    u0, u1 = int(unit_arr[0]), int(unit_arr[1])
    tiles = _tiles_for(self, u0, u1)
    if not tiles.ok:
        return _original("LocalView.__call__")(self, player, unit)
    self._unit = unit_arr
    self._center = np.array(player.pos)
    g0, g1 = self._grid.tolist()
    cx, cy = self._center.tolist()
    ox, oy = self._offset.tolist()
    a0, a1 = world._mat_map.shape
    # The view covers world tiles [wx, wx + g0) x [wy, wy + g1); [x0, x1) x [y0, y1) is inside the world.
    wx, wy = cx - ox, cy - oy
    x0, x1, y0, y1 = max(wx, 0), min(wx + g0, a0), max(wy, 0), min(wy + g1, a1)
    ids = np.full((g0, g1), tiles.outside, np.intp)
    inside = x0 < x1 and y0 < y1
    if inside:
        window = world._mat_map[x0:x1, y0:y1]
        if int(window.max()) >= tiles.outside:  # a material id Crafter has no name for
            return _original("LocalView.__call__")(self, player, unit)
        ids[x0 - wx:x1 - wx, y0 - wy:y1 - wy] = window
        occupied = world._obj_map[x0:x1, y0:y1]
        xs, ys = np.nonzero(occupied)
        if xs.size:
            indices = occupied[xs, ys].tolist()
            xs, ys = (xs + (x0 - wx)).tolist(), (ys + (y0 - wy)).tolist()
            objects = world._objects
            for index, x, y in zip(indices, xs, ys):
                obj = objects[index]
                if obj is None:  # the object map and the object list disagree: let Crafter draw
                    return _original("LocalView.__call__")(self, player, unit)
                tile = tiles.blend(obj.texture, int(ids[x, y]))
                if tile is None:
                    return _original("LocalView.__call__")(self, player, unit)
                ids[x, y] = tile
    return _lit_view(self, tiles, ids, world.daylight, player.sleeping)


def _layout(tiles: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """The view of tile ``ids[x, y]`` at each grid position: (g0, g1) tiles -> a (g0 * u0, g1 * u1, 3) canvas."""
    g0, g1 = ids.shape
    _, u0, u1, channels = tiles.shape
    return tiles[ids].transpose(0, 2, 1, 3, 4).reshape(g0 * u0, g1 * u1, channels)


def _lit_view(view: Any, tiles: _Tiles, ids: np.ndarray, daylight: float, sleeping: bool) -> np.ndarray:
    """The canvas Crafter's ``LocalView`` returns: tiles laid out, lit, and filtered while the player sleeps.

    Lighting and the sleep filter act on each pixel alone, except the night noise, which draws a random
    value per pixel. So while there is no noise (daylight >= 0.5), only the few distinct tiles in view
    are lit and then laid out, which gives the same floats as lighting the whole canvas; at night the
    whole canvas goes through Crafter's own code."""
    if daylight < 0.5 or not _own_lighting(view):
        canvas = view._light(_layout(tiles.tiles, ids), daylight)
        return view._sleep(canvas) if sleeping else canvas
    present = np.zeros(len(tiles.tiles), np.bool_)
    present[ids] = True
    distinct = np.flatnonzero(present)
    position = np.empty(len(present), np.intp)
    position[distinct] = np.arange(len(distinct))
    lit = _light_and_sleep(view, tiles.tiles[distinct], daylight, sleeping)
    return _layout(lit, position[ids])


# ---------------------------------------------------------------------------------------------
# Lighting and the sleep filter
# ---------------------------------------------------------------------------------------------

# Crafter's night and sleep filters: (PIL colour factor, tint colour, tint amount).
_NIGHT_FILTER = (0.4, (0, 16, 64), 0.5)
_SLEEP_FILTER = (0.0, (0, 0, 16), 0.5)


@functools.lru_cache(maxsize=1)
def _own_filters() -> tuple[Callable, Callable, Callable]:
    """Crafter's ``LocalView._light``, ``_sleep`` and ``_tint``, as checked by ``install()``."""
    from crafter import engine

    return engine.LocalView._light, engine.LocalView._sleep, engine.LocalView._tint


@functools.lru_cache(maxsize=4)
def _blend_table(factor: float) -> np.ndarray:
    """``table[gray, value]``: the byte PIL's ``Image.blend(gray, value, factor)`` makes, for all 256 x 256 pairs.

    Made by PIL itself, so it holds whatever rounding PIL's blend uses."""
    from PIL import Image

    grays = np.repeat(np.arange(256, dtype=np.uint8)[:, None], 256, axis=1)
    return np.asarray(Image.blend(Image.fromarray(grays), Image.fromarray(np.ascontiguousarray(grays.T)), factor))


def _gray(rgb: np.ndarray) -> np.ndarray:
    """PIL's RGB -> L conversion (ITU-R 601-2 luma in 16-bit fixed point, rounded), as int32."""
    rgb = rgb.astype(np.int32)
    return (rgb[..., 0] * 19595 + rgb[..., 1] * 38470 + rgb[..., 2] * 7471 + 0x8000) >> 16


def _pil_color(rgb: np.ndarray, factor: float) -> np.ndarray:
    """``np.array(ImageEnhance.Color(Image.fromarray(rgb)).enhance(factor))`` for a uint8 RGB array."""
    return _blend_table(factor)[_gray(rgb)[..., None], rgb]


@functools.lru_cache(maxsize=1)
def _pil_color_matches() -> bool:
    """Whether ``_pil_color`` reproduces the installed PIL: checked once per process, on the 256 greys and 4096
    random colours (tests/envs/test_fast_step.py checks every colour)."""
    from PIL import Image, ImageEnhance

    rng = np.random.default_rng(0)
    probe = np.concatenate([np.repeat(np.arange(256, dtype=np.uint8)[:, None], 3, axis=1)[None],
                            rng.integers(0, 256, size=(1, 4096, 3), dtype=np.uint8)], axis=1)
    for factor in (_NIGHT_FILTER[0], _SLEEP_FILTER[0]):
        expected = np.array(ImageEnhance.Color(Image.fromarray(probe)).enhance(factor))
        if not np.array_equal(_pil_color(probe, factor), expected):
            return False
    return True


def _own_lighting(view: Any) -> bool:
    """Whether ``view`` lights with Crafter's own code (not a subclass's) and PIL matches the tables."""
    klass = type(view)
    return (klass._light, klass._sleep, klass._tint) == _own_filters() and _pil_color_matches()


def _colour_filter(view: Any, pixels: np.ndarray, spec: tuple[float, tuple[int, int, int], float]) -> np.ndarray:
    """Crafter's PIL colour filter then ``view._tint``, as ``_light`` (night) and ``_sleep`` apply them."""
    factor, color, amount = spec
    return view._tint(_pil_color(pixels.astype(np.uint8), factor), color, amount)


def _light_and_sleep(view: Any, pixels: np.ndarray, daylight: float, sleeping: bool) -> np.ndarray:
    """Crafter's ``LocalView._light(pixels, daylight)`` without night noise (daylight >= 0.5), then ``_sleep``
    when the player sleeps: the same arithmetic in the same order, with PIL's colour filter as table lookups
    (cheaper than PIL's image round trip on the few distinct tiles of a daylight view)."""
    pixels = daylight * pixels + (1 - daylight) * _colour_filter(view, pixels, _NIGHT_FILTER)
    return _colour_filter(view, pixels, _SLEEP_FILTER) if sleeping else pixels


# ---------------------------------------------------------------------------------------------
# ItemView
# ---------------------------------------------------------------------------------------------


def _item_view_call(self, inventory, unit):
    """Drop-in for ``crafter.engine.ItemView.__call__``: Crafter's render, cached per inventory."""
    original = _original("ItemView.__call__")
    unit_arr = np.asarray(unit)
    try:
        items = tuple(inventory.items())
    except AttributeError:
        return original(self, inventory, unit)
    # Only exact ints as amounts: 1 == 1.0 == True as keys, but Crafter draws them differently.
    if unit_arr.dtype.kind not in "iu" or not all(type(amount) is int for _, amount in items):
        return original(self, inventory, unit)
    key = (unit_arr.shape, unit_arr.tobytes(), items)
    cache = self.__dict__.get(_CACHE)
    if cache is None or cache[0] is not self._textures or cache[1] is not self._grid:
        cache = self.__dict__[_CACHE] = (self._textures, self._grid, {})
    renders = cache[2]
    canvas = renders.get(key)
    if canvas is None:
        canvas = original(self, inventory, unit)
        if len(renders) >= _ITEM_CACHE_SIZE:
            renders.clear()
        renders[key] = canvas.copy()
        return canvas
    return canvas.copy()


# ---------------------------------------------------------------------------------------------
# SemanticView
# ---------------------------------------------------------------------------------------------


def _semantic_view_call(self):
    """Drop-in for ``crafter.engine.SemanticView.__call__``."""
    world = self._world
    objects = world._objects
    cache = self.__dict__.get(_CACHE)
    if cache is None or cache[0] is not objects or cache[1] is not self._obj_ids:
        # The semantic id of the object at each index of this world's object list (-1: none Crafter
        # can write), filled for the first cache[3] indices.
        cache = self.__dict__[_CACHE] = [objects, self._obj_ids, np.full(64, -1, np.int64), 0]
    table, filled = cache[2], cache[3]
    if filled < len(objects):
        if len(table) < len(objects):
            grown = np.full(2 * len(objects), -1, np.int64)
            grown[:filled] = table[:filled]
            table = cache[2] = grown
        obj_ids = self._obj_ids
        for index in range(filled, len(objects)):
            obj = objects[index]
            if obj is not None:  # an object already removed is on no tile: its entry is never read
                value = obj_ids.get(type(obj), -1)
                table[index] = value if 0 <= value <= 255 else -1
        cache[3] = len(objects)
    occupied = world._obj_map
    where = np.nonzero(occupied)
    values = table[occupied[where]]
    if values.size and values.min() < 0:  # an object Crafter cannot encode (it raises): let it
        return _original("SemanticView.__call__")(self)
    canvas = world._mat_map.copy()
    canvas[where] = values
    return canvas


# ---------------------------------------------------------------------------------------------
# Env.step
# ---------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def _own_updates() -> dict[type, Callable]:
    """Crafter's object classes with their own ``update``: each moves at most itself."""
    from crafter import objects

    return {cls: cls.update for cls in (objects.Player, objects.Cow, objects.Zombie, objects.Skeleton,
                                        objects.Arrow, objects.Plant, objects.Fence)}


def _update_objects(env: Any) -> None:
    """``for obj in world.objects: if player.distance(obj) < 2 * max(view): obj.update()``."""
    world, player = env._world, env._player
    snapshot = list(world._objects)  # the objects Crafter's loop visits: the non-None ones, in order
    radius = int(2 * max(env._view))
    own = _own_updates()
    cow_class = _crafter_env.objects.Cow
    px, py = player.pos.tolist()
    omap = world._obj_map
    a0, a1 = omap.shape
    # Candidates: objects within radius (not radius - 1) of the player's position now, so that a
    # player that moves one tile in its own update still finds everything in range.
    x0, x1, y0, y1 = max(px - radius, 0), min(px + radius + 1, a0), max(py - radius, 0), min(py + radius + 1, a1)
    near = omap[x0:x1, y0:y1]
    xs, ys = np.nonzero(near)
    indices = near[xs, ys]
    xs = xs + (x0 - px)
    ys = ys + (y0 - py)
    keep = np.abs(xs) + np.abs(ys) <= radius
    indices, xs, ys = indices[keep], xs[keep], ys[keep]
    order = np.argsort(indices)
    cx, cy = 0, 0  # the player's position relative to (px, py)
    for index, dx, dy in zip(indices[order].tolist(), xs[order].tolist(), ys[order].tolist()):
        obj = snapshot[index]
        cls = type(obj)
        if obj is None or own.get(cls) is not cls.update:
            return _update_tail(env, snapshot, index)
        if abs(dx - cx) + abs(dy - cy) < radius:
            if cls is cow_class:
                _cow_update(obj)
            else:
                obj.update()
        if obj is player:
            nx, ny = player.pos.tolist()
            cx, cy = nx - px, ny - py
            if abs(cx) + abs(cy) > 1:
                return _update_tail(env, snapshot, index + 1)
    return None


# Object.all_dirs, in its order: the index drawn by Object.random_dir picks from it.
_DIRECTIONS = ((-1, 0), (+1, 0), (0, -1), (0, +1))


def _cow_update(cow: Any) -> None:
    """``Cow.update`` (crafter 1.8.3): the same draws from ``world.random`` and the same effect.

    Cows are most of the objects updated each step on the cows task (10 summoned beside the player), and
    Crafter's version is slow for what it does: ``uniform()`` costs many times what ``random_sample()`` does for
    the same double from the same stream (``uniform`` computes ``0.0 + 1.0 * random_sample()``), and
    ``Object.move`` / ``World.move`` build numpy arrays and tuples per try. Here the free-tile test (inside the area,
    no object there, a walkable material) and the move run on Python ints; the object map, chunk sets and ``pos`` (a
    fresh int64 array) end as Crafter leaves them. A removed cow still draws, as in Crafter, and does not move."""
    world = cow.world
    if cow.inventory["health"] <= 0:
        world.remove(cow)
    random = cow.random
    if random.random_sample() >= 0.5:
        return
    dx, dy = _DIRECTIONS[random.randint(0, 4)]
    x, y = cow.pos.tolist()
    tx, ty = x + dx, y + dy
    area_x, area_y = world.area
    if not (0 <= tx < area_x and 0 <= ty < area_y) or cow.removed:
        return
    obj_map = world._obj_map
    if world._objects[obj_map[tx, ty]] is not None or world._mat_names[world._mat_map[tx, ty]] not in cow.walkable:
        return
    obj_map[tx, ty] = obj_map[x, y]
    obj_map[x, y] = 0
    old_chunk, new_chunk = world.chunk_key((x, y)), world.chunk_key((tx, ty))
    if old_chunk != new_chunk:
        world._chunks[old_chunk].remove(cow)
        world._chunks[new_chunk].add(cow)
    cow.pos = np.array((tx, ty))


def _update_tail(env: Any, snapshot: list, start: int) -> None:
    """Crafter's own loop over the step's object snapshot, from list index ``start`` on."""
    player, view = env._player, env._view
    for obj in snapshot[start:]:
        if obj and player.distance(obj) < 2 * max(view):
            obj.update()


def _own_balancing(env_class: type) -> bool:
    """Whether ``env_class`` balances creatures with Crafter's own methods (a subclass may override them)."""
    crafter_env = _crafter_env.Env
    return (env_class._balance_chunk is crafter_env._balance_chunk
            and env_class._balance_object is crafter_env._balance_object)


def _chunk_counts(world: Any, material: str) -> np.ndarray:
    """Tiles of ``material`` per chunk, indexed ``[xmin // chunk width, ymin // chunk height]``."""
    (width, height), (area_x, area_y) = world._chunk_size, world.area
    tiles = (world._mat_map == world._mat_ids[material]).astype(np.int32)
    per_row_of_chunks = np.add.reduceat(tiles, np.arange(0, area_x, width), axis=0)
    return np.add.reduceat(per_row_of_chunks, np.arange(0, area_y, height), axis=1)


def _balance_chunks(env: Any) -> None:
    """``for chunk, objs in world.chunks.items(): env._balance_chunk(chunk, objs)`` (crafter 1.8.3), exactly.

    Every 10th step Crafter balances zombies, skeletons and cows in each chunk, and each of those 75 calls
    (25 chunks on the default 64x64 world) counted the chunk's grass or path tiles with a numpy mask and sum. The
    counts cannot change during the pass (balancing adds and removes creatures only), so they come from one
    ``reduceat`` per material up front. The rest is Crafter's code in Crafter's order, with the same draws
    (``random_sample`` for ``uniform``, the same double), and the same live sets of objects, to which an earlier call
    may have added."""
    world, objects = env._world, _crafter_env.objects
    light = world.daylight
    grass, path = _chunk_counts(world, "grass"), _chunk_counts(world, "path")
    width, height = world._chunk_size
    for chunk, objs in world.chunks.items():
        cell = chunk[0] // width, chunk[2] // height
        space = grass[cell]
        _balance_object(env, chunk, objs, objects.Zombie, "grass", 6, 0, 0.3, 0.4,
                        lambda pos: objects.Zombie(world, pos, env._player),
                        0 if space < 50 else 3.5 - 3 * light, 3.5 - 3 * light)
        _balance_object(env, chunk, objs, objects.Skeleton, "path", 7, 7, 0.1, 0.1,
                        lambda pos: objects.Skeleton(world, pos, env._player),
                        0 if path[cell] < 6 else 1, 2)
        _balance_object(env, chunk, objs, objects.Cow, "grass", 5, 5, 0.01, 0.1,
                        lambda pos: objects.Cow(world, pos),
                        0 if space < 30 else 1, 1.5 + light)


def _balance_object(env: Any, chunk: tuple, objs: set, cls: type, material: str, span_dist: int,
                    despan_dist: int, spawn_prob: float, despawn_prob: float, ctor: Callable,
                    target_min: float, target_max: float) -> None:
    """``Env._balance_object`` with the chunk's tile count already applied to its target function."""
    xmin, xmax, ymin, ymax = chunk
    world = env._world
    random = world.random
    creatures = [obj for obj in objs if isinstance(obj, cls)]
    if len(creatures) < int(target_min) and random.random_sample() < spawn_prob:
        mask = world.mask(*chunk, material)
        xs = np.tile(np.arange(xmin, xmax)[:, None], [1, ymax - ymin])
        ys = np.tile(np.arange(ymin, ymax)[None, :], [xmax - xmin, 1])
        xs, ys = xs[mask], ys[mask]
        i = random.randint(0, len(xs))
        pos = np.array((xs[i], ys[i]))
        empty = world[pos][1] is None
        away = env._player.distance(pos) >= span_dist
        if empty and away:
            world.add(ctor(pos))
    elif len(creatures) > int(target_max) and random.random_sample() < despawn_prob:
        obj = creatures[random.randint(0, len(creatures))]
        away = env._player.distance(obj.pos) >= despan_dist
        if away:
            world.remove(obj)


def _env_render(self, size=None):
    """Drop-in for ``crafter.Env.render``: the same pixels, laid out in row-major (C) order.

    Crafter fills a (width, height) canvas and returns its transposed view, so every frame left the env as
    a strided array, and each consumer paid for the transpose again (fragment encoding and batched inference,
    in the rollout worker). Writing the transposed views straight into an (height, width) canvas here costs
    less than those gathers did. The local view is float64 until this assignment, as in Crafter."""
    size = size or self._size
    unit = size // self._view
    local_view = self._local_view(self._player, unit)
    item_view = self._item_view(self._player.inventory, unit)
    x, y = (size - unit * self._view) // 2
    width, local_height = local_view.shape[:2]
    item_height = item_view.shape[1]
    canvas = np.zeros((size[1], size[0], 3), np.uint8)
    canvas[y:y + local_height, x:x + width] = local_view.transpose(1, 0, 2)
    canvas[y + local_height:y + local_height + item_height, x:x + width] = item_view.transpose(1, 0, 2)
    return canvas


def _env_step(self, action):
    """Drop-in for ``crafter.Env.step`` (crafter 1.8.3): the object loop is ``_update_objects``."""
    self._step += 1
    self._update_time()
    self._player.action = _crafter_env.constants.actions[action]
    _update_objects(self)
    if self._step % 10 == 0:
        if _own_balancing(type(self)):
            _balance_chunks(self)
        else:
            for chunk, objs in self._world.chunks.items():
                self._balance_chunk(chunk, objs)
    obs = self._obs()
    reward = (self._player.health - self._last_health) / 10
    self._last_health = self._player.health
    unlocked = {
        name for name, count in self._player.achievements.items()
        if count > 0 and name not in self._unlocked}
    if unlocked:
        self._unlocked |= unlocked
        reward += 1.0
    dead = self._player.health <= 0
    over = self._length and self._step >= self._length
    done = dead or over
    info = {
        'inventory': self._player.inventory.copy(),
        'achievements': self._player.achievements.copy(),
        'discount': 1 - float(dead),
    }
    # The whole-world map is a copy of the world's material map per step; CrafterSim(semantic_map=False) never reads it.
    if not getattr(self, 'craftrl_skip_semantic', False):
        info['semantic'] = self._sem_view()
    info['player_pos'] = self._player.pos
    info['reward'] = reward
    if not self._reward:
        reward = 0.0
    return obs, reward, done, info


# ---------------------------------------------------------------------------------------------
# Installation into crafter.
# ---------------------------------------------------------------------------------------------

# What install() replaces: (module, class, attribute) -> drop-in.
_PATCHES: dict[tuple[str, str, str], Callable] = {
    ("crafter.engine", "LocalView", "__call__"): _local_view_call,
    ("crafter.engine", "ItemView", "__call__"): _item_view_call,
    ("crafter.engine", "SemanticView", "__call__"): _semantic_view_call,
    ("crafter.env", "Env", "step"): _env_step,
    ("crafter.env", "Env", "render"): _env_render,
}

# SHA-256 (first 16 hex digits) of crafter 1.8.3's source of the code replaced above and of the code
# the drop-ins rely on behaving as it does there (object map bookkeeping, objects moving only
# themselves, the drawing helpers).
_REFERENCE_SOURCES = {
    "engine.LocalView.__call__": "009028100db2f386",
    "engine.ItemView.__call__": "0b0a83ed7ae8fff5",
    "engine.SemanticView.__call__": "acb055d9999ec60e",
    "env.Env.step": "854cce6a1fb41be6",
    "env.Env.render": "c38369e2b91b7950",
    "engine.World.add": "71e03b9ec6f267b5",
    "engine.World.remove": "f5cda0035a2da66e",
    "engine.World.move": "191e8662cb1914e6",
    "engine.World.objects": "70cfec303b46f619",
    "engine.Textures.get": "c5fde7e052e5df69",
    "engine.LocalView._light": "097a50f6d8d8a046",
    "engine.LocalView._sleep": "cc1af773b05a9d41",
    "engine.LocalView._tint": "7d8c5db80d95f9f5",
    "engine._draw": "cde1b16f1290e5ad",
    "engine._draw_alpha": "10093f101328266b",
    "objects.Object.move": "01bb86512a6cb4e7",
    "objects.Object.is_free": "a2cec420049ded27",
    "objects.Object.random_dir": "7fbac1a93a4754c5",
    "objects.Object.all_dirs": "92484a2979d364ee",
    "objects.Object.walkable": "1814c9f36f207bc4",
    "objects.Object.health": "4ac7f6bbed054c54",
    "engine.World.__getitem__": "215ace2b0a89102b",
    "engine._inside": "ceffebd24e2c5215",
    "engine.World.chunk_key": "1fb6cd11f8a11884",
    "engine.World.chunks": "384609fff8ed2c1c",
    "engine.World.mask": "b8c3454d7cb968e9",
    "env.Env._balance_chunk": "214519e3386e69cb",
    "env.Env._balance_object": "727c7663e0679ed5",
    "objects.Player.update": "8564d4e1c231d6c1",
    "objects.Player._move": "05bf5e9459c1563d",
    "objects.Player._do_object": "3b37d06d5d4c0ad1",
    "objects.Player._place": "79ebb5b31a020394",
    "objects.Cow.update": "650d37a81ac8b63c",
    "objects.Zombie.update": "476cb1adc6a5e5eb",
    "objects.Skeleton.update": "a338ba2d1122f21f",
    "objects.Skeleton._shoot": "0516ebb4e161e7be",
    "objects.Arrow.update": "599a6ad3ac28d06c",
    "objects.Plant.update": "32b5a9e0be4c15b5",
    "objects.Fence.update": "51c987fe392fe9e7",
}

# crafter.env, whose module globals _env_step reads as Crafter's step does; set by install().
_crafter_env: Any = None

# Crafter's own versions of the patched methods, by "Class.attribute", saved by install().
_originals: dict[str, Callable] = {}


def _original(name: str) -> Callable:
    """Crafter's own version of a patched method, e.g. ``_original("ItemView.__call__")``."""
    return _originals[name]


def _source_digest(path: str) -> str:
    import importlib

    module_name, *attrs = path.split(".")
    target: Any = importlib.import_module(f"crafter.{module_name}")
    for attr in attrs:
        target = inspect.getattr_static(target, attr) if isinstance(target, type) else getattr(target, attr)
    if isinstance(target, property):
        target = target.fget
    return hashlib.sha256(inspect.getsource(target).encode()).hexdigest()[:16]


@functools.lru_cache(maxsize=1)
def _check_reference() -> None:
    mismatched = []
    for path, digest in _REFERENCE_SOURCES.items():
        try:
            ours = _source_digest(path)
        except (OSError, TypeError, AttributeError):
            ours = None
        if ours != digest:
            mismatched.append(path)
    if mismatched:
        import importlib.metadata

        try:
            version = importlib.metadata.version("crafter")
        except importlib.metadata.PackageNotFoundError:  # pragma: no cover
            version = "?"
        raise RuntimeError(
            f"fast_step reproduces crafter 1.8.3; the installed crafter {version} differs in {mismatched}, "
            "so it cannot be installed")


def _class(module: str, cls: str) -> type:
    import importlib

    return getattr(importlib.import_module(module), cls)


def install() -> None:
    """Patch crafter's ``LocalView``, ``ItemView``, ``SemanticView``, ``Env.step`` and ``Env.render`` with the
    exact drop-ins of this module. Idempotent and process-local; raises ``RuntimeError`` (and patches
    nothing) if the installed crafter's code is not the code the drop-ins reproduce."""
    global _crafter_env
    if is_installed():
        return
    _check_reference()
    _own_updates()  # Crafter's update methods as checked, before anything else can patch them
    _own_filters()
    from crafter import env as _crafter_env
    for (module, cls, attr), function in _PATCHES.items():
        klass = _class(module, cls)
        current = klass.__dict__[attr]
        if current is not function:
            _originals[f"{cls}.{attr}"] = current
            setattr(klass, attr, function)


def uninstall() -> None:
    """Restore what ``install()`` replaced (no-op if not installed)."""
    for (module, cls, attr), function in _PATCHES.items():
        klass = _class(module, cls)
        original = _originals.get(f"{cls}.{attr}")
        if klass.__dict__.get(attr) is function and original is not None:
            setattr(klass, attr, original)


def is_installed() -> bool:
    return all(_class(module, cls).__dict__.get(attr) is function
               for (module, cls, attr), function in _PATCHES.items())
