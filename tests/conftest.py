"""Shared fixtures. One local Ray runtime per test session: starting Ray costs ~4 s on 2 cores."""
from __future__ import annotations

import os
import sys

import pytest

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.2")
os.environ.setdefault("WANDB_MODE", "offline")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test on the shared Ray runtime is a `ray` test whether or not it says so, so `make check` leaves it out."""
    for item in items:
        if "ray_session" in getattr(item, "fixturenames", ()) and not item.get_closest_marker("ray"):
            item.add_marker(pytest.mark.ray)


@pytest.fixture(scope="session")
def ray_session():
    """A local Ray runtime with 4 logical CPUs (over-committed on purpose: actors mostly wait)."""
    import ray

    # Test modules are not importable inside Ray workers, so classes and functions defined in them
    # (test actors, generators) must travel by value.
    tests_dir = os.path.dirname(os.path.abspath(__file__))
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None) or ""
        if path.startswith(tests_dir) and module.__name__ != __name__:
            ray.cloudpickle.register_pickle_by_value(module)
    if not ray.is_initialized():
        ray.init(address="local", num_cpus=4, include_dashboard=False, object_store_memory=1 << 30,
                 namespace="craftrl-tests", log_to_driver=False)
    yield ray
    ray.shutdown()
