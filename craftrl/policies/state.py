"""Recurrent-state pytrees: merging, splitting and moving them between torch and numpy.

A state is a pytree (nested dict / list / tuple) whose leaves are tensors or numpy arrays with the batch
dimension first. Rollout workers keep one state per env slot (batch 1) and merge them for a batched
inference call; fragments store them as numpy (see ``craftrl.rollout.fragment``); the trainer merges the
stored ``state_in`` of many fragments into one batch. Every helper here works on either leaf type.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np
import torch

State = Any  # nested dict / list / tuple of torch.Tensor or np.ndarray, batch dimension first


def tree_map(fn: Callable[[Any], Any], tree: State) -> State:
    """Apply ``fn`` to every array leaf, keeping the container structure (tuples stay tuples)."""
    if isinstance(tree, dict):
        return {key: tree_map(fn, value) for key, value in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(tree_map(fn, value) for value in tree)
    if tree is None:
        return None
    return fn(tree)


def tree_leaves(tree: State) -> list[Any]:
    """All array leaves in a fixed (depth-first, insertion) order."""
    if isinstance(tree, dict):
        return [leaf for value in tree.values() for leaf in tree_leaves(value)]
    if isinstance(tree, (list, tuple)):
        return [leaf for value in tree for leaf in tree_leaves(value)]
    if tree is None:
        return []
    return [tree]


def _zip_map(fn: Callable[[list[Any]], Any], trees: Sequence[State]) -> State:
    first = trees[0]
    if isinstance(first, dict):
        return {key: _zip_map(fn, [tree[key] for tree in trees]) for key in first}
    if isinstance(first, (list, tuple)):
        return type(first)(_zip_map(fn, [tree[i] for tree in trees]) for i in range(len(first)))
    if first is None:
        return None
    return fn(list(trees))


def merge_states(states: Sequence[State]) -> State:
    """Concatenate states along the batch dimension (torch or numpy leaves, not mixed)."""
    if len(states) == 0:
        raise ValueError("merge_states: need at least one state")

    def concat(leaves: list[Any]) -> Any:
        if isinstance(leaves[0], torch.Tensor):
            return torch.cat(leaves, dim=0)
        return np.concatenate(leaves, axis=0)

    return _zip_map(concat, states)


def batch_size_of(state: State) -> int | None:
    """Batch size of a state, or None for a stateless policy (empty pytree)."""
    leaves = tree_leaves(state)
    return int(leaves[0].shape[0]) if leaves else None


def split_state(state: State, batch_size: int | None = None) -> list[State]:
    """Split a batched state into ``batch_size`` states that keep a batch dimension of 1.

    ``batch_size`` is only needed for stateless policies, whose empty state carries no batch size.
    """
    inferred = batch_size_of(state)
    n = inferred if inferred is not None else batch_size
    if n is None:
        raise ValueError("split_state: empty state, pass batch_size")
    if batch_size is not None and inferred is not None and batch_size != inferred:
        raise ValueError(f"split_state: state has batch {inferred}, asked for {batch_size}")
    return [tree_map(lambda leaf, i=i: leaf[i:i + 1], state) for i in range(n)]


def select_state(state: State, indices: torch.Tensor | np.ndarray | Sequence[int]) -> State:
    """Gather batch rows (e.g. for minibatching whole sequences in the trainer)."""
    def take(leaf: Any) -> Any:
        if isinstance(leaf, torch.Tensor):
            return leaf[torch.as_tensor(indices, device=leaf.device, dtype=torch.long)]
        return leaf[np.asarray(indices)]

    return tree_map(take, state)


def state_to_numpy(state: State) -> State:
    """Detached CPU numpy copy, the layout a ``Fragment.state_in`` stores."""
    return tree_map(lambda leaf: leaf.detach().cpu().numpy() if isinstance(leaf, torch.Tensor)
                    else np.asarray(leaf), state)


def state_from_numpy(state: State, device: torch.device | str = "cpu") -> State:
    """Tensors on ``device`` from a numpy (or already torch) state; dtypes are kept (bool masks stay bool)."""
    return tree_map(lambda leaf: torch.as_tensor(leaf).to(device), state)


def detach_state(state: State) -> State:
    """Cut the graph at a chunk boundary (truncated BPTT)."""
    return tree_map(lambda leaf: leaf.detach() if isinstance(leaf, torch.Tensor) else leaf, state)
