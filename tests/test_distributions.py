"""Tests of kitae.distributions against closed forms written out with numpy.

The value tests are chex variants: each runs once under ``jax.jit`` and once eagerly (the function
that builds a distribution and calls its methods goes through ``self.variant``).
"""

import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kitae.distributions import Categorical, Deterministic, DiagNormal, EpsilonGreedy, TanhNormal

N_SAMPLES = 10_000
VARIANTS = dict(with_jit=True, without_jit=True)


def np_log_softmax(logits):
    logits = np.asarray(logits, np.float64)
    m = logits.max(-1, keepdims=True)
    return logits - m - np.log(np.exp(logits - m).sum(-1, keepdims=True))


def np_normal_logpdf(x, loc, scale):
    x, loc, scale = (np.asarray(a, np.float64) for a in (x, loc, scale))
    return -0.5 * ((x - loc) / scale) ** 2 - np.log(scale) - 0.5 * np.log(2 * np.pi)


def frequencies(samples, n):
    return np.bincount(np.asarray(samples).ravel(), minlength=n) / np.asarray(samples).size


# ------------------------------------------------------------------------------------------------
# Categorical
# ------------------------------------------------------------------------------------------------


LOGITS = np.array([[1.0, 2.0, 0.5, -1.0], [0.0, 0.0, 3.0, 1.0]], np.float32)


class TestCategorical(chex.TestCase):
    @chex.variants(**VARIANTS)
    def test_categorical_log_prob_entropy_mode(self):
        @self.variant
        def f(logits, actions):
            dist = Categorical(logits)
            return dist, dist.log_prob(actions), dist.entropy(), dist.mode(), dist.probs

        actions = np.array([1, 3])
        dist, log_prob, entropy, mode, probs = f(jnp.asarray(LOGITS), actions)
        logp = np_log_softmax(LOGITS)
        np.testing.assert_allclose(log_prob, logp[[0, 1], actions], rtol=1e-5)
        np.testing.assert_allclose(entropy, -(np.exp(logp) * logp).sum(-1), rtol=1e-5)
        np.testing.assert_array_equal(mode, [1, 2])
        assert dist.batch_shape == (2,)
        np.testing.assert_allclose(probs.sum(-1), 1.0, rtol=1e-6)

    @chex.variants(**VARIANTS)
    def test_categorical_sampling_frequencies(self):
        logits = jnp.asarray(LOGITS[0])
        sample = self.variant(lambda logits, key: Categorical(logits).sample(key))
        samples = sample(jnp.broadcast_to(logits, (N_SAMPLES, 4)), jax.random.key(0))
        assert samples.shape == (N_SAMPLES,) and samples.dtype == jnp.int32
        np.testing.assert_allclose(frequencies(samples, 4), np.exp(np_log_softmax(LOGITS[0])), atol=0.02)

    @chex.variants(**VARIANTS)
    def test_categorical_sample_and_log_prob_consistent(self):
        @self.variant
        def f(logits, key):
            dist = Categorical(logits)
            x, logp = dist.sample_and_log_prob(key)
            return x, logp, dist.log_prob(x)

        _, logp, log_prob_of_x = f(jnp.asarray(LOGITS), jax.random.key(1))
        np.testing.assert_allclose(logp, log_prob_of_x, rtol=1e-6)

    @chex.variants(**VARIANTS)
    def test_masked_categorical_never_samples_masked_actions(self):
        logits = jnp.array([5.0, 1.0, 0.0, 4.0])  # the best two are masked out
        mask = jnp.array([False, True, True, False])
        sample = self.variant(
            lambda logits, mask, key: Categorical(jnp.broadcast_to(logits, (N_SAMPLES, 4)), mask).sample(key)
        )
        samples = np.asarray(sample(logits, mask, jax.random.key(2)))
        assert set(np.unique(samples)) <= {1, 2}
        expected = np.exp(np_log_softmax(np.array([1.0, 0.0])))
        np.testing.assert_allclose(frequencies(samples, 4)[[1, 2]], expected, atol=0.02)

        @self.variant
        def single(logits, mask):
            dist = Categorical(logits, mask)
            return dist.mode(), dist.probs, dist.entropy(), dist.log_prob(2), dist.log_prob(0)

        mode, probs, entropy, log_prob_2, log_prob_0 = single(logits, mask)
        assert int(mode) == 1
        np.testing.assert_allclose(probs[jnp.array([0, 3])], 0.0, atol=1e-30)
        # Entropy of the renormalised allowed classes, finite.
        p = expected
        np.testing.assert_allclose(entropy, -(p * np.log(p)).sum(), rtol=1e-5)
        np.testing.assert_allclose(log_prob_2, np.log(p[1]), rtol=1e-5)
        assert float(log_prob_0) < -1e30

    @chex.variants(**VARIANTS)
    def test_categorical_as_output_and_under_vmap(self):
        logits = jnp.asarray(LOGITS)
        mask = jnp.array([[True, False, True, True], [True, True, False, True]])

        @self.variant
        def f(logits, mask, key):
            dist = Categorical(logits, mask)
            x, logp = dist.sample_and_log_prob(key)
            return dist, x, logp, dist.entropy(), dist.mode()

        dist, x, logp, ent, mode = f(logits, mask, jax.random.key(3))
        assert isinstance(dist, Categorical)
        assert x.shape == logp.shape == ent.shape == mode.shape == (2,)
        np.testing.assert_array_equal(mode, [0, 3])

        keys = jax.random.split(jax.random.key(4), 2)
        g = self.variant(jax.vmap(lambda lg, m, k: Categorical(lg, m).sample_and_log_prob(k)))
        xs, logps = g(logits, mask, keys)
        assert xs.shape == (2,) and logps.shape == (2,)
        assert bool(mask[0, xs[0]]) and bool(mask[1, xs[1]])
        ref = np.asarray(jax.vmap(lambda lg, m, a: Categorical(lg, m).log_prob(a))(logits, mask, xs))
        np.testing.assert_allclose(logps, ref, rtol=1e-6)


