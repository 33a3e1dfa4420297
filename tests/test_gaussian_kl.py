"""``kitae.algos.utils.gaussian_kl`` (seed 003): the decoupled KL terms against closed-form values
computed by hand, under ``jit`` and ``vmap``, and against distrax's full KL."""

from __future__ import annotations

import math

import distrax
import jax
import jax.numpy as jnp
import numpy as np

from kitae.algos.utils import gaussian_kl

# Case 1, diagonal: mu1 = 0, mu2 = (1, 2), cov1 = diag(1, 4), cov2 = diag(2, 1).
#   kl_mu = 0.5 * (1^2 / 1 + 2^2 / 4) = 1.0
#   kl_sigma = 0.5 * ((1/2 + 4/1) - 2 + log((2 * 1) / (1 * 4))) = 0.5 * (2.5 - log 2)
# Case 2, correlated: mu1 = 0, mu2 = (1, -1), cov1 = [[2, 1], [1, 2]], cov2 = I.
#   cov1^-1 = [[2, -1], [-1, 2]] / 3, so d^T cov1^-1 d = 2 and kl_mu = 1.0
#   kl_sigma = 0.5 * (tr(cov1) - 2 + log(1 / det cov1)) = 0.5 * (2 - log 3)
MU1 = jnp.zeros((2, 2))
MU2 = jnp.array([[1.0, 2.0], [1.0, -1.0]])
COV1 = jnp.array([[[1.0, 0.0], [0.0, 4.0]], [[2.0, 1.0], [1.0, 2.0]]])
COV2 = jnp.array([[[2.0, 0.0], [0.0, 1.0]], [[1.0, 0.0], [0.0, 1.0]]])
KL_MU = [1.0, 1.0]
KL_SIGMA = [0.5 * (2.5 - math.log(2.0)), 0.5 * (2.0 - math.log(3.0))]


def test_closed_form_values_by_hand():
    for fn in (gaussian_kl, jax.jit(gaussian_kl)):
        kl_mu, kl_sigma = fn(MU1, MU2, COV1, COV2)
        np.testing.assert_allclose(float(kl_mu), np.mean(KL_MU), rtol=1e-6)
        np.testing.assert_allclose(float(kl_sigma), np.mean(KL_SIGMA), rtol=1e-6)
    for i in range(2):  # each case alone (a batch of one)
        kl_mu, kl_sigma = gaussian_kl(MU1[i : i + 1], MU2[i : i + 1], COV1[i : i + 1], COV2[i : i + 1])
        np.testing.assert_allclose([float(kl_mu), float(kl_sigma)], [KL_MU[i], KL_SIGMA[i]], rtol=1e-6)


def test_under_vmap_each_batch_gets_its_own_means():
    stacked = [jnp.stack([x[:1], x[1:]]) for x in (MU1, MU2, COV1, COV2)]
    kl_mu, kl_sigma = jax.vmap(gaussian_kl)(*stacked)
    np.testing.assert_allclose(np.asarray(kl_mu), KL_MU, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(kl_sigma), KL_SIGMA, rtol=1e-6)


def test_the_terms_are_distraxs_kl_with_one_part_held_fixed():
    key = jax.random.PRNGKey(0)
    k1, k2, k3, k4 = jax.random.split(key, 4)
    b, n = 5, 3
    a1, a2 = jax.random.normal(k1, (b, n, n)), jax.random.normal(k2, (b, n, n))
    cov1 = a1 @ jnp.swapaxes(a1, -1, -2) + 0.5 * jnp.eye(n)
    cov2 = a2 @ jnp.swapaxes(a2, -1, -2) + 0.5 * jnp.eye(n)
    mu1, mu2 = jax.random.normal(k3, (b, n)), jax.random.normal(k4, (b, n))
    kl_mu, kl_sigma = gaussian_kl(mu1, mu2, cov1, cov2)

    def kl(m0, c0, m1, c1):
        return distrax.MultivariateNormalFullCovariance(m0, c0).kl_divergence(
            distrax.MultivariateNormalFullCovariance(m1, c1)
        )

    np.testing.assert_allclose(float(kl_mu), float(jnp.mean(kl(mu1, cov1, mu2, cov1))), rtol=1e-4)
    np.testing.assert_allclose(float(kl_sigma), float(jnp.mean(kl(mu1, cov1, mu1, cov2))), rtol=1e-4)
