"""Tests for kitae.timesteps, pinned against values worked out by hand.

The value tests are chex variants: each runs once under ``jax.jit`` and once eagerly (the functions
under test go through ``self.variant``); the tests of rejected inputs are plain pytest tests.
"""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import parameterized

from kitae.timesteps import (
    compute_discounted_returns,
    compute_gae,
    compute_n_step_returns,
    compute_td_targets,
)

GAMMA = 0.9
LAMBDA = 0.8  # gamma * lambda = 0.72


def close(actual, expected):
    np.testing.assert_allclose(np.asarray(actual), np.asarray(expected), rtol=1e-5, atol=1e-5)


# Three 4-step trajectories sharing rewards and values (next_values[t] ==
# values[t + 1] inside an episode).
REWARDS = np.array([1.0, 2.0, 3.0, 4.0], np.float32)
VALUES = np.array([0.5, 1.0, 1.5, 2.0], np.float32)
ZEROS = np.zeros(4, np.float32)

# A: no episode end inside the array; the last step bootstraps from 10.0.
NEXT_A = np.array([1.0, 1.5, 2.0, 10.0], np.float32)
TERM_A, TRUNC_A = ZEROS, ZEROS
# B: terminates at t=1 (next_values[1]=7.0 must be ignored), new episode at t=2.
NEXT_B = np.array([1.0, 7.0, 2.0, 10.0], np.float32)
TERM_B = np.array([False, True, False, False])
TRUNC_B = np.array([False, False, False, False])
# C: truncated at t=1; 7.0 is the value of the final observation -> bootstrap.
NEXT_C = NEXT_B
TERM_C = np.array([0.0, 0.0, 0.0, 0.0], np.float32)  # float flags also allowed
TRUNC_C = np.array([0.0, 1.0, 0.0, 0.0], np.float32)

TRAJS = [
    (NEXT_A, TERM_A, TRUNC_A),
    (NEXT_B, TERM_B, TRUNC_B),
    (NEXT_C, TERM_C, TRUNC_C),
]

# ---------------------------------------------------------------------------
# Hand-computed GAE (gamma=0.9, lambda=0.8, gamma*lambda=0.72)
# delta_t = r_t + 0.9 * (1 - term_t) * next_t - v_t
# A: delta = [1 + 0.9*1.0 - 0.5, 2 + 0.9*1.5 - 1.0, 3 + 0.9*2.0 - 1.5, 4 + 0.9*10 - 2]
#          = [1.4, 2.35, 3.3, 11.0]
#    A3 = 11.0
#    A2 = 3.3 + 0.72 * 11.0 = 11.22
#    A1 = 2.35 + 0.72 * 11.22 = 10.4284
#    A0 = 1.4 + 0.72 * 10.4284 = 8.908448
ADV_A = [8.908448, 10.4284, 11.22, 11.0]
RET_A = [8.908448 + 0.5, 10.4284 + 1.0, 11.22 + 1.5, 11.0 + 2.0]
# B (terminated at t=1): delta1 = 2 + 0 - 1.0 = 1.0, chain cut after t=1
#    A3 = 11.0, A2 = 11.22, A1 = 1.0, A0 = 1.4 + 0.72 * 1.0 = 2.12
ADV_B = [2.12, 1.0, 11.22, 11.0]
RET_B = [2.62, 2.0, 12.72, 13.0]
# C (truncated at t=1): delta1 = 2 + 0.9 * 7.0 - 1.0 = 7.3, chain cut after t=1
#    A3 = 11.0, A2 = 11.22, A1 = 7.3, A0 = 1.4 + 0.72 * 7.3 = 6.656
ADV_C = [6.656, 7.3, 11.22, 11.0]
RET_C = [7.156, 8.3, 12.72, 13.0]
GAE_EXPECTED = [(ADV_A, RET_A), (ADV_B, RET_B), (ADV_C, RET_C)]

