"""Ray nodes on this machine that stand in for other machines, for the cluster tests and ``bench/slow_link.py``.

Each node is a ``ray start`` inside a mount namespace of its own, where an empty directory is bind-mounted over a
path the driver sees (the run root, say): the node's processes see that empty directory instead, as a machine
without the driver's disk would. With a :class:`NodeLink` it also runs in a network namespace of its own and
reaches the cluster only through that link, which can be slowed down or cut. Needs root (``unshare``), ``ip``
and ``tc``; :func:`mount_namespaces_work` and :func:`nodes_behind_links_work` say why not where they are refused.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable


class RolloutNode:
    """A Ray node in its own mount namespace: it sees ``view`` (empty at start) where the driver sees ``hidden``.
    With ``link``, also in a network namespace of its own, reaching the cluster only through that link."""

    def __init__(self, address: str, resources: dict[str, float], hidden: Path, view: Path, worker_ports: range,
                 link: NodeLink | None = None):
        view.mkdir(parents=True)
        ray_cli = Path(sys.executable).with_name("ray")
        # `ray start` binds a few fixed default ports and socket names: a second node on this machine needs its own
        ports = " ".join(f"--{name}={unclaimed_port()}" for name in (
            "node-manager-port", "object-manager-port", "metrics-export-port", "dashboard-agent-listen-port",
            "dashboard-agent-grpc-port", "runtime-env-agent-port"))
        self.sockets = Path(tempfile.mkdtemp(prefix="craftrl-node-"))  # short: a unix socket path has <= 107 bytes
        ports += f" --temp-dir={self.sockets}"  # the node's sockets, e.g. the object store's, under a path of its own
        command = (f"mount --bind {view} {hidden} && exec {ray_cli} start --address={address} --num-cpus=2 "
                   f"--resources='{json.dumps(resources)}' --object-store-memory={256 << 20} {ports} "
                   f"--min-worker-port={worker_ports.start} --max-worker-port={worker_ports.stop - 1} --block")
        namespaces = ["--mount", "--propagation", "private"]
        if link is not None:
            command = f"{link.node_side()} && {command} --node-ip-address={link.node_ip}"
            namespaces.insert(0, "--net")
        self.view = view
        self.log = view.with_name(view.name + ".log")  # beside the view, which must stay empty
        with open(self.log, "w") as log:
            self.process = subprocess.Popen(["unshare", *namespaces, "sh", "-c", command],
                                            start_new_session=True, stdout=log, stderr=subprocess.STDOUT)
        if link is not None:
            link.attach(self.process.pid)

    def describe(self) -> str:
        """What the node's ``ray start`` and raylet said, for a test that waited for the node in vain."""
        status = "running" if self.process.poll() is None else f"exited with {self.process.returncode}"
        raylet = sorted(self.sockets.glob("session_*/logs/raylet.out"))
        raylet_tail = raylet[-1].read_text(errors="replace")[-1500:] if raylet else "(no raylet.out)"
        return (f"node {self.view.name}: ray start {status}; its output: {self.log.read_text(errors='replace')[-1500:]}"
                f"\nraylet.out: {raylet_tail}")

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
        shutil.rmtree(self.sockets, ignore_errors=True)

    def crash(self) -> None:
        """Every process of the node dies at once, as when its machine goes down."""
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(30)


class NodeLink:
    """A virtual cable (a veth pair) between this machine and a node in a network namespace of its own: the node's
    only way to the cluster. ``slow_down`` limits its rate towards the node, as a slow or shared network would;
    ``cut`` takes this machine's end down, so nothing passes either way while every process of the node runs on,
    as in a network partition; ``mend`` brings it back up."""

    SUBNET = "10.213.{index}.{host}"

    def __init__(self, index: int):
        self.host_end = f"crl{os.getpid() % 100_000}n{index}"  # an interface name has at most 15 characters
        self.host_ip, self.node_ip = self.SUBNET.format(index=index, host=1), self.SUBNET.format(index=index, host=2)
        self.namespace: str | None = None
        self.pid: int | None = None  # a process in the node's network namespace, once attached

    def node_side(self) -> str:
        """Shell run in the node's namespace before ``ray start``: wait for the cable, address it, route through it."""
        return (f"until ip link show uplink >/dev/null 2>&1; do sleep 0.1; done; ip link set lo up && "
                f"ip addr add {self.node_ip}/30 dev uplink && ip link set uplink up && "
                f"ip route add default via {self.host_ip}")

    def attach(self, pid: int) -> None:
        """Plug the cable into the network namespace of process ``pid`` once that process has one of its own."""
        own = os.readlink("/proc/self/ns/net")
        wait_for("the node's network namespace", lambda: os.readlink(f"/proc/{pid}/ns/net") != own, timeout=10)
        self.namespace = os.readlink(f"/proc/{pid}/ns/net")
        self.pid = pid
        network_command(f"ip link add {self.host_end} type veth peer name uplink netns {pid}")
        network_command(f"ip addr add {self.host_ip}/30 dev {self.host_end}")
        network_command(f"ip link set {self.host_end} up")

    def slow_down(self, rate: str) -> None:
        """Let at most ``rate`` (in ``tc``'s units, e.g. ``20mbit``) through to the node, queueing up to 0.5 s."""
        network_command(f"tc qdisc add dev {self.host_end} root tbf rate {rate} burst 64kbit latency 500ms")

    def speed_up(self) -> None:
        network_command(f"tc qdisc del dev {self.host_end} root")

    def cut(self) -> None:
        network_command(f"ip link set {self.host_end} down")

    def mend(self) -> None:
        network_command(f"ip link set {self.host_end} up")

    def copy_seconds(self, nbytes: int) -> float:
        """Seconds a plain TCP copy of ``nbytes`` from this machine takes to reach the node: what the link itself
        allows, to compare Ray's transfers against."""
        if self.pid is None:
            raise RuntimeError("NodeLink.copy_seconds: the link is not attached to a node yet")
        receive = ("import socket, sys, time\n"
                   f"connection = socket.create_connection(({self.host_ip!r}, int(sys.argv[1])))\n"
                   "started, received = time.monotonic(), 0\n"
                   f"while received < {nbytes}:\n"
                   "    chunk = connection.recv(1 << 20)\n"
                   "    if not chunk:\n"
                   "        raise SystemExit('the copy ended early')\n"
                   "    received += len(chunk)\n"
                   "print(time.monotonic() - started)\n")
        with socket.socket() as server:
            server.bind((self.host_ip, 0))
            server.listen(1)
            receiver = subprocess.Popen(["nsenter", f"--net=/proc/{self.pid}/ns/net", sys.executable, "-c", receive,
                                         str(server.getsockname()[1])], stdout=subprocess.PIPE, text=True)
            server.settimeout(30)
            connection, _ = server.accept()
            with connection:
                connection.sendall(bytes(nbytes))
            output, _ = receiver.communicate(timeout=600)
        if receiver.returncode != 0:
            raise RuntimeError(f"the TCP copy to the node failed (exit {receiver.returncode})")
        return float(output)

    def processes(self) -> list[str]:
        """``pid command`` of every process still in the node's network namespace."""
        found = []
        for proc in Path("/proc").iterdir():
            try:
                if proc.name.isdigit() and os.readlink(proc / "ns/net") == self.namespace:
                    command = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                    found.append(f"{proc.name} {command[:120]}")
            except OSError:  # it ended while we looked
                continue
        return found


