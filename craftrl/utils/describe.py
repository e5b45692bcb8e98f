"""Short descriptions of values for one-line error messages (a value's whole repr could be megabytes)."""

from __future__ import annotations

from typing import Any


def with_article(noun: str) -> str:
    """``"a uint8 array"``, ``"an int64 tensor"``."""
    return f"{'an' if noun[:1].lower() in 'aeio' else 'a'} {noun}"


def describe_value(value: Any) -> str:
    """What ``value`` is, in a few words: arrays and tensors by dtype and shape, tuples by length, else the type."""
    if hasattr(value, "dtype") and hasattr(value, "shape"):
        kind = "tensor" if type(value).__module__.startswith("torch") else "array"
        return with_article(f"{str(value.dtype).replace('torch.', '')} {kind} of shape {list(value.shape)}")
    if isinstance(value, tuple):
        return f"a tuple of {len(value)} items"
    return with_article(type(value).__name__)
