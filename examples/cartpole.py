"""CartPole with craftrl: any gymnasium env, wrapped to the env contract, with an MLP policy.

Shows that nothing in craftrl is Minecraft- or pixel-specific. The wrapper adds the ``"image"`` entry the env
contract asks for (a small drawing of the cart and pole, also used for videos) next to the ``"vector"``
observation the MLP policy reads.

    craftrl train examples/cartpole.py
"""

import numpy as np


class CartPoleEnv:
    """gymnasium's CartPole-v1 behind the craftrl env contract (see docs/envs.md)."""

    def __init__(self, size: int = 32):
        import gymnasium

        self.env = gymnasium.make("CartPole-v1")
        self.size = size
        self.state = np.zeros(4, np.float32)

    def _obs(self):
        return {"vector": self.state.astype(np.float32), "image": self._draw(self.size)}

    def _draw(self, size: int) -> np.ndarray:
        image = np.full((size, size, 3), 255, np.uint8)
        cart = int(np.clip((self.state[0] / 4.8 + 0.5) * (size - 1), 0, size - 1))
        image[size - 4:size - 2, max(cart - 2, 0):cart + 3] = (40, 40, 200)
        for r in np.linspace(0, size * 0.6, size):  # the pole, from the cart upwards at its angle
            x = int(np.clip(cart + r * np.sin(self.state[2]), 0, size - 1))
            y = int(np.clip(size - 5 - r * np.cos(self.state[2]), 0, size - 1))
            image[y, x] = (200, 60, 40)
        return image

    def reset(self, seed=None):
        self.state, info = self.env.reset(seed=seed)
        return self._obs(), dict(info)

    def step(self, action):
        self.state, reward, terminated, truncated, info = self.env.step(int(np.asarray(action).reshape(())))
        return self._obs(), float(reward), bool(terminated), bool(truncated), dict(info)

    def render(self):
        return self._draw(128)

    def close(self):
        self.env.close()


def env_generator():
    return CartPoleEnv()


def policy_generator():
    from craftrl.policies import mlp_policy_generator

    return mlp_policy_generator(obs_dim=4, num_actions=2, hidden_sizes=(64, 64))


online_dict = {
    "detach_rollout_manager": False,
    "rollout_config": {
        "num_rollout_workers": 1,
        "num_cpus_per_worker": 1,
        "fragment_length": 128,
        "to_send_queue_size": 4,
        "worker_config": {"num_envs": 4, "batch_size": 4},
        "replay_buffer_config": {"max_chunks": 128, "max_reuse": 4, "max_staleness": 2,
                                 "database_config": {"num_shards": 1}},
    },
    "train_config": {
        # ~150k env steps; with lr 1e-3 a mean return of 475 came after ~50k (bench/cartpole_steps.py, P5)
        "num_iterations": 300,
        "learning_rate": 1e-3,
        "batch_size_per_gpu": 4,
        "batches_per_iteration": 2,
        "epochs_per_iteration": 4,
        "context_length": 128,
        "discount": 0.99,
        "gae_lambda": 0.95,
        "entropy_bonus_coef": 0.0,
        "max_grad_norm": 0.5,
        "save_interval": 50,
        "keep_interval": 0,
    },
    "logger_config": {"name": "cartpole"},
}