# ---------------------------------------------------------------------------
# Hand-computed n-step returns (gamma=0.9, gamma^2=0.81, gamma^3=0.729, gamma^4=0.6561)
# A, n=1: [1 + 0.9*1.0, 2 + 0.9*1.5, 3 + 0.9*2.0, 4 + 0.9*10] = [1.9, 3.35, 4.8, 13.0]
NSTEP_A_1 = [1.9, 3.35, 4.8, 13.0]
# A, n=2: G0 = 1 + 0.9*2 + 0.81*1.5 = 4.015
#         G1 = 2 + 0.9*3 + 0.81*2.0 = 6.32
#         G2 = 3 + 0.9*4 + 0.81*10  = 14.7
#         G3 = 4 + 0.9*10           = 13.0   (array end: m = 1)
NSTEP_A_2 = [4.015, 6.32, 14.7, 13.0]
# A, n=3: G0 = 1 + 0.9*2 + 0.81*3 + 0.729*2.0 = 6.688
#         G1 = 2 + 0.9*3 + 0.81*4 + 0.729*10  = 15.23
#         G2 = 14.7, G3 = 13.0
NSTEP_A_3 = [6.688, 15.23, 14.7, 13.0]
# A, n>=4: G0 = 1 + 0.9*2 + 0.81*3 + 0.729*4 + 0.6561*10 = 14.707
NSTEP_A_FULL = [14.707, 15.23, 14.7, 13.0]
# B (terminated at t=1), n=3:
#         G0 = 1 + 0.9*2 + 0.81*(1-1)*7.0 = 2.8   (m = 2)
#         G1 = 2 + 0.9*(1-1)*7.0          = 2.0   (m = 1)
#         G2 = 3 + 0.9*4 + 0.81*10        = 14.7
#         G3 = 13.0
NSTEP_B_3 = [2.8, 2.0, 14.7, 13.0]
# C (truncated at t=1), n=3:
#         G0 = 1 + 0.9*2 + 0.81*7.0 = 8.47
#         G1 = 2 + 0.9*7.0          = 8.3
NSTEP_C_3 = [8.47, 8.3, 14.7, 13.0]
NSTEP_3_EXPECTED = [NSTEP_A_3, NSTEP_B_3, NSTEP_C_3]


VARIANTS = dict(with_jit=True, without_jit=True)
TRAJ_IDS = (("bootstrap_last", 0), ("terminated", 1), ("truncated", 2))


# ---------------------------------------------------------------------------
# compute_td_targets
# ---------------------------------------------------------------------------


class TestTdTargets(chex.TestCase):
    @chex.variants(**VARIANTS)
    def test_td_targets_by_hand(self):
        discounts = GAMMA * (1.0 - TERM_B.astype(np.float32))  # [0.9, 0, 0.9, 0.9]
        out = self.variant(compute_td_targets)(REWARDS, discounts, NEXT_B)
        # [1 + 0.9*1.0, 2 + 0*7.0, 3 + 0.9*2.0, 4 + 0.9*10]
        close(out, [1.9, 2.0, 4.8, 13.0])

    @chex.variants(**VARIANTS)
    def test_td_targets_broadcasts_like_the_guide(self):
        reward = jnp.array([1.0, 2.0])  # (B,)
        discounts = jnp.array([[0.9], [0.0]])  # (B, 1)
        next_q = jnp.array([[3.0], [5.0]])  # (B, 1)
        out = self.variant(compute_td_targets)(reward[..., None], discounts, next_q)
        assert out.shape == (2, 1)
        close(out, [[1 + 0.9 * 3.0], [2.0]])

    @chex.variants(**VARIANTS)
    def test_td_targets_vmap(self):
        r = jnp.stack([jnp.asarray(REWARDS)] * 3)
        d = jnp.array([[0.9] * 4, [0.0] * 4, [0.5] * 4])
        nv = jnp.stack([NEXT_A, NEXT_B, NEXT_C])
        expected = r + d * nv
        close(self.variant(compute_td_targets)(r, d, nv), expected)
        close(self.variant(jax.vmap(compute_td_targets))(r, d, nv), expected)


def test_td_targets_rejects_bad_shapes():
    with pytest.raises(ValueError, match="next_values"):
        compute_td_targets(jnp.zeros(4), jnp.zeros(4), jnp.zeros(3))


# ---------------------------------------------------------------------------
# compute_gae
# ---------------------------------------------------------------------------


