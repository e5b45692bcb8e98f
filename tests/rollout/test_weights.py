"""Weight publishing without Ray's actors: a worker that is behind loads only the newest version."""
from __future__ import annotations

import threading

import torch

from craftrl.weights import NewestWeights


def test_a_busy_loader_skips_every_superseded_version_and_never_goes_back():
    applied: list[int] = []
    loading, release = threading.Event(), threading.Event()

    def apply(version, state_dict):
        assert float(state_dict["w"]) == version
        loading.set()
        release.wait(5)  # the first load is slow: versions 2-5 arrive meanwhile
        applied.append(version)

    weights = NewestWeights(apply)
    try:
        weights.offer(1, [{"w": torch.tensor(1.0)}])
        assert loading.wait(5)
        for version in (2, 3, 5, 4):  # 4 comes after 5: older than what is waiting, so ignored
            weights.offer(version, [{"w": torch.tensor(float(version))}])
        release.set()
        assert weights.wait_for(5, timeout=5)
        weights.offer(3, [{"w": torch.tensor(3.0)}])  # older than what is applied: ignored
        weights.offer(6, [{"w": torch.tensor(6.0)}])
        assert weights.wait_for(6, timeout=5)
    finally:
        weights.close()
    assert applied == [1, 5, 6] and weights.fetches == 3 and weights.error is None


def test_offer_returns_while_a_load_is_in_progress_and_a_failed_load_keeps_the_last_weights():
    started, release = threading.Event(), threading.Event()
    applied: list[int] = []

    def apply(version, state_dict):
        if version == 2:
            raise ValueError("shape mismatch")
        started.set()
        release.wait(5)
        applied.append(version)

    weights = NewestWeights(apply)
    try:
        weights.offer(1, [{}])
        assert started.wait(5)
        weights.offer(2, [{}])  # returns although the loader is busy
        release.set()
        assert weights.wait_for(1, timeout=5)
        assert not weights.wait_for(2, timeout=0.5)
    finally:
        weights.close()
    assert applied == [1] and weights.applied_version == 1
    assert weights.error == "loading weights version 2: ValueError: shape mismatch"
