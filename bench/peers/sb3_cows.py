"""Stable-Baselines3 PPO (NatureCNN) or sb3-contrib RecurrentPPO (CnnLstm) on craftrl's ``crafter/cows``.

The peer side of issue 10's comparison: the same task through ``cows_gym.CowsGymEnv`` (craftrl's own env
factory), 4 envs in ``SubprocVecEnv`` processes, PPO with 128 steps per env per update and 4 epochs -- the
settings issue 10's author used for SB3 on a 2-core machine. Everything else is SB3's default except the
entropy bonus (0.01, craftrl's default; SB3's 0.0 leaves a sparse-reward policy to collapse early).
``--recurrent`` runs RecurrentPPO with a NatureCNN (256 features) and one LSTM of 256 shared by policy and
value, close to craftrl's default policy (Nature-style CNN + LSTM 256).

    python bench/peers/sb3_cows.py --minutes 20 --seed 0 --out /tmp/peers/sb3-s0
    python bench/peers/sb3_cows.py --recurrent --minutes 20 --seed 0 --out /tmp/peers/sb3-lstm-s0

The script stops itself ``--minutes`` after launch (see ``peer_curve``), closes its env processes and writes
``OUT/curve.jsonl`` and ``OUT/summary.json``; its last line is ``summary {...}``.
"""

from __future__ import annotations

from peer_curve import CowsCurve, launched_at, parameter_count, peer_arguments, start  # noqa: I001 (first: the clock)

LAUNCHED = launched_at()

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any, Callable  # noqa: E402

PEERS_DIR = Path(__file__).resolve().parent
# env processes (forkserver) import cows_gym by name, like this script does
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(PEERS_DIR), os.environ.get("PYTHONPATH")) if p)


def env_factory(run_seed: int, env_index: int) -> Callable[[], Any]:
    def build() -> Any:
        from cows_gym import CowsGymEnv, world_seed

        # SB3's env.seed(seed + i) would give seeds 0 and 1 overlapping worlds; each env keeps its own sequence
        return CowsGymEnv(seed=world_seed(run_seed, env_index), follow_reset_seeds=False)

    return build


def make_model(args: argparse.Namespace, env: Any) -> Any:
    common = dict(n_steps=args.n_steps, n_epochs=args.epochs, learning_rate=args.lr, ent_coef=args.ent_coef,
                  gamma=0.99, gae_lambda=0.95, clip_range=0.2, max_grad_norm=0.5, seed=args.seed, device="cpu",
                  verbose=0)
    if args.recurrent:
        from sb3_contrib import RecurrentPPO

        policy_kwargs = {"features_extractor_kwargs": {"features_dim": 256}, "lstm_hidden_size": 256,
                         "n_lstm_layers": 1, "shared_lstm": True, "enable_critic_lstm": False}
        return RecurrentPPO("CnnLstmPolicy", env, batch_size=args.batch_size or 128, policy_kwargs=policy_kwargs,
                            **common)
    from stable_baselines3 import PPO

    return PPO("CnnPolicy", env, batch_size=args.batch_size or 64, **common)


def main() -> int:
    parser = peer_arguments(__doc__.split("\n")[0])
    parser.add_argument("--recurrent", action="store_true", help="sb3-contrib RecurrentPPO, CnnLstmPolicy")
    parser.add_argument("--envs", type=int, default=4)
    parser.add_argument("--n-steps", type=int, default=128, help="env steps per env per update")
    parser.add_argument("--batch-size", type=int, default=None, help="minibatch size (default 64; 128 recurrent)")
    args = parser.parse_args()
    start(args)
    import torch

    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.vec_env import SubprocVecEnv

    system = "sb3-recurrentppo" if args.recurrent else "sb3-ppo"
    curve = CowsCurve(args.out, system, args.seed, args.minutes, LAUNCHED)

    class CowsCallback(BaseCallback):
        """Counts cows at every episode end, writes a curve point per finished episode, stops at the deadline."""

        def __init__(self) -> None:
            super().__init__()
            self.next_print = time.time() + 30

        def _on_step(self) -> bool:
            for done, info in zip(self.locals["dones"], self.locals["infos"]):
                if done:
                    curve.add_episodes([info["cows_killed"]])
                    curve.record(self.num_timesteps)
            if time.time() >= self.next_print:
                self.next_print += 30
                point = curve.record(self.num_timesteps)
                print(f"{system}: {point}", flush=True)
            return curve.time_left() > 0

    env = SubprocVecEnv([env_factory(args.seed, index) for index in range(args.envs)])
    interrupted, model = False, None
    try:
        model = make_model(args, env)
        params = parameter_count(model.policy)
        print(f"{system}: {params} parameters, setup done at {curve.wall_s():.1f} s", flush=True)
        if curve.time_left() > 0:
            model.learn(total_timesteps=10**12, callback=CowsCallback())
    except (SystemExit, KeyboardInterrupt):  # SIGTERM or Ctrl-C: still close the envs and write what was measured
        interrupted = True
    finally:
        if model is not None:
            curve.record(model.num_timesteps)  # training stopped: the last point, before the envs close
        env.close()
    settings = {"library": "stable-baselines3", "algorithm": type(model).__name__, "policy": str(model.policy_class.__name__),
                "envs": args.envs, "vec_env": "SubprocVecEnv", "n_steps": args.n_steps, "epochs": args.epochs,
                "batch_size": model.batch_size, "lr": args.lr, "ent_coef": args.ent_coef,
                "torch_threads": torch.get_num_threads()}
    summary = curve.finish(params, settings)
    print("summary " + json.dumps({k: v for k, v in summary.items() if k not in ("settings", "machine")}), flush=True)
    return 1 if interrupted else 0


if __name__ == "__main__":
    sys.exit(main())
