"""Start or join Ray with exactly the resources a config reserves.

Three traps this avoids:

* On a 2-core machine a local Ray with ``num_cpus=2`` deadlocks: two Ray Train workers take both CPUs and the
  rollout workers wait forever. Locally we therefore declare as many *logical* CPUs as the config reserves
  (never fewer than the machine has). Over-committing is intended: env processes and actors mostly wait on
  each other, and the OS shares the real cores.
* On an existing cluster, an actor that asks for more than the cluster has stays PENDING with no error
  (MineStudio's fate with undeclared custom resources). We compare the request with the cluster's resources
  up front and fail in one line.
* Left in the launcher's process group, a local Ray's own processes (GCS, raylet, dashboard, monitors) die at
  once from a SIGTERM sent to the whole group (``timeout``, ``kill -- -PGID``, launchers that stop a job by its
  group), and the launcher's orderly stop then waits 60 s for the missing GCS and exits 1. They start in
  sessions of their own instead, so only the launcher gets the signal and stops the run in order; they still
  die with the driver (Ray's kernel fate-sharing).
"""

from __future__ import annotations

import contextlib
import math
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from craftrl.config.schema import OnlineConfig


class ClusterResourceError(RuntimeError):
    """The cluster cannot host what the config asks for."""


@dataclass(frozen=True)
class ResourceRequest:
    cpus: float
    gpus: float
    breakdown: str
    custom: dict[str, float] = field(default_factory=dict)  # resources_per_worker summed over workers

    def describe(self) -> str:
        custom = "".join(f", {amount:g} {name}" for name, amount in self.custom.items())
        return f"{self.cpus:g} CPU and {self.gpus:g} GPU{custom} ({self.breakdown})"


def required_resources(config: OnlineConfig) -> ResourceRequest:
    """Logical CPUs/GPUs every actor of a run reserves; small bookkeeping actors reserve 0 CPU."""
    rollout, train = config.rollout_config, config.train_config
    train_workers = train.num_workers  # 0 = learner in the driver, outside Ray's accounting
    reader_groups = max(train.num_workers, 1)
    parts = {
        "rollout": (rollout.num_rollout_workers * rollout.num_cpus_per_worker,
                    rollout.num_rollout_workers * rollout.num_gpus_per_worker),
        "train": (train_workers * train.num_cpus_per_worker, train_workers * train.num_gpus_per_worker),
        "readers": (reader_groups * train.num_readers * train.num_cpus_per_reader, 0.0),
    }
    if train.num_workers == 0 and train.num_gpus_per_worker > 0:
        parts["train"] = (0.0, train.num_gpus_per_worker)
    cpus = sum(c for c, _ in parts.values())
    gpus = sum(g for _, g in parts.values())
    breakdown = ", ".join(f"{name} {c:g} CPU" + (f"/{g:g} GPU" if g else "") for name, (c, g) in parts.items())
    custom: dict[str, float] = {}
    for count, per_worker in ((rollout.num_rollout_workers, rollout.resources_per_worker),
                              (train_workers, train.resources_per_worker)):
        for name, amount in (per_worker or {}).items():
            custom[name] = custom.get(name, 0.0) + count * amount
    return ResourceRequest(cpus=cpus, gpus=gpus, breakdown=breakdown, custom=custom)


def local_cpu_count(config: OnlineConfig, machine_cpus: int | None = None) -> int:
    """Logical CPUs for a local Ray: what the config reserves, plus one spare, never below the machine's cores."""
    if config.ray_config.num_cpus is not None:
        return config.ray_config.num_cpus
    machine_cpus = machine_cpus if machine_cpus is not None else (os.cpu_count() or 1)
    return max(machine_cpus, math.ceil(required_resources(config).cpus) + 1)


