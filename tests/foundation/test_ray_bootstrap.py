"""Ray sizing: a 2-core machine gets enough logical CPUs; a too-small cluster fails fast in one line."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from craftrl.config import build_config
from craftrl.ray_bootstrap import (ClusterResourceError, check_cluster_resources, local_cpu_count,
                                   ray_processes_in_their_own_session, required_resources)

BIG = {"rollout_config": {"num_rollout_workers": 2, "num_cpus_per_worker": 1},
       "train_config": {"num_workers": 2, "num_readers": 4, "num_cpus_per_reader": 0.25}}


def test_required_resources_add_up_every_reservation():
    need = required_resources(build_config(BIG))
    # rollout 2x1 + train 2x1 + readers 2 workers x 4 x 0.25
    assert need.cpus == pytest.approx(6.0) and need.gpus == 0
    local = required_resources(build_config({"train_config": {"num_workers": 0, "num_readers": 2}}))
    assert local.cpus == pytest.approx(1.0)  # learner in the driver; readers reserve 0 CPU by default


def test_local_cpu_count_never_starves_a_two_core_machine():
    assert local_cpu_count(build_config(BIG), machine_cpus=2) == 7
    assert local_cpu_count(build_config({}), machine_cpus=2) == 2
    assert local_cpu_count(build_config({}), machine_cpus=16) == 16
    assert local_cpu_count(build_config({"ray_config": {"num_cpus": 3}}), machine_cpus=2) == 3


def test_cluster_check_names_what_is_missing():
    with pytest.raises(ClusterResourceError, match=r"has 4 CPU and 0 GPU, but the config reserves 6 CPU"):
        check_cluster_resources(build_config(BIG), {"CPU": 4.0})
    with pytest.raises(ClusterResourceError, match="1 GPU"):
        check_cluster_resources(build_config({"rollout_config": {"num_gpus_per_worker": 1.0}}), {"CPU": 8.0})
    check_cluster_resources(build_config(BIG), {"CPU": 6.0})


def _python(script: str, **kwargs) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(script)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, stdin=subprocess.PIPE, text=True, **kwargs)


def test_a_local_rays_processes_lead_sessions_of_their_own_so_a_signal_to_the_launchers_group_misses_them():
    """The class Ray starts its GCS, raylet and monitors with: inside the context a process leads a new session
    (a SIGTERM to the launcher's group cannot reach it), outside it stays in the launcher's; the class is Ray's
    own again afterwards. The whole run under such a signal: test_process_faults.py, 'sigterm-to-group'."""
    from ray._private import services, utils

    if not utils.detect_fate_sharing_support():
        pytest.skip("without kernel fate-sharing Ray's processes stay in the driver's group")
    rays_own = services.ConsolePopen
    started = []
    try:
        with ray_processes_in_their_own_session():
            started.append(services.ConsolePopen(["sleep", "30"]))
        started.append(services.ConsolePopen(["sleep", "30"]))
        inside, outside = started
        assert os.getsid(inside.pid) == inside.pid and os.getpgid(inside.pid) == inside.pid
        assert os.getsid(outside.pid) == os.getsid(0) and os.getpgid(outside.pid) == os.getpgid(0)
        assert services.ConsolePopen is rays_own
    finally:
        for process in started:
            process.kill()
            process.wait()


@pytest.mark.ray
def test_ray_init_sizes_a_local_ray_on_two_cores():
    """Real Ray, in a subprocess so it does not clash with the session's Ray fixture."""
    process = _python(f"""
        import ray
        from craftrl.config import build_config
        from craftrl.ray_bootstrap import ray_init
        resources = ray_init(build_config({BIG!r}), machine_cpus=2, object_store_memory=200 << 20)
        print("cpus", resources["CPU"], ray.get_runtime_context().namespace)
    """)
    out, err = process.communicate(timeout=180)
    assert process.returncode == 0, err[-2000:]
    assert "cpus 7.0 craftrl" in out


@pytest.mark.ray
def test_joining_a_cluster_too_small_for_the_config_fails_fast_in_one_line():
    cluster = _python("""
        import sys, ray
        ray.init(num_cpus=1, include_dashboard=False, object_store_memory=100 << 20)
        print(ray.get_runtime_context().gcs_address, flush=True)
        sys.stdin.readline()
    """)
    try:
        address = cluster.stdout.readline().strip()
        assert address, cluster.stderr.read()[-2000:]
        joiner = _python(f"""
            from craftrl.config import build_config
            from craftrl.ray_bootstrap import ray_init, ClusterResourceError
            try:
                ray_init(build_config({BIG!r}), address={address!r})
            except ClusterResourceError as error:
                print("rejected:", error)
        """)
        out, err = joiner.communicate(timeout=120)
        assert joiner.returncode == 0, err[-2000:]
        assert "rejected: the Ray cluster has 1 CPU and 0 GPU, but the config reserves 6 CPU" in out
    finally:
        cluster.communicate(input="\n", timeout=60)


@pytest.mark.ray
def test_joining_a_token_cluster_without_its_token_is_one_line_naming_what_to_set(tmp_path):
    """A head started with token authentication (``ray start --head`` under RAY_AUTH_MODE=token); ``craftrl train
    --address`` without the token mode stops in one line that says what to set, not with a traceback. The head runs
    in a process group of its own and is stopped by killing that group: ``ray stop`` would end every Ray process
    on the machine, this test session's own Ray too."""
    import os
    import secrets
    import shutil
    import signal
    import socket
    import tempfile
    import time

    ray_cli = shutil.which("ray", path=os.path.dirname(sys.executable))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    token = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32),
             "RAY_USAGE_STATS_ENABLED": "0"}
    head = subprocess.Popen([ray_cli, "start", "--head", f"--port={port}", "--num-cpus=1", "--include-dashboard=false",
                             f"--temp-dir={tempfile.mkdtemp(prefix='craftrl-ray-')}", "--block"],  # short socket paths
                            env=token, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while True:  # the head's GCS accepts connections
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert head.poll() is None and time.monotonic() < deadline, "the Ray head did not start"
                time.sleep(0.5)
        without = {key: value for key, value in token.items() if not key.startswith("RAY_AUTH_")}
        result = subprocess.run(
            [sys.executable, "-m", "craftrl.cli.main", "train", "tests/config_fixtures/tiny.py",
             f"output_root={tmp_path / 'runs'}", "--address", f"127.0.0.1:{port}"],
            env=without, capture_output=True, text=True, timeout=120)
    finally:  # SIGKILL: on SIGTERM, `ray start --block` takes about 30 s to end
        os.killpg(head.pid, signal.SIGKILL)
        head.wait(30)
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    (line,) = [line for line in result.stderr.splitlines() if line.startswith("craftrl: error:")]
    assert f"cannot connect to the Ray cluster at '127.0.0.1:{port}'" in line and "RAY_AUTH_MODE=token" in line


@pytest.mark.ray
def test_joining_a_cluster_of_another_python_is_one_line_naming_both_releases(tmp_path):
    """A driver whose Python differs from the cluster's: Ray refuses it with a multi-line RuntimeError under a
    traceback; ``craftrl train --address`` says in one line which releases each side runs. The cluster is a real
    local Ray whose record of the Python it was started with (the cluster metadata in its GCS, which Ray's check
    reads) is rewritten to another release, as a head started by another Python would have written it."""
    cluster = _python("""
        import json, sys, ray
        from ray._common.usage.usage_constants import CLUSTER_METADATA_KEY
        from ray._private.ray_constants import KV_NAMESPACE_CLUSTER
        from ray.experimental.internal_kv import _internal_kv_get, _internal_kv_put
        ray.init(num_cpus=1, include_dashboard=False, object_store_memory=100 << 20)
        metadata = json.loads(_internal_kv_get(CLUSTER_METADATA_KEY, namespace=KV_NAMESPACE_CLUSTER))
        metadata["python_version"] = "3.10.13"
        _internal_kv_put(CLUSTER_METADATA_KEY, json.dumps(metadata), overwrite=True, namespace=KV_NAMESPACE_CLUSTER)
        print(ray.get_runtime_context().gcs_address, flush=True)
        sys.stdin.readline()
    """)
    try:
        address = cluster.stdout.readline().strip()
        assert address, cluster.stderr.read()[-2000:]
        result = subprocess.run(
            [sys.executable, "-m", "craftrl.cli.main", "train", "tests/config_fixtures/tiny.py",
             f"output_root={tmp_path / 'runs'}", "--address", address],
            capture_output=True, text=True, timeout=120)
    finally:
        cluster.communicate(input="\n", timeout=60)
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    (line,) = [line for line in result.stderr.splitlines() if line.startswith("craftrl: error:")]
    own_python = ".".join(map(str, sys.version_info[:3]))
    assert f"the Ray cluster at '{address}' runs Ray " in line and "on Python 3.10.13" in line
    assert f"this driver Ray {__import__('ray').__version__} on Python {own_python}" in line
    assert not (tmp_path / "runs").exists()
