"""Return targets computed over time-major trajectories.

Every function here is a pure JAX function that works under ``jax.jit`` and
``jax.vmap``.

Conventions
-----------
* Time is axis 0. Per-step arrays have shape ``(T, ...)``, where ``...`` is
  empty or holds extra trailing dimensions, e.g. ``(T,)``, ``(T, 1)`` or
  ``(T, n_envs)``.
* To process a batch of independent trajectories stored batch-major
  ``(B, T, ...)``, wrap the function in ``jax.vmap`` (over axis 0).
* ``terminated[t]`` means the episode reached a terminal state at step ``t``:
  the value of the next state is 0, so there is no bootstrapping.
  ``truncated[t]`` means the episode was cut at step ``t`` (time limit, ...):
  the next state still has a value, so targets bootstrap from
  ``next_values[t]``. Either one ends the episode, so no quantity is
  propagated backwards across step ``t``. Both may be boolean or float (0/1)
  arrays.
* ``next_values[t]`` is the value of the *real* next observation of step
  ``t``. On truncation this is the final observation of the episode, not the
  observation after the automatic reset.
* The last row of the arrays (``t = T - 1``) always bootstraps from
  ``next_values[T - 1]`` unless it is terminated.

Inside :func:`compute_gae`, :func:`compute_n_step_returns` and
:func:`compute_discounted_returns` the per-step arrays are aligned on the time
axis: an array with fewer dimensions than the others is padded with trailing
singleton axes before broadcasting, so ``terminated`` of shape ``(T,)`` can be
combined with ``values`` of shape ``(T, 1)`` (to ``(T, 1)``, not ``(T, T)``).
:func:`compute_td_targets` has no time axis of its own and uses plain NumPy
broadcasting.

``gamma`` and ``lambda_`` may be Python numbers (checked to lie in
``[0, 1]``) or JAX scalars (not checked, so they can be traced).
"""

from __future__ import annotations

import numbers

import jax
import jax.numpy as jnp
import numpy as np

__all__ = [
    "bootstrap_discounts",
    "compute_td_targets",
    "compute_gae",
    "compute_vtrace",
    "compute_n_step_returns",
    "compute_discounted_returns",
]


# ---------------------------------------------------------------------------
# Validation helpers
# ---------------------------------------------------------------------------


def _check_unit_interval(name: str, value) -> None:
    """Raise ValueError if ``value`` is a Python number outside [0, 1]."""
    if isinstance(value, bool):
        raise ValueError(f"{name} must be a number in [0, 1], got bool {value!r}.")
    if isinstance(value, numbers.Real):
        if not 0.0 <= float(value) <= 1.0:  # also rejects NaN
            raise ValueError(f"{name} must be in [0, 1], got {name}={value!r}.")
        return
    shape = np.shape(value)
    if shape != ():
        raise ValueError(f"{name} must be a scalar (Python number or 0-d array), got an array of shape {shape}.")


def _time_aligned(**arrays) -> tuple[tuple[jax.Array, ...], int]:
    """Check leading (time) dims agree and broadcast the arrays together.

    Arrays with fewer dimensions get trailing singleton axes first, so that
    alignment is on axis 0 (time). Returns the broadcast arrays (in order) and
    ``T``.
    """
    names = list(arrays)
    arrs = [jnp.asarray(a) for a in arrays.values()]
    for name, a in zip(names, arrs):
        if a.ndim < 1:
            raise ValueError(f"{name} must have a leading time axis, shape (T, ...); got a scalar of shape {a.shape}.")
    T = arrs[0].shape[0]
    for name, a in zip(names, arrs):
        if a.shape[0] != T:
            desc = ", ".join(f"{n}: {x.shape}" for n, x in zip(names, arrs))
            raise ValueError(
                f"{name} has leading (time) dimension {a.shape[0]} but "
                f"{names[0]} has {T}; all arrays must share axis 0 ({desc})."
            )
    ndim = max(a.ndim for a in arrs)
    arrs = [a.reshape(a.shape + (1,) * (ndim - a.ndim)) for a in arrs]
    try:
        shape = np.broadcast_shapes(*(a.shape for a in arrs))
    except ValueError:
        desc = ", ".join(f"{n}: {x.shape}" for n, x in zip(names, arrs))
        raise ValueError(
            "Trailing dimensions of the per-step arrays cannot be broadcast "
            f"together (shapes after aligning on the time axis: {desc})."
        ) from None
    return tuple(jnp.broadcast_to(a, shape) for a in arrs), T