class TestGae(chex.TestCase):
    @chex.variants(**VARIANTS)
    @parameterized.named_parameters(*TRAJ_IDS)
    def test_gae_by_hand(self, idx):
        nv, term, trunc = TRAJS[idx]
        adv, ret = self.variant(compute_gae)(REWARDS, VALUES, nv, term, trunc, GAMMA, LAMBDA)
        exp_adv, exp_ret = GAE_EXPECTED[idx]
        close(adv, exp_adv)
        close(ret, exp_ret)

    @chex.variants(**VARIANTS)
    def test_gae_terminated_at_last_step(self):
        term = np.array([0, 0, 0, 1], np.float32)
        adv, ret = self.variant(compute_gae)(REWARDS, VALUES, NEXT_A, term, ZEROS, GAMMA, LAMBDA)
        # delta3 = 4 - 2 = 2.0 (no bootstrap from 10.0)
        # A2 = 3.3 + 0.72*2.0 = 4.74
        # A1 = 2.35 + 0.72*4.74 = 5.7628
        # A0 = 1.4 + 0.72*5.7628 = 5.549216
        close(adv, [5.549216, 5.7628, 4.74, 2.0])
        close(ret, [6.049216, 6.7628, 6.24, 4.0])

    @chex.variants(**VARIANTS)
    def test_gae_lambda_extremes(self):
        gae = self.variant(compute_gae)
        nv, term, trunc = TRAJS[2]
        # lambda=0: advantages are the TD errors, returns the TD targets.
        adv, ret = gae(REWARDS, VALUES, nv, term, trunc, GAMMA, 0.0)
        close(adv, [1.4, 7.3, 3.3, 11.0])
        close(ret, compute_td_targets(REWARDS, GAMMA * (1 - term), nv))
        # lambda=1 with consistent values: returns are the full bootstrapped returns.
        for nv, term, trunc in TRAJS:
            _, ret = gae(REWARDS, VALUES, nv, term, trunc, GAMMA, 1.0)
            close(ret, compute_n_step_returns(REWARDS, nv, term, trunc, GAMMA, n=100))

    @chex.variants(**VARIANTS)
    def test_gae_jax_scalar_gamma_and_lambda(self):
        f = self.variant(compute_gae)
        for (nv, term, trunc), (exp_adv, exp_ret) in zip(TRAJS, GAE_EXPECTED):
            # gamma and lambda_ as JAX scalars (traced under jit).
            adv, ret = f(REWARDS, VALUES, nv, term, trunc, jnp.float32(GAMMA), jnp.float32(LAMBDA))
            close(adv, exp_adv)
            close(ret, exp_ret)

    @chex.variants(**VARIANTS)
    def test_gae_vmap(self):
        nvs = jnp.stack([t[0] for t in TRAJS])
        terms = jnp.stack([jnp.asarray(t[1], jnp.float32) for t in TRAJS])
        truncs = jnp.stack([jnp.asarray(t[2], jnp.float32) for t in TRAJS])
        rewards = jnp.stack([REWARDS] * 3)
        values = jnp.stack([VALUES] * 3)
        batched = jax.vmap(lambda r, v, nv, te, tr: compute_gae(r, v, nv, te, tr, GAMMA, LAMBDA))
        adv, ret = self.variant(batched)(rewards, values, nvs, terms, truncs)
        assert adv.shape == ret.shape == (3, 4)
        for i, (nv, term, trunc) in enumerate(TRAJS):
            # the eager, unbatched call is the reference for both variants
            single_adv, single_ret = compute_gae(REWARDS, VALUES, nv, term, trunc, GAMMA, LAMBDA)
            close(adv[i], single_adv)
            close(ret[i], single_ret)
            close(adv[i], GAE_EXPECTED[i][0])
        # the jitted vmap agrees with the eager one
        close(adv, batched(rewards, values, nvs, terms, truncs)[0])

    @chex.variants(**VARIANTS)
    def test_gae_trailing_dims(self):
        gae = self.variant(compute_gae)
        nv, term, trunc = TRAJS[1]
        adv, ret = gae(REWARDS[:, None], VALUES[:, None], nv[:, None], term[:, None], trunc[:, None], GAMMA, LAMBDA)
        assert adv.shape == ret.shape == (4, 1)
        close(adv[:, 0], ADV_B)
        close(ret[:, 0], RET_B)
        # Flags of shape (T,) are aligned on the time axis with (T, 1) values.
        adv, _ = gae(REWARDS[:, None], VALUES[:, None], nv[:, None], term, trunc, GAMMA, LAMBDA)
        assert adv.shape == (4, 1)
        close(adv[:, 0], ADV_B)
        # Two independent columns (e.g. two envs): (T, 2).
        adv, _ = gae(
            np.stack([REWARDS] * 2, 1),
            np.stack([VALUES] * 2, 1),
            np.stack([NEXT_A, NEXT_C], 1),
            np.stack([TERM_A, TERM_C], 1),
            np.stack([TRUNC_A, TRUNC_C], 1),
            GAMMA,
            LAMBDA,
        )
        assert adv.shape == (4, 2)
        close(adv[:, 0], ADV_A)
        close(adv[:, 1], ADV_C)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(gamma=1.5), r"gamma must be in \[0, 1\], got gamma=1.5"),
        (dict(gamma=-0.1), "gamma"),
        (dict(lambda_=1.2), "lambda_"),
        (dict(lambda_=float("nan")), "lambda_"),
        (dict(gamma=jnp.ones(3)), "gamma"),
        (dict(values=np.zeros(5)), "^values has leading"),
        (dict(terminated=np.zeros(3)), "^terminated has leading"),
        (dict(next_values=np.zeros((4, 3))), "broadcast"),
        (dict(rewards=np.float32(1.0)), "^rewards must have a leading time axis"),
    ],
)
def test_gae_rejects_bad_inputs(kwargs, match):
    args = dict(
        rewards=REWARDS,
        values=VALUES[:, None] * np.ones((1, 2), np.float32),
        next_values=NEXT_A,
        terminated=TERM_A,
        truncated=TRUNC_A,
        gamma=GAMMA,
        lambda_=LAMBDA,
    )
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        compute_gae(**args)


