"""Cutting one env slot's step stream into fragments (pure logic, no processes, no Ray).

The worker feeds each env slot's cutter two kinds of events, in this order per step:

1. ``begin_step`` when the policy has acted on observation ``o_t``: the observation, whether it starts an
   episode, the action, its log-prob and value, the policy version that acted, and -- for the first step of
   a fragment -- the recurrent state that was the *input* of that forward pass;
2. ``end_step`` when the env answered: the reward, ``terminated`` / ``truncated``, and for a truncation the
   bootstrap value of the final observation.

When ``fragment_length`` steps are complete, the *next* ``begin_step`` (whose observation is ``o_L``)
closes the fragment with that observation as ``next_obs``. Waiting for ``o_L`` instead of the env result
is what lets the fragment carry ``next_obs`` and ``next_first`` exactly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from craftrl.rollout.fragment import Fragment


@dataclass
class _Step:
    obs: dict[str, np.ndarray]
    first: bool
    action: Any
    logp: float
    value: float
    version: int
    reward: float = 0.0
    terminated: bool = False
    truncated: bool = False
    final_value: float = float("nan")
    complete: bool = False


class FragmentCutter:
    """Accumulates one env slot's steps and returns a ``Fragment`` every ``fragment_length`` steps."""

    def __init__(self, env_id: str, fragment_length: int):
        if fragment_length < 1:
            raise ValueError(f"fragment_length: expected >= 1, got {fragment_length}")
        self.env_id = env_id
        self.fragment_length = fragment_length
        self.next_index = 0
        self._steps: list[_Step] = []
        self._state_in: Any = None

    @property
    def num_steps(self) -> int:
        return len(self._steps)

    def begin_step(self, obs: dict[str, np.ndarray], first: bool, action: Any, logp: float, value: float,
                   version: int, state_in: Any | Callable[[], Any]) -> Fragment | None:
        """Record that the policy acted on ``obs``; returns the fragment this observation closes, if any."""
        if self._steps and not self._steps[-1].complete:
            raise RuntimeError(f"{self.env_id}: begin_step before the previous step's env result arrived")
        closed = self.close_if_full(obs, first)
        if not self._steps:  # a callable is evaluated only here, so a worker converts states once per fragment
            self._state_in = state_in() if callable(state_in) else state_in
        self._steps.append(_Step(obs, bool(first), action, float(logp), float(value), int(version)))
        return closed

    def close_if_full(self, next_obs: dict[str, np.ndarray], next_first: bool) -> Fragment | None:
        """Close the fragment once its ``fragment_length`` steps are complete and ``next_obs`` (``o_L``) is known.

        ``begin_step`` calls it; a worker that will not act on ``o_L`` yet (synchronous sampling waits for the
        next policy version there) calls it directly, so the fragment leaves without the next action."""
        if len(self._steps) == self.fragment_length and self._steps[-1].complete:
            return self._close(next_obs, next_first)
        return None

    def end_step(self, reward: float, terminated: bool, truncated: bool, final_value: float | None = None) -> None:
        """Record the env's answer to the last action."""
        if not self._steps or self._steps[-1].complete:
            raise RuntimeError(f"{self.env_id}: end_step without a pending action")
        if terminated and truncated:
            raise ValueError(f"{self.env_id}: a step cannot be both terminated and truncated")
        step = self._steps[-1]
        step.reward, step.terminated, step.truncated = float(reward), bool(terminated), bool(truncated)
        if truncated:
            step.final_value = step.value if final_value is None else float(final_value)
        step.complete = True

    def drop(self) -> int:
        """Discard buffered steps (e.g. when a worker must abandon them); the next index is skipped so
        the gap is visible to the trainer's chaining. Returns how many steps were dropped."""
        dropped = len(self._steps)
        if dropped:
            self._steps = []
            self._state_in = None
            self.next_index += 1
        return dropped

    def _close(self, next_obs: dict[str, np.ndarray], next_first: bool) -> Fragment:
        steps = self._steps
        fragment = Fragment(
            env_id=self.env_id,
            index=self.next_index,
            obs=_stack([s.obs for s in steps]),
            action=_stack([s.action for s in steps]),
            reward=np.array([s.reward for s in steps], dtype=np.float32),
            terminated=np.array([s.terminated for s in steps], dtype=np.bool_),
            truncated=np.array([s.truncated for s in steps], dtype=np.bool_),
            first=np.array([s.first for s in steps], dtype=np.bool_),
            logp=np.array([s.logp for s in steps], dtype=np.float32),
            value=np.array([s.value for s in steps], dtype=np.float32),
            version=np.array([s.version for s in steps], dtype=np.int64),
            final_value=np.array([s.final_value for s in steps], dtype=np.float32),
            next_obs={k: np.asarray(v) for k, v in next_obs.items()},
            next_first=bool(next_first),
            state_in=self._state_in,
        )
        self.next_index += 1
        self._steps = []
        self._state_in = None
        return fragment


def _stack(items: list[Any]) -> Any:
    """Stack per-step values along a new leading axis (dicts per key; scalars become arrays)."""
    head = items[0]
    if isinstance(head, dict):
        return {key: _stack([item[key] for item in items]) for key in head}
    return np.stack([np.asarray(item) for item in items])
