"""The user's own modules a generator needs where it runs, and the Ray nodes that cannot import them.

A generator reaches another process pickled by reference to its module (unless cloudpickle ships that module by
value, as ``craftrl train`` does for its config module), and it may import modules when called:
ROCKET-3's ``env_generator`` imports ``rocket_callbacks``, a file beside its launcher. Ray puts the driver's script
directory and working directory on its workers' import path, which is enough on the driver's machine. On another
node those directories exist only if Ray's ``runtime_env`` ships them (``working_dir`` or ``py_modules``,
docs/cluster.md); without it every env process there would fail on its import, over and over. Checking each node
before any worker starts turns that into one line naming the module.

"The user's own" means found on this machine outside the Python installation (its standard library and
site-packages): an installed package is the node's own installation's business, and checked by its import there.
"""

from __future__ import annotations

import dis
import functools
import importlib.util
import site
import sys
import sysconfig
import time
import types
from pathlib import Path
from typing import Any, Callable, Iterable


def imported_names(code: types.CodeType) -> set[str]:
    """Top-level names of the modules ``code`` (and the functions and classes defined in it) imports absolutely."""
    names: set[str] = set()
    instructions = list(dis.get_instructions(code))
    for position, instruction in enumerate(instructions):
        # `import a.b` / `from a.b import c` compile to LOAD_CONST level, LOAD_CONST fromlist, IMPORT_NAME 'a.b';
        # a relative import (level > 0) names a module of the generator's own package
        if instruction.opname == "IMPORT_NAME":
            level = instructions[position - 2] if position >= 2 else None
            if level is None or level.opname != "LOAD_CONST" or level.argval == 0:
                names.add(instruction.argval.split(".")[0])
    for constant in code.co_consts:
        if isinstance(constant, types.CodeType):
            names |= imported_names(constant)
    return names


def generator_module_names(generator: Callable[..., Any]) -> set[str]:
    """Top-level modules that unpickling and calling ``generator`` import: its own module (unless it travels by
    value) and the modules its code imports."""
    while isinstance(generator, functools.partial):
        generator = generator.func
    names: set[str] = set()
    module = getattr(generator, "__module__", None) or type(generator).__module__
    if module and module != "__main__" and not _pickled_by_value(sys.modules.get(module)):
        names.add(module.split(".")[0])
    code = getattr(generator, "__code__", None)
    if code is not None:
        names |= imported_names(code)
    return names


def _pickled_by_value(module: types.ModuleType | None) -> bool:
    if module is None:
        return False
    try:
        from ray.cloudpickle.cloudpickle import _is_registered_pickle_by_value
    except ImportError:  # pragma: no cover - ray is a dependency
        return False
    return _is_registered_pickle_by_value(module)


def _installation_paths() -> list[Path]:
    paths = {sysconfig.get_paths()[key] for key in ("stdlib", "platstdlib", "purelib", "platlib")}
    paths.update(site.getsitepackages())
    paths.add(site.getusersitepackages())
    return [Path(path).resolve() for path in paths]


