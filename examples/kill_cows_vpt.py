"""Kill cows (Crafter) with the VPT network: OpenAI's published model when you give its files, else ``vpt_tiny``.

    VPT_MODEL=foundation-model-1x.model VPT_WEIGHTS=foundation-model-1x.weights craftrl train examples/kill_cows_vpt.py
    craftrl train examples/kill_cows_vpt.py          # vpt_tiny: the same code at a size a CPU can run

``craftrl eval`` of such a run builds the policy from this file too, so it needs the same ``VPT_MODEL``.

Nothing is downloaded: the ``.model``/``.weights`` files must be on disk. VPT acts in MineRL's action space
(8641 button combinations x 121 camera bins), which Crafter does not have, so this example keeps VPT's
trunk (Impala CNN + transformer memory) and its value head, and trains a fresh 17-way action head for
Crafter on the trunk's latent. The published models see 128x128 frames; Crafter's 64x64 ones are scaled up
to that by repeating pixels, inside the policy, so the envs and the replay keep the small frames. On
MinecraftSim (examples/minecraft_kill_cows.py) VPT's own head is used.
It shows VPT's network trained by craftrl; on a laptop the config that learns this task in minutes is
examples/kill_cows.py (bench/notes/default_config.md, "A config that leaves the learning settings out").
"""

import os

import torch.nn.functional as F

from craftrl.policies import CategoricalHead, Policy


def _absolute_path(variable):
    value = os.environ.get(variable)
    return os.path.abspath(value) if value else None


# Read here, when the driver loads this file: the values travel with policy_generator to every worker, whose own
# environment and working directory (on another node, those of its `ray start`) differ (docs/cluster.md).
VPT_MODEL, VPT_WEIGHTS = _absolute_path("VPT_MODEL"), _absolute_path("VPT_WEIGHTS")


class VPTForCrafter(Policy):
    """VPT's trunk and value head with a new categorical action head over Crafter's actions."""

    def __init__(self, vpt: Policy, num_actions: int = 17):
        super().__init__()
        self.vpt = vpt
        latent_size = vpt.value_head.linear.in_features
        self.pi_head = CategoricalHead(latent_size, num_actions)
        self.value_head = vpt.value_head

    def initial_state(self, batch_size: int):
        return self.vpt.initial_state(batch_size)

    def forward(self, input, state_in, first):  # noqa: A002 - contract name
        images = input["image"]  # [batch, time, height, width, channels], uint8
        height, width = self.vpt.config.img_shape[:2]
        if images.shape[2:4] != (height, width):
            frames = images.flatten(0, 1).permute(0, 3, 1, 2)
            frames = F.interpolate(frames, size=(height, width), mode="nearest").permute(0, 2, 3, 1)
            input = {**input, "image": frames.reshape(*images.shape[:2], height, width, images.shape[-1])}  # noqa: A001
        latents, state_out = self.vpt(input=input, state_in=state_in, first=first)
        return {"pi_logits": self.pi_head(latents["latent"]), "vpred": latents["vpred"]}, state_out


def policy_generator():
    if VPT_MODEL:
        from craftrl.policies.vpt import load_vpt_policy

        return VPTForCrafter(load_vpt_policy(VPT_MODEL, VPT_WEIGHTS))
    from craftrl.policies import vpt_tiny_policy_generator

    return VPTForCrafter(vpt_tiny_policy_generator(img_shape=(64, 64, 3)))


def env_generator():
    from craftrl.envs import make

    return make("crafter/cows")  # the kill_cows.py task: 10 cows near the player, +1 per kill, 600 steps


online_dict = {
    "detach_rollout_manager": False,
    "rollout_config": {
        "num_rollout_workers": 1,
        "fragment_length": 64,
        "to_send_queue_size": 4,
        "worker_config": {"num_envs": 4, "batch_size": 4},
        "replay_buffer_config": {"max_chunks": 256, "database_config": {"num_shards": 2}},
    },
    "train_config": {
        "num_iterations": 300,
        "learning_rate": 1e-4,
        "batch_size_per_gpu": 4,
        "batches_per_iteration": 4,
        "context_length": 32,
        "entropy_bonus_coef": 0.01,
        "kl_divergence_coef_rho": 0.0,
        "save_interval": 25,
        "keep_interval": 100,
    },
    "logger_config": {"name": "kill_cows_vpt"},
}