def _truncation(terminated, truncated):
    """``truncated``, or all-False flags shaped like ``terminated`` when it is ``None`` (experience
    that records no time-limit truncation, e.g. an ``Experience`` made without that field)."""
    if truncated is None:
        return jnp.zeros(jnp.shape(terminated), bool)
    return truncated


def _float_dtype(*arrays):
    """Floating dtype of the result: float inputs kept, ints promoted."""
    return jnp.result_type(*arrays, 0.0)


# ---------------------------------------------------------------------------
# Public functions
# ---------------------------------------------------------------------------


def compute_td_targets(rewards, discounts, next_values) -> jax.Array:
    """One-step TD targets ``rewards + discounts * next_values``.

    Args:
        rewards: rewards ``r_t``, any shape, e.g. ``(T,)``, ``(T, 1)`` or
            ``(B, 1)``.
        discounts: per-step discounts, typically
            ``gamma * (1 - terminated)``; any shape broadcastable with
            ``rewards`` and ``next_values``.
        next_values: value estimates of the next state (e.g.
            ``max_a Q(s', a)``), broadcastable with the others.

    Returns:
        ``rewards + discounts * next_values`` with the NumPy-broadcast shape
        of the three inputs. No time axis is assumed, so e.g.
        ``compute_td_targets(reward[..., None], discounts, next_q)`` with
        ``reward`` of shape ``(B,)`` and ``next_q`` of shape ``(B, 1)`` gives
        ``(B, 1)``.

    Raises:
        ValueError: if the shapes cannot be broadcast together.
    """
    shapes = {
        "rewards": np.shape(rewards),
        "discounts": np.shape(discounts),
        "next_values": np.shape(next_values),
    }
    try:
        np.broadcast_shapes(*shapes.values())
    except ValueError:
        raise ValueError(
            "rewards, discounts and next_values cannot be broadcast together: "
            + ", ".join(f"{k}: {v}" for k, v in shapes.items())
        ) from None
    return jnp.asarray(rewards) + jnp.asarray(discounts) * jnp.asarray(next_values)


def bootstrap_discounts(gamma, terminated, n_steps=None) -> jax.Array:
    """The discount of each transition's bootstrap value: ``gamma ** n_steps * (1 - terminated)``.

    A one-step transition (``n_steps=None``) discounts by ``gamma``; an n-step one (sampled by
    n-step replay: ``kitae.buffer.Experience.n_steps``) by ``gamma`` to the number of rewards its
    ``reward`` sums. Termination cuts the bootstrap; truncation does not (the real final
    observation is bootstrapped from).

    Args:
        gamma: the discount, a float or an array broadcastable with ``terminated``.
        terminated: ``(B,)`` bool or 0/1.
        n_steps: ``(B,)`` ints >= 1, or ``None`` (1).

    Returns:
        ``(B,)`` discounts, float32 (the dtype of a floating ``gamma`` array otherwise).
    """
    terminated = jnp.asarray(terminated)
    dtype = _float_dtype(jnp.asarray(gamma, jnp.float32), terminated)
    discount = jnp.asarray(gamma, dtype)
    if n_steps is not None:
        discount = discount ** jnp.asarray(n_steps, dtype)
    return discount * (1.0 - terminated.astype(dtype))