def module_location(name: str) -> str | None:
    """Where ``name`` is found on this machine's import path (a file or a package directory), or None."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if spec.origin not in (None, "built-in", "frozen"):
        return spec.origin
    locations = list(spec.submodule_search_locations or [])
    return locations[0] if locations else None


def users_own_modules(names: Iterable[str]) -> dict[str, str]:
    """``{name: location}`` of the modules among ``names`` found here outside the Python installation."""
    installed = _installation_paths()
    own = {}
    for name in sorted(set(names)):
        location = module_location(name)
        if location is None:
            continue
        resolved = Path(location).resolve()
        if not any(resolved.is_relative_to(path) for path in installed):
            own[name] = location
    return own


def unimportable(names: Iterable[str]) -> list[str]:
    """The modules among ``names`` this process cannot find on its import path (run on each node)."""
    return [name for name in names if module_location(name) is None]


def missing_module_problems(generators: dict[str, Callable[..., Any]], nodes: dict[str, dict[str, str]],
                            ask_nodes: Callable[[dict[str, list[str]]], dict[str, list[str] | None]]) -> list[str]:
    """One line per generator module that a node cannot import.

    ``generators``: ``{"env_generator": ..., ...}``; ``nodes``: ``{node_id: {"name": ..., "needs": "env_generator
    policy_generator"}}`` (the generators that run there, space-separated); ``ask_nodes({node_id: names})``: for
    each node the names it cannot import, or None when it did not answer (then it is not judged).
    """
    own = {name: users_own_modules(generator_module_names(generator)) for name, generator in generators.items()}
    wanted = {node_id: sorted({module for generator in node["needs"].split() for module in own.get(generator, {})})
              for node_id, node in nodes.items()}
    answers = ask_nodes({node_id: names for node_id, names in wanted.items() if names})
    needed_by: dict[str, list[str]] = {}  # module -> the generators that need it
    for generator, modules in own.items():
        for module in modules:
            needed_by.setdefault(module, []).append(generator)
    lacking_on: dict[str, list[str]] = {}  # module -> the nodes that cannot import it
    for node_id, lacking in answers.items():
        for module in sorted(set(lacking or ()) & needed_by.keys()):
            names = lacking_on.setdefault(module, [])
            if nodes[node_id]["name"] not in names:  # nodes of one machine share its address
                names.append(nodes[node_id]["name"])
    return [f"{' and '.join(needed_by[module])}: need{'s' if len(needed_by[module]) == 1 else ''} module "
            f"{module!r} ({own[needed_by[module][0]][module]} here), which Ray node"
            f"{'s' if len(names) > 1 else ''} {', '.join(names)} cannot import; ship it to the nodes with Ray's "
            "runtime_env (working_dir or py_modules, docs/cluster.md)"
            for module, names in sorted(lacking_on.items())]


def _fits(resources: dict[str, float], cpus: float, gpus: float, custom: dict[str, float] | None) -> bool:
    wanted = {"CPU": cpus, "GPU": gpus, **(custom or {})}
    return all(resources.get(name, 0.0) >= amount for name, amount in wanted.items() if amount > 0)


def nodes_to_check(config: Any, ray_nodes: list[dict[str, Any]], home_node_id: str | None) -> dict[str, dict[str, str]]:
    """The live nodes other than the driver's that can host a rollout worker (env and policy generators run there)
    or a train worker (the policy generator), from ``ray.nodes()``; the driver's node imports what the driver does."""
    rollout, train = config.rollout_config, config.train_config
    checked = {}
    for node in ray_nodes:
        if not node.get("Alive") or node["NodeID"] == home_node_id:
            continue
        resources = node.get("Resources", {})
        needs = []
        if _fits(resources, rollout.num_cpus_per_worker, rollout.num_gpus_per_worker, rollout.resources_per_worker):
            needs += ["env_generator", "policy_generator"]
        elif train.num_workers and _fits(resources, train.num_cpus_per_worker, train.num_gpus_per_worker,
                                         train.resources_per_worker):
            needs.append("policy_generator")
        if needs:
            checked[node["NodeID"]] = {"name": node.get("NodeManagerAddress", node["NodeID"][:8]),
                                       "needs": " ".join(needs)}
    return checked


def problems_on_cluster(env_generator: Callable[[], Any], policy_generator: Callable[[], Any], config: Any,
                        timeout: float = 60.0) -> list[str]:
    """:func:`missing_module_problems` for the nodes of the connected Ray cluster, each asked by a task placed on
    it (no CPU reserved); a node that does not answer within ``timeout`` is not judged."""
    import ray

    from craftrl.placement import current_node_id, on_node

    nodes = nodes_to_check(config, ray.nodes(), current_node_id())
    if not nodes:
        return []
    ask = ray.remote(num_cpus=0, max_retries=0)(unimportable)

    def ask_nodes(requests: dict[str, list[str]]) -> dict[str, list[str] | None]:
        asked = {node_id: ask.options(**on_node(node_id)).remote(names) for node_id, names in requests.items()}
        deadline = time.monotonic() + timeout
        answers: dict[str, list[str] | None] = {}
        for node_id, reference in asked.items():
            try:
                answers[node_id] = ray.get(reference, timeout=max(deadline - time.monotonic(), 0.1))
            except Exception:  # a node that died or is too slow is left to the run's own fault handling
                answers[node_id] = None
        return answers

    return missing_module_problems({"env_generator": env_generator, "policy_generator": policy_generator},
                                   nodes, ask_nodes)
