"""Benchmark: how fast the replay buffer ingests fragments from rollout workers on other nodes.

A simulated cluster on this machine (``ray.cluster_utils.Cluster``): the head node holds the replay buffer, two
more raylets stand for rollout nodes. Writer actors encode and send the same fragments either from the head node
(the direct write: LMDB from the writer's process) or from the two other nodes (the remote write: the records
travel through Ray's object store and the buffer actor writes them). Fragments come from Crafter's cows task:
64x64 frames in 32-step fragments (the default config's) and 128x128 frames in 256-step fragments (Minecraft's
size of frame and the seed configs' fragment length), with an LSTM state of 2 x 256 floats.

Reported per case: fragments/s and MB/s of encoded fragments the buffer registered (wall clock from the first send
to the last registration), and the CPU milliseconds per fragment of the writers and of the buffer actor (from
/proc). On 2 cores the writers' compression takes most of the CPU, so a third row has the remote writers compress
before the clock starts: what the buffer itself ingests. The nodes share this machine's cores and loopback, so MB/s
is a floor for real networks of 10 Gbit/s and more, not a network measurement. Writes
bench/results/cluster_transport.md; the last line is ``P9 remote_ingest_mb_per_s=<128x128 remote, encoded ahead,
MB/s>``.

    .venv/bin/python bench/cluster_transport.py [--fragments 48] [--writers 2]
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from machine import describe_machine, machine_busy_seconds
from headlines import finish, headline  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "cluster_transport.md"
CASES = {"crafter/cows 64x64, 32 steps": ((64, 64), 32), "128x128, 256 steps": ((128, 128), 256)}


def crafter_frames(size: tuple[int, int], count: int, seed: int = 0) -> np.ndarray:
    """``count`` consecutive observations of the cows task under random actions (resets included)."""
    from craftrl.envs import make

    env = make("crafter/cows", seed=seed, obs_size=size)
    rng = np.random.default_rng(seed)
    obs, _ = env.reset()
    frames = []
    for _ in range(count):
        frames.append(obs["image"])
        obs, _, terminated, truncated, _ = env.step(int(rng.integers(17)))
        if terminated or truncated:
            obs, _ = env.reset()
    env.close()
    return np.stack(frames)


def make_fragment(frames: np.ndarray, env_id: str, index: int):
    from craftrl.rollout.fragment import Fragment

    length = len(frames) - 1
    rng = np.random.default_rng(index)
    return Fragment(
        env_id=env_id, index=index, obs={"image": frames[:length]},
        action=rng.integers(0, 17, length).astype(np.int64), reward=np.zeros(length, np.float32),
        terminated=np.zeros(length, bool), truncated=np.zeros(length, bool), first=np.zeros(length, bool),
        logp=rng.normal(size=length).astype(np.float32), value=rng.normal(size=length).astype(np.float32),
        version=np.zeros(length, np.int64), final_value=np.full(length, np.nan, np.float32),
        next_obs={"image": frames[length:]}, next_first=False,
        state_in={"h": rng.normal(size=(1, 256)).astype(np.float32), "c": rng.normal(size=(1, 256)).astype(np.float32)})


class Writer:
    """A rollout worker's sending side, alone: encode and send prepared fragments as fast as the buffer takes them."""

    def __init__(self, buffer, frames: np.ndarray, name: str):
        from craftrl.replay.client import ReplayWriter

        self.writer = ReplayWriter(buffer)
        self.frames, self.name = frames, name

    def run(self, count: int, start_index: int, encoded_ahead: bool = False) -> dict:
        """``encoded_ahead``: compress every fragment before the clock starts (the writer then only sends), which
        measures what the buffer can take rather than how fast the writers compress on these shared cores."""
        import craftrl.replay.client as client

        fragments = [make_fragment(self.frames, f"{self.name}/e0", start_index + i) for i in range(count)]
        if encoded_ahead:
            records = {id(f): client.encode_fragment(f, self.writer._layout.compression_level) for f in fragments}
            client.encode_fragment = lambda fragment, level: records[id(fragment)]
        cpu, wall = time.process_time(), time.perf_counter()
        for fragment in fragments:
            self.writer.add_fragments([fragment])
        self.writer.flush()
        return {"cpu_s": time.process_time() - cpu, "wall_s": time.perf_counter() - wall, "direct": self.writer.direct,
                "pid": os.getpid()}