# ---------------------------------------------------------------------------
# compute_n_step_returns (n is static: static_argnames=("n",) under jit)
# ---------------------------------------------------------------------------


class TestNStepReturns(chex.TestCase):
    def n_step(self):
        return self.variant(compute_n_step_returns, static_argnames=("n",))

    @chex.variants(**VARIANTS)
    @parameterized.named_parameters(
        ("n1", 1, NSTEP_A_1),
        ("n2", 2, NSTEP_A_2),
        ("n3", 3, NSTEP_A_3),
        ("n4", 4, NSTEP_A_FULL),
        ("n50", 50, NSTEP_A_FULL),
    )
    def test_n_step_by_hand_bootstrap_last(self, n, expected):
        close(self.n_step()(REWARDS, NEXT_A, TERM_A, TRUNC_A, GAMMA, n=n), expected)

    @chex.variants(**VARIANTS)
    @parameterized.named_parameters(*TRAJ_IDS[1:])
    def test_n_step_by_hand_episode_end(self, idx):
        nv, term, trunc = TRAJS[idx]
        close(self.n_step()(REWARDS, nv, term, trunc, GAMMA, n=3), NSTEP_3_EXPECTED[idx])

    @chex.variants(**VARIANTS)
    @parameterized.named_parameters(*TRAJ_IDS)
    def test_n_step_one_equals_td_targets(self, idx):
        nv, term, trunc = TRAJS[idx]
        discounts = GAMMA * (1.0 - np.asarray(term, np.float32))
        close(
            self.n_step()(REWARDS, nv, term, trunc, GAMMA, n=1),
            compute_td_targets(REWARDS, discounts, nv),
        )

    @chex.variants(**VARIANTS)
    def test_n_step_large_n_equals_discounted_return_with_bootstrap(self):
        n_step = self.n_step()
        # No episode end: the discounted return bootstrapped with next_values[-1].
        full = self.variant(compute_discounted_returns)(REWARDS, TERM_A, TRUNC_A, GAMMA, bootstrap_value=10.0)
        close(full, NSTEP_A_FULL)  # 13, 3 + 0.9*13, 2 + 0.9*14.7, 1 + 0.9*15.23
        close(n_step(REWARDS, NEXT_A, TERM_A, TRUNC_A, GAMMA, n=1000), full)
        # Terminated at t=1: the first episode is a plain (non-bootstrapped) sum.
        out = n_step(REWARDS, NEXT_B, TERM_B, TRUNC_B, GAMMA, n=1000)
        close(out, [2.8, 2.0, 14.7, 13.0])

    @chex.variants(**VARIANTS)
    def test_n_step_jax_scalar_gamma(self):
        f = self.n_step()
        for (nv, term, trunc), expected in zip(TRAJS, NSTEP_3_EXPECTED):
            # gamma as a JAX scalar (traced under jit).
            close(f(REWARDS, nv, term, trunc, jnp.float32(GAMMA), n=3), expected)

    @chex.variants(**VARIANTS)
    def test_n_step_vmap(self):
        nvs = jnp.stack([t[0] for t in TRAJS])
        terms = jnp.stack([jnp.asarray(t[1], jnp.float32) for t in TRAJS])
        truncs = jnp.stack([jnp.asarray(t[2], jnp.float32) for t in TRAJS])
        rewards = jnp.stack([REWARDS] * 3)
        batched = jax.vmap(lambda r, nv, te, tr: compute_n_step_returns(r, nv, te, tr, GAMMA, 3))
        out = self.variant(batched)(rewards, nvs, terms, truncs)
        assert out.shape == (3, 4)
        for i, (nv, term, trunc) in enumerate(TRAJS):
            # the eager, unbatched call is the reference for both variants
            close(out[i], compute_n_step_returns(REWARDS, nv, term, trunc, GAMMA, 3))
            close(out[i], NSTEP_3_EXPECTED[i])
        # the jitted vmap agrees with the eager one
        close(out, batched(rewards, nvs, terms, truncs))

    @chex.variants(**VARIANTS)
    def test_n_step_trailing_dims(self):
        n_step = self.n_step()
        out = n_step(REWARDS[:, None], NEXT_C[:, None], TERM_C[:, None], TRUNC_C[:, None], GAMMA, n=3)
        assert out.shape == (4, 1)
        close(out[:, 0], NSTEP_C_3)
        out = n_step(REWARDS[:, None], NEXT_B[:, None], TERM_B, TRUNC_B, GAMMA, n=3)
        assert out.shape == (4, 1)
        close(out[:, 0], NSTEP_B_3)


