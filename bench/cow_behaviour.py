"""What a checkpoint does around cows on ``crafter/cows``: a diagnostic behind bench/notes/learning.md.

Plays ``--episodes`` episodes with the checkpoint's policy (sampled actions) and sorts every step by the
nearest cow within the player's 9x7 view: next to the player and in front of it (the right action is `do`),
next to it but not in front (the right action is a move towards it, which turns the player), further away in
view (a move that shortens the distance), or none in view. For each class it prints how often the policy did
the right thing and its most frequent actions -- enough to tell a policy that hunts from one that presses
`do` and waits for cows to step in front of it.

    python bench/cow_behaviour.py runs/<run>/checkpoints/iter_00000200 --episodes 6
"""

from __future__ import annotations

import argparse
import collections

import numpy as np
import torch

MOVES = {"move_left": (-1, 0), "move_right": (1, 0), "move_up": (0, -1), "move_down": (0, 1)}
VIEW_HALF = (4, 3)  # the map part of Crafter's 64x64 frame is 9 x 7 tiles around the player


def step_class(player_pos: np.ndarray, facing: np.ndarray, cows: list[np.ndarray], action: str) -> tuple[str, bool]:
    """The step's class by the nearest visible cow, and whether ``action`` was the right one for it."""
    visible = [c for c in cows
               if abs(c[0] - player_pos[0]) <= VIEW_HALF[0] and abs(c[1] - player_pos[1]) <= VIEW_HALF[1]]
    if not visible:
        return "no cow in view", False
    distances = [int(np.abs(c - player_pos).sum()) for c in visible]
    nearest, distance = visible[int(np.argmin(distances))], min(distances)
    towards = action in MOVES and int(np.abs(player_pos + np.array(MOVES[action]) - nearest).sum()) < distance
    if distance == 1:
        if tuple(player_pos + facing) == tuple(nearest):
            return "cow adjacent, faced", action == "do"
        return "cow adjacent, not faced", towards
    return "cow in view", towards


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("checkpoint")
    parser.add_argument("--episodes", type=int, default=6)
    args = parser.parse_args()

    import crafter

    from craftrl.cli.evaluate import load_eval_policy, load_for_eval
    from craftrl.rollout.loop import action_rows, obs_batch

    torch.set_num_threads(1)
    loaded, payload, _ = load_for_eval(args.checkpoint, None)
    policy = load_eval_policy(loaded, payload["model"])
    env = loaded.env_generator()
    names = crafter.constants.actions
    counts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    cows_per_episode = []
    for episode in range(args.episodes):
        obs, _ = env.reset(seed=2000 + episode)
        state, first, kills = policy.initial_state(1), True, 0.0
        while True:
            player = env.player  # CrafterSim exposes Crafter's player and world
            cows = [np.array(o.pos) for o in env.world.objects if type(o).__name__ == "Cow"]
            with torch.no_grad():
                out = policy.act(obs_batch([obs], policy.device), state, torch.tensor([[first]]), deterministic=False)
            action = names[int(action_rows(out.action, 1)[0])]
            name, right = step_class(np.array(player.pos), np.array(player.facing), cows, action)
            counts[name]["steps"] += 1
            counts[name]["right"] += right
            counts[name][action] += 1
            obs, reward, terminated, truncated, _ = env.step(names.index(action))
            state, first, kills = out.state_out, False, kills + reward
            if terminated or truncated:
                break
        cows_per_episode.append(kills)
    for name, c in sorted(counts.items()):
        top = ", ".join(f"{a} {n / c['steps']:.2f}" for a, n in c.most_common() if a not in ("steps", "right"))
        print(f"{name:24s} steps {c['steps']:5d}  right action {c['right'] / c['steps']:.2f}  | {top[:90]}")
    print(f"cows per episode {np.mean(cows_per_episode):.2f} over {args.episodes} episodes")


if __name__ == "__main__":
    main()
