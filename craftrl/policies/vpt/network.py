"""The VPT body: Impala CNN -> dense -> residual transformer blocks over a frame memory -> final layers.

Module names reproduce the official state_dict names exactly (``img_process.cnn.stacks.0.firstconv.layer``,
``recurrent_layer.blocks.0.r.orc_block.q_layer`` ...) so that OpenAI's ``.weights`` load strictly.
Layout facts (from /work/shared/vpt/README.md): norms come *before* their layer, a layer has a bias only
when it has no norm, attention logits are scaled by 1/head_dim, relative-position bias from a learned
banded basis, memory of ``attention_memory_size - timesteps`` frames.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from craftrl.policies.vpt.config import VPTConfig

NUM_POSITION_BASIS = 10
MASKED_LOGIT = -1e9


def fan_in_init(layer: nn.Module, scale: float) -> None:
    """Rows of unit norm times ``scale``: unit-variance ReLU outputs for unit-variance inputs."""
    with torch.no_grad():
        weight = layer.weight
        row_norms = weight.flatten(1).norm(dim=1).reshape(-1, *([1] * (weight.ndim - 1)))
        weight.mul_(scale / row_norms)
        if layer.bias is not None:
            layer.bias.zero_()


class NormedLayer(nn.Module):
    """``[norm] -> conv/linear -> [ReLU]``; bias only without a norm (the norm's shift plays that role)."""

    def __init__(self, norm: nn.Module | None, layer_factory, relu: bool = True, init_scale: float = 1.0) -> None:
        super().__init__()
        self.norm = norm
        self.layer = layer_factory(norm is None)
        self.relu = relu
        fan_in_init(self.layer, init_scale)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.norm is not None:
            x = self.norm(x)
        x = self.layer(x)
        return F.relu(x) if self.relu else x


def _conv_layer(in_channels: int, out_channels: int, normed: bool, init_scale: float) -> NormedLayer:
    return NormedLayer(nn.GroupNorm(1, in_channels) if normed else None,
                       lambda bias: nn.Conv2d(in_channels, out_channels, 3, padding=1, bias=bias),
                       init_scale=init_scale)


def _dense_layer(in_features: int, out_features: int, relu: bool = True, normed: bool = True,
                 init_scale: float = 1.0) -> NormedLayer:
    return NormedLayer(nn.LayerNorm(in_features) if normed else None,
                       lambda bias: nn.Linear(in_features, out_features, bias=bias), relu=relu,
                       init_scale=init_scale)


class CnnBlock(nn.Module):
    """Residual pair of normed convs; no activation after the sum."""

    def __init__(self, channels: int, init_scale: float) -> None:
        super().__init__()
        self.conv0 = _conv_layer(channels, channels, True, math.sqrt(init_scale))
        self.conv1 = _conv_layer(channels, channels, True, math.sqrt(init_scale))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv1(self.conv0(x))


class CnnStack(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, first_conv_normed: bool, init_scale: float,
                 num_blocks: int = 2) -> None:
        super().__init__()
        self.firstconv = _conv_layer(in_channels, out_channels, first_conv_normed, 1.0)
        self.n = nn.GroupNorm(1, out_channels)
        self.blocks = nn.ModuleList(CnnBlock(out_channels, init_scale / math.sqrt(num_blocks))
                                    for _ in range(num_blocks))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.n(F.max_pool2d(self.firstconv(x), kernel_size=3, stride=2, padding=1))
        for block in self.blocks:
            x = block(x)
        return x


class ImpalaCnn(nn.Module):
    """``stack_init_scale`` sets the residual branches' start (see ``CnnStack``): VPT's sqrt(stacks) by default;
    Moon et al.'s Crafter PPO, which took this network from VPT, starts them at 1 / sqrt(stacks)."""

    def __init__(self, img_shape: tuple[int, int, int], channels: tuple[int, ...], out_features: int = 256,
                 stack_init_scale: float | None = None) -> None:
        super().__init__()
        height, width, in_channels = img_shape
        if stack_init_scale is None:
            stack_init_scale = math.sqrt(len(channels))
        self.stacks = nn.ModuleList()
        for index, out_channels in enumerate(channels):
            self.stacks.append(CnnStack(in_channels, out_channels, first_conv_normed=index > 0,
                                        init_scale=stack_init_scale))
            in_channels, height, width = out_channels, (height + 1) // 2, (width + 1) // 2
        self.dense = _dense_layer(in_channels * height * width, out_features, init_scale=1.4)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """``images``: float ``[N, H, W, C]`` in [0, 1] -> ``[N, out_features]`` (flattened C, H, W)."""
        x = images.permute(0, 3, 1, 2)
        for stack in self.stacks:
            x = stack(x)
        return self.dense(x.flatten(1))


class ImageEncoder(nn.Module):
    def __init__(self, config: VPTConfig) -> None:
        super().__init__()
        self.cnn = ImpalaCnn(config.img_shape, config.cnn_channels)
        self.linear = _dense_layer(256, config.hidsize)

    def forward(self, images_uint8: torch.Tensor) -> torch.Tensor:
        batch, time = images_uint8.shape[:2]
        x = images_uint8.reshape(batch * time, *images_uint8.shape[2:]).float() / 255.0
        return self.linear(self.cnn(x)).reshape(batch, time, -1)


class RelativeSelfAttention(nn.Module):
    """Projections and the learned relative-position basis of one attention layer (``orc_block``)."""

    def __init__(self, hidsize: int, heads: int, memory_len: int, init_scale: float) -> None:
        super().__init__()
        self.heads = heads
        self.head_dim = hidsize // heads
        if hidsize % heads:
            raise ValueError(f"hidsize {hidsize} not divisible by {heads} heads")
        root = math.sqrt(init_scale)
        self.q_layer = nn.Linear(hidsize, hidsize)
        self.k_layer = nn.Linear(hidsize, hidsize, bias=False)
        self.v_layer = nn.Linear(hidsize, hidsize, bias=False)
        self.proj_layer = nn.Linear(hidsize, hidsize)
        self.r_layer = nn.Linear(hidsize, NUM_POSITION_BASIS * heads)
        for layer, scale in ((self.q_layer, 0.1), (self.k_layer, 0.2), (self.v_layer, root),
                             (self.proj_layer, root), (self.r_layer, 0.1)):
            fan_in_init(layer, scale)
        self.b_nd = nn.Parameter(torch.randn(NUM_POSITION_BASIS, memory_len) * 0.2)


class EpisodeMaskedAttention(nn.Module):
    """Self-attention over a sliding memory of past frames that never crosses an episode start.

    State per layer: ``[valid bool [B, 1, M], keys [B, M, E], values [B, M, E]]``; a key is visible to a
    query when it lies at distance ``0 <= d < M`` back in time, its slot is valid, and no episode start
    lies between them. Starts are honoured at every step of a chunk (OpenAI's code only reads step 0).
    """

    def __init__(self, hidsize: int, heads: int, memory_len: int, init_scale: float) -> None:
        super().__init__()
        self.memory_len = memory_len
        self.hidsize = hidsize
        self.orc_block = RelativeSelfAttention(hidsize, heads, memory_len, init_scale)

    def initial_state(self, batch_size: int, device: torch.device, dtype: torch.dtype) -> list[torch.Tensor]:
        return [torch.zeros(batch_size, 1, self.memory_len, dtype=torch.bool, device=device),
                torch.zeros(batch_size, self.memory_len, self.hidsize, dtype=dtype, device=device),
                torch.zeros(batch_size, self.memory_len, self.hidsize, dtype=dtype, device=device)]

    def forward(self, x: torch.Tensor, first: torch.Tensor, state: list[torch.Tensor]
                ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        block = self.orc_block
        batch, time, _ = x.shape
        memory = self.memory_len
        memory_valid, memory_keys, memory_values = state
        keys = torch.cat([memory_keys.to(x.dtype), block.k_layer(x)], dim=1)          # [B, M+t, E]
        values = torch.cat([memory_values.to(x.dtype), block.v_layer(x)], dim=1)

        # Episode index of every query and key: memory keys belong to the episode running before the chunk.
        query_episode = torch.cumsum(first.long(), dim=1)                              # [B, t]
        key_episode = F.pad(query_episode, (memory, 0))                                 # [B, M+t]
        key_valid = torch.cat([memory_valid[:, 0].bool(),
                               torch.ones(batch, time, dtype=torch.bool, device=x.device)], dim=1)
        distance = (torch.arange(time, device=x.device)[:, None] + memory
                    - torch.arange(memory + time, device=x.device)[None, :])           # [t, M+t]
        in_window = (distance >= 0) & (distance < memory)
        visible = (in_window[None] & key_valid[:, None, :]
                   & (key_episode[:, None, :] == query_episode[:, :, None]))           # [B, t, M+t]

        def split_heads(tensor: torch.Tensor) -> torch.Tensor:
            return tensor.reshape(batch, tensor.shape[1], block.heads, -1).transpose(1, 2)

        queries = split_heads(block.q_layer(x))                                         # [B, H, t, D]
        position_weights = split_heads(block.r_layer(x))                               # [B, H, t, nbasis]
        # Scores and softmax in float32 also under autocast, which would run these products in fp16 (where
        # the mask value overflows: use_amp crashed here) or bf16.
        with torch.autocast(device_type=x.device.type, enabled=False):
            logits = torch.matmul(queries.float(), split_heads(keys).float().transpose(-1, -2)) / block.head_dim
            band = block.b_nd.float()[:, distance.clamp(0, memory - 1)] * in_window   # [nbasis, t, M+t]
            logits = logits + torch.einsum("bhtn,ntk->bhtk", position_weights.float(), band)
            logits = logits.masked_fill(~visible[:, None], MASKED_LOGIT)
            weights = torch.softmax(logits, dim=-1)
        attended = torch.matmul(weights.to(values.dtype), split_heads(values))
        output = x + block.proj_layer(attended.transpose(1, 2).reshape(batch, time, -1))

        still_valid = key_valid & (key_episode == query_episode[:, -1:])
        new_state = [still_valid[:, None, -memory:], keys[:, -memory:], values[:, -memory:]]
        return output, new_state


class TransformerBlock(nn.Module):
    """LayerNorm -> masked attention (residual on the normalised input) -> residual pointwise MLP."""

    def __init__(self, config: VPTConfig, init_scale: float) -> None:
        super().__init__()
        hidsize, wide = config.hidsize, config.hidsize * config.pointwise_ratio
        second_residual_scale = init_scale * 2 ** -0.5
        self.mlp0 = _dense_layer(hidsize, wide)
        self.mlp1 = _dense_layer(wide, hidsize, relu=False, normed=False, init_scale=second_residual_scale)
        self.pre_r_ln = nn.LayerNorm(hidsize)
        self.r = EpisodeMaskedAttention(hidsize, config.attention_heads, config.memory_len, second_residual_scale)

    def forward(self, x: torch.Tensor, first: torch.Tensor, state: list[torch.Tensor]
                ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        x, state = self.r(self.pre_r_ln(x), first, state)
        return x + self.mlp1(self.mlp0(x)), state


class TransformerStack(nn.Module):
    def __init__(self, config: VPTConfig) -> None:
        super().__init__()
        init_scale = config.n_recurrence_layers ** -0.5
        self.blocks = nn.ModuleList(TransformerBlock(config, init_scale) for _ in range(config.n_recurrence_layers))

    def forward(self, x: torch.Tensor, first: torch.Tensor, state: list[torch.Tensor]
                ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        if len(state) != 3 * len(self.blocks):
            raise ValueError(f"VPT state: expected {3 * len(self.blocks)} tensors, got {len(state)}")
        state_out: list[torch.Tensor] = []
        for index, block in enumerate(self.blocks):
            x, block_state = block(x, first, state[3 * index:3 * index + 3])
            state_out += block_state
        return x, state_out


class VPTNet(nn.Module):
    """Everything before the heads; ``forward`` returns the shared ``[B, T, hidsize]`` latent."""

    def __init__(self, config: VPTConfig) -> None:
        super().__init__()
        self.config = config
        self.img_process = ImageEncoder(config)
        self.recurrent_layer = TransformerStack(config)
        self.lastlayer = _dense_layer(config.hidsize, config.hidsize)
        self.final_ln = nn.LayerNorm(config.hidsize)

    def initial_state(self, batch_size: int, device: torch.device, dtype: torch.dtype) -> list[torch.Tensor]:
        state: list[torch.Tensor] = []
        for block in self.recurrent_layer.blocks:
            state += block.r.initial_state(batch_size, device, dtype)
        return state

    def forward(self, images: torch.Tensor, first: torch.Tensor, state: list[torch.Tensor]
                ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        x = self.img_process(images)
        x, state_out = self.recurrent_layer(x, first, state)
        return self.final_ln(self.lastlayer(F.relu(x))), state_out