@pytest.mark.parametrize("n", [0, -2, 2.0, True, None])
def test_n_step_rejects_bad_n(n):
    with pytest.raises(ValueError, match=r"\bn\b"):
        compute_n_step_returns(REWARDS, NEXT_A, TERM_A, TRUNC_A, GAMMA, n)


def test_n_step_rejects_bad_gamma_and_shapes():
    with pytest.raises(ValueError, match="gamma"):
        compute_n_step_returns(REWARDS, NEXT_A, TERM_A, TRUNC_A, 2.0, 3)
    with pytest.raises(ValueError, match="^next_values has leading"):
        compute_n_step_returns(REWARDS, NEXT_A[:3], TERM_A, TRUNC_A, GAMMA, 3)


# ---------------------------------------------------------------------------
# compute_discounted_returns
# ---------------------------------------------------------------------------


class TestDiscountedReturns(chex.TestCase):
    @chex.variants(**VARIANTS)
    def test_discounted_returns_by_hand(self):
        returns = self.variant(compute_discounted_returns)
        # Terminated or truncated at t=1: [1 + 0.9*2, 2, 3 + 0.9*4, 4] with no bootstrap.
        for term, trunc in [(TERM_B, TRUNC_B), (TERM_C, TRUNC_C)]:
            close(returns(REWARDS, term, trunc, GAMMA), [2.8, 2.0, 6.6, 4.0])
        # With a bootstrap value of 10 for the last step: G3 = 13, G2 = 3 + 0.9*13 = 14.7.
        out = returns(REWARDS, TERM_B, TRUNC_B, GAMMA, bootstrap_value=10.0)
        close(out, [2.8, 2.0, 14.7, 13.0])

    @chex.variants(**VARIANTS)
    def test_discounted_returns_vmap_and_trailing_dims(self):
        terms = jnp.stack([jnp.asarray(t[1], jnp.float32) for t in TRAJS])
        truncs = jnp.stack([jnp.asarray(t[2], jnp.float32) for t in TRAJS])
        rewards = jnp.stack([REWARDS] * 3)
        boot = jnp.array([10.0, 0.0, 5.0])
        f = self.variant(jax.vmap(lambda r, te, tr, b: compute_discounted_returns(r, te, tr, GAMMA, b)))
        out = f(rewards, terms, truncs, boot)
        for i in range(3):
            # the eager, unbatched call is the reference for both variants
            close(out[i], compute_discounted_returns(REWARDS, terms[i], truncs[i], GAMMA, boot[i]))
        close(out[0], NSTEP_A_FULL)
        out = self.variant(compute_discounted_returns)(REWARDS[:, None], TERM_B, TRUNC_B, GAMMA, jnp.array([10.0]))
        assert out.shape == (4, 1)
        close(out[:, 0], [2.8, 2.0, 14.7, 13.0])


def test_discounted_returns_rejects_bad_bootstrap_value():
    with pytest.raises(ValueError, match="bootstrap_value"):
        compute_discounted_returns(REWARDS, TERM_B, TRUNC_B, GAMMA, jnp.zeros(3))
