"""Built-in policies for the built-in tasks: a recurrent CNN for pixels and a small MLP for vectors.

Two pixel encoders: the Impala CNN (residual, max-pooled; strong but several times the CPU cost per frame) and a
Nature-style strided CNN (three convolutions, no pooling), which is what makes CPU-only training fast
(bench/policy_inference.py measures both).

Initialisation follows the PPO implementation-detail literature: orthogonal weights with gain sqrt(2) in
hidden layers, 0.01 for the policy head (near-uniform initial policy), 1 for the value head, zero biases. Moon et
al.'s normed Impala CNN (``NormedImpalaEncoder``) and the layer after it start as VPT's layers do instead.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from craftrl.policies.base import Policy, as_first
from craftrl.policies.heads import CategoricalHead, ValueHead
from craftrl.policies.recurrent import ResettableRNN
from craftrl.policies.state import State
from craftrl.policies.vpt.network import ImpalaCnn, fan_in_init

HIDDEN_GAIN = math.sqrt(2.0)


def _orthogonal(module: nn.Module, gain: float = HIDDEN_GAIN) -> nn.Module:
    nn.init.orthogonal_(module.weight, gain=gain)
    if module.bias is not None:
        nn.init.zeros_(module.bias)
    return module


def _group_norm(channels: int, enabled: bool) -> nn.Module:
    """One group over all channels (a per-sample LayerNorm of a feature map), or nothing."""
    return nn.GroupNorm(1, channels) if enabled else nn.Identity()


class _ResidualBlock(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv0 = _orthogonal(nn.Conv2d(channels, channels, 3, padding=1))
        self.conv1 = _orthogonal(nn.Conv2d(channels, channels, 3, padding=1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv1(F.relu(self.conv0(F.relu(x))))


class _DownStack(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, num_blocks: int = 2) -> None:
        super().__init__()
        self.conv = _orthogonal(nn.Conv2d(in_channels, out_channels, 3, padding=1))
        self.blocks = nn.Sequential(*[_ResidualBlock(out_channels) for _ in range(num_blocks)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks(F.max_pool2d(self.conv(x), kernel_size=3, stride=2, padding=1))


class ImpalaEncoder(nn.Module):
    """Impala-style CNN (Espeholt et al. 2018) from uint8 ``[N, H, W, C]`` images to a feature vector."""

    def __init__(self, image_shape: tuple[int, int, int], channels: tuple[int, ...] = (16, 32, 32),
                 out_features: int = 256) -> None:
        super().__init__()
        height, width, in_channels = image_shape
        stacks = []
        for out_channels in channels:
            stacks.append(_DownStack(in_channels, out_channels))
            in_channels = out_channels
            height, width = (height + 1) // 2, (width + 1) // 2
        self.stacks = nn.Sequential(*stacks)
        self.dense = _orthogonal(nn.Linear(in_channels * height * width, out_features))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = images.permute(0, 3, 1, 2).float().mul_(1.0 / 255.0)
        return F.relu(self.dense(F.relu(self.stacks(x)).flatten(1)))


class NormedImpalaEncoder(nn.Module):
    """The Impala CNN of Moon et al.'s Crafter PPO (arXiv 2307.03486): VPT's (``craftrl.policies.vpt.network``),
    which they took over with its residual branches started smaller, from uint8 ``[N, H, W, C]`` images.

    Every convolution is norm -> convolution -> ReLU, with a one-group GroupNorm before each but the image's and
    after every max-pool, so a residual branch adds a non-negative term; the stacks' output goes unrectified
    through a LayerNorm into the dense layer. Weights start with each output unit's row rescaled to a fixed norm.
    """

    def __init__(self, image_shape: tuple[int, int, int], channels: tuple[int, ...] = (64, 128, 128),
                 out_features: int = 256) -> None:
        super().__init__()
        self.cnn = ImpalaCnn(image_shape, channels, out_features, stack_init_scale=1.0 / math.sqrt(len(channels)))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.cnn(images.float().mul_(1.0 / 255.0))


class NatureEncoder(nn.Module):
    """Strided CNN after Mnih et al. (2015): 8x8/4, 4x4/2, 3x3/1 convolutions, then a dense layer.

    Kernel sizes and strides are the paper's; only the channel counts are configurable. uint8
    ``[N, H, W, C]`` images in, a feature vector out.
    """

    KERNELS = ((8, 4), (4, 2), (3, 1))

    def __init__(self, image_shape: tuple[int, int, int], channels: tuple[int, ...] = (32, 64, 64),
                 out_features: int = 256) -> None:
        super().__init__()
        if len(channels) != len(self.KERNELS):
            raise ValueError(f"NatureEncoder channels: expected {len(self.KERNELS)} values, got {channels!r}")
        height, width, in_channels = image_shape
        convs = []
        for out_channels, (kernel, stride) in zip(channels, self.KERNELS):
            convs.append(_orthogonal(nn.Conv2d(in_channels, out_channels, kernel, stride)))
            in_channels = out_channels
            height, width = (height - kernel) // stride + 1, (width - kernel) // stride + 1
        if min(height, width) < 1:
            raise ValueError(f"NatureEncoder: image {image_shape[:2]} is too small for its kernels")
        self.convs = nn.ModuleList(convs)
        self.dense = _orthogonal(nn.Linear(in_channels * height * width, out_features))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = images.permute(0, 3, 1, 2).float().mul_(1.0 / 255.0)
        for conv in self.convs:
            x = F.relu(conv(x))
        return F.relu(self.dense(x.flatten(1)))


class TileEncoder(nn.Module):
    """For grid worlds drawn tile by tile: one convolution per tile (kernel = stride = ``tile_size``), a 3x3
    convolution over the grid of tiles, then a dense layer over the whole grid.

    Why: Crafter draws its 9x9 grid (a 9x7 map above a 9x2 inventory) in 7-pixel tiles from pixel 0. A strided
    CNN's receptive fields straddle tiles, so it has to learn what a tile is before what is on it; a
    tile-aligned first layer sees exactly one tile per position, and the dense layer keeps where each tile is
    relative to the player. ``channels`` = (per-tile, per-neighbourhood) widths. ``norm`` adds a one-group
    GroupNorm before the neighbourhood convolution and a LayerNorm before the dense layer, as
    ``NormedImpalaEncoder`` normalises.
    """

    def __init__(self, image_shape: tuple[int, int, int], channels: tuple[int, ...] = (32, 32),
                 out_features: int = 256, tile_size: int = 7, norm: bool = False) -> None:
        super().__init__()
        if len(channels) != 2:
            raise ValueError(f"TileEncoder channels: expected 2 values, got {channels!r}")
        height, width, in_channels = image_shape
        rows, columns = height // tile_size, width // tile_size
        if min(rows, columns) < 1:
            raise ValueError(f"TileEncoder: image {image_shape[:2]} is smaller than one {tile_size}-pixel tile")
        self.tile = _orthogonal(nn.Conv2d(in_channels, channels[0], tile_size, tile_size))
        self.neighbourhood_norm = _group_norm(channels[0], norm)
        self.neighbourhood = _orthogonal(nn.Conv2d(channels[0], channels[1], 3, padding=1))
        flat = channels[1] * rows * columns
        self.dense_norm = nn.LayerNorm(flat) if norm else nn.Identity()
        self.dense = _orthogonal(nn.Linear(flat, out_features))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = images.permute(0, 3, 1, 2).float().mul_(1.0 / 255.0)
        x = F.relu(self.neighbourhood(self.neighbourhood_norm(F.relu(self.tile(x)))))
        return F.relu(self.dense(self.dense_norm(x.flatten(1))))


ENCODERS = {"impala": ImpalaEncoder, "nature": NatureEncoder, "tiles": TileEncoder}


class ImpalaRecurrentPolicy(Policy):
    """CNN encoder -> MLP (-> LayerNorm) -> LSTM/GRU (or nothing) -> categorical action head + value head.

    The name is historical: ``encoder`` picks the Impala CNN, the Nature CNN or the tile encoder (whose
    ``tile_size`` is the pixel size of one grid tile). ``recurrent="none"`` gives a feed-forward policy whose
    state is ``{}``. Input ``{"image": uint8 [B, T, H, W, 3]}``; action: long
    ``[B, T]`` in ``[0, num_actions)``.

    ``encoder_features`` is the width of the encoder's output (``hidden_size`` when None), which the MLP widens
    or narrows to ``hidden_size``. ``encoder_norm`` layer-normalises the MLP's input and normalises inside the
    encoder: the Impala CNN becomes Moon et al.'s (``NormedImpalaEncoder``), the tile encoder gains their norms (see
    ``TileEncoder``). With channels 64/128/128, ``encoder_features`` 256, ``hidden_size`` 1024 and no recurrent
    core it is the policy of Moon et al.'s Crafter PPO.

    ``feature_norm`` puts a LayerNorm between the MLP and the core. Nothing else bounds the scale of the
    features the recurrent gates see: without it they can grow until every LSTM gate saturates, and the policy then
    stops depending on its observations for good, since no gradient flows back through saturated gates
    (bench/notes/code_figures.md).
    """

    def __init__(self, num_actions: int = 17, image_shape: tuple[int, int, int] = (64, 64, 3), *,
                 channels: tuple[int, ...] = (16, 32, 32), hidden_size: int = 256, recurrent: str = "lstm",
                 encoder: str = "impala", image_key: str = "image", value_beta: float = 0.999,
                 feature_norm: bool = False, tile_size: int = 7, encoder_features: int | None = None,
                 encoder_norm: bool = False) -> None:
        super().__init__()
        if encoder not in ENCODERS:
            raise ValueError(f"encoder: expected one of {sorted(ENCODERS)}, got {encoder!r}")
        if recurrent not in ("lstm", "gru", "none"):
            raise ValueError(f"recurrent: expected 'lstm', 'gru' or 'none', got {recurrent!r}")
        if encoder_norm and encoder == "nature":
            raise ValueError("encoder_norm: only the 'impala' and 'tiles' encoders have one, got encoder='nature'")
        self.image_key = image_key
        self.image_shape = tuple(image_shape)
        encoder_features = encoder_features or hidden_size
        shapes = (tuple(image_shape), tuple(channels), encoder_features)
        if encoder == "impala" and encoder_norm:
            self.encoder = NormedImpalaEncoder(*shapes)
        elif encoder == "tiles":
            self.encoder = TileEncoder(*shapes, tile_size=tile_size, norm=encoder_norm)
        else:
            self.encoder = ENCODERS[encoder](*shapes)
        self.mlp_norm = nn.LayerNorm(encoder_features) if encoder_norm else nn.Identity()
        if isinstance(self.encoder, NormedImpalaEncoder):  # their 1024-wide layer: started as their encoder's
            self.mlp = nn.Linear(encoder_features, hidden_size, bias=False)
            fan_in_init(self.mlp, 1.0)
        else:
            self.mlp = _orthogonal(nn.Linear(encoder_features, hidden_size))
        self.feature_norm = nn.LayerNorm(hidden_size) if feature_norm else nn.Identity()
        self.core = ResettableRNN(hidden_size, hidden_size, kind=recurrent) if recurrent != "none" else None
        self.pi_head = CategoricalHead(hidden_size, num_actions, init_gain=0.01)
        self.value_head = ValueHead(hidden_size, beta=value_beta, init_gain=1.0)

    def initial_state(self, batch_size: int) -> State:
        return self.core.initial_state(batch_size, self.device) if self.core is not None else {}

    def forward(self, input: dict[str, torch.Tensor], state_in: State,  # noqa: A002
                first: torch.Tensor | None = None) -> tuple[dict[str, Any], State]:
        images = input[self.image_key]
        if tuple(images.shape[2:]) != self.image_shape:  # else a layer inside says "shapes cannot be multiplied"
            raise ValueError(f"{type(self).__name__}: input {self.image_key!r} is {list(images.shape[2:])} per step, "
                             f"but the policy was built for image_shape {self.image_shape}")
        batch, time = images.shape[:2]
        first = as_first(first, batch, time, images.device)
        features = self.encoder(images.reshape(batch * time, *images.shape[2:]))
        features = self.feature_norm(F.relu(self.mlp(self.mlp_norm(features)))).reshape(batch, time, -1)
        if self.core is None:
            latent, state_out = features, {}
        else:
            latent, state_out = self.core(features, state_in, first)
        return {"pi_logits": self.pi_head(latent), "vpred": self.value_head(latent), "latent": latent}, state_out


class MLPPolicy(Policy):
    """Feed-forward tanh MLP for vector observations (CartPole-sized tasks); its state is empty ``{}``.

    Input ``{"vector": float [B, T, D]}``; action: long ``[B, T]``. ``first`` is accepted and unused.
    """

    def __init__(self, obs_dim: int, num_actions: int, *, hidden_sizes: tuple[int, ...] = (64, 64),
                 vector_key: str = "vector", value_beta: float = 0.999) -> None:
        super().__init__()
        self.vector_key = vector_key
        self.obs_dim = obs_dim
        layers: list[nn.Module] = []
        in_features = obs_dim
        for width in hidden_sizes:
            layers += [_orthogonal(nn.Linear(in_features, width)), nn.Tanh()]
            in_features = width
        self.pi_body = nn.Sequential(*layers)
        self.value_body = nn.Sequential(*[_orthogonal(nn.Linear(m.in_features, m.out_features))
                                          if isinstance(m, nn.Linear) else nn.Tanh() for m in layers])
        self.pi_head = CategoricalHead(in_features, num_actions, init_gain=0.01)
        self.value_head = ValueHead(in_features, beta=value_beta, init_gain=1.0)

    def initial_state(self, batch_size: int) -> State:
        return {}

    def forward(self, input: dict[str, torch.Tensor], state_in: State = None,  # noqa: A002
                first: torch.Tensor | None = None) -> tuple[dict[str, Any], State]:
        vector = input[self.vector_key].float()
        if vector.shape[2:] != (self.obs_dim,):
            raise ValueError(f"{type(self).__name__}: input {self.vector_key!r} is {list(vector.shape[2:])} per step, "
                             f"but the policy was built for obs_dim {self.obs_dim}")
        return {"pi_logits": self.pi_head(self.pi_body(vector)),
                "vpred": self.value_head(self.value_body(vector))}, {}
