"""Generalised Advantage Estimation over fragments, with truncation bootstrap and fragment chaining.

For step t with value V_t, the value of the next state is

* 0                      when the env step terminated the episode;
* ``final_values[t]``    when it was truncated (time limit, env restart): the episode did not end, it was cut;
* V_{t+1}                inside a fragment otherwise;
* the successor's V_0    at a fragment's last step when the next fragment of the same env is in the batch
                         (the chain continues and its advantage carries over);
* ``bootstrap_values``   at a fragment's last step otherwise (the learner's value of ``next_obs``).

    delta_t = r_t + gamma * V_next_t - V_t
    A_t     = delta_t + gamma * lambda * (1 - done_t) * A_{t+1},  done_t = terminated_t or truncated_t

Chaining lengthens the GAE horizon past fragment boundaries where the data allows it; MineStudio chains too
but treats truncation as termination (no bootstrap on time limits), which this module does not.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np


def successors(env_ids: Sequence[str], indices: Sequence[int]) -> np.ndarray:
    """For each fragment, the batch position of fragment ``index + 1`` of the same env, or -1."""
    position = {(env, int(index)): i for i, (env, index) in enumerate(zip(env_ids, indices))}
    if len(position) != len(env_ids):
        raise ValueError("successors: the batch holds the same (env_id, index) twice")
    return np.array([position.get((env, int(index) + 1), -1) for env, index in zip(env_ids, indices)],
                    dtype=np.int64)


def _chains(successor: np.ndarray) -> list[list[int]]:
    """Split fragments into chains (head first) following successor links."""
    has_predecessor = np.zeros(len(successor), dtype=bool)
    has_predecessor[successor[successor >= 0]] = True
    chains = []
    for head in np.flatnonzero(~has_predecessor):
        chain, node = [], int(head)
        while node >= 0:
            chain.append(node)
            node = int(successor[node])
        chains.append(chain)
    if sum(len(c) for c in chains) != len(successor):
        raise ValueError("successors: the links form a cycle")
    return chains


def compute_gae(rewards: np.ndarray, values: np.ndarray, terminated: np.ndarray, truncated: np.ndarray,
                final_values: np.ndarray, bootstrap_values: np.ndarray, successor: np.ndarray,
                discount: float, gae_lambda: float) -> tuple[np.ndarray, np.ndarray]:
    """Advantages and value targets, both ``[B, L]`` float32, for a batch of fragments.

    ``rewards``, ``values``, ``terminated``, ``truncated``, ``final_values``: ``[B, L]``;
    ``bootstrap_values``: ``[B]``; ``successor``: ``[B]`` from :func:`successors` (or all -1 for no chaining).
    """
    rewards = np.asarray(rewards, dtype=np.float64)
    batch, length = rewards.shape
    chains = _chains(np.asarray(successor))
    longest = max(len(c) for c in chains) * length
    shape = (len(chains), longest)
    reward = np.zeros(shape)
    value = np.zeros(shape)
    next_value = np.zeros(shape)
    carry = np.zeros(shape)  # 1 where A_{t+1} flows into A_t
    for c, chain in enumerate(chains):
        span = len(chain) * length
        reward[c, :span] = rewards[chain].reshape(-1)
        value[c, :span] = np.asarray(values, dtype=np.float64)[chain].reshape(-1)
        term = np.asarray(terminated, dtype=bool)[chain].reshape(-1)
        trunc = np.asarray(truncated, dtype=bool)[chain].reshape(-1)
        following = np.append(value[c, 1:span], bootstrap_values[chain[-1]])
        following = np.where(trunc, np.asarray(final_values, dtype=np.float64)[chain].reshape(-1), following)
        next_value[c, :span] = np.where(term, 0.0, following)
        carry[c, :span] = ~(term | trunc)
    advantage = np.zeros(shape)
    running = np.zeros(len(chains))
    for t in range(longest - 1, -1, -1):
        delta = reward[:, t] + discount * next_value[:, t] - value[:, t]
        running = delta + discount * gae_lambda * carry[:, t] * running
        advantage[:, t] = running
    out = np.zeros((batch, length))
    for c, chain in enumerate(chains):
        out[chain] = advantage[c, :len(chain) * length].reshape(len(chain), length)
    # padded tail steps have delta = 0 and carry = 0, so they never leak into a chain's real steps
    returns = out + np.asarray(values, dtype=np.float64)
    return out.astype(np.float32), returns.astype(np.float32)