def compute_gae(
    rewards,
    values,
    next_values,
    terminated,
    truncated,
    gamma,
    lambda_,
) -> tuple[jax.Array, jax.Array]:
    """Generalized Advantage Estimation (Schulman et al., 2016).

    For each step ``t``::

        delta_t = r_t + gamma * (1 - terminated_t) * next_values_t - values_t
        A_t     = delta_t + gamma * lambda_ * (1 - done_t) * A_{t+1}
        done_t  = terminated_t or truncated_t
        A_T     = 0                               (beyond the last row)
        returns_t = A_t + values_t

    Bootstrapping (through ``next_values``) stops only at termination; the
    advantage chain is cut at both termination and truncation, so nothing
    leaks between consecutive episodes stored in the same array. The last row
    bootstraps through ``next_values[T - 1]``.

    Computed with a reverse ``jax.lax.scan`` over time.

    Args:
        rewards: ``(T, ...)`` rewards ``r_t``.
        values: ``(T, ...)`` ``V(s_t)``.
        next_values: ``(T, ...)`` ``V(s'_t)`` of the real next observation of
            step ``t`` (the final observation on truncation).
        terminated: ``(T, ...)`` bool or float, 1 where ``s'_t`` is terminal.
        truncated: ``(T, ...)`` bool or float, 1 where the episode was cut
            at step ``t`` without reaching a terminal state; ``None``: never.
        gamma: discount factor in ``[0, 1]`` (Python number or JAX scalar).
        lambda_: GAE parameter in ``[0, 1]`` (Python number or JAX scalar).
            ``lambda_=0`` gives one-step TD errors, ``lambda_=1`` Monte-Carlo
            returns minus ``values``.

    Returns:
        ``(advantages, returns)``, both of the broadcast shape ``(T, ...)`` of
        the inputs (see the module docstring for alignment on axis 0) and of
        a floating dtype.

    Raises:
        ValueError: if ``gamma`` or ``lambda_`` is a Python number outside
            ``[0, 1]`` or not a scalar, if an input has no time axis, or if
            the leading (time) dimensions or trailing dimensions disagree.
    """
    _check_unit_interval("gamma", gamma)
    _check_unit_interval("lambda_", lambda_)
    (rewards, values, next_values, terminated, truncated), _ = _time_aligned(
        rewards=rewards,
        values=values,
        next_values=next_values,
        terminated=terminated,
        truncated=_truncation(terminated, truncated),
    )
    dtype = _float_dtype(rewards, values, next_values)
    rewards, values, next_values = (x.astype(dtype) for x in (rewards, values, next_values))
    not_term = 1.0 - terminated.astype(dtype)
    done = jnp.logical_or(terminated.astype(bool), truncated.astype(bool))
    not_done = 1.0 - done.astype(dtype)
    gamma = jnp.asarray(gamma, dtype)
    lambda_ = jnp.asarray(lambda_, dtype)

    deltas = rewards + gamma * not_term * next_values - values
    chain = gamma * lambda_ * not_done

    def step(next_advantage, inputs):
        delta, c = inputs
        advantage = delta + c * next_advantage
        return advantage, advantage

    init = jnp.zeros(deltas.shape[1:], dtype)
    _, advantages = jax.lax.scan(step, init, (deltas, chain), reverse=True)
    return advantages, advantages + values