def check_cluster_resources(config: OnlineConfig, available: dict[str, float]) -> None:
    """Raise ``ClusterResourceError`` (one line) when ``available`` cannot host the config's request."""
    need = required_resources(config)
    have_cpu, have_gpu = available.get("CPU", 0.0), available.get("GPU", 0.0)
    if need.cpus > have_cpu + 1e-9 or need.gpus > have_gpu + 1e-9:
        raise ClusterResourceError(
            f"the Ray cluster has {have_cpu:g} CPU and {have_gpu:g} GPU, but the config reserves {need.describe()}; "
            "lower num_*_per_worker / worker counts or add nodes")
    short = {name: amount for name, amount in need.custom.items() if amount > available.get(name, 0.0) + 1e-9}
    if short:
        have = ", ".join(f"{available.get(name, 0.0):g} {name}" for name in short)
        raise ClusterResourceError(
            f"the Ray cluster has {have}, but the config's resources_per_worker reserve {need.describe()}; start "
            "nodes with those resources (ray start --resources) or lower the worker counts")


NAMESPACE = "craftrl"  # a launcher's: its actors' names are MineStudio's, one run of them per cluster


def ray_init(config: OnlineConfig | None = None, address: str | None = None, *,
             include_dashboard: bool | None = None, machine_cpus: int | None = None, code_dir: str | None = None,
             namespace: str = NAMESPACE, **ray_kwargs: Any) -> dict[str, float]:
    """Start a local Ray sized to ``config`` or join ``address`` and check it can host ``config``.

    ``code_dir``: a directory Ray's workers import the user's modules from, as they do from the directory of the
    driver's script (``craftrl train``'s config file plays the script). ``namespace``: the Ray namespace of the
    run's named actors. Returns the cluster's resources. Usage statistics are always off.
    """
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import ray
    from ray.util.client import ray as ray_client

    if code_dir is not None and "job_config" not in ray_kwargs:
        from ray.job_config import JobConfig

        # the field Ray fills with the script's directory; Ray adds that and the working directory to it
        ray_kwargs["job_config"] = JobConfig(_py_driver_sys_path=[code_dir])

    config = config or OnlineConfig()
    address = address if address is not None else config.ray_config.address
    dashboard = config.ray_config.include_dashboard if include_dashboard is None else include_dashboard
    client_address = (address or "").startswith("ray://")
    if client_address or ray_client.is_connected():
        where = f"the address {address!r}" if client_address else "this process's Ray connection"
        raise ClusterResourceError(
            f"{where} goes through Ray Client, which craftrl does not support: the run's actors would write its "
            "outputs on the head's disk under this machine's paths, out of the driver's sight; run the driver on "
            "the head node with the head's host:port or 'auto', or submit it as a Ray job (ray job submit, "
            "docs/cluster.md)")
    if ray.is_initialized():
        resources = ray.cluster_resources()
        check_cluster_resources(config, resources)
        return resources
    if address:
        unreachable = unreachable_reason(address)
        if unreachable:
            raise ClusterResourceError(f"cannot reach a Ray cluster at {address!r} ({unreachable}); start one there "
                                       "(ray start --head --port PORT, docs/cluster.md) or leave the address out for "
                                       "a local Ray")
        try:
            ray.init(address=address, namespace=namespace, **ray_kwargs)
        except ConnectionError as error:
            if "Could not find any running Ray instance" in str(error):  # 'auto' on a machine without one
                raise ClusterResourceError(f"no Ray cluster runs on this machine to join at {address!r}; start one "
                                           "(ray start --head, docs/cluster.md), name its host:port, or leave the "
                                           "address out for a local Ray") from None
            raise ClusterResourceError(f"cannot connect to the Ray cluster at {address!r}: {error}"
                                       f"{_token_hint()}") from None
        except ray.exceptions.AuthenticationError:
            raise ClusterResourceError(f"the Ray cluster at {address!r} refused this driver's token"
                                       f"{_token_hint()}") from None
        except RuntimeError as error:
            mismatch = version_mismatch(str(error), address)
            if mismatch is None:
                raise
            raise ClusterResourceError(mismatch) from None
        resources = ray.cluster_resources()
        try:
            check_cluster_resources(config, resources)
        except ClusterResourceError:
            ray.shutdown()
            raise
        return resources
    need = required_resources(config)
    detected_gpus = _detected_gpus()
    if need.gpus > detected_gpus:
        raise ClusterResourceError(
            f"the config reserves {need.describe()}, but this machine has {detected_gpus} GPU; "
            "set rollout_config.num_gpus_per_worker and train_config.num_gpus_per_worker to 0")
    memory_mb = config.ray_config.object_store_memory_mb
    # address="local": a plain ray.init() would join any cluster /tmp/ray/ray_current_cluster names (one a
    # `ray start` or another test left), and then refuse num_cpus with a traceback.
    options = {"address": "local", "num_cpus": local_cpu_count(config, machine_cpus), "num_gpus": detected_gpus,
               "include_dashboard": dashboard, "namespace": namespace,
               "object_store_memory": memory_mb * (1 << 20) if memory_mb else None,
               # one machine plays every node: it declares the custom resources the config places by
               "resources": dict(need.custom) or None}
    options.update(ray_kwargs)
    with ray_processes_in_their_own_session():
        ray.init(**options)
    return ray.cluster_resources()


