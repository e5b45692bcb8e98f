"""P2/P3 against peers: craftrl, Stable-Baselines3 PPO and RLlib PPO on the same task, cores and clock.

Issue 10: same task (craftrl's ``crafter/cows``; the peers reach it through ``bench/peers/cows_gym.py``, which
calls craftrl's own env factory, fast Crafter paths included), models of comparable size (the parameter counts
are in the table), the same machine, one system at a time. For each seed it runs every system in turn
(seed 0: craftrl, SB3, RLlib; then seed 1: ...), so a drift in the machine's load hits all systems alike:

* craftrl through ``bench/time_to_cows.py``'s ``run_once`` (``craftrl train CONFIG``, SIGTERM at the deadline),
  with ``num_iterations`` raised so that the run lasts the whole ``--minutes``;
* ``bench/peers/sb3_cows.py`` (PPO, NatureCNN; ``sb3-recurrentppo``: RecurrentPPO, CnnLstm) and
  ``bench/peers/rllib_cows.py`` (PPO, new API stack), which stop themselves at the deadline.

Every system's clock starts when its command is launched (imports, Ray and env start-up count), and cows per
episode is the mean over the last 20 finished episodes, counted only once 20 episodes have finished. Just before
each deadline the CPU time of every process of the run is recorded by role (the profile in the results).
``--stop-at-cows N`` ends every system's run, the same way, once it reaches N cows per episode (profile taken
then): the headlines need nothing after 3 cows, and a seed that gets there early no longer holds the machine
for the rest of ``--minutes``. A run that misses 3 cows by its deadline counts as never reaching them, so
``--minutes`` must leave the slowest system room: 7 minutes on the 2-core machines with AVX-512, 12 on a 2-core
AMD EPYC without it, where RLlib PPO runs at ~200 env steps/s and needs ~100-160k of them.

    python bench/peers.py --minutes 7 --stop-at-cows 3 --systems craftrl rllib-ppo --write-results   # make bench
    python bench/peers.py --minutes 20 --seeds 5 6 --systems craftrl sb3-ppo sb3-recurrentppo rllib-ppo
    python bench/peers.py --summarize runs/bench_peers/<date>  # re-read finished runs, run nothing

Without ``--seeds`` it draws ``--num-seeds`` (10) seeds at random at run time (``bench/seeds.py``), prints them and
saves them in the run's ``context.json``: a reported figure comes from seeds no setting was chosen on. The results
give each system's median and interquartile range and how many of its runs did not reach 3 cows.

Writes ``OUTPUT_ROOT/peers.md`` and ``OUTPUT_ROOT/peers_cows.png`` (with ``--write-results`` also
``bench/results/peers.md`` and ``bench/figures/peers_cows.png``, which ``make bench`` puts into BENCHMARKS.md).

A CPU without native bf16 on a machine that has it: set ``ISA_LIMIT_VARIABLES`` for the whole run, which the
results then name, and keep the section apart from the main one::

    ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 \
        python bench/peers.py --minutes 7 --stop-at-cows 3 --seeds 32 33 34 35 36 --systems craftrl rllib-ppo
    python bench/peers.py --summarize <that run's dated folder> --write-results --results-name peers_isa_limited

The last three lines are ``P2 sps_ratio_vs_best_peer=<craftrl / fastest peer, median env steps/s>``,
``P3 time_to_3_cows_ratio_vs_best_peer=<craftrl / quickest peer, median seconds to 3 cows>`` and
``P3b env_steps_to_3_cows_ratio_vs_best_peer=<craftrl / the peer with the fewest, median env steps to 3
cows>``; a system that never reaches 3 cows counts as infinitely slow (``inf`` if only craftrl misses, ``0`` if
only the peers miss, ``nan`` if nobody reaches it).
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import importlib.metadata
import importlib.util
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Mapping, NamedTuple

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
PEERS_DIR = BENCH / "peers"
sys.path.insert(0, str(PEERS_DIR))  # peer_curve; time_to_cows is importable from BENCH (sys.path[0])

import time_to_cows  # noqa: E402
from headlines import Headline, headline, with_headlines  # noqa: E402
from machine import describe_machine  # noqa: E402
from craftrl.metrics import read_jsonl  # noqa: E402
from peer_curve import LAUNCHED_AT_ENV, THRESHOLDS, first_reaching, summarize_points, reached_or_inf  # noqa: E402
from seeds import add_seed_arguments, seeds_from, spread  # noqa: E402

PEER_SCRIPTS: dict[str, list[str]] = {
    "sb3-ppo": ["sb3_cows.py"],
    "sb3-recurrentppo": ["sb3_cows.py", "--recurrent"],
    "rllib-ppo": ["rllib_cows.py"],
}
SYSTEMS = ["craftrl", *PEER_SCRIPTS]
DEFAULT_SYSTEMS = ["craftrl", "sb3-ppo", "rllib-ppo"]
LABELS = {"craftrl": "craftrl (default config)", "sb3-ppo": "SB3 PPO, NatureCNN",
          "sb3-recurrentppo": "sb3-contrib RecurrentPPO, CnnLstm", "rllib-ppo": "RLlib PPO, new API stack"}
COLOURS = {"craftrl": "tab:red", "sb3-ppo": "tab:blue", "sb3-recurrentppo": "tab:cyan", "rllib-ppo": "tab:green"}
LINE_STYLES = ["-", "--", ":", "-."]
# Variables that keep torch (oneDNN, ATen's kernels, MKL) from instruction sets the CPU has. Every process of every
# system inherits them, so a run under them shows on the same cores what a CPU without those instructions (without
# native bf16, say) would do.
ISA_LIMIT_VARIABLES = ("ONEDNN_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS")
# A peer stops itself at its deadline, at most one PPO update later; past this grace it gets SIGTERM.
STOP_GRACE_S = 120.0

# (role, test on a process's command line and its parent's); the driver itself is labelled by the caller
PROCESS_ROLES = (
    ("env runners: envs + inference (RLlib)", lambda cmd, parent: cmd.startswith("ray::SingleAgentEnvRunner")),
    ("env processes (SB3 SubprocVecEnv)", lambda cmd, parent: "multiprocessing" in cmd),
    ("env processes (craftrl)", lambda cmd, parent: parent.startswith("ray::RolloutWorker")),
    ("rollout worker: inference, fragments, replay writes (craftrl)", lambda cmd, parent: cmd.startswith("ray::RolloutWorker")),
    ("replay buffer and readers (craftrl)", lambda cmd, parent: cmd.startswith(("ray::ReplayBuffer", "ray::ChunkReader"))),
    ("metrics, statistics, manager (craftrl)", lambda cmd, parent: cmd.startswith(("ray::Metrics", "ray::Episode", "ray::RolloutManager"))),
)
DRIVER_ROLE = {"craftrl": "driver: learner (craftrl)", "sb3-ppo": "driver: inference + learner (SB3)",
               "sb3-recurrentppo": "driver: inference + learner (SB3)", "rllib-ppo": "driver: learner (RLlib)"}


def cpu_by_role(root: int, system: str) -> dict[str, float]:
    """CPU seconds used so far by ``root`` and its descendants, by role (Ray's own daemons: "Ray system")."""
    return time_to_cows.cpu_split(root, DRIVER_ROLE[system], PROCESS_ROLES, "Ray system processes / other")


def _start_ticks(pid: int) -> int | None:
    """A process's start time (clock ticks after boot): with the pid, it names one process even if pids are reused."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()
    return None if fields[0] == "Z" else int(fields[19])


def process_tree(root: int) -> dict[int, int]:
    """pid -> start time for ``root`` and its live descendants (Ray's workers included: they are children of the
    raylet, which the driver started, although they run in sessions of their own)."""
    table = time_to_cows._proc_table()
    children: dict[int, list[int]] = {}
    for pid, (parent, _, _) in table.items():
        children.setdefault(parent, []).append(pid)
    tree, stack = {}, [root]
    while stack:
        pid = stack.pop()
        stack.extend(children.get(pid, []))
        start = _start_ticks(pid)
        if start is not None:
            tree[pid] = start
    return tree


def still_running(snapshot: dict[int, int], group: int) -> list[int]:
    """Processes of a finished run that are still alive: from a snapshot of its tree, or in its process group."""
    alive = {pid for pid, start in snapshot.items() if _start_ticks(pid) == start}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and _start_ticks(int(entry.name)) is not None:
            try:
                if os.getpgid(int(entry.name)) == group:
                    alive.add(int(entry.name))
            except ProcessLookupError:
                pass
    return sorted(alive)


def run_peer(system: str, seed: int, minutes: float, out: Path, extra: list[str],
             stop_at_cows: float | None = None) -> dict[str, Any] | None:
    """Run one peer script to its own deadline, or until its curve reaches ``stop_at_cows`` (then SIGTERM, which
    every peer script answers by writing its summary); returns that summary with the CPU profile added, or None
    if the script wrote none."""
    out.mkdir(parents=True, exist_ok=True)
    script, *flags = PEER_SCRIPTS[system]
    arguments = [*flags, *extra, "--minutes", f"{minutes:g}", "--seed", str(seed)]
    command = [sys.executable, str(PEERS_DIR / script), *arguments, "--out", str(out)]
    launched = time.time()
    env = {**os.environ, LAUNCHED_AT_ENV: repr(launched), "PYTHONUNBUFFERED": "1", "RAY_USAGE_STATS_ENABLED": "0"}
    with (out / "log.txt").open("w") as log:
        child = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT, start_new_session=True)
        profile_at = max(minutes * 60 - 5, 1)
        split: dict[str, float] = {}
        snapshot: dict[int, int] = {}
        reached = time_to_cows.wait_until(child, launched + profile_at - time.time(),
                                          None if stop_at_cows is None else lambda: curve_reached(out, stop_at_cows))
        profiled_s = profile_at
        if child.poll() is None:
            split = cpu_by_role(child.pid, system)
            snapshot = process_tree(child.pid)
            profiled_s = time.time() - launched
        if reached:
            child.send_signal(signal.SIGTERM)
        try:
            child.wait(timeout=max(launched + minutes * 60 + STOP_GRACE_S - time.time(), 1))
        except subprocess.TimeoutExpired:
            print(f"peers: {system} seed {seed} ran past its deadline; sending SIGTERM", file=sys.stderr, flush=True)
            child.send_signal(signal.SIGTERM)
            try:
                child.wait(timeout=60)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
    time.sleep(2)
    leftovers = still_running(snapshot, group=child.pid)
    if leftovers:
        print(f"peers: {system} seed {seed} left processes {leftovers}; killing them", file=sys.stderr, flush=True)
        for pid in leftovers:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    summary_path = out / "summary.json"
    if not summary_path.exists():  # one failed run does not cost the others: the results name it
        print(f"peers: {system} seed {seed} wrote no summary (exit {child.returncode}); see {out / 'log.txt'}",
              file=sys.stderr, flush=True)
        return None
    summary = json.loads(summary_path.read_text())
    summary.update(command=f"python bench/peers/{script} {' '.join(arguments)} --out OUT", exit_code=child.returncode,
                   stopped_at_cows=reached,  # then the script's exit code is that of a SIGTERM'd run
                   left_processes=len(leftovers), profile=profile(split, profiled_s))
    summary_path.write_text(json.dumps(summary, indent=1) + "\n")
    return summary


def profile(split: dict[str, float], wall_s: float) -> dict[str, Any]:
    return {"wall_s": wall_s, "cpu_s": split, "cores_used": {k: v / wall_s for k, v in split.items()}} if split else {}


def craftrl_parameter_count(config: str) -> int:
    """Parameters of the policy the craftrl config builds (a module name or a .py file)."""
    if config.endswith(".py"):
        spec = importlib.util.spec_from_file_location("craftrl_bench_config", config)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    else:
        module = importlib.import_module(config)
    return int(sum(p.numel() for p in module.policy_generator().parameters()))


def run_craftrl(config: str, overrides: list[str], seed: int, minutes: float, out: Path,
                stop_at_cows: float | None = None) -> dict[str, Any]:
    """craftrl through time_to_cows.run_once; its metrics become the same curve.jsonl/summary.json as a peer's."""
    out.mkdir(parents=True, exist_ok=True)
    # enough iterations to outlast the deadline (no learning-rate schedule depends on it by default)
    overrides = ["train_config.num_iterations=1000000", *overrides]
    run_dir = time_to_cows.run_once(config, overrides, seed, minutes, out, out / "log.txt", stop_at_cows=stop_at_cows)
    return summarize_craftrl_run(run_dir, config, seed, minutes, out,
                                 command=f"craftrl train {config} seed={seed} {' '.join(overrides)}")


def summarize_craftrl_run(run_dir: Path, config: str, seed: int, minutes: float, out: Path,
                          command: str) -> dict[str, Any]:
    points = [{"wall_s": round(p["t"], 3), "env_steps": int(p["steps"]), "episodes": int(p["episodes"]),
               "cows_mean_last20": p["cows"]} for p in time_to_cows.read_curve(run_dir)]
    (out / "curve.jsonl").write_text("".join(json.dumps(p) + "\n" for p in points))
    split_path = run_dir / "cpu_split.json"
    split = json.loads(split_path.read_text()) if split_path.exists() else {}
    summary = {"system": "craftrl", "seed": seed, "minutes_asked": minutes, "params": craftrl_parameter_count(config),
               **summarize_points(points), "settings": {"config": config, "run_dir": str(run_dir)},
               "command": command,
               "profile": profile(relabel_craftrl_split(split.get("cpu_s", {})), split.get("wall_s", 1.0))}
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary


def relabel_craftrl_split(split: dict[str, float]) -> dict[str, float]:
    """time_to_cows's component names -> this harness's roles, so one profile table covers every system."""
    names = {"learner (driver process)": DRIVER_ROLE["craftrl"], "env processes": "env processes (craftrl)",
             "rollout worker: inference, fragments, replay writes": PROCESS_ROLES[3][0],
             "replay buffer and readers": PROCESS_ROLES[4][0], "metrics, statistics, manager": PROCESS_ROLES[5][0],
             "Ray system processes": "Ray system processes / other"}
    return {names.get(name, name): seconds for name, seconds in split.items()}


# ---- results -----------------------------------------------------------------------------------------------

def read_curve(out: Path) -> list[dict[str, Any]]:
    """The points of ``out/curve.jsonl``; a line its script is still writing is left out."""
    path = out / "curve.jsonl"
    return read_jsonl(path) if path.exists() else []


def curve_reached(out: Path, cows: float) -> bool:
    """Whether the curve a running script writes under ``out`` has reached a mean of ``cows`` per episode."""
    return first_reaching(read_curve(out), cows) is not None


def median(values: list[float]) -> float:
    return statistics.median(values) if values else math.nan


def fmt_s(value: float | None) -> str:
    return "not reached" if value is None or math.isinf(value) else f"{value:.0f} s"


def fmt_steps(value: float) -> str:
    return "not reached" if math.isinf(value) else f"{value:.0f}"


def fmt_cows(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


class Ratios(NamedTuple):
    p2: float  # craftrl / fastest peer, median env steps/s
    p3: float  # craftrl / quickest peer, median seconds to 3 cows
    p3b: float  # craftrl / the peer with the fewest median env steps to 3 cows
    fastest: str
    quickest: str
    leanest: str


def headline_ratios(summaries: list[dict[str, Any]]) -> Ratios:
    """P2, P3 and P3b, and the peer each compares against, from per-system medians over seeds."""
    systems = sorted({s["system"] for s in summaries}, key=SYSTEMS.index)

    def medians(value) -> dict[str, float]:
        return {name: median([value(s) for s in summaries if s["system"] == name]) for name in systems}

    sps = medians(lambda s: s.get("end_to_end_sps", 0.0))
    to3 = medians(lambda s: reached_or_inf(s.get("time_to_3_cows_s")))
    steps3 = medians(lambda s: reached_or_inf(s.get("env_steps_to_3_cows")))
    peers = [name for name in systems if name != "craftrl"]
    if "craftrl" not in systems or not peers:
        return Ratios(math.nan, math.nan, math.nan, "", "", "")
    fastest = max(peers, key=lambda name: sps[name])
    quickest = min(peers, key=lambda name: to3[name])
    leanest = min(peers, key=lambda name: steps3[name])
    p2 = sps["craftrl"] / sps[fastest] if sps[fastest] > 0 else math.nan
    return Ratios(p2, reached_ratio(to3["craftrl"], to3[quickest]),
                    reached_ratio(steps3["craftrl"], steps3[leanest]), fastest, quickest, leanest)


def reached_ratio(ours: float, theirs: float) -> float:
    """ours / theirs, where inf means never reached: nan if neither reached, inf if only ours did not, 0 if
    only theirs did not."""
    if math.isinf(ours) and math.isinf(theirs):
        return math.nan
    if math.isinf(ours):
        return math.inf
    if math.isinf(theirs):
        return 0.0
    return ours / theirs


def plot(summaries: list[dict[str, Any]], run_dirs: dict[tuple[str, int], Path], minutes: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    seeds = sorted({s["seed"] for s in summaries})
    figure, axes = plt.subplots(figsize=(9, 5.5))
    for summary in summaries:
        name, seed = summary["system"], summary["seed"]
        points = [p for p in read_curve(run_dirs[(name, seed)]) if p["cows_mean_last20"] is not None]
        if not points:
            continue
        axes.plot([p["wall_s"] / 60 for p in points], [p["cows_mean_last20"] for p in points],
                  color=COLOURS.get(name, "black"), linestyle=LINE_STYLES[seeds.index(seed) % len(LINE_STYLES)],
                  linewidth=1.6, label=f"{LABELS.get(name, name)}, seed {seed} ({summary['params'] / 1e6:.2f} M params)")
    axes.axhline(3.0, color="grey", linewidth=0.8, linestyle=(0, (4, 4)))
    axes.set_xlim(0, minutes * 1.02)  # a peer stops at most one update after its deadline
    axes.set_xlabel("wall-clock minutes since launch")
    axes.set_ylabel("cows per episode (mean of last 20 episodes)")
    axes.set_title(f"crafter/cows on {os.cpu_count()} cores, one system at a time")
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8, loc="upper left")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)


def versions() -> str:
    names = ["torch", "ray", "gymnasium", "stable-baselines3", "sb3-contrib"]
    found = []
    for name in names:
        try:
            found.append(f"{name} {importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            found.append(f"{name} (not installed)")
    return ", ".join(found)


def isa_limits(environ: Mapping[str, str]) -> dict[str, str]:
    """The ``ISA_LIMIT_VARIABLES`` set in ``environ``."""
    return {name: environ[name] for name in ISA_LIMIT_VARIABLES if environ.get(name)}


def results_markdown(summaries: list[dict[str, Any]], context: dict[str, Any], figure: str,
                     missing: list[tuple[str, int]] | None = None) -> str:
    """The results section; ``missing`` names the (system, seed) runs that wrote no summary."""
    p2, p3, p3b, fastest, quickest, leanest = headline_ratios(summaries)
    limits = " ".join(f"{name}={value}" for name, value in context.get("isa_limits", {}).items())
    lines = [
        "## Against peers on the default task (`bench/peers.py`, P2, P3 and P3b)"
        + (f" on {context['machine']}" if context.get("machine") else "")
        + (f", torch limited to fewer instructions ({limits})" if limits else ""), "",
        f"`{limits + ' ' if limits else ''}{context['command']}`, {context['date']}, "
        f"{context.get('machine') or str(context['cores']) + ' cores'}, 1-minute load average "
        f"{context['load_before']:.1f} before / {context['load_after']:.1f} after; {context['versions']}. "
        "Systems ran one at a time, seeds interleaved; each clock starts at its command's launch (imports, Ray and "
        "env start-up count); cows per episode is the mean of the last 20 episodes, counted once 20 have finished. "
        "All systems step craftrl's own `crafter/cows` env (the peers through `bench/peers/cows_gym.py`)."
        + (" The seeds were drawn at random when the run started (bench/seeds.py): no setting was chosen on them."
           if context.get("seeds_drawn") else "")
        + (f" Every process of every system ran with {limits}: torch used none of the CPU's instructions beyond"
           " those, as on a CPU without them." if limits else "")
        + (f" Each run ended once it reached {context['stop_at_cows']:g} cows per episode (or at {context['minutes']:g}"
           " min), so its env steps/s span launch to that point, start-up included, and later minutes are blank."
           if context.get("stop_at_cows") else ""), "",
        "| system | seed | params | end-to-end env steps/s | time to 1 / 2 / 3 cows | env steps to 3 cows | "
        "cows at 5 / 10 / 15 / 20 min |",
        "|---|---:|---:|---:|---|---:|---|",
    ]
    for s in summaries:
        times = " / ".join(fmt_s(reached_or_inf(s.get(f"time_to_{t:g}_cows_s"))) for t in THRESHOLDS)
        cows = " / ".join(fmt_cows(s.get(f"cows_at_{m:g}min")) for m in (5, 10, 15, 20))
        steps3 = s.get("env_steps_to_3_cows")
        lines.append(f"| {LABELS.get(s['system'], s['system'])} | {s['seed']} | {s['params'] / 1e6:.2f} M | "
                     f"{s.get('end_to_end_sps', 0.0):.0f} | {times} | {'not reached' if steps3 is None else steps3} | {cows} |")
    systems = sorted({s["system"] for s in summaries}, key=SYSTEMS.index)
    lines += ["", "Median (first quartile - third quartile) over seeds; a run that did not reach 3 cows counts as "
              "infinite.", "",
              "| system | env steps/s | time to 3 cows | env steps to 3 cows | did not reach 3 cows | seeds |",
              "|---|---:|---|---:|---:|---:|"]
    for name in systems:
        mine = [s for s in summaries if s["system"] == name]
        sps = spread([s.get("end_to_end_sps", 0.0) for s in mine])
        seconds = spread([reached_or_inf(s.get("time_to_3_cows_s")) for s in mine])
        steps = spread([reached_or_inf(s.get("env_steps_to_3_cows")) for s in mine])
        missed = sum(1 for s in mine if s.get("time_to_3_cows_s") is None)
        lines.append(f"| {LABELS.get(name, name)} | {sps[0]:.0f} ({sps[1]:.0f} - {sps[2]:.0f}) | "
                     f"{fmt_s(seconds[0])} ({fmt_s(seconds[1])} - {fmt_s(seconds[2])}) | "
                     f"{fmt_steps(steps[0])} ({fmt_steps(steps[1])} - {fmt_steps(steps[2])}) | {missed} | "
                     f"{len(mine)} |")
    lines += ["", f"**P2** (craftrl / fastest peer, {LABELS.get(fastest, fastest)}, median env steps/s): **{p2:.2f}**. "
              f"**P3** (craftrl / quickest peer to 3 cows, {LABELS.get(quickest, quickest)}, median seconds; "
              f"a median that did not reach 3 cows in {context['minutes']:g} min counts as infinite): **{p3:.2f}**. "
              f"**P3b** (craftrl / the peer with the fewest, {LABELS.get(leanest, leanest)}, median env steps to 3 "
              f"cows): **{p3b:.2f}**.", ""]
    lines += verdict(p2, p3, fastest, quickest, summaries, context["minutes"])
    if missing:
        lines.append("Wrote no summary, so left out of the medians (see each run's log.txt): "
                     + ", ".join(f"{LABELS.get(name, name)} seed {seed}" for name, seed in missing) + ".")
    if not math.isnan(p3b):
        lines += ["", f"In env steps craftrl needed {p3b:.2f}x what {LABELS.get(leanest, leanest)} needed to 3 cows "
                      f"per episode (P3b's target: 0.5 or less)."]
    lines += ["", f"![cows per episode against wall-clock minutes]({figure})", ""]
    lines += profile_table(summaries)
    lines += ["", "Commands (each run's settings are in its `summary.json`):", ""]
    seen = set()
    for s in summaries:
        command = s.get("command", "").replace(f"--seed {s['seed']}", "--seed S").replace(f"seed={s['seed']}", "seed=S")
        if s["system"] not in seen:
            seen.add(s["system"])
            lines.append(f"- {LABELS.get(s['system'], s['system'])}: `{command}`")
    return "\n".join(lines) + "\n"


def verdict(p2: float, p3: float, fastest: str, quickest: str, summaries: list[dict[str, Any]],
            minutes: float) -> list[str]:
    """Says plainly where craftrl loses (the profile below shows where each system's CPU went)."""
    out = []
    if p2 < 1:
        out.append(f"craftrl **loses on throughput**: it sampled {p2:.2f}x the env steps/s of "
                   f"{LABELS.get(fastest, fastest)}; see the CPU profile below.")
    if math.isinf(p3) or p3 > 1:
        out.append(f"craftrl **loses on time to 3 cows** against {LABELS.get(quickest, quickest)}"
                   + (f" (its median did not reach 3 cows in {minutes:g} min)" if math.isinf(p3) else "") + ".")
    if math.isnan(p3):
        out.append(f"No system's median reached 3 cows per episode in {minutes:g} minutes, so P3 is undefined.")
    if not out:
        out.append("craftrl wins on both: more env steps/s than the fastest peer and less time to 3 cows than the "
                   "quickest.")
    never = [LABELS.get(s["system"], s["system"]) + f" seed {s['seed']}" for s in summaries
             if s.get("time_to_3_cows_s") is None]
    if never:
        out.append(f"Never reached 3 cows (counted as infinite time): {', '.join(never)}.")
    return out


def profile_table(summaries: list[dict[str, Any]]) -> list[str]:
    """Cores used by each role, per system (mean over seeds), measured 5 s before each deadline."""
    by_system: dict[str, dict[str, list[float]]] = {}
    for s in summaries:
        for role, cores in s.get("profile", {}).get("cores_used", {}).items():
            by_system.setdefault(s["system"], {}).setdefault(role, []).append(cores)
    if not by_system:
        return []
    lines = ["### Where the CPU goes (cores used over the whole run, mean over seeds)", "",
             "| system | role | cores used |", "|---|---|---:|"]
    for name in sorted(by_system, key=SYSTEMS.index):
        roles = by_system[name]
        total = sum(statistics.mean(v) for v in roles.values())
        for role, values in sorted(roles.items(), key=lambda item: -statistics.mean(item[1])):
            lines.append(f"| {LABELS.get(name, name)} | {role} | {statistics.mean(values):.2f} |")
        lines.append(f"| {LABELS.get(name, name)} | **total** | **{total:.2f}** |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=20.0)
    add_seed_arguments(parser, count=10)
    parser.add_argument("--systems", nargs="+", choices=SYSTEMS, default=DEFAULT_SYSTEMS)
    parser.add_argument("--config", default="craftrl.configs.default", help="craftrl config")
    parser.add_argument("--output-root", default="runs/bench_peers")
    parser.add_argument("--peer-torch-threads", type=int, default=None,
                        help="torch threads of each peer's driver (default: torch's own); craftrl's processes use 1")
    parser.add_argument("--stop-at-cows", type=float, default=None,
                        help="end each run once its 20-episode mean reaches this many cows (default: run all --minutes)")
    parser.add_argument("--summarize", metavar="OUTPUT_ROOT", default=None,
                        help="read the runs of an earlier invocation (its context.json) instead of running")
    parser.add_argument("--write-results", action="store_true",
                        help="also rewrite bench/results/NAME.md and bench/figures/NAME_cows.png "
                             "(NAME: --results-name)")
    parser.add_argument("--results-name", default="peers",
                        help="NAME of the results section and figure that --write-results rewrites (default: peers; "
                             "another name adds a section, as for a run under ISA_LIMIT_VARIABLES)")
    parser.add_argument("overrides", nargs="*", help="craftrl config overrides, e.g. train_config.learning_rate=1e-3")
    args = parser.parse_args()

    if args.summarize:
        root = Path(args.summarize).resolve()
        context = json.loads((root / "context.json").read_text())
        run_dirs = {(name, seed): root / f"{name}-seed{seed}" for name in context["systems"] for seed in context["seeds"]}
        summaries = [json.loads((d / "summary.json").read_text()) for d in run_dirs.values() if (d / "summary.json").exists()]
    else:
        root = Path(args.output_root).resolve() / datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
        root.mkdir(parents=True, exist_ok=True)
        seeds, drawn = seeds_from(args, "peers")
        context = {"command": "python bench/peers.py " + " ".join(sys.argv[1:]), "date": datetime.date.today().isoformat(),
                   "cores": os.cpu_count(), "machine": describe_machine(),
                   "load_before": os.getloadavg()[0], "versions": versions(),
                   "minutes": args.minutes, "stop_at_cows": args.stop_at_cows, "seeds": seeds, "seeds_drawn": drawn,
                   "systems": args.systems, "isa_limits": isa_limits(os.environ)}
        (root / "context.json").write_text(json.dumps(context, indent=1) + "\n")
        run_dirs, summaries = {}, []
        for seed in seeds:
            for name in args.systems:
                out = root / f"{name}-seed{seed}"
                run_dirs[(name, seed)] = out
                print(f"== {name} seed {seed}, {args.minutes:g} min -> {out}", flush=True)
                if name == "craftrl":
                    summary = run_craftrl(args.config, args.overrides, seed, args.minutes, out, args.stop_at_cows)
                else:
                    extra = ["--torch-threads", str(args.peer_torch_threads)] if args.peer_torch_threads else []
                    summary = run_peer(name, seed, args.minutes, out, extra, args.stop_at_cows)
                if summary is None:
                    continue
                summaries.append(summary)
                print(json.dumps({k: summary.get(k) for k in ("system", "seed", "params", "end_to_end_sps", "episodes",
                                                              "time_to_1_cows_s", "time_to_3_cows_s",
                                                              "final_cows_mean_last20")}), flush=True)
        context["load_after"] = os.getloadavg()[0]
        (root / "context.json").write_text(json.dumps(context, indent=1) + "\n")
    context.setdefault("load_after", math.nan)

    summaries.sort(key=lambda s: (SYSTEMS.index(s["system"]), s["seed"]))
    finished = {(s["system"], s["seed"]) for s in summaries}
    missing = [run for run in run_dirs if run not in finished]
    figures = headline_figures(summaries)
    targets = [(root / "peers.md", root / "peers_cows.png", "peers_cows.png")]
    if args.write_results:
        name = args.results_name
        targets.append((BENCH / "results" / f"{name}.md", BENCH / "figures" / f"{name}_cows.png",
                        f"bench/figures/{name}_cows.png"))
    for markdown_path, figure_path, figure_link in targets:
        plot(summaries, run_dirs, context["minutes"], figure_path)
        markdown_path.parent.mkdir(parents=True, exist_ok=True)
        markdown_path.write_text(with_headlines(results_markdown(summaries, context, figure_link, missing), figures))
    print(results_markdown(summaries, context, str(root / "peers_cows.png"), missing), flush=True)
    print(f"peers: results in {root}", flush=True)
    for figure in figures:
        print(figure.figure, flush=True)


def headline_figures(summaries: list[dict[str, Any]]) -> list[Headline]:
    """P2, P3 and P3b as headlines, each saying whom it compares with."""
    ratios = headline_ratios(summaries)
    seeds = len({s["seed"] for s in summaries})

    def summary(what: str, peer: str) -> str:
        return f"craftrl / {LABELS.get(peer, peer)}, median {what} over {seeds} seeds"

    return [headline("P2", "sps_ratio_vs_best_peer", ratios.p2, 3, summary("env steps/s", ratios.fastest)),
            headline("P3", "time_to_3_cows_ratio_vs_best_peer", ratios.p3, 3,
                     summary("seconds to 3 cows per episode", ratios.quickest)),
            headline("P3b", "env_steps_to_3_cows_ratio_vs_best_peer", ratios.p3b, 3,
                     summary("env steps to 3 cows per episode", ratios.leanest))]


if __name__ == "__main__":
    main()
