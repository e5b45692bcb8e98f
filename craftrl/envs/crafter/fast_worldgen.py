"""Vectorised Crafter world generation that reproduces ``crafter.worldgen`` exactly.

Crafter builds every world with ``crafter.worldgen.generate_world``, which walks the grid tile by
tile and evaluates OpenSimplex 3-D noise (``opensimplex`` 0.3, pure Python) lazily through
``worldgen._simplex``: about 27k scalar ``noise3d`` calls per 64x64 world, most of the cost of an
``env.reset()``.

This module has two parts:

* ``noise3_grid``: OpenSimplex 3-D noise (Kurt Spencer's public-domain algorithm) evaluated for
  whole arrays of points with numpy. Every arithmetic step is done in the same float64 order as the
  scalar reference, and the lattice contributions are summed in the same order, so the values are
  bit-for-bit those of ``opensimplex.OpenSimplex(seed).noise3d`` 0.3, not merely close.
* ``generate_world``: a drop-in for ``crafter.worldgen.generate_world``. It draws the noise seed the
  same way, evaluates each noise field the tile rules consult in one batch over all the tiles that
  may consult it, decides every tile whose material needs no random number with array masks, and
  replays the random draws of the remaining tiles (and of the object pass) in Crafter's x-then-y
  order, drawing exactly when Crafter's short-circuiting ``and`` would. The material map, the objects and ``world.random``
  afterwards are identical to Crafter's.

``install()`` makes ``crafter.Env`` use it (``crafter.env`` calls ``worldgen.generate_world`` through
the module attribute, so patching ``crafter.worldgen.generate_world`` is enough).
"""

from __future__ import annotations

import functools
import operator
from typing import Any, Callable

import numpy as np

__all__ = ["generate_world", "install", "is_installed", "noise3_grid", "uninstall"]

# ---------------------------------------------------------------------------------------------
# OpenSimplex 3-D noise.
# ---------------------------------------------------------------------------------------------

# Constants of the 3-D algorithm: the skew onto the simplectic honeycomb ("stretch"), its inverse
# ("squish") and the normalisation that maps the summed contributions to about [-1, 1].
_STRETCH = -1.0 / 6
_SQUISH = 1.0 / 3
_NORM = 103

# The 24 gradients: the vertices of a skewed rhombicuboctahedron, in the reference order (the
# permutation table selects among them by ``perm % 24``).
_GRADIENTS = np.array([
    (-11, 4, 4), (-4, 11, 4), (-4, 4, 11),
    (11, 4, 4), (4, 11, 4), (4, 4, 11),
    (-11, -4, 4), (-4, -11, 4), (-4, -4, 11),
    (11, -4, 4), (4, -11, 4), (4, -4, 11),
    (-11, 4, -4), (-4, 11, -4), (-4, 4, -11),
    (11, 4, -4), (4, 11, -4), (4, 4, -11),
    (-11, -4, -4), (-4, -11, -4), (-4, -4, -11),
    (11, -4, -4), (4, -11, -4), (4, -4, -11),
], dtype=np.float64)

# 64-bit LCG (Knuth's MMIX constants) that shuffles the permutation table from the seed.
_LCG_MUL = 6364136223846793005
_LCG_INC = 1442695040888963407
_U64 = (1 << 64) - 1


def _lcg_step(state: int) -> int:
    """One LCG step with signed 64-bit wrap-around (the value is used as a signed integer)."""
    state = (state * _LCG_MUL + _LCG_INC) & _U64
    return state - (1 << 64) if state >> 63 else state


