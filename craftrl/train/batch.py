"""The learner's view of fragments: a Batch of rows (fragments, or sequences cut from them) as tensors."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch

from craftrl.policies.state import merge_states, state_from_numpy, tree_map
from craftrl.rollout.fragment import Fragment


@dataclass
class Batch:
    fragments: list[Fragment]
    obs: dict[str, torch.Tensor]  # [B, L+1, ...]: next_obs appended
    first: torch.Tensor  # [B, L+1]
    action: Any  # [B, L, ...] tensor or dict of them
    behaviour_logp: torch.Tensor  # [B, L]
    state_in: Any
    rows: np.ndarray  # positions of these fragments in the iteration's fragment list
    advantages: torch.Tensor | None = None  # [B, L]
    returns: torch.Tensor | None = None  # [B, L], return units
    old_values: torch.Tensor | None = None  # [B, L], return units
    proximal_logp: torch.Tensor | None = None  # [B, L]: log-prob under the learner's weights at iteration start
    reference_state_in: Any = None  # the KL reference's state, when it differs from ``state_in``
    sequence_states: list | None = None  # with ``minibatch_sequence_length``: the state at each sequence start
    reference_sequence_states: list | None = None

    @property
    def length(self) -> int:
        return self.behaviour_logp.shape[1]


def _stack_tree(items: Sequence[Any]) -> Any:
    if isinstance(items[0], dict):
        return {key: _stack_tree([item[key] for item in items]) for key in items[0]}
    return torch.from_numpy(np.stack([np.asarray(item) for item in items]))


def collate(fragments: Sequence[Fragment], rows: np.ndarray, device: torch.device) -> Batch:
    obs = {}
    for key, value in fragments[0].obs.items():
        if np.asarray(value).dtype.kind not in "biuf":
            continue
        stacked = np.stack([np.concatenate([f.obs[key], np.asarray(f.next_obs[key])[None]]) for f in fragments])
        obs[key] = torch.from_numpy(stacked).to(device)
    first = torch.from_numpy(np.stack([np.append(f.first, f.next_first) for f in fragments])).to(device)
    action = tree_map(lambda t: t.to(device), _stack_tree([f.action for f in fragments]))
    logp = torch.from_numpy(np.stack([f.logp for f in fragments])).to(device)
    state = state_from_numpy(merge_states([f.state_in for f in fragments]), device)
    return Batch(list(fragments), obs, first, action, logp, state, np.asarray(rows))


def slice_time(tree: Any, start: int, end: int) -> Any:
    return tree_map(lambda t: t[:, start:end], tree)


def _concat_rows(trees: Sequence[Any]) -> Any:
    return None if trees[0] is None else merge_states(list(trees))


def cut_sequences(batches: Sequence[Batch], sequence_length: int) -> Batch:
    """Every fragment cut into ``sequence_length``-step sequences, all of them rows of one Batch.

    Each sequence starts from the state ``evaluate`` recorded at its first step, so minibatches can mix
    sequences of any fragments and times (``minibatch_sequence_length``). A batch's rows come sequence by
    sequence (all fragments' first sequences, then their second, ...), the order of its recorded states.
    """
    return merge_batches([_sequences_of(batch, sequence_length) for batch in batches])


def _sequences_of(batch: Batch, sequence_length: int) -> Batch:
    count = batch.length // sequence_length  # the config makes fragment lengths multiples of it

    def cut(t: torch.Tensor) -> torch.Tensor:  # [B, >= count * n, ...] -> [count * B, n, ...]
        rows, rest = t.shape[0], t.shape[2:]
        t = t[:, :count * sequence_length].reshape(rows, count, sequence_length, *rest)
        return t.transpose(0, 1).reshape(count * rows, sequence_length, *rest)

    references = batch.reference_sequence_states
    return Batch(fragments=[], obs=tree_map(cut, batch.obs), first=cut(batch.first),
                 action=tree_map(cut, batch.action), behaviour_logp=cut(batch.behaviour_logp),
                 state_in=merge_states(batch.sequence_states), rows=np.tile(batch.rows, count),
                 advantages=cut(batch.advantages), returns=cut(batch.returns), old_values=cut(batch.old_values),
                 proximal_logp=cut(batch.proximal_logp),
                 reference_state_in=merge_states(references) if references else None)


def merge_batches(parts: Sequence[Batch]) -> Batch:
    """The rows of all ``parts`` (same length) as one Batch: what one optimiser step over all of them sees."""
    fields = ("obs", "first", "action", "behaviour_logp", "state_in", "advantages", "returns", "old_values",
              "proximal_logp", "reference_state_in")
    joined = {name: _concat_rows([getattr(part, name) for part in parts]) for name in fields}
    return Batch(fragments=[], rows=np.concatenate([part.rows for part in parts]), **joined)


def select_rows(batch: Batch, rows: torch.Tensor) -> Batch:
    pick = lambda tree: tree_map(lambda t: t[rows.to(t.device)], tree)  # noqa: E731
    return Batch(fragments=[], obs=pick(batch.obs), first=pick(batch.first), action=pick(batch.action),
                 behaviour_logp=pick(batch.behaviour_logp), state_in=pick(batch.state_in),
                 rows=batch.rows[rows.numpy()], advantages=pick(batch.advantages), returns=pick(batch.returns),
                 old_values=pick(batch.old_values), proximal_logp=pick(batch.proximal_logp),
                 reference_state_in=pick(batch.reference_state_in))
