"""RLlib PPO (new API stack) with a Nature-style CNN on craftrl's ``crafter/cows``.

The peer side of issue 10's comparison: the same task through ``cows_gym.CowsGymEnv`` (craftrl's own env
factory), 2 env runners x 2 envs each (the settings issue 10's author used on a 2-core machine), the learner
in the driver process on CPU (``num_learners=0``). RLlib's default CNN expects float images, so the uint8 frames
go through RLlib's own ``NormalizedImageEnv`` wrapper (as RLlib's Atari examples do). The model is RLlib's
default PPO module: Nature CNN 32/64/64 with "valid" padding (a 4x4x64 map), then separate policy and value
heads of one hidden layer of 256 -- ~0.6 M parameters, like SB3's NatureCNN policy (0.61 M) and craftrl's
default (0.75 M, of which 0.53 M is its LSTM). PPO: 1024 env steps per iteration (256 per env), minibatches of
128, 4 epochs -- craftrl's 32 optimiser steps per 1024 steps; lr 3e-4, entropy 0.01, gamma 0.99, lambda 0.95,
clip 0.2, gradient clip 0.5; RLlib's defaults otherwise (its KL penalty included).

    python bench/peers/rllib_cows.py --minutes 20 --seed 0 --out /tmp/peers/rllib-s0

Ray gets ``max(cores, env runners + 1)`` logical CPUs: each env runner reserves one, and the learner runs in the
driver outside Ray's accounting, so a 2-core machine neither deadlocks nor oversubscribes by more than one.
The script stops itself ``--minutes`` after launch (see ``peer_curve``; at most one training iteration
later), stops the algorithm and Ray, and writes ``OUT/curve.jsonl`` and ``OUT/summary.json``; its last line is
``summary {...}``.
"""

from __future__ import annotations

from peer_curve import CowsCurve, launched_at, peer_arguments, start  # noqa: I001 (first: the clock)

LAUNCHED = launched_at()

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

PEERS_DIR = Path(__file__).resolve().parent
# Ray's worker processes inherit this environment and import cows_gym by name, like this script does
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(PEERS_DIR), os.environ.get("PYTHONPATH")) if p)
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
ENV_NAME = "craftrl-crafter-cows"
NATURE_CNN = [[32, 8, 4, "valid"], [64, 4, 2, "valid"], [64, 3, 1, "valid"]]


_envs_made_here = 0  # RLlib gives every sub-env of an env runner the same context (vector_index 0)


def make_env(env_config: dict[str, Any]) -> Any:
    """Env creator for RLlib: craftrl's task, frames scaled to float by RLlib's own wrapper.

    Each env plays its own sequence of worlds (``cows_gym.world_seed``): RLlib's reset seeds
    (``seed + worker_index + j``) would make neighbouring env runners replay the same worlds."""
    global _envs_made_here
    from cows_gym import CowsGymEnv, world_seed
    from ray.rllib.env.wrappers.atari_wrappers import NormalizedImageEnv

    worker = int(getattr(env_config, "worker_index", 0))
    index = worker * int(env_config["envs_per_runner"]) + _envs_made_here
    _envs_made_here += 1
    env = CowsGymEnv(seed=world_seed(int(env_config["seed"]), index), episode_log_dir=env_config["episode_log_dir"],
                     follow_reset_seeds=False)
    return NormalizedImageEnv(env)


