"""A launcher in the shape of ROCKET-3's ``run_online.py`` (CraftJarvis/ROCKET-3), run unchanged but for its two
imports: craftrl's ``start_rolloutmanager`` and ``start_trainer`` in place of MineStudio's.

It binds a checkpoint path into the policy generator with ``functools.partial``, joins the Ray cluster at
``--ray-address`` and imports its config from ``online_configs/``, whose env generator imports
``crafter_callbacks``, a module beside this file. tests/reliability/test_minestudio_launcher.py runs it.
"""

import argparse
from functools import partial
from pathlib import Path


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--checkpoint", required=True, type=Path, help="policy weights to start from")
    parser.add_argument("--ray-address", default="localhost:9899", help="the Ray cluster to join")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    checkpoint = args.checkpoint.expanduser().resolve()

    from craftrl import start_rolloutmanager, start_trainer  # MineStudio: minestudio.online.{rollout,trainer}
    from omegaconf import OmegaConf

    from online_configs.rocket_log import env_generator, online_dict, policy_generator

    config_file = Path(__file__).resolve().parent / "online_configs" / "rocket_log.py"
    online_cfg = OmegaConf.create(online_dict)
    policy_factory = partial(policy_generator, str(checkpoint))
    start_rolloutmanager(policy_factory, env_generator, online_cfg, address=args.ray_address)
    start_trainer(policy_factory, env_generator, online_cfg, config_file.read_text(encoding="utf-8"))


if __name__ == "__main__":
    main()