def compute_vtrace(
    rewards,
    values,
    next_values,
    terminated,
    truncated,
    log_rhos,
    gamma,
    lambda_=1.0,
    rho_bar=1.0,
    c_bar=1.0,
    pg_rho_bar=1.0,
) -> tuple[jax.Array, jax.Array]:
    """V-trace targets and policy-gradient advantages (Espeholt et al. 2018, IMPALA) for a
    trajectory collected by a behaviour policy ``mu`` and learned by ``pi``.

    With ``rho_t = pi(a_t|s_t) / mu(a_t|s_t) = exp(log_rhos_t)``, for each step ``t``::

        delta_t = min(rho_bar, rho_t) * (r_t + gamma * (1 - terminated_t) * next_values_t - values_t)
        A_t     = delta_t + gamma * (1 - done_t) * lambda_ * min(c_bar, rho_t) * A_{t+1}   (A_T = 0)
        vs_t    = values_t + A_t
        q_t     = r_t + gamma * (1 - terminated_t) * next_vs_t
        pg_t    = min(pg_rho_bar, rho_t) * (q_t - values_t)

    with ``done_t = terminated_t or truncated_t`` and ``next_vs_t = lambda_ * vs_{t+1} + (1 -
    lambda_) * values_{t+1}`` inside an episode, ``next_values_t`` where the episode ended at
    ``t`` (its real final observation's value: truncation bootstraps, like ``compute_gae``) and on
    the last row. Termination and truncation are handled as in ``compute_gae``: the bootstrap stops
    at termination only, the trace at both. With every ``rho_t = 1`` and ``lambda_ = 1``, ``vs``
    is the n-step return bootstrapped at the end of the array (``compute_gae``'s returns with
    ``lambda_ = 1``), and ``pg`` its advantage.

    Args:
        rewards, values, next_values, terminated, truncated: as ``compute_gae``'s, ``(T, ...)``.
        log_rhos: ``log pi(a_t|s_t) - log mu(a_t|s_t)``, ``(T, ...)``.
        gamma: discount factor in ``[0, 1]``.
        lambda_: trace mixing in ``[0, 1]`` (1 in the paper).
        rho_bar: the clip of the importance weights in the TD errors (``rho``-bar, > 0; 1 in the
            paper): the fixed point is the value of a policy between ``mu`` and ``pi``.
        c_bar: the clip of the trace coefficients (``c``-bar, > 0; 1 in the paper): how far
            corrections propagate.
        pg_rho_bar: the clip of the importance weights of the policy-gradient advantages (> 0).

    Returns:
        ``(vs, pg_advantages)``, the targets of the value function and the advantages of the
        policy gradient, ``(T, ...)``, with no gradient through them.

    Raises:
        ValueError: as ``compute_gae``; a clip that is not a positive number.
    """
    _check_unit_interval("gamma", gamma)
    _check_unit_interval("lambda_", lambda_)
    for name, value in (("rho_bar", rho_bar), ("c_bar", c_bar), ("pg_rho_bar", pg_rho_bar)):
        if isinstance(value, (int, float)) and not value > 0:
            raise ValueError(f"{name}={value!r} is not allowed; allowed: a number > 0")
    (rewards, values, next_values, terminated, truncated, log_rhos), _ = _time_aligned(
        rewards=rewards,
        values=values,
        next_values=next_values,
        terminated=terminated,
        truncated=_truncation(terminated, truncated),
        log_rhos=log_rhos,
    )
    dtype = _float_dtype(rewards, values, next_values, log_rhos)
    rewards, values, next_values, log_rhos = (x.astype(dtype) for x in (rewards, values, next_values, log_rhos))
    rhos = jnp.exp(log_rhos)
    not_term = 1.0 - terminated.astype(dtype)
    done = jnp.logical_or(terminated.astype(bool), truncated.astype(bool))
    not_done = 1.0 - done.astype(dtype)
    gamma = jnp.asarray(gamma, dtype)
    lambda_ = jnp.asarray(lambda_, dtype)

    deltas = jnp.minimum(rho_bar, rhos) * (rewards + gamma * not_term * next_values - values)
    chain = gamma * not_done * lambda_ * jnp.minimum(c_bar, rhos)

    def step(next_correction, inputs):
        delta, c = inputs
        correction = delta + c * next_correction
        return correction, correction

    init = jnp.zeros(deltas.shape[1:], dtype)
    _, corrections = jax.lax.scan(step, init, (deltas, chain), reverse=True)
    vs = values + corrections
    inside = lambda_ * vs[1:] + (1.0 - lambda_) * values[1:]  # the next step of the same episode
    next_vs = jnp.concatenate([jnp.where(done[:-1], next_values[:-1], inside), next_values[-1:]], axis=0)
    pg_advantages = jnp.minimum(pg_rho_bar, rhos) * (rewards + gamma * not_term * next_vs - values)
    return jax.lax.stop_gradient(vs), jax.lax.stop_gradient(pg_advantages)