# ------------------------------------------------------------------------------------------------
# DiagNormal
# ------------------------------------------------------------------------------------------------


LOC = np.array([[0.0, 1.0, -2.0], [0.5, 0.5, 0.5]], np.float32)
SCALE = np.array([[1.0, 0.5, 2.0], [0.1, 1.0, 3.0]], np.float32)


class TestDiagNormal(chex.TestCase):
    @chex.variants(**VARIANTS)
    def test_diag_normal_log_prob_entropy_mode(self):
        @self.variant
        def f(loc, scale, x):
            dist = DiagNormal(loc, scale)
            return dist, dist.log_prob(x), dist.entropy(), dist.mode()

        x = np.array([[0.3, 0.0, 1.0], [0.4, -1.0, 2.0]], np.float32)
        dist, log_prob, entropy, mode = f(jnp.asarray(LOC), jnp.asarray(SCALE), x)
        np.testing.assert_allclose(log_prob, np_normal_logpdf(x, LOC, SCALE).sum(-1), rtol=1e-5)
        expected_entropy = (0.5 + 0.5 * np.log(2 * np.pi) + np.log(SCALE.astype(np.float64))).sum(-1)
        np.testing.assert_allclose(entropy, expected_entropy, rtol=1e-5)
        np.testing.assert_array_equal(mode, LOC)
        assert dist.batch_shape == (2,) and dist.event_shape == (3,)

    @chex.variants(**VARIANTS)
    def test_diag_normal_broadcast_scale_and_sampling_moments(self):
        @self.variant
        def f(loc, scale, key):
            dist = DiagNormal(jnp.broadcast_to(loc, (N_SAMPLES, 3)), scale)
            x, logp = dist.sample_and_log_prob(key)
            return x, logp, dist.entropy()

        x, logp, entropy = f(jnp.asarray(LOC[0]), jnp.asarray(SCALE[0]), jax.random.key(5))
        assert x.shape == (N_SAMPLES, 3) and logp.shape == (N_SAMPLES,)
        np.testing.assert_allclose(x.mean(0), LOC[0], atol=0.06)
        np.testing.assert_allclose(x.std(0), SCALE[0], rtol=0.05)
        assert entropy.shape == (N_SAMPLES,)

    @chex.variants(**VARIANTS)
    def test_diag_normal_under_vmap(self):
        keys = jax.random.split(jax.random.key(6), 2)
        f = self.variant(jax.vmap(lambda m, s, k: DiagNormal(m, s).sample_and_log_prob(k)))
        x, logp = f(jnp.asarray(LOC), jnp.asarray(SCALE), keys)
        assert x.shape == (2, 3) and logp.shape == (2,)
        np.testing.assert_allclose(logp, np_normal_logpdf(x, LOC, SCALE).sum(-1), rtol=1e-5)


# ------------------------------------------------------------------------------------------------
# TanhNormal
# ------------------------------------------------------------------------------------------------


def np_tanh_normal_logpdf_from_u(u, loc, scale):
    u = np.asarray(u, np.float64)
    return (np_normal_logpdf(u, loc, scale) - np.log(1.0 - np.tanh(u) ** 2)).sum(-1)


