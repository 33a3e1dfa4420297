"""Small maths shared by algorithms: ``gaussian_kl``, the decoupled KL of MPO's M-step (seed 003's
``gaussian_kl``); the pieces off-policy critics share to learn from n-step and prioritized replay
(``n_step_gamma``, ``weighted_mean``, ``critic_td_errors``)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.scipy.linalg import cho_solve

__all__ = ["gaussian_kl", "n_step_gamma", "weighted_mean", "critic_td_errors"]


def gaussian_kl(mu1: jax.Array, mu2: jax.Array, cov1: jax.Array, cov2: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Decoupled KL divergences between two batches of multivariate Gaussians (seed 003).

    ``kl_mu`` is the batch mean of ``KL(N(mu1, cov1) || N(mu2, cov1))`` (the means differ, the
    covariance is the first one's), ``kl_sigma`` the batch mean of ``KL(N(mu1, cov1) || N(mu1,
    cov2))`` (the covariances differ, the mean is the first one's)::

        kl_mu    = 0.5 * (mu2 - mu1)^T cov1^-1 (mu2 - mu1)
        kl_sigma = 0.5 * (tr(cov2^-1 cov1) - n + log(det cov2 / det cov1))

    MPO constrains each with its own Lagrange multiplier (Abdolmaleki et al. 2018). This follows
    the documented maths, with ``cov1`` and ``cov2`` covariance matrices. The library seed 003
    documents ships code (adapted from daisatojp/mpo) that treats its inputs as Cholesky factors
    and inverts the determinant ratio; that code is not what is written here.

    Args:
        mu1, mu2: means ``(B, n)``.
        cov1, cov2: covariance matrices ``(B, n, n)``, symmetric positive definite.

    Returns:
        ``(kl_mu, kl_sigma)``, scalars (means over the batch).
    """
    n = mu1.shape[-1]
    chol1 = jnp.linalg.cholesky(cov1)
    chol2 = jnp.linalg.cholesky(cov2)
    diff = (mu2 - mu1)[..., None]  # (B, n, 1)
    mahalanobis = jnp.sum(diff * jax.vmap(lambda c, d: cho_solve((c, True), d))(chol1, diff), axis=(-2, -1))
    trace = jnp.trace(jax.vmap(lambda c, s: cho_solve((c, True), s))(chol2, cov1), axis1=-2, axis2=-1)
    logdet1 = 2.0 * jnp.sum(jnp.log(jnp.diagonal(chol1, axis1=-2, axis2=-1)), axis=-1)
    logdet2 = 2.0 * jnp.sum(jnp.log(jnp.diagonal(chol2, axis1=-2, axis2=-1)), axis=-1)
    kl_mu = 0.5 * mahalanobis
    kl_sigma = 0.5 * (trace - n + logdet2 - logdet1)
    return jnp.mean(kl_mu), jnp.mean(kl_sigma)


def n_step_gamma(gamma: float | jax.Array, n_steps: jax.Array | None) -> float | jax.Array:
    """The discount of a transition's bootstrap before termination: ``gamma`` for a one-step
    transition (``n_steps=None``), ``gamma ** n_steps`` ``(B,)`` for one sampled by n-step replay
    (``kitae.buffer.Experience.n_steps``)."""
    return gamma if n_steps is None else jnp.asarray(gamma, jnp.float32) ** jnp.asarray(n_steps, jnp.float32)


def weighted_mean(values: jax.Array, weights: jax.Array | None, axis: int = -1) -> jax.Array:
    """``mean(values)`` over ``axis`` (the batch), each value multiplied by its prioritized-replay
    importance weight ``weights`` ``(B,)`` when given."""
    return jnp.mean(values if weights is None else values * weights, axis=axis)


def critic_td_errors(q_values: jax.Array, targets: jax.Array) -> jax.Array:
    """The TD errors that become prioritized replay's priorities: ``mean_i |Q_i(s, a) - y|`` over
    the critics, ``q_values`` ``(N, B)`` (or ``(B,)``), ``targets`` ``(B,)`` -> ``(B,)``, no gradient."""
    errors = jnp.abs(jax.lax.stop_gradient(q_values) - targets)
    return errors if errors.ndim == 1 else jnp.mean(errors, axis=0)
