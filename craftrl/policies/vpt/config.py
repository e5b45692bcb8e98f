"""VPT network configuration, read from (and written to) the ``net.args`` dict of an official ``.model`` file."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

# Argument values this implementation reproduces; any other value is refused rather than silently ignored.
_REQUIRED_VALUES: dict[str, Any] = {
    "recurrence_type": "transformer",
    "attention_mask_style": "clipped_causal",
    "recurrence_is_residual": True,
    "use_pointwise_layer": True,
    "pointwise_use_activation": False,
    "use_pre_lstm_ln": False,
    "single_output": False,
}


@dataclass(frozen=True)
class VPTConfig:
    hidsize: int = 1024
    impala_width: int = 4
    impala_chans: tuple[int, ...] = (16, 32, 32)
    attention_heads: int = 8
    attention_memory_size: int = 256
    timesteps: int = 128
    n_recurrence_layers: int = 4
    pointwise_ratio: int = 4
    img_shape: tuple[int, int, int] = (128, 128, 3)
    extra_args: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def memory_len(self) -> int:
        """Frames each frame attends to, itself included (= frames kept in the key/value cache)."""
        return self.attention_memory_size - self.timesteps

    @property
    def cnn_channels(self) -> tuple[int, ...]:
        return tuple(int(self.impala_width * c) for c in self.impala_chans)

    @classmethod
    def from_net_args(cls, net_args: dict[str, Any]) -> "VPTConfig":
        for key, expected in _REQUIRED_VALUES.items():
            if key in net_args and net_args[key] != expected:
                raise NotImplementedError(f"VPT net arg {key}={net_args[key]!r} is not supported (need {expected!r})")
        norm_kwargs = net_args.get("init_norm_kwargs", {"group_norm_groups": 1, "batch_norm": False})
        if norm_kwargs.get("batch_norm") or norm_kwargs.get("group_norm_groups") != 1:
            raise NotImplementedError(f"VPT init_norm_kwargs={norm_kwargs!r} is not supported")
        if net_args.get("impala_kwargs", {"post_pool_groups": 1}).get("post_pool_groups") != 1:
            raise NotImplementedError(f"VPT impala_kwargs={net_args.get('impala_kwargs')!r} is not supported")
        known = {name for name in cls.__dataclass_fields__ if name != "extra_args"}
        values = {key: net_args[key] for key in known if key in net_args}
        for key in ("impala_chans", "img_shape"):
            if key in values:
                values[key] = tuple(values[key])
        extra = {key: value for key, value in net_args.items() if key not in known}
        return cls(**values, extra_args=extra)

    def to_net_args(self) -> dict[str, Any]:
        """The ``net.args`` dict in the official layout (what OpenAI's loader passes to its policy)."""
        args = {key: value for key, value in asdict(self).items() if key != "extra_args"}
        args["impala_chans"] = list(self.impala_chans)
        args["img_shape"] = list(self.img_shape)
        defaults = {
            "attention_mask_style": "clipped_causal", "diff_mlp_embedding": False,
            "impala_kwargs": {"post_pool_groups": 1},
            "init_norm_kwargs": {"batch_norm": False, "group_norm_groups": 1}, "only_img_input": True,
            "pointwise_use_activation": False, "recurrence_is_residual": True,
            "recurrence_type": "transformer", "use_pointwise_layer": True, "use_pre_lstm_ln": False,
        }
        return {**defaults, **self.extra_args, **args}


VPT_1X = VPTConfig(hidsize=1024, impala_width=4, attention_heads=8)
VPT_2X = VPTConfig(hidsize=2048, impala_width=8, attention_heads=16)
VPT_TINY = VPTConfig(hidsize=128, impala_width=1, attention_heads=4, attention_memory_size=48, timesteps=16,
                     n_recurrence_layers=2)
