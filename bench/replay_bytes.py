"""P4: replay store bytes per env step against raw uint8 frame bytes, plus write and read throughput.

Frames come from the real ``crafter`` package at 64x64 with uniformly random actions (what the crafter/cows
task renders: same world, same textures). Each fragment is stored exactly as the buffer stores it (encode +
LMDB put) and read back exactly as a trainer reader does (LMDB get + decode).

    .venv/bin/python bench/replay_bytes.py [--fragments 16] [--fragment-length 256]

Last line: ``P4 replay_bytes_ratio=<stored bytes per step / raw uint8 frame bytes per step>``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from craftrl.replay.codec import decode_fragment, encode_fragment
from craftrl.replay.store import FragmentStore, create_store
from craftrl.rollout.fragment import Fragment

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import describe_machine  # noqa: E402  (bench scripts share helpers by plain import)
from headlines import finish, headline  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "replay.md"


def crafter_frames(steps: int, seed: int) -> np.ndarray:
    import crafter

    from craftrl.envs.crafter import reproducible

    reproducible.install()  # the same frames on every run, so the ratio repeats
    env = crafter.Env(size=(64, 64), seed=seed)
    rng = np.random.default_rng(seed)
    frames = [env.reset()]
    while len(frames) < steps + 1:
        obs, _, done, _ = env.step(int(rng.integers(env.action_space.n)))
        frames.append(obs)
        if done:
            frames.append(env.reset())
    return np.stack(frames[: steps + 1])


def make_fragments(frames: np.ndarray, length: int, seed: int) -> list[Fragment]:
    rng = np.random.default_rng(seed)
    fragments = []
    for index in range((len(frames) - 1) // length):
        window = frames[index * length: (index + 1) * length + 1]
        first = np.zeros(length, bool)
        first[0] = index == 0
        fragments.append(Fragment(
            env_id="bench/0", index=index, obs={"image": window[:-1]},
            action=rng.integers(0, 17, length).astype(np.int64),
            reward=(rng.random(length) < 0.01).astype(np.float32),
            terminated=np.zeros(length, bool), truncated=np.zeros(length, bool), first=first,
            logp=rng.normal(-2.8, 0.1, length).astype(np.float32),
            value=rng.normal(0, 1, length).astype(np.float32),
            version=np.full(length, 7, np.int64), final_value=np.full(length, np.nan, np.float32),
            next_obs={"image": window[-1:]}, next_first=False,
            state_in=(rng.normal(size=(1, 256)).astype(np.float32),),
        ))
    return fragments


def measure(fragments: list[Fragment], level: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="replay-bench-") as root:
        layout = create_store(Path(root) / "db", num_shards=2, max_fragments=len(fragments),
                              max_fragment_bytes=4 << 20, compression_level=level)
        with FragmentStore(layout) as store:
            start = time.perf_counter()
            sizes = []
            for fragment_id, fragment in enumerate(fragments):
                record = encode_fragment(fragment, level)
                store.put(fragment_id, record)
                sizes.append(len(record))
            write_s = time.perf_counter() - start
            disk_bytes = sum(path.stat().st_blocks * 512 for path in Path(root).rglob("data.mdb"))
            start = time.perf_counter()
            for fragment_id in range(len(fragments)):
                decode_fragment(store.get(fragment_id))
            read_s = time.perf_counter() - start
    steps = sum(f.length for f in fragments)
    frame_bytes = sum(f.obs["image"].nbytes for f in fragments)
    raw_bytes = sum(f.raw_nbytes() for f in fragments)
    return {
        "stored_per_step": sum(sizes) / steps,
        "frame_per_step": frame_bytes / steps,
        "ratio_frames": sum(sizes) / frame_bytes,
        "ratio_all_fields": sum(sizes) / raw_bytes,
        "write_mb_s": raw_bytes / write_s / 1e6,
        "read_mb_s": raw_bytes / read_s / 1e6,
        "fragment_kib": sum(sizes) / len(sizes) / 1024,
        "disk_per_step": disk_bytes / steps,
    }


def main(argv: list[str] | None = None) -> float:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fragments", type=int, default=16)
    parser.add_argument("--fragment-length", type=int, default=256)
    parser.add_argument("--levels", type=int, nargs="+", default=[3, 1])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-write-results", action="store_true")
    args = parser.parse_args(argv)

    start = time.perf_counter()
    frames = crafter_frames(args.fragments * args.fragment_length, args.seed)
    fragments = make_fragments(frames, args.fragment_length, args.seed)
    print(f"generated {len(fragments)} fragments x {args.fragment_length} steps in "
          f"{time.perf_counter() - start:.1f} s", file=sys.stderr)

    header = ("| zstd level | stored B/step | raw frame B/step | stored / raw frames | stored / raw all fields "
              "| KiB/fragment | LMDB disk B/step | write MB/s (raw) | read MB/s (raw) |")
    rows = [header, "|" + "---|" * 9]
    results = {}
    for level in args.levels:
        results[level] = r = measure(fragments, level)
        rows.append(f"| {level} | {r['stored_per_step']:.0f} | {r['frame_per_step']:.0f} | {r['ratio_frames']:.4f} "
                    f"| {r['ratio_all_fields']:.4f} | {r['fragment_kib']:.0f} | {r['disk_per_step']:.0f} | {r['write_mb_s']:.0f} "
                    f"| {r['read_mb_s']:.0f} |")
    table = "\n".join(rows)
    print(table)

    command = "python bench/replay_bytes.py " + " ".join(argv if argv is not None else sys.argv[1:])
    section = "\n".join([
        "## P4 replay bytes per env step (crafter 64x64, random actions)",
        "",
        f"- command: `{command.strip()}`",
        f"- date: {dt.date.today().isoformat()}; machine: {describe_machine()}",
        f"- {len(fragments)} fragments x {args.fragment_length} steps; store level in use: "
        f"{args.levels[0]}; MB/s are raw (uncompressed) fragment bytes through encode+put and get+decode, "
        "one process, hot page cache",
        "",
        table,
        "",
    ])
    ratio = results[args.levels[0]]["ratio_frames"]
    finish(None if args.no_write_results else RESULTS, "# Replay buffer benchmarks\n\n" + section,
           [headline("P4", "replay_bytes_ratio", ratio, 4, f"stored over raw frame bytes, zstd level {args.levels[0]}")])
    return ratio


if __name__ == "__main__":
    main()
