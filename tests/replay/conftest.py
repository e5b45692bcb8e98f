"""Fragments for the replay tests: every field kind the contract allows, with awkward pytrees."""
from __future__ import annotations

import numpy as np
import pytest

from craftrl.rollout.fragment import Fragment


def build_fragment(env_id: str = "w0/e0", index: int = 0, length: int = 8, version: int = 0,
                   seed: int = 0, image_size: int = 16) -> Fragment:
    rng = np.random.default_rng(seed)
    truncated = np.zeros(length, bool)
    truncated[length // 2] = True
    final_value = np.full(length, np.nan, np.float32)
    final_value[length // 2] = rng.normal()
    fragment = Fragment(
        env_id=env_id,
        index=index,
        obs={"image": rng.integers(0, 256, (length, image_size, image_size, 3), dtype=np.uint8),
             "inventory": rng.integers(0, 9, (length, 16)).astype(np.int32)},
        action={"buttons": rng.integers(0, 2, (length, 20), dtype=np.int8),
                "camera": rng.normal(size=(length, 2)).astype(np.float32)},
        reward=rng.normal(size=length).astype(np.float32),
        terminated=np.zeros(length, bool),
        truncated=truncated,
        first=np.eye(1, length, 0, dtype=bool)[0],
        logp=rng.normal(size=length).astype(np.float32),
        value=rng.normal(size=length).astype(np.float32),
        version=np.full(length, version, np.int64) + (np.arange(length) >= length - 2),
        final_value=final_value,
        next_obs={"image": rng.integers(0, 256, (1, image_size, image_size, 3), dtype=np.uint8),
                  "inventory": rng.integers(0, 9, (1, 16)).astype(np.int32)},
        next_first=True,
        state_in=[(rng.normal(size=(1, 4)).astype(np.float32), rng.normal(size=(1, 4)).astype(np.float64)),
                  {"memory": rng.normal(size=(1, 3, 5)).astype(np.float16), "mask": np.ones((1, 3), bool)},
                  (), []],
        info={"episode": 3, "score": -0.0, "nan": float("nan"), "name": "cows", "raw": b"\x00\x01",
              "np_scalar": np.float32(1.5), "nested": {1: [1, 2.5, None, True]}, "slot": slice(1, 4)},
    )
    fragment.validate()
    return fragment


@pytest.fixture
def make_fragment():
    return build_fragment
