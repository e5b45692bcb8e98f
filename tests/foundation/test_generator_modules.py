"""Which of the user's modules a generator needs on a node, and the one line for a node that cannot import them
(the Ray side, a task asking each node, is run by tests/reliability/test_minestudio_launcher.py)."""

from __future__ import annotations

import functools
import sys
import textwrap

import pytest

from craftrl.config import build_config
from craftrl.config.generator_modules import (generator_module_names, imported_names, missing_module_problems,
                                              nodes_to_check, unimportable, users_own_modules)


def env_generator(size: int = 64):
    import json  # noqa: F401 - what the scan must find
    from sibling_callbacks import Marker  # noqa: F401

    def helper():
        import os.path  # noqa: F401

    return size


@pytest.fixture
def sibling_module(tmp_path, monkeypatch):
    """A module beside a launcher, importable here the way a launcher's directory is (on sys.path)."""
    (tmp_path / "sibling_callbacks.py").write_text(textwrap.dedent("""
        class Marker:
            pass
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path / "sibling_callbacks.py"


def test_the_modules_a_generator_imports_are_read_from_its_code_nested_functions_included():
    assert {"json", "sibling_callbacks", "os"} <= imported_names(env_generator.__code__)
    names = generator_module_names(functools.partial(functools.partial(env_generator, 32)))
    assert {"json", "sibling_callbacks", "os"} <= names
    assert __name__.split(".")[0] in names, "its own module, by which it is pickled"

    def relative():
        from . import neighbour  # noqa: F401

    assert imported_names(relative.__code__) == set(), "a relative import names the generator's own package"


def test_a_generator_that_travels_by_value_needs_no_module_of_its_own(monkeypatch):
    import ray.cloudpickle

    module = sys.modules[__name__]
    ray.cloudpickle.register_pickle_by_value(module)
    try:
        assert __name__.split(".")[0] not in generator_module_names(env_generator)
    finally:
        ray.cloudpickle.unregister_pickle_by_value(module)
    assert __name__.split(".")[0] in generator_module_names(env_generator)


def test_only_modules_outside_the_python_installation_are_the_users_own(sibling_module):
    own = users_own_modules(["json", "numpy", "torch", "sibling_callbacks", "no_such_module_anywhere"])
    assert own == {"sibling_callbacks": str(sibling_module)}
    assert unimportable(["json", "sibling_callbacks", "no_such_module_anywhere"]) == ["no_such_module_anywhere"]


def test_a_node_that_cannot_import_a_sibling_module_is_one_line_naming_module_nodes_and_remedy(sibling_module):
    nodes = {"n1": {"name": "10.0.0.2", "needs": "env_generator policy_generator"},
             "n2": {"name": "10.0.0.3", "needs": "env_generator policy_generator"},
             "n3": {"name": "10.0.0.4", "needs": "env_generator policy_generator"},
             "learner": {"name": "10.0.0.5", "needs": "policy_generator"}}
    asked = {}

    def ask_nodes(requests):
        asked.update(requests)
        return {"n1": ["sibling_callbacks"], "n2": ["sibling_callbacks"], "n3": None, "learner": []}

    problems = missing_module_problems({"env_generator": env_generator, "policy_generator": dict},
                                       nodes, ask_nodes)
    assert "learner" not in asked, "the policy generator needs none of the user's modules"
    assert asked["n1"] == sorted(users_own_modules(generator_module_names(env_generator)))
    assert "sibling_callbacks" in asked["n1"] and "json" not in asked["n1"]
    assert problems == [f"env_generator: needs module 'sibling_callbacks' ({sibling_module} here), which Ray nodes "
                        "10.0.0.2, 10.0.0.3 cannot import; ship it to the nodes with Ray's runtime_env (working_dir "
                        "or py_modules, docs/cluster.md)"]
    assert missing_module_problems({"env_generator": env_generator}, nodes,
                                   lambda requests: {node: [] for node in requests}) == []


def test_the_nodes_checked_are_the_live_others_that_can_host_a_rollout_or_a_train_worker():
    config = build_config({"rollout_config": {"num_cpus_per_worker": 1, "resources_per_worker": {"rollout_node": 1}},
                           "train_config": {"num_workers": 1, "num_gpus_per_worker": 1}})
    ray_nodes = [
        {"NodeID": "home", "Alive": True, "NodeManagerAddress": "h", "Resources": {"CPU": 8, "rollout_node": 1}},
        {"NodeID": "r1", "Alive": True, "NodeManagerAddress": "r1", "Resources": {"CPU": 2, "rollout_node": 1}},
        {"NodeID": "dead", "Alive": False, "NodeManagerAddress": "d", "Resources": {"CPU": 2, "rollout_node": 1}},
        {"NodeID": "gpu", "Alive": True, "NodeManagerAddress": "g", "Resources": {"CPU": 8, "GPU": 1}},
        {"NodeID": "small", "Alive": True, "NodeManagerAddress": "s", "Resources": {"CPU": 8}},
    ]
    assert nodes_to_check(config, ray_nodes, home_node_id="home") == {
        "r1": {"name": "r1", "needs": "env_generator policy_generator"},
        "gpu": {"name": "g", "needs": "policy_generator"}}
