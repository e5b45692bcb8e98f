"""Policy generators: zero-argument callables that build a fresh policy.

Rollout workers, the trainer and the reference model each call the generator inside their own process,
so a generator must be importable by reference (a module-level function, or a ``functools.partial`` of
one). Every function here works with no arguments; bind options with ``functools.partial`` or
``make_policy_generator``::

    from craftrl.policies import make_policy_generator
    policy_generator = make_policy_generator("default", recurrent="gru")
"""

from __future__ import annotations

import functools
from typing import Callable

from craftrl.policies.base import Policy


def default_policy_generator(num_actions: int = 17, image_shape: tuple[int, int, int] = (64, 64, 3),
                             recurrent: str = "lstm", hidden_size: int = 256,
                             channels: tuple[int, ...] = (16, 32, 32), encoder: str = "impala",
                             feature_norm: bool = False, tile_size: int = 7, encoder_features: int | None = None,
                             encoder_norm: bool = False, value_beta: float = 0.999,
                             device: str | None = None) -> Policy:
    """Recurrent CNN for Crafter-like pixel tasks (Impala CNN + LSTM, about 1.2 M parameters, by default).

    ``encoder="nature"`` (with three ``channels``) swaps in the strided Nature CNN, ``encoder="tiles"`` (with
    two ``channels``) a tile-aligned encoder for grid worlds drawn in ``tile_size``-pixel tiles;
    ``recurrent="none"`` drops the recurrent core; ``feature_norm`` layer-normalises the features before the
    core (it keeps the LSTM's gates out of saturation; off by default so checkpoints of earlier policies still
    load); ``encoder_features`` sets the encoder's output width apart from ``hidden_size``, and ``encoder_norm``
    builds Moon et al.'s Impala CNN, in VPT's layout (``craftrl.configs.crafter_resnet``);
    ``value_beta`` is the decay of the value's return normaliser per training iteration (lower tracks a
    return scale that grows as the agent learns more quickly).
    """
    from craftrl.policies.default import ImpalaRecurrentPolicy

    policy = ImpalaRecurrentPolicy(num_actions, image_shape, channels=channels, hidden_size=hidden_size,
                                   recurrent=recurrent, encoder=encoder, feature_norm=feature_norm,
                                   tile_size=tile_size, encoder_features=encoder_features,
                                   encoder_norm=encoder_norm, value_beta=value_beta)
    return policy.to(device) if device else policy


def mlp_policy_generator(obs_dim: int = 4, num_actions: int = 2, hidden_sizes: tuple[int, ...] = (64, 64),
                         device: str | None = None) -> Policy:
    """Feed-forward MLP for vector observations; the defaults fit CartPole."""
    from craftrl.policies.default import MLPPolicy

    policy = MLPPolicy(obs_dim, num_actions, hidden_sizes=hidden_sizes)
    return policy.to(device) if device else policy


def vpt_policy_generator(model_path: str | None = None, weights_path: str | None = None,
                         device: str | None = None) -> Policy:
    """OpenAI VPT from its ``.model``/``.weights`` files (weights optional: random init if omitted)."""
    from craftrl.policies.vpt import load_vpt_policy

    if model_path is None:
        raise ValueError("vpt_policy_generator needs model_path (bind it with functools.partial)")
    return load_vpt_policy(model_path, weights_path, device=device)


def vpt_tiny_policy_generator(device: str | None = None, **config_overrides) -> Policy:
    """The VPT architecture at CPU-test size, randomly initialised."""
    from craftrl.policies.vpt import vpt_tiny

    policy = vpt_tiny(**config_overrides)
    return policy.to(device) if device else policy


POLICY_GENERATORS: dict[str, Callable[..., Policy]] = {
    "default": default_policy_generator,
    "mlp": mlp_policy_generator,
    "vpt": vpt_policy_generator,
    "vpt_tiny": vpt_tiny_policy_generator,
}


def make_policy_generator(name: str, **kwargs) -> Callable[[], Policy]:
    """A picklable zero-argument generator for a built-in policy with ``kwargs`` bound."""
    if name not in POLICY_GENERATORS:
        raise KeyError(f"unknown policy {name!r}; built-in: {sorted(POLICY_GENERATORS)}")
    return functools.partial(POLICY_GENERATORS[name], **kwargs)
