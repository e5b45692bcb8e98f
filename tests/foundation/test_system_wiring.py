"""The run's actors are named, started and looked up in one module (craftrl/system.py)."""

from __future__ import annotations

import ast
from pathlib import Path

import craftrl
from craftrl import system

PACKAGE = Path(craftrl.__file__).parent


def name_lookups(source: str) -> list[int]:
    """Line numbers of ``ray.get_actor(...)`` calls in ``source``."""
    return [node.lineno for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get_actor"]


def test_only_the_system_module_looks_an_actor_up_by_name():
    elsewhere = {str(path.relative_to(PACKAGE)): lines for path in sorted(PACKAGE.rglob("*.py"))
                 if path.name != "system.py" and (lines := name_lookups(path.read_text()))}
    assert elsewhere == {}, f"look actors up through craftrl.system.connect/find instead: {elsewhere}"
    assert name_lookups(Path(system.__file__).read_text()), "system.find looks names up"


def test_the_lookup_check_sees_a_call_written_any_way():
    assert name_lookups("import ray\nray.get_actor('metrics')\n") == [2]
    assert name_lookups("from ray import util\nhandle = ray.get_actor(name=NAME, namespace=None)\n") == [2]
    assert name_lookups("ray.get(actor.remote())\n") == []


def test_every_named_actor_is_in_the_wiring_table_and_connect():
    doc = system.__doc__ or ""
    for name in (system.METRICS, system.REPLAY_BUFFER, system.EPISODE_STATISTICS, system.ROLLOUT_MANAGER):
        assert f"``{name}``" in doc, f"{name} missing from craftrl/system.py's table of actors"
    assert set(vars(system.SystemActors())) == {"manager", "replay", "statistics", "metrics"}