class EpisodeLogReader:
    """Reads the episodes that env processes appended to ``cows_gym``'s per-process logs since the last call."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.offsets: dict[Path, int] = {}

    def new_episodes(self) -> list[dict[str, Any]]:
        episodes = []
        for path in sorted(self.directory.glob("episodes-*.jsonl")):
            with path.open() as log:
                log.seek(self.offsets.get(path, 0))
                text = log.read()
            complete = text[: text.rfind("\n") + 1]  # a line still being written waits for the next call
            self.offsets[path] = self.offsets.get(path, 0) + len(complete.encode())
            episodes += [json.loads(line) for line in complete.splitlines() if line.strip()]
        return sorted(episodes, key=lambda episode: episode["end_time"])


def learner_parameter_count(algo: Any) -> int:
    """Trainable parameters of the module the learner trains (CNN, policy and value heads); the env runners'
    copy is inference-only (no value head), so ``algo.get_module()`` would undercount."""
    counts = algo.learner_group.foreach_learner(
        lambda learner: sum(p.numel() for module in learner.module.values() for p in module.parameters()))
    return int(next(iter(counts)).get())  # one learner (the local one)


def build_config(args: argparse.Namespace, episode_log_dir: Path) -> Any:
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig

    return (
        PPOConfig()
        .api_stack(enable_rl_module_and_learner=True, enable_env_runner_and_connector_v2=True)
        .framework("torch")
        .environment(ENV_NAME, env_config={"seed": args.seed, "episode_log_dir": str(episode_log_dir),
                                           "envs_per_runner": args.envs_per_runner})
        .env_runners(num_env_runners=args.env_runners, num_envs_per_env_runner=args.envs_per_runner,
                     num_cpus_per_env_runner=1)
        .learners(num_learners=0, num_gpus_per_learner=0)
        .rl_module(model_config=DefaultModelConfig(conv_filters=NATURE_CNN, conv_activation="relu",
                                                   head_fcnet_hiddens=[256], head_fcnet_activation="relu",
                                                   vf_share_layers=True))
        .training(train_batch_size_per_learner=args.train_batch, minibatch_size=args.minibatch,
                  num_epochs=args.epochs, lr=args.lr, entropy_coeff=args.ent_coef, gamma=0.99, lambda_=0.95,
                  clip_param=0.2, vf_loss_coeff=0.5, grad_clip=0.5)
        .debugging(seed=args.seed, log_level="WARN")
    )


def stop_ray(algo: Any) -> None:
    import ray

    if algo is not None:
        algo.stop()
    ray.shutdown()


def main() -> int:
    parser = peer_arguments(__doc__.split("\n")[0])
    parser.add_argument("--env-runners", type=int, default=2)
    parser.add_argument("--envs-per-runner", type=int, default=2)
    parser.add_argument("--train-batch", type=int, default=1024, help="env steps per training iteration")
    parser.add_argument("--minibatch", type=int, default=128)
    args = parser.parse_args()
    start(args)
    import torch

    import ray
    from ray.rllib.utils.metrics import ENV_RUNNER_RESULTS, NUM_ENV_STEPS_SAMPLED_LIFETIME
    from ray.tune.registry import register_env

    curve = CowsCurve(args.out, "rllib-ppo", args.seed, args.minutes, LAUNCHED)
    episode_log_dir = Path(args.out).resolve() / "episodes"
    for stale in episode_log_dir.glob("episodes-*.jsonl"):  # a rerun into the same directory starts afresh
        stale.unlink()
    reader = EpisodeLogReader(episode_log_dir)
    logical_cpus = max(os.cpu_count() or 1, args.env_runners + 1)
    algo, params, env_steps, interrupted = None, 0, 0, False  # the loop's last record is the final point
    try:
        # address="local": a plain ray.init() joins whatever cluster /tmp/ray/ray_current_cluster names
        ray.init(address="local", num_cpus=logical_cpus, include_dashboard=False, logging_level="WARNING",
                 log_to_driver=False)
        register_env(ENV_NAME, make_env)
        algo = build_config(args, episode_log_dir).build_algo()
        params = learner_parameter_count(algo)
        print(f"rllib-ppo: {params} parameters, setup done at {curve.wall_s():.1f} s", flush=True)
        next_print = time.time() + 30
        while curve.time_left() > 0:
            result = algo.train()
            env_steps = int(result[ENV_RUNNER_RESULTS].get(NUM_ENV_STEPS_SAMPLED_LIFETIME, env_steps))
            curve.add_episodes(episode["cows"] for episode in reader.new_episodes())
            point = curve.record(env_steps)
            if time.time() >= next_print:
                next_print += 30
                print(f"rllib-ppo: {point}", flush=True)
    except (SystemExit, KeyboardInterrupt):  # SIGTERM or Ctrl-C: still write what was measured, then stop Ray
        interrupted = True
    except BaseException:
        stop_ray(algo)
        raise
    settings = {"library": f"ray[rllib] {ray.__version__}", "algorithm": "PPO (new API stack)",
                "model": f"conv {NATURE_CNN}, heads [256] (separate pi/vf heads, shared CNN)",
                "env_runners": args.env_runners, "envs_per_env_runner": args.envs_per_runner,
                "train_batch": args.train_batch, "minibatch": args.minibatch, "epochs": args.epochs, "lr": args.lr,
                "ent_coef": args.ent_coef, "ray_logical_cpus": logical_cpus, "learner": "local (driver), CPU",
                "driver_torch_threads": torch.get_num_threads(), "env_runner_torch_threads": "1 (Ray sets OMP_NUM_THREADS)"}
    # The summary comes before Ray stops: a Ray process stopped by SIGTERM may abort in its shutdown.
    summary = curve.finish(params, settings)
    print("summary " + json.dumps({k: v for k, v in summary.items() if k not in ("settings", "machine")}), flush=True)
    stop_ray(algo)
    return 1 if interrupted else 0


if __name__ == "__main__":
    sys.exit(main())