def _tanh_normal_sample_and_log_probs(loc, scale, key):
    """``(x, log p(x) from sampling, log_prob(x))`` of ``TanhNormal(loc, scale)``."""
    dist = TanhNormal(loc, scale)
    x, logp = dist.sample_and_log_prob(key)
    return x, logp, dist.log_prob(x)


class TestTanhNormal(chex.TestCase):
    @chex.variants(**VARIANTS)
    def test_tanh_normal_sample_and_log_prob_matches_closed_form_and_log_prob(self):
        loc = jnp.asarray(LOC * 0.5)
        scale = jnp.asarray(SCALE * 0.3)
        x, logp, log_prob_of_x = self.variant(_tanh_normal_sample_and_log_probs)(loc, scale, jax.random.key(7))
        assert x.shape == (2, 3) and logp.shape == (2,)
        assert np.all(np.abs(np.asarray(x)) < 1)
        u = np.arctanh(np.asarray(x, np.float64))
        np.testing.assert_allclose(logp, np_tanh_normal_logpdf_from_u(u, LOC * 0.5, SCALE * 0.3), rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(log_prob_of_x, logp, atol=1e-4)

    @chex.variants(**VARIANTS)
    def test_tanh_normal_many_samples_consistent(self):
        f = self.variant(_tanh_normal_sample_and_log_probs)
        x, logp, log_prob_of_x = f(jnp.zeros((1000, 2)), jnp.full((1000, 2), 0.8), jax.random.key(8))
        moderate = np.all(np.abs(np.asarray(x)) < 0.99, axis=-1)  # |u| < ~2.6
        assert moderate.mean() > 0.9
        np.testing.assert_allclose(np.asarray(log_prob_of_x)[moderate], np.asarray(logp)[moderate], atol=1e-4)

    @chex.variants(**VARIANTS)
    def test_tanh_normal_stable_for_large_pre_tanh_values(self):
        f = self.variant(_tanh_normal_sample_and_log_probs)
        _, logp, log_prob_of_x = f(jnp.array([[20.0, -20.0]]), jnp.array([[0.1, 0.1]]), jax.random.key(9))
        assert np.all(np.isfinite(np.asarray(logp)))
        assert np.all(np.isfinite(np.asarray(log_prob_of_x)))  # clipped

    @chex.variants(**VARIANTS)
    def test_tanh_normal_mode_and_base_entropy(self):
        @self.variant
        def f(loc, scale):
            dist = TanhNormal(loc, scale)
            return dist.mode(), dist.entropy()

        mode, entropy = f(jnp.asarray(LOC), jnp.asarray(SCALE))
        np.testing.assert_allclose(mode, np.tanh(LOC), rtol=1e-6)
        np.testing.assert_allclose(entropy, DiagNormal(jnp.asarray(LOC), jnp.asarray(SCALE)).entropy())

    @chex.variants(**VARIANTS)
    def test_tanh_normal_under_vmap(self):
        keys = jax.random.split(jax.random.key(10), 2)
        f = self.variant(jax.vmap(lambda m, s, k: TanhNormal(m, s).sample_and_log_prob(k)))
        x, logp = f(jnp.asarray(LOC * 0.5), jnp.asarray(SCALE * 0.3), keys)
        assert x.shape == (2, 3) and logp.shape == (2,)
        g = self.variant(lambda d, x: d.log_prob(x))
        np.testing.assert_allclose(g(TanhNormal(jnp.asarray(LOC * 0.5), jnp.asarray(SCALE * 0.3)), x), logp, atol=1e-4)


# ------------------------------------------------------------------------------------------------
# EpsilonGreedy
# ------------------------------------------------------------------------------------------------


class TestEpsilonGreedy(chex.TestCase):
    @chex.variants(**VARIANTS)
    def test_epsilon_greedy_probs_log_prob_entropy_mode(self):
        @self.variant
        def f(prefs, eps, actions):
            dist = EpsilonGreedy(prefs, eps)
            return dist.probs, dist.log_prob(actions), dist.entropy(), dist.mode()

        prefs = jnp.array([[1.0, 3.0, 2.0], [0.0, -1.0, 5.0]])
        eps = 0.3
        probs, log_prob, entropy, mode = f(prefs, eps, np.array([1, 0]))
        expected = np.array([[0.1, 0.8, 0.1], [0.1, 0.1, 0.8]])
        np.testing.assert_allclose(probs, expected, rtol=1e-6)
        np.testing.assert_allclose(log_prob, np.log([0.8, 0.1]), rtol=1e-5)
        np.testing.assert_allclose(entropy, -(expected * np.log(expected)).sum(-1), rtol=1e-5)
        np.testing.assert_array_equal(mode, [1, 2])

    @chex.variants(**VARIANTS)
    def test_epsilon_greedy_sampling_frequencies(self):
        sample = self.variant(lambda prefs, eps, key: EpsilonGreedy(prefs, eps).sample(key))
        prefs = jnp.broadcast_to(jnp.array([0.0, 2.0, 1.0, -1.0]), (N_SAMPLES, 4))
        samples = sample(prefs, 0.4, jax.random.key(11))
        assert samples.shape == (N_SAMPLES,) and samples.dtype == jnp.int32
        np.testing.assert_allclose(frequencies(samples, 4), [0.1, 0.7, 0.1, 0.1], atol=0.02)

        greedy = sample(prefs, 0.0, jax.random.key(12))
        assert np.all(np.asarray(greedy) == 1)
        uniform = sample(prefs, 1.0, jax.random.key(13))
        np.testing.assert_allclose(frequencies(uniform, 4), 0.25, atol=0.02)

    @chex.variants(**VARIANTS)
    def test_epsilon_greedy_zero_epsilon_log_prob(self):
        @self.variant
        def f(prefs, eps):
            dist = EpsilonGreedy(prefs, eps)
            return dist.log_prob(1), dist.log_prob(0), dist.entropy()

        log_prob_1, log_prob_0, entropy = f(jnp.array([0.0, 1.0]), 0.0)
        assert float(log_prob_1) == 0.0
        assert float(log_prob_0) == -np.inf
        assert float(entropy) == 0.0

    @chex.variants(**VARIANTS)
    def test_epsilon_greedy_under_vmap_with_array_epsilon(self):
        prefs = jnp.array([[1.0, 3.0, 2.0], [0.0, -1.0, 5.0]])
        eps = jnp.array([0.0, 0.3])
        keys = jax.random.split(jax.random.key(14), 2)
        f = self.variant(jax.vmap(lambda p, e, k: EpsilonGreedy(p, e).sample_and_log_prob(k)))
        x, logp = f(prefs, eps, keys)
        assert x.shape == (2,) and logp.shape == (2,)
        assert int(x[0]) == 1 and float(logp[0]) == 0.0
        dist = self.variant(lambda p, e: EpsilonGreedy(p, e))(prefs, eps)
        np.testing.assert_allclose(dist.probs[1], [0.1, 0.1, 0.8], rtol=1e-6)


# ------------------------------------------------------------------------------------------------
# Deterministic and pytree behaviour
# ------------------------------------------------------------------------------------------------


class TestDeterministic(chex.TestCase):
    @chex.variants(**VARIANTS)
    def test_deterministic(self):
        @self.variant
        def f(value, key):
            dist = Deterministic(value)
            return dist.sample(key), dist.mode(), dist.log_prob(value), dist.entropy()

        value = jnp.arange(6.0).reshape(2, 3)
        sample, mode, log_prob, entropy = f(value, jax.random.key(0))
        np.testing.assert_array_equal(sample, value)
        np.testing.assert_array_equal(mode, value)
        np.testing.assert_array_equal(log_prob, np.zeros(2))
        x, logp = self.variant(lambda d, k: d.sample_and_log_prob(k))(Deterministic(value), jax.random.key(0))
        np.testing.assert_array_equal(x, value)
        # were shape-checked only: an entropy of ones passed; the class documents zeros for both
        np.testing.assert_array_equal(logp, np.zeros(2, np.float32))
        np.testing.assert_array_equal(entropy, np.zeros(2, np.float32))
        assert logp.shape == (2,) and entropy.shape == (2,)


@pytest.mark.parametrize(
    "dist",
    [
        Categorical(jnp.zeros((2, 3)), jnp.ones((2, 3), bool)),
        Categorical(jnp.zeros((2, 3))),
        DiagNormal(jnp.zeros((2, 3)), jnp.ones((2, 3))),
        TanhNormal(jnp.zeros((2, 3)), jnp.ones((2, 3))),
        EpsilonGreedy(jnp.zeros((2, 3)), 0.1),
        Deterministic(jnp.zeros((2, 3))),
    ],
    ids=lambda d: type(d).__name__,
)
def test_distributions_are_pytrees(dist):
    leaves, treedef = jax.tree_util.tree_flatten(dist)
    assert leaves
    rebuilt = jax.tree_util.tree_unflatten(treedef, leaves)
    assert type(rebuilt) is type(dist)
    out = jax.jit(lambda d: d)(dist)
    assert type(out) is type(dist)
    mode = jax.jit(lambda d: d.mode())(dist)
    np.testing.assert_array_equal(mode, dist.mode())
    assert math.isfinite(float(jnp.sum(jax.jit(lambda d: d.entropy())(dist))))
