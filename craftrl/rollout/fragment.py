"""The fragment: the unit of experience shared by rollout workers, the replay buffer and the trainer.

A fragment is ``L = fragment_length`` consecutive steps of one env slot. Time alignment, for step ``t``
(``o_t`` the observation the policy saw, ``a_t`` the action it chose on ``o_t``):

* ``reward[t]``      reward returned by the env step that executed ``a_t``;
* ``terminated[t]``  that env step ended the episode for good (no bootstrap);
* ``truncated[t]``   that env step cut the episode short (time limit, env restart): bootstrap;
* ``first[t]``       ``o_t`` is the first observation of an episode (recurrent state was reset before it);
* ``logp[t]``        log-probability of ``a_t`` under the behaviour policy that acted;
* ``value[t]``       the behaviour policy's value estimate of ``o_t``, in return units (denormalised);
* ``version[t]``     the policy version (trainer iteration count) whose weights chose ``a_t``.

Why ``terminated`` and ``truncated`` are kept apart: GAE bootstraps through a truncation with the value of
the observation the episode ended on, and through a termination with zero. Merging them (as MineStudio
does) biases every time-limited task.

``final_value[t]`` carries that bootstrap value for a truncation *inside* the fragment, because the
observation the episode ended on is not stored (the next stored observation already belongs to the next
episode). It is the behaviour policy's estimate of the final observation, or ``value[t]`` when the env
crashed and no final observation exists; it is NaN wherever ``truncated[t]`` is False.

``next_obs`` is ``o_L``, the observation after the last step, with ``next_first`` telling whether it starts
a new episode. The trainer bootstraps the fragment's tail by running its own policy one step further on
``next_obs`` (from the state it reached), unless the fragment with ``index + 1`` of the same ``env_id`` is
in the same batch, in which case GAE simply chains into it.

``state_in`` is the recurrent state that was the *input* of step 0, as a pytree (nested lists / tuples /
dicts) of numpy arrays with a leading batch dimension of 1.

Chaining rule: fragments of one ``env_id`` are numbered ``index = 0, 1, 2, ...`` with no gaps; fragment
``index + 1`` starts exactly at ``next_obs`` of fragment ``index``. A worker that has to drop buffered steps
(e.g. after an env-slot restart inside a worker restart) skips an index, so a gap in the numbering always
means a gap in time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

Pytree = Any  # nested dict / list / tuple of np.ndarray


@dataclass
class Fragment:
    env_id: str
    index: int
    obs: dict[str, np.ndarray]
    action: np.ndarray | dict[str, np.ndarray]
    reward: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    first: np.ndarray
    logp: np.ndarray
    value: np.ndarray
    version: np.ndarray
    final_value: np.ndarray
    next_obs: dict[str, np.ndarray]
    next_first: bool
    state_in: Pytree
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def length(self) -> int:
        return int(self.reward.shape[0])

    @property
    def min_version(self) -> int:
        """Oldest policy version that acted in this fragment: what staleness is measured against."""
        return int(self.version.min())

    def validate(self) -> None:
        """Raise ``ValueError`` naming the first field whose shape or dtype breaks the contract."""
        length = self.length
        if length < 1:
            raise ValueError("fragment.reward: expected at least one step, got 0")
        per_step = {
            "terminated": (self.terminated, np.bool_),
            "truncated": (self.truncated, np.bool_),
            "first": (self.first, np.bool_),
            "logp": (self.logp, np.float32),
            "value": (self.value, np.float32),
            "version": (self.version, np.int64),
            "final_value": (self.final_value, np.float32),
        }
        for name, (array, dtype) in per_step.items():
            if not isinstance(array, np.ndarray) or array.shape != (length,):
                got = getattr(array, "shape", type(array).__name__)
                raise ValueError(f"fragment.{name}: expected shape ({length},), got {got}")
            if array.dtype != dtype:
                raise ValueError(f"fragment.{name}: expected dtype {np.dtype(dtype)}, got {array.dtype}")
        if self.reward.dtype != np.float32:
            raise ValueError(f"fragment.reward: expected dtype float32, got {self.reward.dtype}")
        if np.any(self.terminated & self.truncated):
            raise ValueError("fragment.terminated/truncated: a step cannot be both")
        for key, array in _leaves("obs", self.obs):
            if array.shape[:1] != (length,):
                raise ValueError(f"fragment.{key}: expected leading dimension {length}, got {array.shape}")
        for key, array in _leaves("action", self.action):
            if array.shape[:1] != (length,):
                raise ValueError(f"fragment.{key}: expected leading dimension {length}, got {array.shape}")
        if "image" in self.obs and (self.obs["image"].dtype != np.uint8 or self.obs["image"].ndim != 4):
            raise ValueError(
                f"fragment.obs.image: expected uint8 [L, H, W, 3], got {self.obs['image'].dtype} "
                f"{self.obs['image'].shape}"
            )

    def raw_nbytes(self) -> int:
        """Uncompressed size of all arrays: the denominator of the replay compression ratio."""
        total = 0
        for value in (self.obs, self.action, self.next_obs, self.state_in):
            total += sum(a.nbytes for _, a in _leaves("", value))
        for array in (self.reward, self.terminated, self.truncated, self.first, self.logp, self.value,
                      self.version, self.final_value):
            total += array.nbytes
        return total


# reward, terminated, truncated, first, logp, value, version, final_value: float32, 3 bools, 2 x float32, int64, float32
STEP_SCALAR_BYTES = 4 + 1 + 1 + 1 + 4 + 4 + 8 + 4


def fragment_nbytes(obs: Pytree, action: Pytree, state_in: Pytree, length: int) -> int:
    """What ``raw_nbytes`` will be for a fragment of ``length`` steps with observations like ``obs`` and actions
    like ``action`` (one step's, of one env) and recurrent state ``state_in`` (one env's)."""
    def nbytes(tree: Pytree) -> int:
        return sum(np.asarray(leaf).nbytes for _, leaf in _leaves("", _as_arrays(tree)))

    return length * (nbytes(obs) + nbytes(action) + STEP_SCALAR_BYTES) + nbytes(obs) + nbytes(state_in)


def _as_arrays(tree: Pytree) -> Pytree:
    if isinstance(tree, dict):
        return {key: _as_arrays(value) for key, value in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(_as_arrays(value) for value in tree)
    if hasattr(tree, "detach"):  # a torch tensor
        return tree.detach().cpu().numpy()
    return np.asarray(tree)


def _leaves(prefix: str, tree: Pytree):
    """Yield ``(dotted_path, array)`` for every numpy array in a pytree."""
    if isinstance(tree, np.ndarray):
        yield prefix, tree
    elif isinstance(tree, dict):
        for key, value in tree.items():
            yield from _leaves(f"{prefix}.{key}" if prefix else str(key), value)
    elif isinstance(tree, (list, tuple)):
        for i, value in enumerate(tree):
            yield from _leaves(f"{prefix}[{i}]", value)