def process_cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(ray, buffer, buffer_pid: int, frames: np.ndarray, remote: bool, encoded_ahead: bool, writers: int,
            count: int, case_number: int) -> dict:
    from craftrl.placement import current_node_id, on_node

    placement = {"resources": {"writer_node": 1}} if remote else on_node(current_node_id())
    tag = f"{'remote' if remote else 'direct'}{int(encoded_ahead)}{case_number}"  # env ids of their own
    actors = [ray.remote(Writer).options(num_cpus=0, **placement).remote(buffer, frames, f"{tag}-w{i}")
              for i in range(writers)]
    ray.get([actor.run.remote(1, 0) for actor in actors])  # warm up: imports, connections
    buffer_cpu, machine_cpu = process_cpu_seconds(buffer_pid), machine_busy_seconds()
    started = time.perf_counter()
    results = ray.get([actor.run.remote(count, 1, encoded_ahead) for actor in actors])
    wall = time.perf_counter() - started
    buffer_cpu = process_cpu_seconds(buffer_pid) - buffer_cpu
    machine_cores = (machine_busy_seconds() - machine_cpu) / wall
    for actor in actors:
        ray.kill(actor)
    assert all(r["direct"] != remote for r in results), "writers took the wrong path"
    fragments = writers * count
    return {"fragments_per_s": fragments / wall, "wall_s": wall, "fragments": fragments,
            "writer_cpu_ms": 1000 * sum(r["cpu_s"] for r in results) / fragments,
            "buffer_cpu_ms": 1000 * buffer_cpu / fragments, "machine_cores": machine_cores}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--fragments", type=int, default=48, help="fragments each writer sends per case")
    parser.add_argument("--writers", type=int, default=2)
    args = parser.parse_args()
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import ray
    from ray.cluster_utils import Cluster

    from craftrl.replay.actor import start_replay_buffer
    from craftrl.replay.codec import encode_fragment
    from craftrl.replay.config import BufferSettings, StoreSettings
    from craftrl.placement import on_home_node

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": False,
                                                            "object_store_memory": 512 << 20})
    for _ in range(2):
        cluster.add_node(num_cpus=2, resources={"writer_node": args.writers}, object_store_memory=512 << 20)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address)
    rows = []
    try:
        for case, (size, length) in CASES.items():
            frames = crafter_frames(size, length + 1)
            encoded = len(encode_fragment(make_fragment(frames, "probe", 0), 1))
            raw = make_fragment(frames, "probe", 0).raw_nbytes()
            with tempfile.TemporaryDirectory(prefix="craftrl-transport-") as scratch:
                settings = BufferSettings(max_chunks=64, store=StoreSettings(
                    path=str(Path(scratch) / "store"), num_shards=4, max_fragment_bytes=raw, compression_level=1))
                buffer = start_replay_buffer(settings, name=f"bench-{len(rows)}", **on_home_node())
                buffer_pid = ray.get(buffer.__ray_call__.remote(lambda self: os.getpid()))
                for remote, encoded_ahead in ((False, False), (True, False), (True, True)):
                    result = measure(ray, buffer, buffer_pid, frames, remote, encoded_ahead, args.writers,
                                     args.fragments, len(rows))
                    mode = "remote (object store)" if remote else "direct (LMDB in writer)"
                    result.update(case=case, mode=mode + (", encoded ahead" if encoded_ahead else ""),
                                  mb_per_s=result["fragments_per_s"] * encoded / 1e6, encoded=encoded, raw=raw)
                    rows.append(result)
                    print(f"{case}, {result['mode']}: {result['fragments_per_s']:.1f} fragments/s, "
                          f"{result['mb_per_s']:.1f} MB/s encoded, writer {result['writer_cpu_ms']:.2f} CPU ms, "
                          f"buffer {result['buffer_cpu_ms']:.2f} CPU ms per fragment, machine "
                          f"{result['machine_cores']:.2f} cores busy", flush=True)
                ray.kill(buffer)
    finally:
        ray.shutdown()
        cluster.shutdown()
    command = "python bench/cluster_transport.py " + " ".join(sys.argv[1:])
    lines = [
        "## Cluster transport: fragments from rollout nodes into the replay buffer", "",
        f"`{command.strip()}`, {datetime.date.today().isoformat()}, {describe_machine()}. One machine plays a head "
        f"node (the buffer) and two rollout nodes; {args.writers} writers send {args.fragments} fragments each per "
        "row, zstd level 1. MB/s counts encoded bytes.", "",
        "| fragments | writers on | raw / encoded MB per fragment | fragments/s | MB/s | writer CPU ms per fragment "
        "| buffer CPU ms per fragment | cores busy (all processes) |",
        "|---|---|---|---:|---:|---:|---:|---:|",
        *[f"| {r['case']} | {r['mode']} | {r['raw'] / 1e6:.2f} / {r['encoded'] / 1e6:.2f} | {r['fragments_per_s']:.1f} "
          f"| {r['mb_per_s']:.1f} | {r['writer_cpu_ms']:.2f} | {r['buffer_cpu_ms']:.2f} | {r['machine_cores']:.2f} |"
          for r in rows],
        "",
    ]
    small_direct, small_remote, _, big_direct, big_remote, big_ahead = rows
    lines += [f"Remote writer CPU per fragment against the direct write: "
              f"{small_remote['writer_cpu_ms'] / small_direct['writer_cpu_ms']:.2f}x (64x64), "
              f"{big_remote['writer_cpu_ms'] / big_direct['writer_cpu_ms']:.2f}x (128x128).", ""]
    print(f"remote/direct writer CPU: {small_remote['writer_cpu_ms'] / small_direct['writer_cpu_ms']:.2f}x (64x64), "
          f"{big_remote['writer_cpu_ms'] / big_direct['writer_cpu_ms']:.2f}x (128x128)")
    finish(RESULTS, "\n".join(lines), [headline("P9", "remote_ingest_mb_per_s", big_ahead["mb_per_s"], 1,
                                                 "128x128 fragments from 2 simulated rollout nodes, encoded ahead")])


if __name__ == "__main__":
    main()
