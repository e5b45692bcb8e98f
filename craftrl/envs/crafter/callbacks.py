"""Callbacks that turn a bare Crafter world into a task, named and shaped like MineStudio's.

Each hook has a no-op default, so a callback overrides only what it needs. Hooks run in list order.
MineStudio concepts map onto Crafter as follows: Minecraft's x/z plane is Crafter's 2-D grid; the
``kill_entity`` / ``mine_block`` / ``craft_item`` counters are Crafter's per-episode achievement
counters (e.g. killing a cow increments ``eat_cow``); ``/give`` commands become inventory edits.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    from craftrl.envs.crafter.sim import CrafterSim

Obs = dict[str, Any]
Info = dict[str, Any]


class CrafterCallback:
    """Base class: override any hook. Hooks return what they received, possibly changed."""

    def after_reset(self, sim: CrafterSim, obs: Obs, info: Info) -> tuple[Obs, Info]:
        return obs, info

    def before_step(self, sim: CrafterSim, action: Any) -> Any:
        return action

    def after_step(self, sim: CrafterSim, obs: Obs, reward: float, terminated: bool, truncated: bool,
                   info: Info) -> tuple[Obs, float, bool, bool, Info]:
        return obs, reward, terminated, truncated, info

    def after_render(self, sim: CrafterSim, image: np.ndarray) -> np.ndarray:
        return image

    def before_close(self, sim: CrafterSim) -> None:
        return None


def _require_keys(spec: Mapping[str, Any], required: Iterable[str], owner: str) -> None:
    if not isinstance(spec, Mapping):
        raise TypeError(f"{owner}: expected each entry to be a dict, got {type(spec).__name__}")
    missing = [key for key in required if key not in spec]
    if missing:
        raise ValueError(f"{owner}: entry {dict(spec)!r} is missing key(s) {missing}")


def _mob_factories() -> dict[str, Any]:
    from crafter import objects

    return {
        "cow": lambda sim, pos: objects.Cow(sim.world, pos),
        "zombie": lambda sim, pos: objects.Zombie(sim.world, pos, sim.player),
        "skeleton": lambda sim, pos: objects.Skeleton(sim.world, pos, sim.player),
    }


class SummonMobsCallback(CrafterCallback):
    """Place mobs on free walkable tiles within ``range_x`` × ``range_z`` tiles of the player at reset.

    Why: Crafter's world generation puts cows only sparsely (on few grass tiles, never within 3 tiles of the
    player); the MineStudio quick-start summons 10 cows within ±5 blocks.
    If fewer free tiles exist than requested, as many as fit are placed; ``info["summoned"]`` tells
    how many of each mob were placed.
    """

    def __init__(self, mobs: Sequence[Mapping[str, Any]]) -> None:
        factories = _mob_factories()
        self.mobs = []
        for spec in mobs:
            _require_keys(spec, ("name", "number", "range_x", "range_z"), "SummonMobsCallback")
            if spec["name"] not in factories:
                raise ValueError(f"SummonMobsCallback: expected name in {sorted(factories)}, got {spec['name']!r}")
            for key in ("range_x", "range_z"):
                low, high = spec[key]
                if low > high:
                    raise ValueError(f"SummonMobsCallback: {key} must be [low, high], got {spec[key]!r}")
            self.mobs.append(dict(spec))
        self._factories = factories

    def after_reset(self, sim: CrafterSim, obs: Obs, info: Info) -> tuple[Obs, Info]:
        summoned = dict(info.get("summoned", {}))
        for spec in self.mobs:
            placed = self._summon(sim, spec)
            summoned[spec["name"]] = summoned.get(spec["name"], 0) + placed
        info = dict(info, summoned=summoned)
        return sim.observe(), info

    def _summon(self, sim: CrafterSim, spec: Mapping[str, Any]) -> int:
        from crafter import constants

        (x_low, x_high), (z_low, z_high) = spec["range_x"], spec["range_z"]
        player_x, player_y = (int(v) for v in sim.player.pos)
        candidates = [(player_x + dx, player_y + dz)
                      for dx in range(int(x_low), int(x_high) + 1)
                      for dz in range(int(z_low), int(z_high) + 1)
                      if (dx, dz) != (0, 0)]
        order = sim.rng.permutation(len(candidates))
        placed = 0
        for index in order:
            if placed >= spec["number"]:
                break
            pos = candidates[index]
            material, occupant = sim.world[pos]
            if material in constants.walkable and occupant is None:
                sim.world.add(self._factories[spec["name"]](sim, np.array(pos)))
                placed += 1
        return placed


# MineStudio event/object names -> Crafter achievement counters.
_EVENT_COUNTERS: dict[str, dict[str, str]] = {
    "kill_entity": {"cow": "eat_cow", "zombie": "defeat_zombie", "skeleton": "defeat_skeleton"},
    "mine_block": {"tree": "collect_wood", "log": "collect_wood", "stone": "collect_stone",
                   "coal": "collect_coal", "coal_ore": "collect_coal", "iron": "collect_iron",
                   "iron_ore": "collect_iron", "diamond": "collect_diamond", "diamond_ore": "collect_diamond",
                   "sapling": "collect_sapling", "water": "collect_drink"},
    "craft_item": {"wood_pickaxe": "make_wood_pickaxe", "wooden_pickaxe": "make_wood_pickaxe",
                   "stone_pickaxe": "make_stone_pickaxe", "iron_pickaxe": "make_iron_pickaxe",
                   "wood_sword": "make_wood_sword", "wooden_sword": "make_wood_sword",
                   "stone_sword": "make_stone_sword", "iron_sword": "make_iron_sword"},
    "use_item": {"stone": "place_stone", "table": "place_table", "crafting_table": "place_table",
                 "furnace": "place_furnace", "sapling": "place_plant"},
}


def _achievement_names() -> list[str]:
    from crafter import constants

    return list(constants.achievements)


class RewardsCallback(CrafterCallback):
    """Replace the step reward with ``reward`` × (increase of the mapped counter), per spec.

    Why counters: Crafter's own reward pays only the first unlock of an achievement, but a kill-cow
    task must pay every kill; ``eat_cow`` counts kills. Each spec pays at most ``max_reward_times``
    times per episode. ``event`` is a MineStudio event (``kill_entity``, ``mine_block``,
    ``craft_item``, ``use_item``) or ``"achievement"`` to name Crafter counters directly.
    ``info["reward_times"][identity]`` is how many times each spec has paid this episode.
    """

    def __init__(self, rewards: Sequence[Mapping[str, Any]]) -> None:
        achievements = set(_achievement_names())
        self.specs = []
        for index, spec in enumerate(rewards):
            _require_keys(spec, ("event", "objects", "reward"), "RewardsCallback")
            event = spec["event"]
            if event != "achievement" and event not in _EVENT_COUNTERS:
                raise ValueError(f"RewardsCallback: expected event in {sorted(_EVENT_COUNTERS) + ['achievement']}, "
                                 f"got {event!r}")
            counters = []
            for name in spec["objects"]:
                counter = name if event == "achievement" else _EVENT_COUNTERS[event].get(name)
                if counter not in achievements:
                    known = sorted(achievements) if event == "achievement" else sorted(_EVENT_COUNTERS[event])
                    raise ValueError(f"RewardsCallback: {event} object {name!r} has no Crafter counterpart; "
                                     f"expected one of {known}")
                counters.append(counter)
            max_times = spec.get("max_reward_times")
            self.specs.append({
                "identity": str(spec.get("identity", f"reward_{index}")),
                "counters": counters,
                "reward": float(spec["reward"]),
                "max_times": None if max_times is None else int(max_times),
            })
        self._previous: dict[str, int] = {}
        self._times: dict[str, int] = {}

    def after_reset(self, sim: CrafterSim, obs: Obs, info: Info) -> tuple[Obs, Info]:
        self._previous = dict(info["achievements"])
        self._times = {spec["identity"]: 0 for spec in self.specs}
        return obs, dict(info, reward_times=dict(self._times))

    def after_step(self, sim: CrafterSim, obs: Obs, reward: float, terminated: bool, truncated: bool,
                   info: Info) -> tuple[Obs, float, bool, bool, Info]:
        counts = info["achievements"]
        reward = 0.0
        for spec in self.specs:
            increase = sum(max(0, counts[c] - self._previous.get(c, 0)) for c in spec["counters"])
            if spec["max_times"] is not None:
                increase = min(increase, spec["max_times"] - self._times[spec["identity"]])
            if increase > 0:
                self._times[spec["identity"]] += increase
                reward += spec["reward"] * increase
        self._previous = dict(counts)
        return obs, reward, terminated, truncated, dict(info, reward_times=dict(self._times))


class JudgeResetCallback(CrafterCallback):
    """End the episode as *truncated* after ``time_limit`` steps.

    Why truncated: a time limit is not a property of the world, so the trainer must bootstrap through
    it (MineStudio reports it as ``terminated``, which biases value estimates near the limit).
    """

    def __init__(self, time_limit: int) -> None:
        if not isinstance(time_limit, (int, np.integer)) or time_limit < 1:
            raise ValueError(f"JudgeResetCallback: expected a positive int time_limit, got {time_limit!r}")
        self.time_limit = int(time_limit)

    def after_step(self, sim: CrafterSim, obs: Obs, reward: float, terminated: bool, truncated: bool,
                   info: Info) -> tuple[Obs, float, bool, bool, Info]:
        if sim.step_count >= self.time_limit and not terminated:
            truncated = True
        return obs, reward, terminated, truncated, info


# Minecraft item ids (as in `/give @p minecraft:<id> <n>`) -> Crafter inventory names.
_MINECRAFT_ITEMS = {"wooden_sword": "wood_sword", "wooden_pickaxe": "wood_pickaxe", "oak_log": "wood",
                    "log": "wood", "cobblestone": "stone", "oak_sapling": "sapling", "iron_ingot": "iron"}


class GiveItemsCallback(CrafterCallback):
    """Put items into the player's inventory at reset: Crafter's stand-in for ``/give`` commands.

    ``items`` maps Crafter inventory names to counts (``{"iron_sword": 1}``); ``commands`` accepts
    MineStudio-style ``"/give @p minecraft:iron_sword 1"`` strings. Counts are clamped to Crafter's
    maximum of 9 per item.
    """

    def __init__(self, items: Mapping[str, int] | None = None, commands: Sequence[str] = ()) -> None:
        from crafter import constants

        wanted = dict(items or {})
        for command in commands:
            name, count = self._parse_give(command)
            wanted[name] = wanted.get(name, 0) + count
        for name, count in wanted.items():
            if name not in constants.items:
                raise ValueError(f"GiveItemsCallback: expected a Crafter item in {sorted(constants.items)}, got {name!r}")
            if not isinstance(count, (int, np.integer)) or count < 0:
                raise ValueError(f"GiveItemsCallback: expected a non-negative int count for {name!r}, got {count!r}")
        self.items = wanted
        self._max = {name: info["max"] for name, info in constants.items.items()}

    @staticmethod
    def _parse_give(command: str) -> tuple[str, int]:
        parts = command.split()
        if len(parts) not in (3, 4) or parts[0] != "/give":
            raise ValueError(f"GiveItemsCallback: expected '/give @p minecraft:<item> [count]', got {command!r}")
        item = parts[2].split(":")[-1]
        return _MINECRAFT_ITEMS.get(item, item), int(parts[3]) if len(parts) == 4 else 1

    def after_reset(self, sim: CrafterSim, obs: Obs, info: Info) -> tuple[Obs, Info]:
        inventory = sim.player.inventory
        for name, count in self.items.items():
            inventory[name] = min(self._max[name], inventory[name] + int(count))
        # The inventory is drawn into the image, so refresh both.
        return sim.observe(), dict(info, inventory=dict(inventory))


class MaskActionsCallback(CrafterCallback):
    """Replace masked actions before they reach the game, like MineStudio's ``MaskActionsCallback``.

    Keywords are Crafter action names; the value is the replacement: ``0``/``False``/``None`` mean
    ``noop``, a string names another action. ``MaskActionsCallback(sleep=0)`` stops the agent from
    sleeping.
    """

    def __init__(self, **masks: Any) -> None:
        from crafter import constants

        names = list(constants.actions)
        self._replacement: dict[int, int] = {}
        for name, value in masks.items():
            if name not in names:
                raise ValueError(f"MaskActionsCallback: expected Crafter action names {names}, got {name!r}")
            target = "noop" if value in (0, False, None) else value
            if target not in names:
                raise ValueError(f"MaskActionsCallback: replacement for {name!r} must be an action name or 0, "
                                 f"got {value!r}")
            self._replacement[names.index(name)] = names.index(target)

    def before_step(self, sim: CrafterSim, action: Any) -> Any:
        if isinstance(action, (int, np.integer)) and not isinstance(action, bool):
            return self._replacement.get(int(action), action)
        return action