def compute_n_step_returns(
    rewards,
    next_values,
    terminated,
    truncated,
    gamma,
    n: int,
) -> jax.Array:
    """n-step bootstrapped returns, truncated at episode ends.

    For each step ``t``::

        G_t = sum_{k=0}^{m-1} gamma^k r_{t+k}
              + gamma^m * (1 - terminated_{t+m-1}) * next_values_{t+m-1}

    with ``m = min(n, steps until the episode ends (counting the ending
    step), steps until the end of the array)``. The sum stops at the first
    step ``t+k`` that is terminated or truncated, and at the last row; it
    then bootstraps from that step's ``next_values`` unless that step
    terminated. ``n=1`` gives the TD target
    ``r_t + gamma * (1 - terminated_t) * next_values_t``; ``n >= T`` gives the
    discounted return up to the episode end (or the array end), bootstrapped
    as above.

    Implemented through the recursion::

        G1_t       = r_t + gamma * (1 - terminated_t) * next_values_t
        G^(h+1)_t  = G1_t                      if done_t or t == T - 1
                     r_t + gamma * G^(h)_{t+1} otherwise

    run ``min(n, T) - 1`` times inside a ``jax.lax.fori_loop`` (each
    iteration is vectorised over time), so the cost is ``O(min(n, T) * T)``.

    Args:
        rewards: ``(T, ...)`` rewards.
        next_values: ``(T, ...)`` value of the real next observation of each
            step (the final observation on truncation).
        terminated: ``(T, ...)`` bool or float, 1 where the episode
            terminated at this step.
        truncated: ``(T, ...)`` bool or float, 1 where the episode was cut
            at this step; ``None``: never.
        gamma: discount factor in ``[0, 1]`` (Python number or JAX scalar).
        n: number of steps, a static Python ``int >= 1``. Under ``jax.jit``
            pass it via ``static_argnames=("n",)`` or close over it.

    Returns:
        ``(T, ...)`` floating array of n-step returns (the broadcast shape of
        the inputs, aligned on axis 0).

    Raises:
        ValueError: if ``n`` is not a Python int ``>= 1``, if ``gamma`` is a
            Python number outside ``[0, 1]``, or on mismatched shapes.
    """
    if isinstance(n, bool) or not isinstance(n, numbers.Integral):
        raise ValueError(f"n must be a static Python int >= 1, got n={n!r} of type {type(n).__name__}.")
    n = int(n)
    if n < 1:
        raise ValueError(f"n must be a Python int >= 1, got n={n}.")
    _check_unit_interval("gamma", gamma)
    (rewards, next_values, terminated, truncated), T = _time_aligned(
        rewards=rewards,
        next_values=next_values,
        terminated=terminated,
        truncated=_truncation(terminated, truncated),
    )
    dtype = _float_dtype(rewards, next_values)
    rewards = rewards.astype(dtype)
    next_values = next_values.astype(dtype)
    gamma = jnp.asarray(gamma, dtype)
    not_term = 1.0 - terminated.astype(dtype)

    g1 = rewards + gamma * not_term * next_values
    n_iter = min(n, T) - 1
    if n_iter <= 0:
        return g1

    done = jnp.logical_or(terminated.astype(bool), truncated.astype(bool))
    is_last = (jnp.arange(T) == T - 1).reshape((T,) + (1,) * (rewards.ndim - 1))
    cut = jnp.logical_or(done, is_last)
    pad = jnp.zeros((1,) + rewards.shape[1:], dtype)

    def body(_, g):
        g_next = jnp.concatenate([g[1:], pad], axis=0)
        return jnp.where(cut, g1, rewards + gamma * g_next)

    return jax.lax.fori_loop(0, n_iter, body, g1)


def compute_discounted_returns(
    rewards,
    terminated,
    truncated,
    gamma,
    bootstrap_value=0.0,
) -> jax.Array:
    """Discounted reward-to-go within each episode.

    For each step ``t``::

        G_t = r_t + gamma * (1 - done_t) * G_{t+1},   done_t = terminated_t or truncated_t
        G_T = bootstrap_value                          (beyond the last row)

    No value estimates are used for episodes that end inside the array
    (truncated episodes are *not* bootstrapped here; use
    :func:`compute_n_step_returns` with a large ``n`` for that). The last row
    bootstraps from ``bootstrap_value`` unless it terminated or was truncated.
    Computed with a reverse ``jax.lax.scan``.

    Args:
        rewards: ``(T, ...)`` rewards.
        terminated: ``(T, ...)`` bool or float episode-termination flags.
        truncated: ``(T, ...)`` bool or float episode-truncation flags;
            ``None``: never truncated.
        gamma: discount factor in ``[0, 1]`` (Python number or JAX scalar).
        bootstrap_value: value after the last row, a scalar or an array of
            the trailing shape ``(...)``; defaults to 0.

    Returns:
        ``(T, ...)`` floating array of discounted returns.

    Raises:
        ValueError: if ``gamma`` is a Python number outside ``[0, 1]``, on
            mismatched shapes, or if ``bootstrap_value`` does not broadcast
            to the trailing shape.
    """
    _check_unit_interval("gamma", gamma)
    (rewards, terminated, truncated), _ = _time_aligned(
        rewards=rewards, terminated=terminated, truncated=_truncation(terminated, truncated)
    )
    dtype = _float_dtype(rewards)
    rewards = rewards.astype(dtype)
    gamma = jnp.asarray(gamma, dtype)
    done = jnp.logical_or(terminated.astype(bool), truncated.astype(bool))
    chain = gamma * (1.0 - done.astype(dtype))
    trailing = rewards.shape[1:]
    bootstrap_value = jnp.asarray(bootstrap_value, dtype)
    try:
        init = jnp.broadcast_to(bootstrap_value, trailing)
    except ValueError:
        raise ValueError(
            f"bootstrap_value of shape {bootstrap_value.shape} cannot be "
            f"broadcast to the trailing shape {trailing} of rewards."
        ) from None

    def step(next_return, inputs):
        r, c = inputs
        g = r + c * next_return
        return g, g

    _, returns = jax.lax.scan(step, init, (rewards, chain), reverse=True)
    return returns