def network_command(command: str) -> None:
    done = subprocess.run(command.split(), capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{command}: {done.stderr.strip()}")


_CLAIMED_PORTS: set[int] = set()


def unclaimed_port() -> int:
    """A port no process has bound on any address (Ray's servers bind the node's address, where a port free on
    127.0.0.1 may be taken), below the kernel's ephemeral range: an outgoing connection (Ray's processes open
    many) can take a free ephemeral port in the seconds before ``ray start`` binds it, but never this one."""
    ephemeral_start = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    for port in range(24000, ephemeral_start):
        if port in _CLAIMED_PORTS:
            continue
        with socket.socket() as probe:
            try:
                probe.bind(("0.0.0.0", port))
            except OSError:
                continue
        _CLAIMED_PORTS.add(port)
        return port
    raise RuntimeError(f"no free port between 24000 and {ephemeral_start}")


def wait_for_nodes(address: str, count: int, nodes: list[RolloutNode], timeout: float = 90.0) -> set[str]:
    """The ids of the cluster's live nodes once there are ``count`` (asked through Ray's state API: this test
    process may hold a Ray connection of its own already, to the test session's local Ray)."""
    from ray.util.state import list_nodes

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and all(node.process.poll() is None for node in nodes):
        alive = {node.node_id for node in list_nodes(address=address, filters=[("state", "=", "ALIVE")],
                                                     raise_on_missing_output=False)}
        if len(alive) >= count:
            return alive
        time.sleep(0.5)
    raise TimeoutError(f"fewer than {count} Ray nodes after {timeout - (deadline - time.monotonic()):.0f} s\n"
                       + "\n".join(node.describe() for node in nodes))


def wait_for(what: str, condition: Callable[[], bool], timeout: float = 180.0) -> None:
    """Poll ``condition`` every second until it holds; a ``TimeoutError`` naming ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout:.0f} s")
        time.sleep(1.0)


def mount_namespaces_work() -> str | None:
    """None when this process may give a child its own mount namespace with a bind mount, else why not."""
    if shutil.which("unshare") is None:
        return "no unshare command"
    probe = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                            "mount --bind /tmp /mnt && umount /mnt"], capture_output=True, text=True)
    return None if probe.returncode == 0 else f"mount namespaces refused here: {probe.stderr.strip()[:120]}"


def network_namespaces_work() -> str | None:
    """None when this process may give a child a network namespace of its own, cable it to this one (a veth
    pair) and limit the cable's rate (``tc``'s token bucket filter), else why not."""
    if shutil.which("ip") is None or shutil.which("tc") is None:
        return "no ip or no tc command"
    probe = subprocess.run(["unshare", "--net", "sh", "-c", "ip link add probe0 type veth peer name probe1 && "
                            "tc qdisc add dev probe0 root tbf rate 20mbit burst 64kbit latency 500ms"],
                           capture_output=True, text=True)
    return None if probe.returncode == 0 else f"network namespaces or tc refused here: {probe.stderr.strip()[:120]}"


def nodes_behind_links_work() -> str | None:
    """None when a node in a network namespace of its own, behind a :class:`NodeLink`, can join a Ray cluster
    started here (both kinds of namespace work and Ray does not listen on the loopback address), else why not."""
    from ray.util import get_node_ip_address

    reason = mount_namespaces_work() or network_namespaces_work()
    if reason is None and get_node_ip_address().startswith("127."):
        reason = "Ray listens on the loopback address here, which a node in a network of its own cannot reach"
    return reason
