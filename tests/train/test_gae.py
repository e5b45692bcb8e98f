"""GAE against a plain forward-sum reference, with termination, truncation and fragment chaining."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from craftrl.train.gae import compute_gae, successors

GAMMA, LAMBDA = 0.9, 0.8


def reference_stream(r, v, term, trunc, final, bootstrap, gamma=GAMMA, lam=LAMBDA):
    """A_t = sum_k (gamma*lam)^k delta_{t+k}, summed forward until the episode's last step (inclusive)."""
    n = len(r)
    next_v = []
    for s in range(n):
        if term[s]:
            next_v.append(0.0)
        elif trunc[s]:
            next_v.append(final[s])
        else:
            next_v.append(v[s + 1] if s + 1 < n else bootstrap)
    delta = [r[s] + gamma * next_v[s] - v[s] for s in range(n)]
    advantages = []
    for t in range(n):
        total, weight = 0.0, 1.0
        for s in range(t, n):
            total += weight * delta[s]
            if term[s] or trunc[s]:
                break
            weight *= gamma * lam
        advantages.append(total)
    return np.array(advantages)


def random_fragments(rng, batch, length, p_done=0.1):
    r = rng.normal(size=(batch, length))
    v = rng.normal(size=(batch, length))
    term = rng.random((batch, length)) < p_done
    trunc = (rng.random((batch, length)) < p_done) & ~term
    final = np.where(trunc, rng.normal(size=(batch, length)), np.nan)
    boot = rng.normal(size=batch)
    return r, v, term, trunc, final, boot


def test_single_fragment_without_episode_ends_matches_reference():
    rng = np.random.default_rng(0)
    r, v, term, trunc, final, boot = random_fragments(rng, 1, 12, p_done=0.0)
    adv, ret = compute_gae(r, v, term, trunc, final, boot, np.array([-1]), GAMMA, LAMBDA)
    expected = reference_stream(r[0], v[0], term[0], trunc[0], final[0], boot[0])
    np.testing.assert_allclose(adv[0], expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ret, adv + v, rtol=1e-5, atol=1e-5)


def test_termination_uses_zero_and_truncation_bootstraps_with_the_final_value():
    r = np.array([[0.0, 1.0, 0.0, 0.0]])
    v = np.array([[0.5, 0.5, 0.5, 0.5]])
    term = np.array([[False, True, False, False]])
    trunc = np.array([[False, False, False, True]])
    final = np.array([[np.nan, np.nan, np.nan, 2.0]])
    adv, _ = compute_gae(r, v, term, trunc, final, np.array([100.0]), np.array([-1]), GAMMA, 1.0)
    # step 3 is truncated: delta = 0 + 0.9*2.0 - 0.5 = 1.3, the bootstrap 100 is never used
    assert adv[0, 3] == pytest.approx(1.3)
    # step 1 terminated: delta = 1 + 0 - 0.5 = 0.5
    assert adv[0, 1] == pytest.approx(0.5)
    # step 0 chains into step 1: delta0 = 0 + 0.9*0.5 - 0.5 = -0.05; A0 = -0.05 + 0.9*0.5
    assert adv[0, 0] == pytest.approx(-0.05 + 0.9 * 0.5)
    # step 2 starts a new episode: delta2 = 0 + 0.9*0.5 - 0.5 = -0.05, plus 0.9*A3
    assert adv[0, 2] == pytest.approx(-0.05 + 0.9 * 1.3)


def test_chained_fragments_equal_one_long_fragment_regardless_of_batch_order():
    rng = np.random.default_rng(1)
    r, v, term, trunc, final, boot = random_fragments(rng, 3, 8)
    long = compute_gae(r.reshape(1, -1), v.reshape(1, -1), term.reshape(1, -1), trunc.reshape(1, -1),
                       final.reshape(1, -1), boot[2:], np.array([-1]), GAMMA, LAMBDA)[0].reshape(3, 8)
    order = [2, 0, 1]  # fragments arrive shuffled; chaining is by (env_id, index)
    succ = successors(["env"] * 3, [order[i] for i in range(3)])
    shuffled = compute_gae(r[order], v[order], term[order], trunc[order], final[order], boot[order], succ,
                           GAMMA, LAMBDA)[0]
    np.testing.assert_allclose(shuffled, long[order], rtol=1e-5, atol=1e-5)


def test_a_gap_in_fragment_indices_breaks_the_chain_and_uses_the_bootstrap():
    succ = successors(["a", "a", "b", "a"], [0, 2, 1, 3])
    assert succ.tolist() == [-1, 3, -1, -1]
    rng = np.random.default_rng(2)
    r, v, term, trunc, final, boot = random_fragments(rng, 2, 5, p_done=0.0)
    adv = compute_gae(r, v, term, trunc, final, boot, np.array([-1, -1]), GAMMA, LAMBDA)[0]
    np.testing.assert_allclose(adv[0], reference_stream(r[0], v[0], term[0], trunc[0], final[0], boot[0]),
                               rtol=1e-5, atol=1e-5)


def test_duplicate_fragments_are_rejected():
    with pytest.raises(ValueError, match="same \\(env_id, index\\) twice"):
        successors(["a", "a"], [1, 1])


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), envs=st.integers(1, 3), per_env=st.integers(1, 4), length=st.integers(1, 6),
       keep=st.lists(st.booleans(), min_size=12, max_size=12))
def test_random_batches_match_the_reference_chain_by_chain(seed, envs, per_env, length, keep):
    rng = np.random.default_rng(seed)
    env_ids, indices = [], []
    for e in range(envs):
        for i in range(per_env):
            if keep[(e * per_env + i) % len(keep)] or i == 0:
                env_ids.append(f"env{e}")
                indices.append(i)
    batch = len(env_ids)
    r, v, term, trunc, final, boot = random_fragments(rng, batch, length, p_done=0.2)
    perm = rng.permutation(batch)
    env_ids = [env_ids[p] for p in perm]
    indices = [indices[p] for p in perm]
    adv, _ = compute_gae(r, v, term, trunc, final, boot, successors(env_ids, indices), GAMMA, LAMBDA)
    for env in set(env_ids):
        rows = sorted((i for i in range(batch) if env_ids[i] == env), key=lambda i: indices[i])
        run = [rows[0]]
        for row in rows[1:] + [None]:
            if row is not None and indices[row] == indices[run[-1]] + 1:
                run.append(row)
                continue
            expected = reference_stream(r[run].ravel(), v[run].ravel(), term[run].ravel(), trunc[run].ravel(),
                                        final[run].ravel(), boot[run[-1]])
            np.testing.assert_allclose(adv[run].ravel(), expected, rtol=1e-4, atol=1e-4)
            run = [row]