@functools.lru_cache(maxsize=256)
def _tables(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The seed's permutation of 0..255 and, per hash value, the gradient it selects ((3, 256))."""
    state = int(seed)
    for _ in range(3):
        state = _lcg_step(state)
    pool = list(range(256))
    perm = [0] * 256
    # Fisher-Yates from the top: slot i takes a random element of the first i + 1 still in the pool.
    for i in range(255, -1, -1):
        state = _lcg_step(state)
        pick = (state + 31) % (i + 1)  # Python's % is already non-negative for a positive divisor
        perm[i] = pool[pick]
        pool[pick] = pool[i]
    perm_arr = np.array(perm, dtype=np.int64)
    # Gradient components per final hash value, one row per axis: (3, 256).
    gradients = np.ascontiguousarray(_GRADIENTS[perm_arr % len(_GRADIENTS)].T)
    perm_arr.setflags(write=False)
    gradients.setflags(write=False)
    return perm_arr, gradients


# The lattice vertices whose contributions are summed for a point, beyond its two "extra" ones,
# per region of the rhombohedral super-cell, in the order the reference adds them. Each vertex is
# its offset from the cell origin; the sum of the offsets is its layer.
_NEAR_CORNER_VERTICES = ((0, 0, 0), (1, 0, 0), (0, 1, 0), (0, 0, 1))  # coordinate sum <= 1
_FAR_CORNER_VERTICES = ((1, 1, 0), (1, 0, 1), (0, 1, 1), (1, 1, 1))  # coordinate sum >= 2
_OCTAHEDRON_VERTICES = ((1, 0, 0), (0, 1, 0), (0, 0, 1), (1, 1, 0), (1, 0, 1), (0, 1, 1))
_EYE = np.eye(3, dtype=np.int64)
_ONES = np.ones(3, dtype=np.int64)
# For a single axis k, the other two axes in x, y, z order.
_OTHER_AXES = np.array([(1, 2), (0, 2), (0, 1)], dtype=np.int64)


def _axes_of(code: np.ndarray) -> np.ndarray:
    """Bit code (1 = x, 2 = y, 4 = z) -> (n, 3) 0/1 integer array of the axes it names."""
    return (code[:, None] >> np.arange(3)) & 1


def _first_axis_in(code: np.ndarray) -> np.ndarray:
    """Index of the first axis (x, then y, then z) whose bit is set in ``code``."""
    return np.where(code & 1, 0, np.where(code & 2, 1, 2))


def _first_axis_not_in(code: np.ndarray) -> np.ndarray:
    """Index of the first axis (x, then y, then z) whose bit is clear in ``code``."""
    return _first_axis_in(~code)


class _ExtraVertices:
    """The two extra lattice vertices of each of ``n`` points, beyond the ones of its region.

    Extra vertex ``v`` of point ``i`` sits at ``pre[v, :, i] + post[v, :, i]`` from the cell origin
    and lies on lattice layer ``layer[v, i]`` (the sum of its offsets); its displacement on an axis is
    ``((d0 - pre) - layer * squish) - post``. ``post`` is almost always 0, but in two cases the
    reference subtracts part of the integer offset after the squish term, which can round
    differently, so it is kept apart to stay bit-exact.
    """

    def __init__(self, n: int) -> None:
        self.pre = np.zeros((2, 3, n), np.int64)
        self.post = np.zeros((2, 3, n), np.int64)
        self.layer = np.zeros((2, n), np.int64)
        self.any_post = False

    def put(self, rows: np.ndarray, slot: int, pre: Any, layer: int, post: Any = None) -> None:
        """Set vertex ``slot`` of the points ``rows``; offsets are (3,) or (len(rows), 3) arrays."""
        pre = np.asarray(pre)
        self.pre[slot][:, rows] = pre.T if pre.ndim == 2 else pre.reshape(-1, 1)
        if post is not None:
            self.post[slot][:, rows] = np.asarray(post).T
            self.any_post = True
        self.layer[slot, rows] = layer


def _near_corner_extras(ax: np.ndarray, ay: np.ndarray, az: np.ndarray, total: np.ndarray) -> _ExtraVertices:
    """Extra vertices for points in the tetrahedron at (0,0,0); arguments are in-cell coordinates."""
    # The two closest of (1,0,0), (0,1,0), (0,0,1) as (bit code, score); z may displace x or y.
    z_for_b = (ax >= ay) & (az > ay)
    z_for_a = (ax < ay) & (az > ax)
    a_code = np.where(z_for_a, 4, 1)
    a_score = np.where(z_for_a, az, ax)
    b_code = np.where(z_for_b, 4, 2)
    b_score = np.where(z_for_b, az, ay)
    origin_score = 1 - total
    origin_close = (origin_score > a_score) | (origin_score > b_score)

    extra = _ExtraVertices(ax.size)
    # (0,0,0) among the closest two: the nearer of a and b names one axis k; the extras step +1 on
    # k and -1 on each of the two other axes in turn (layer 0).
    rows = np.flatnonzero(origin_close)
    if rows.size:
        k = _first_axis_in(np.where(b_score > a_score, b_code, a_code)[rows])
        others = _OTHER_AXES[k]
        extra.put(rows, 0, _EYE[k] - _EYE[others[:, 0]], 0)
        extra.put(rows, 1, _EYE[k] - _EYE[others[:, 1]], 0)
    # Otherwise a and b together name two axes: the extras are their (1,1,0)-type vertex (layer 2)
    # and the vertex stepping +1 on both and -1 on the third (layer 1).
    rows = np.flatnonzero(~origin_close)
    if rows.size:
        axes = _axes_of((a_code | b_code)[rows])
        extra.put(rows, 0, axes, 2)
        extra.put(rows, 1, 2 * axes - 1, 1)
    return extra


def _far_corner_extras(ax: np.ndarray, ay: np.ndarray, az: np.ndarray, total: np.ndarray) -> _ExtraVertices:
    """Extra vertices for points in the tetrahedron at (1,1,1); arguments are in-cell coordinates."""
    # The two closest of (1,1,0), (1,0,1), (0,1,1), each scored by the coordinate it has no 1 in.
    z_for_b = (ax <= ay) & (az < ay)
    z_for_a = (ax > ay) & (az < ax)
    a_code = np.where(z_for_a, 3, 6)
    a_score = np.where(z_for_a, az, ax)
    b_code = np.where(z_for_b, 3, 5)
    b_score = np.where(z_for_b, az, ay)
    corner_score = 3 - total
    corner_close = (corner_score < a_score) | (corner_score < b_score)

    extra = _ExtraVertices(ax.size)
    # (1,1,1) among the closest two: the nearer of a and b names two axes p < q; the extras are
    # 2p + q and p + 2q (layer 3). When the axis that gets the 2 is y, the reference subtracts its
    # second unit after the squish term.
    rows = np.flatnonzero(corner_close)
    if rows.size:
        code = np.where(b_score < a_score, b_code, a_code)[rows]
        p = _first_axis_in(code)
        q = _first_axis_in(code & ~(1 << p))
        for slot, (two, one) in enumerate(((p, q), (q, p))):
            late = (two == 1)[:, None] * _EYE[1]
            extra.put(rows, slot, 2 * _EYE[two] + _EYE[one] - late, 3, late)
    # Otherwise a and b share a single axis k: the extras are e_k (layer 1) and 2 e_k (layer 2).
    rows = np.flatnonzero(~corner_close)
    if rows.size:
        axes = _axes_of((a_code & b_code)[rows])
        extra.put(rows, 0, axes, 1)
        extra.put(rows, 1, 2 * axes, 2)
    return extra


def _octahedron_extras(ax: np.ndarray, ay: np.ndarray, az: np.ndarray, total: np.ndarray) -> _ExtraVertices:
    """Extra vertices for points in the octahedron between the two tetrahedra (``total`` unused)."""

    def closer(pair_sum: np.ndarray, far_code: int, near_code: int):
        far = pair_sum > 1
        return np.where(far, pair_sum - 1, 1 - pair_sum), np.where(far, far_code, near_code), far

    # Closest of (1,1,0) / (0,0,1), of (1,0,1) / (0,1,0), and of (0,1,1) / (1,0,0); the third
    # candidate replaces whichever of the first two is further, if it is closer still (the kept
    # scores are not updated).
    a_score, a_code, a_far = closer(ax + ay, 3, 4)
    b_score, b_code, b_far = closer(ax + az, 5, 2)
    c_score, c_code, c_far = closer(ay + az, 6, 1)
    into_a = (a_score <= b_score) & (a_score < c_score)
    into_b = (a_score > b_score) & (b_score < c_score)
    a_code = np.where(into_a, c_code, a_code)
    a_far = np.where(into_a, c_far, a_far)
    b_code = np.where(into_b, c_code, b_code)
    b_far = np.where(into_b, c_far, b_far)

    extra = _ExtraVertices(ax.size)
    # Both on the (1,1,1) side: (1,1,1) itself (layer 3) and 2 along their shared axis (layer 2).
    rows = np.flatnonzero(a_far & b_far)
    if rows.size:
        extra.put(rows, 0, _ONES, 3)
        extra.put(rows, 1, 2 * _EYE[_first_axis_in((a_code & b_code)[rows])], 2)
    # Both on the (0,0,0) side: (0,0,0) (layer 0) and -1 on the axis neither uses, +1 on the others
    # (layer 1).
    rows = np.flatnonzero(~a_far & ~b_far)
    if rows.size:
        extra.put(rows, 1, _ONES - 2 * _EYE[_first_axis_not_in((a_code | b_code)[rows])], 1)
    # One each side: a (1,1,-1)-type vertex from the far one (layer 1), and 2 along the near one's
    # axis (layer 2), an integer step the reference applies after the squish term.
    rows = np.flatnonzero(a_far != b_far)
    if rows.size:
        far_code = np.where(a_far, a_code, b_code)[rows]
        near_code = np.where(a_far, b_code, a_code)[rows]
        extra.put(rows, 0, _ONES - 2 * _EYE[_first_axis_not_in(far_code)], 1)
        extra.put(rows, 1, 0, 2, 2 * _EYE[_first_axis_in(near_code)])
    return extra


class _Cells:
    """Per-point cell data of a set of points: the lattice cell and the displacement from it."""

    def __init__(self, cell: tuple, d0: tuple, perm: np.ndarray, gradients: np.ndarray) -> None:
        self.cell, self.d0, self.perm, self.gradients = cell, d0, perm, gradients

    def contribution(self, pre, layer, post=None) -> np.ndarray:
        """Falloff-weighted gradient ramp of the lattice vertex at ``pre + post`` (per axis, each
        a number or a per-point array) from every point; 0 where the vertex is out of reach."""
        shift = layer * _SQUISH
        d = [(d0 - p) - shift for d0, p in zip(self.d0, pre)]
        if post is not None:
            d = [di - q for di, q in zip(d, post)]
            pre = [p + q for p, q in zip(pre, post)]
        dx, dy, dz = d
        falloff = ((2 - dx * dx) - dy * dy) - dz * dz
        perm = self.perm
        lx, ly, lz = ((c + p) & 0xFF for c, p in zip(self.cell, pre))
        hashed = (perm[(perm[lx] + ly) & 0xFF] + lz) & 0xFF
        g = self.gradients[:, hashed]
        ramp = (g[0] * dx + g[1] * dy) + g[2] * dz
        f2 = falloff * falloff
        return np.where(falloff > 0, (f2 * f2) * ramp, 0.0)


def noise3_grid(seed: int, xs: np.ndarray, ys: np.ndarray, z: float | np.ndarray) -> np.ndarray:
    """OpenSimplex 3-D noise of ``opensimplex.OpenSimplex(seed)`` at the points ``(xs, ys, z)``.

    ``xs``, ``ys`` and ``z`` broadcast against each other (``z`` is usually one number); the result
    has their broadcast shape and equals ``noise3d`` of opensimplex 0.3 at every point, bit for bit.
    """
    perm, gradients = _tables(int(seed))
    x, y, zz = np.broadcast_arrays(np.asarray(xs, np.float64), np.asarray(ys, np.float64),
                                   np.asarray(z, np.float64))
    shape = x.shape
    x, y, zz = x.ravel(), y.ravel(), zz.ravel()

    # Skew onto the honeycomb, find the super-cell and the point's place in it.
    stretch = (x + y + zz) * _STRETCH
    sx, sy, sz = x + stretch, y + stretch, zz + stretch
    cx, cy, cz = np.floor(sx), np.floor(sy), np.floor(sz)
    fx, fy, fz = sx - cx, sy - cy, sz - cz
    total = fx + fy + fz
    squish = (cx + cy + cz) * _SQUISH
    # Displacement from the cell origin, in input space.
    d0 = (x - (cx + squish), y - (cy + squish), zz - (cz + squish))
    cell = (cx.astype(np.int64), cy.astype(np.int64), cz.astype(np.int64))

    value = np.zeros(x.size)
    near = total <= 1
    far = total >= 2
    regions = ((near, _NEAR_CORNER_VERTICES, _near_corner_extras),
               (far, _FAR_CORNER_VERTICES, _far_corner_extras),
               (~near & ~far, _OCTAHEDRON_VERTICES, _octahedron_extras))
    for members, vertices, find_extras in regions:
        rows = np.flatnonzero(members)
        if not rows.size:
            continue
        cells = _Cells(tuple(c[rows] for c in cell), tuple(d[rows] for d in d0), perm, gradients)
        extra = find_extras(fx[rows], fy[rows], fz[rows], total[rows])
        # Sequential sum in the reference's order: the region's vertices, then the two extras.
        acc = np.zeros(rows.size)
        for vertex in vertices:
            acc = acc + cells.contribution(vertex, sum(vertex))
        for slot in range(2):
            post = extra.post[slot] if extra.any_post else None
            acc = acc + cells.contribution(extra.pre[slot], extra.layer[slot], post)
        value[rows] = acc
    return (value / _NORM).reshape(shape)


# ---------------------------------------------------------------------------------------------
# World generation.
# ---------------------------------------------------------------------------------------------


class _NoiseBatch:
    """Collects noise lookups of one seed and evaluates them all in a single ``noise3_grid`` call."""

    def __init__(self, seed: int) -> None:
        self._seed = seed
        self._parts: list[tuple[np.ndarray, np.ndarray, float]] = []
        self._results: list[np.ndarray] | None = None

    def octaves(self, x: np.ndarray, y: np.ndarray, z: float, sizes: Any, normalize: bool = True):
        """Queue ``worldgen._simplex(simplex, x, y, z, sizes, normalize)``; returns a getter."""
        if not isinstance(sizes, dict):
            sizes = {sizes: 1}
        first = len(self._parts)
        for size in sizes:
            self._parts.append((x / size, y / size, z))
        weights = list(sizes.values())

        def get() -> np.ndarray:
            assert self._results is not None, "evaluate() the batch first"
            # The same float operations as _simplex: value = 0; value += weight * noise; value /= sum.
            value = 0.0
            for offset, weight in enumerate(weights):
                value = value + weight * self._results[first + offset]
            if normalize:
                value = value / sum(weights)
            return value

        return get

    def evaluate(self) -> None:
        xs = np.concatenate([np.ravel(p[0]) for p in self._parts])
        ys = np.concatenate([np.ravel(p[1]) for p in self._parts])
        zs = np.concatenate([np.full(np.size(p[0]), float(p[2])) for p in self._parts])
        values = noise3_grid(self._seed, xs, ys, zs)
        bounds = np.cumsum([0] + [np.size(p[0]) for p in self._parts])
        self._results = [values[lo:hi].reshape(np.shape(p[0]))
                         for p, lo, hi in zip(self._parts, bounds[:-1], bounds[1:])]


class _Uniforms:
    """Replays ``rng.uniform()`` draws in order, fetched in bulk where that is provably the same.

    For a plain ``np.random.RandomState``, ``uniform()`` (low 0, high 1) is ``0 + 1 * next_double``,
    i.e. exactly the next value of ``random_sample``. So a phase that needs at most ``upper`` draws
    takes that many ahead of time; ``finish()`` rewinds the generator and advances it by exactly the
    number actually consumed, leaving the state as if each draw had been a ``uniform()`` call. Any
    other generator is simply called once per draw.
    """

    def __init__(self, rng: Any) -> None:
        self._rng = rng
        self._bulk = type(rng) is np.random.RandomState
        self._saved = rng.get_state() if self._bulk else None
        self._used = 0
        self._ahead: Any = None
        self._upper = 0

    def take(self, upper: int) -> Callable[[], float]:
        """A zero-argument function returning the next draw; call it at most ``upper`` times, then
        ``sync()`` (or ``finish()``) before the next ``take``."""
        if not self._bulk:
            return self._rng.uniform
        self._rng.set_state(self._saved)
        ahead = self._rng.random_sample(self._used + upper)[self._used:]
        self._ahead, self._upper = iter(ahead.tolist()), upper
        return self._ahead.__next__

    def sync(self) -> None:
        """Count the draws handed out since the last ``take``."""
        if self._ahead is not None:
            self._used += self._upper - operator.length_hint(self._ahead)
            self._ahead = None

    def finish(self) -> None:
        """Leave the generator exactly as if every draw handed out had been a ``uniform()`` call."""
        self.sync()
        if self._bulk:
            self._rng.set_state(self._saved)
            if self._used:
                self._rng.random_sample(self._used)


# Rule codes (bit flags) of the tiles whose outcome needs random draws: material pass, object pass.
_TREE = 1
_COAL = 2
_IRON = 4
_DIAMOND = 8
_LAVA = 16
_COW = 1
_ZOMBIE = 2
_SKELETON = 4


def generate_world(world: Any, player: Any) -> None:
    """Drop-in for ``crafter.worldgen.generate_world``: fills ``world`` (a ``crafter.engine.World``
    right after ``reset`` with ``player`` added) with the same materials and objects as Crafter's
    generator, and leaves ``world.random`` in the same state."""
    from crafter import constants, objects

    rng = world.random
    seed = rng.randint(0, 2 ** 31 - 1)  # the same draw Crafter makes for its OpenSimplex seed
    width, height = world.area
    gx, gy = np.meshgrid(np.arange(width, dtype=np.int64), np.arange(height, dtype=np.int64),
                         indexing="ij")
    x, y = gx.astype(np.float64), gy.astype(np.float64)
    px, py = player.pos[0], player.pos[1]
    dist_sq = (gx - px) ** 2 + (gy - py) ** 2

    # Fields every tile needs.
    batch = _NoiseBatch(seed)
    start_noise = batch.octaves(x, y, 8, 3)
    water_noise = batch.octaves(x, y, 3, {15: 1, 5: 0.15}, False)
    mountain_noise = batch.octaves(x, y, 0, {15: 1, 5: 0.3})
    batch.evaluate()

    raw_start = (4 - np.sqrt(dist_sq)) + 2 * start_noise()
    start = 1 / (1 + np.exp(-raw_start))
    water = water_noise() + 0.1
    mountain = mountain_noise()
    start = _guard_start(raw_start, start, water, mountain)
    water = water - 2 * start
    mountain = mountain - (4 * start + 0.3 * water)

    grass = start > 0.5
    hills = ~grass & (mountain > 0.15)
    lowland = ~grass & ~hills

    # Fields only some tiles consult; evaluated only there (noise is pointwise, so this is exact).
    batch = _NoiseBatch(seed)
    hx, hy = x[hills], y[hills]
    lx, ly = x[lowland], y[lowland]
    cave_noise = batch.octaves(hx, hy, 6, 7)
    htunnel_noise = batch.octaves(2 * hx, hy / 5, 7, 3)
    vtunnel_noise = batch.octaves(hx / 5, 2 * hy, 7, 3)
    coal_noise = batch.octaves(hx, hy, 1, 8)
    iron_noise = batch.octaves(hx, hy, 2, 6)
    lava_noise = batch.octaves(hx, hy, 6, 5)
    sand_noise = batch.octaves(lx, ly, 4, 9)
    tree_noise = batch.octaves(lx, ly, 5, 7)
    batch.evaluate()

    ids = {name: _material_id(world, name) for name in (
        "grass", "path", "coal", "iron", "diamond", "lava", "stone", "sand", "water", "tree")}
    mat = np.full(world.area, ids["grass"], np.uint8)
    tunnels = np.zeros(world.area, bool)
    # Per-tile rule codes for the tiles whose outcome depends on random draws, x-then-y order.
    codes = np.zeros(world.area, np.int64)

    # Hills: cave, horizontal tunnel, vertical tunnel, then the ores that need draws.
    m_hill = mountain[hills]
    cave = (cave_noise() > 0.15) & (m_hill > 0.3)
    htunnel = ~cave & (htunnel_noise() > 0.4)
    vtunnel = ~cave & ~htunnel & (vtunnel_noise() > 0.4)
    rest = ~cave & ~htunnel & ~vtunnel
    hill_mat = np.full(m_hill.shape, ids["stone"], np.uint8)
    hill_mat[cave | htunnel | vtunnel] = ids["path"]
    tunnels[hills] = htunnel | vtunnel
    coal_ok = coal_noise() > 0
    iron_ok = iron_noise() > 0.4
    diamond_ok = m_hill > 0.18
    lava_ok = (m_hill > 0.3) & (lava_noise() > 0.35)
    # Tiles where at least one ore rule draws are decided in the replay below; the others fall
    # straight through to lava or stone.
    drawn = rest & (coal_ok | iron_ok | diamond_ok)
    hill_mat[rest & ~drawn & lava_ok] = ids["lava"]
    hill_codes = np.where(drawn, _COAL * coal_ok + _IRON * iron_ok + _DIAMOND * diamond_ok
                          + _LAVA * lava_ok, 0)
    mat[hills] = hill_mat
    codes[hills] = hill_codes

    # Lowland: sand, water, else grassland whose trees need a draw.
    w_low = water[lowland]
    sand = (0.25 < w_low) & (w_low <= 0.35) & (sand_noise() > -0.2)
    lake = ~sand & (0.3 < w_low)
    low_mat = np.full(w_low.shape, ids["grass"], np.uint8)
    low_mat[sand] = ids["sand"]
    low_mat[lake] = ids["water"]
    codes[lowland] = np.where(~sand & ~lake & (tree_noise() > 0), _TREE, 0)
    mat[lowland] = low_mat

    uniforms = _Uniforms(rng)
    flat = np.flatnonzero(codes)
    code_list = codes.ravel()[flat].tolist()
    draw = uniforms.take(_count_flags(codes, _TREE, _COAL, _IRON, _DIAMOND))
    chosen = []
    tree, grass_id = ids["tree"], ids["grass"]
    coal, iron, diamond, lava, stone = (ids[k] for k in ("coal", "iron", "diamond", "lava", "stone"))
    for code in code_list:
        if code == _TREE:
            chosen.append(tree if draw() > 0.8 else grass_id)
        elif code & _COAL and draw() > 0.85:
            chosen.append(coal)
        elif code & _IRON and draw() > 0.75:
            chosen.append(iron)
        elif code & _DIAMOND and draw() > 0.994:
            chosen.append(diamond)
        elif code & _LAVA:
            chosen.append(lava)
        else:
            chosen.append(stone)
    uniforms.sync()
    mat.ravel()[flat] = chosen
    world._mat_map[...] = mat

    # Objects: Crafter's _set_object rules over the finished material map, same order and draws.
    walkable = np.isin(mat, [_material_id(world, name) for name in constants.walkable])
    dist = np.sqrt(dist_sq)
    on_grass = mat == ids["grass"]
    obj_codes = walkable * (_COW * ((dist > 3) & on_grass) + _ZOMBIE * (dist > 10)
                            + _SKELETON * ((mat == ids["path"]) & tunnels))
    flat = np.flatnonzero(obj_codes)
    code_list = obj_codes.ravel()[flat].tolist()
    draw = uniforms.take(_count_flags(obj_codes, _COW, _ZOMBIE, _SKELETON))
    spawns = []
    for index, code in zip(flat.tolist(), code_list):
        if code & _COW and draw() > 0.985:
            spawns.append((objects.Cow, index, False))
        elif code & _ZOMBIE and draw() > 0.993:
            spawns.append((objects.Zombie, index, True))
        elif code & _SKELETON and draw() > 0.95:
            spawns.append((objects.Skeleton, index, True))
    uniforms.finish()
    for cls, index, needs_player in spawns:
        pos = (index // height, index % height)
        world.add(cls(world, pos, player) if needs_player else cls(world, pos))


def _count_flags(codes: np.ndarray, *flags: int) -> int:
    """How many of ``flags`` are set, summed over all tiles: an upper bound on the draws."""
    return int(sum(np.count_nonzero(codes & flag) for flag in flags))


def _material_id(world: Any, name: str) -> int:
    """The world's id of a material, registering it the way ``World.__setitem__`` would."""
    if name not in world._mat_ids:
        world._mat_ids[name] = len(world._mat_ids)
    return world._mat_ids[name]


def _guard_start(raw: np.ndarray, start: np.ndarray, water0: np.ndarray,
                 mountain0: np.ndarray) -> np.ndarray:
    """Redo Crafter's scalar ``np.exp`` sigmoid on tiles whose outcome sits on a threshold.

    Crafter computes ``1 / (1 + np.exp(-start))`` one tile at a time. The array ``np.exp`` is the same
    ufunc loop and gives the same bits on the platforms checked, but should a SIMD kernel ever round
    an array element differently from a lone scalar, only a tile within a hair of a threshold could
    decide differently; those few tiles are recomputed the scalar way, which makes the result
    independent of that question.
    """
    water = water0 - 2 * start
    mountain = mountain0 - (4 * start + 0.3 * water)
    eps = 1e-9
    near = np.abs(start - 0.5) < eps
    for t in (0.25, 0.3, 0.35):
        near |= np.abs(water - t) < eps
    for t in (0.15, 0.18, 0.3):
        near |= np.abs(mountain - t) < eps
    if near.any():
        start = start.copy()
        for index in zip(*np.nonzero(near)):
            start[index] = 1 / (1 + np.exp(-np.float64(raw[index])))
    return start


# ---------------------------------------------------------------------------------------------
# Installation into crafter.
# ---------------------------------------------------------------------------------------------

_original: Callable[[Any, Any], None] | None = None


def install() -> None:
    """Make ``crafter.Env`` (and anything else calling ``crafter.worldgen.generate_world``) use the
    fast generator. Idempotent. Checks first that the installed opensimplex computes the noise this
    module reproduces (opensimplex 0.3), and refuses otherwise."""
    global _original
    from crafter import worldgen

    if worldgen.generate_world is generate_world:
        return
    _check_reference()
    _original = worldgen.generate_world
    worldgen.generate_world = generate_world


def uninstall() -> None:
    """Restore the generator that ``install()`` replaced (no-op if not installed)."""
    from crafter import worldgen

    if worldgen.generate_world is generate_world and _original is not None:
        worldgen.generate_world = _original


def is_installed() -> bool:
    from crafter import worldgen

    return worldgen.generate_world is generate_world


@functools.lru_cache(maxsize=1)
def _check_reference() -> None:
    import opensimplex

    reference = opensimplex.OpenSimplex(seed=12345)
    noise = getattr(reference, "noise3d", None) or reference.noise3
    points = [(0.0, 0.0, 0.0), (1.3, -2.7, 8.0), (5.1, 0.4, 3.0), (-7.25, 3.5, 6.0), (40.2, 63.0, 7.0)]
    ours = noise3_grid(12345, *(np.array(v) for v in zip(*points)))
    theirs = np.array([noise(*p) for p in points])
    if not np.array_equal(ours, theirs):
        raise RuntimeError(
            "fast_worldgen reproduces opensimplex 0.3; the installed opensimplex "
            f"{getattr(opensimplex, '__version__', '?')} computes different noise, so it cannot be installed")