def ray_logs_directory() -> str:
    """Where Ray keeps this session's logs on this node, its workers' output among them (``ray_init`` first)."""
    import ray

    context = ray.get_runtime_context()
    return os.path.join(context.get_temp_dir(), context.get_session_name(), "logs")


@contextlib.contextmanager
def ray_processes_in_their_own_session() -> Iterator[None]:
    """While it is open, every process a local ``ray.init`` starts leads a session of its own (see the module
    docstring). Only where the kernel ties them to the driver's life (Linux): elsewhere Ray's reaper stops them
    by the driver's process group, so they stay in it. Ray starts them all through one private class,
    ``ray._private.services.ConsolePopen``, which this swaps for the call (tests/foundation/test_ray_bootstrap.py
    fails if a Ray release renames it)."""
    from ray._private import services, utils

    if not utils.detect_fate_sharing_support():
        yield
        return
    popen = services.ConsolePopen

    class OwnSessionPopen(popen):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **{**kwargs, "start_new_session": True})

    services.ConsolePopen = OwnSessionPopen
    try:
        yield
    finally:
        services.ConsolePopen = popen


def unreachable_reason(address: str, timeout: float = 5.0) -> str | None:
    """Why nothing answers at ``address`` (``host:port``), or None when something listens
    there. ``ray.init`` retries an address where nothing listens for minutes before it fails; this asks once.
    'auto' is left to Ray, which fails at once when it finds no cluster."""
    import socket

    if address in ("auto", "local"):
        return None
    host, separator, port = address.rpartition(":")
    if not separator or not port.isdigit():
        return "expected host:port or 'auto'"
    try:
        socket.create_connection((host.strip("[]") or "localhost", int(port)), timeout=timeout).close()
    except OSError as error:
        return error.strerror or str(error) or type(error).__name__
    return None


def version_mismatch(message: str, address: str) -> str | None:
    """One line for Ray's refusal to join a cluster that runs another Ray or Python release than this process
    (Ray compares Python to the patch level: 3.11.7 and 3.11.9 differ), or None for any other error."""
    if not message.startswith("Version mismatch"):
        return None
    versions = re.findall(r"Ray: (\S+)\s+Python: (\S+)", message)
    if len(versions) == 2:
        (cluster_ray, cluster_python), (own_ray, own_python) = versions
        found = (f"runs Ray {cluster_ray} on Python {cluster_python}, and this driver Ray {own_ray} on Python "
                 f"{own_python}")
    else:
        found = "runs another Ray or Python release than this driver"
    return (f"the Ray cluster at {address!r} {found}; Ray joins only the same releases of both: run the driver "
            "in the Python environment the cluster's nodes run (docs/cluster.md)")


def _token_hint() -> str:
    """What a driver needs to join a cluster with token authentication, in the words of the mode it runs in."""
    if os.environ.get("RAY_AUTH_MODE") == "token":
        return ("; give this machine the cluster's token: ~/.ray/auth_token as on the head, RAY_AUTH_TOKEN_PATH or "
                "RAY_AUTH_TOKEN (docs/cluster.md)")
    return ("; if the cluster uses token authentication (Ray's log above then says InvalidAuthToken), set "
            "RAY_AUTH_MODE=token and give this machine its token (docs/cluster.md)")


def _detected_gpus() -> int:
    try:
        import torch

        return torch.cuda.device_count()
    except Exception:
        return 0
