"""Probability distributions used by kitae's policies.

Written by hand on purpose: ``distrax`` pulls in ``tfp-nightly``, which is slow to import and warns
about deprecated jax calls, and kitae needs only these few distributions.

Every distribution is a frozen dataclass of arrays registered as a JAX pytree
(``jax.tree_util.register_dataclass``), so it can be returned from / passed through ``jax.jit``,
``jax.vmap`` and ``jax.lax.scan``. Each one has the same interface:

* ``sample(key)`` -> a sample of shape ``batch_shape + event_shape``;
* ``log_prob(x)`` -> log-density / log-mass of ``x``, shape ``batch_shape``;
* ``sample_and_log_prob(key)`` -> ``(sample, log_prob)``;
* ``entropy()`` -> shape ``batch_shape``;
* ``mode()`` -> the most likely value, shape ``batch_shape + event_shape``.

Batch shapes follow the parameters: a ``Categorical`` with logits ``(B, N)`` has batch shape
``(B,)`` and scalar events; a ``DiagNormal`` with loc ``(B, D)`` has batch shape ``(B,)`` and events
of shape ``(D,)`` (the last axis is the event axis).

Construction does no computation (the pytree machinery rebuilds instances from leaves that may be
tracers or placeholders), so derived quantities such as masked logits are computed lazily.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any, TypeVar, dataclass_transform, overload

import jax
import jax.numpy as jnp

from kitae.action_masks import allowed_actions

_LOG_2 = math.log(2.0)
_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)


_T = TypeVar("_T")


@overload
def _pytree_dataclass(cls: type[_T], *, meta_fields: tuple[str, ...] = ()) -> type[_T]: ...


@overload
def _pytree_dataclass(cls: None = None, *, meta_fields: tuple[str, ...] = ()) -> Callable[[type[_T]], type[_T]]: ...


@dataclass_transform(frozen_default=True, eq_default=False)
def _pytree_dataclass(cls: Any = None, *, meta_fields: tuple[str, ...] = ()) -> Any:
    """Turns ``cls`` into a frozen dataclass registered as a pytree (fields in ``meta_fields`` static)."""

    def wrap(c: Any) -> Any:
        c = dataclasses.dataclass(frozen=True, eq=False)(c)
        names = [f.name for f in dataclasses.fields(c)]
        data = [n for n in names if n not in meta_fields]
        return jax.tree_util.register_dataclass(c, data_fields=data, meta_fields=list(meta_fields))

    return wrap if cls is None else wrap(cls)


def _very_negative(dtype) -> float:
    """A finite, very negative logit for ``dtype``: half of its most negative value (so that
    subtracting a log-normaliser cannot overflow to ``-inf``)."""
    return float(jnp.finfo(dtype).min) / 2.0


def _float(x) -> jax.Array:
    x = jnp.asarray(x)
    return x if jnp.issubdtype(x.dtype, jnp.floating) else x.astype(jnp.float32)


def _entropy_from_log_probs(log_probs: jax.Array) -> jax.Array:
    """``-sum(p * log p)`` over the last axis, with ``0 * log 0 = 0``."""
    probs = jnp.exp(log_probs)
    return -jnp.sum(jnp.where(probs > 0, probs * log_probs, 0.0), axis=-1)


def _gather_last(values: jax.Array, index: jax.Array) -> jax.Array:
    """``values[..., index]`` elementwise: values ``(..., N)``, index ``(...)`` -> ``(...)``."""
    index = jnp.asarray(index).astype(jnp.int32)
    shape = jnp.broadcast_shapes(values.shape[:-1], index.shape)
    values = jnp.broadcast_to(values, shape + values.shape[-1:])
    index = jnp.broadcast_to(index, shape)
    return jnp.take_along_axis(values, index[..., None], axis=-1)[..., 0]


# --------------------------------------------------------------------------------------------------
# Categorical
# --------------------------------------------------------------------------------------------------


@_pytree_dataclass
class Categorical:
    """Categorical distribution over ``N`` classes, optionally masked.

    Attributes:
        logits: unnormalised log-probabilities, shape ``(..., N)``; batch shape ``(...)``.
        mask: optional boolean array broadcastable to ``logits``; ``True`` marks an allowed class.
            Masked-out classes get a very negative (finite) logit, so they have probability zero,
            are never sampled, and are never the mode. ``None`` means every class is allowed.
            A row that allows no class at all is treated as allowing every class
            (``kitae.action_masks.allowed_actions``), so it never yields NaN.

    Samples and ``mode()`` are ``int32`` arrays of shape ``(...)``.
    """

    logits: jax.Array
    mask: jax.Array | None = None

    @property
    def masked_logits(self) -> jax.Array:
        """Logits with masked-out classes set to a very negative value, shape ``(..., N)``."""
        logits = _float(self.logits)
        if self.mask is None:
            return logits
        return jnp.where(allowed_actions(self.mask), logits, _very_negative(logits.dtype))

    @property
    def log_probs(self) -> jax.Array:
        """Normalised log-probabilities of every class, shape ``(..., N)``."""
        return jax.nn.log_softmax(self.masked_logits, axis=-1)

    @property
    def probs(self) -> jax.Array:
        """Probabilities of every class, shape ``(..., N)``."""
        return jax.nn.softmax(self.masked_logits, axis=-1)

    @property
    def num_classes(self) -> int:
        """``N``, the size of the last axis of ``logits``."""
        return self.logits.shape[-1]

    @property
    def batch_shape(self) -> tuple[int, ...]:
        """``logits.shape[:-1]`` (broadcast with ``mask``)."""
        shape = self.logits.shape
        if self.mask is not None:
            shape = jnp.broadcast_shapes(shape, jnp.shape(self.mask))
        return shape[:-1]

    def sample(self, key: jax.Array) -> jax.Array:
        """Draws class indices, ``int32`` of shape ``batch_shape``."""
        logits = jnp.broadcast_to(self.masked_logits, self.batch_shape + (self.num_classes,))
        return jax.random.categorical(key, logits, axis=-1).astype(jnp.int32)

    def log_prob(self, x: jax.Array) -> jax.Array:
        """Log-probability of integer classes ``x`` (shape broadcastable to ``batch_shape``)."""
        return _gather_last(self.log_probs, x)

    def sample_and_log_prob(self, key: jax.Array) -> tuple[jax.Array, jax.Array]:
        """``(sample, log_prob(sample))``, both of shape ``batch_shape``."""
        x = self.sample(key)
        return x, self.log_prob(x)

    def entropy(self) -> jax.Array:
        """Shannon entropy in nats, shape ``batch_shape`` (masked classes contribute 0)."""
        return _entropy_from_log_probs(self.log_probs)

    def mode(self) -> jax.Array:
        """Most likely allowed class, ``int32`` of shape ``batch_shape``."""
        logits = jnp.broadcast_to(self.masked_logits, self.batch_shape + (self.num_classes,))
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)


@_pytree_dataclass
class MultiCategorical:
    """``K`` independent categoricals, one per component of a ``MultiDiscrete(nvec)`` action
    (``MultiBinary(K)``: ``nvec = [2] * K``), component ``k`` over ``nvec[k]`` classes.

    Attributes:
        logits: ``(..., K, N)`` with ``N = max(nvec)``; batch shape ``(...)``.
        valid: bool ``(K, N)``: class ``j`` exists in component ``k`` (``j < nvec[k]``); the
            others have probability zero (``Categorical``'s mask).

    Samples and ``mode()`` are ``int32`` of shape ``(..., K)``; ``log_prob`` and ``entropy`` sum
    over the components (independent), shape ``(...)``.
    """

    logits: jax.Array
    valid: jax.Array

    def components(self) -> Categorical:
        """The ``K`` categoricals as one ``Categorical`` of batch shape ``(..., K)``."""
        return Categorical(self.logits, self.valid)

    def sample(self, key: jax.Array) -> jax.Array:
        """Draws one class per component, ``int32`` of shape ``(..., K)``."""
        return self.components().sample(key)

    def log_prob(self, x: jax.Array) -> jax.Array:
        """Log-probability of ``x`` (``(..., K)`` integers): the sum over components, ``(...)``."""
        return jnp.sum(self.components().log_prob(x), axis=-1)

    def sample_and_log_prob(self, key: jax.Array) -> tuple[jax.Array, jax.Array]:
        """``(sample (..., K), log_prob(sample) (...))``."""
        x = self.sample(key)
        return x, self.log_prob(x)

    def entropy(self) -> jax.Array:
        """The sum of the components' entropies, in nats, shape ``(...)``."""
        return jnp.sum(self.components().entropy(), axis=-1)

    def mode(self) -> jax.Array:
        """The most likely class of every component, ``int32`` of shape ``(..., K)``."""
        return self.components().mode()


def multi_categorical_valid(nvec: tuple[int, ...]) -> jax.Array:
    """``MultiCategorical.valid`` for components of ``nvec`` classes: bool ``(K, max(nvec))``."""
    return jnp.arange(max(nvec))[None, :] < jnp.asarray(nvec)[:, None]


# --------------------------------------------------------------------------------------------------
# Diagonal Gaussian
# --------------------------------------------------------------------------------------------------


def _normal_log_prob(x: jax.Array, loc: jax.Array, scale: jax.Array) -> jax.Array:
    """Elementwise ``log N(x; loc, scale^2)`` (no reduction)."""
    z = (x - loc) / scale
    return -0.5 * jnp.square(z) - jnp.log(scale) - _HALF_LOG_2PI


@_pytree_dataclass
class DiagNormal:
    """Gaussian with diagonal covariance over the last axis.

    Attributes:
        loc: means, shape ``(..., D)``.
        scale: standard deviations (> 0), broadcastable with ``loc``.

    The event shape is ``(D,)``; the batch shape is ``broadcast(loc, scale).shape[:-1]``.
    ``log_prob`` and ``entropy`` sum over the event axis.
    """

    loc: jax.Array
    scale: jax.Array

    @property
    def shape(self) -> tuple[int, ...]:
        """``batch_shape + event_shape``, the shape of a sample."""
        return jnp.broadcast_shapes(jnp.shape(self.loc), jnp.shape(self.scale))

    @property
    def batch_shape(self) -> tuple[int, ...]:
        """Shape of ``log_prob`` and ``entropy``: ``shape[:-1]``."""
        return self.shape[:-1]

    @property
    def event_shape(self) -> tuple[int, ...]:
        """``(D,)``."""
        return self.shape[-1:]

    def sample(self, key: jax.Array) -> jax.Array:
        """``loc + scale * eps`` with ``eps ~ N(0, I)``, shape ``batch_shape + (D,)``."""
        loc = _float(self.loc)
        eps = jax.random.normal(key, self.shape, dtype=loc.dtype)
        return loc + self.scale * eps

    def log_prob(self, x: jax.Array) -> jax.Array:
        """Log-density of ``x`` (``(..., D)``), summed over the last axis -> ``batch_shape``."""
        return jnp.sum(_normal_log_prob(x, self.loc, self.scale), axis=-1)

    def sample_and_log_prob(self, key: jax.Array) -> tuple[jax.Array, jax.Array]:
        """``(sample (..., D), log_prob (...))``."""
        x = self.sample(key)
        return x, self.log_prob(x)

    def entropy(self) -> jax.Array:
        """``sum_d (0.5 + 0.5 log(2 pi) + log scale_d)``, shape ``batch_shape``."""
        ent = 0.5 + _HALF_LOG_2PI + jnp.log(jnp.broadcast_to(self.scale, self.shape))
        return jnp.sum(ent, axis=-1)

    def mode(self) -> jax.Array:
        """The mean ``loc``, broadcast to ``batch_shape + (D,)``."""
        return jnp.broadcast_to(self.loc, self.shape)


# --------------------------------------------------------------------------------------------------
# Tanh-squashed diagonal Gaussian
# --------------------------------------------------------------------------------------------------


def _log_det_tanh(u: jax.Array) -> jax.Array:
    """Elementwise ``log(1 - tanh(u)^2) = 2 * (log 2 - u - softplus(-2u))``, numerically stable."""
    return 2.0 * (_LOG_2 - u - jax.nn.softplus(-2.0 * u))


@_pytree_dataclass
class TanhNormal:
    """``x = tanh(u)`` with ``u ~ DiagNormal(loc, scale)``: actions in ``(-1, 1)^D``.

    Attributes:
        loc: pre-tanh means, shape ``(..., D)``.
        scale: pre-tanh standard deviations (> 0), broadcastable with ``loc``.

    ``log p(x) = log N(u) - sum_d log(1 - tanh(u_d)^2)`` with ``u = atanh(x)``.
    Prefer ``sample_and_log_prob``: it keeps the pre-tanh sample ``u`` and is exact even where
    ``tanh(u)`` rounds to ±1; ``log_prob(x)`` must invert the tanh and clips ``x`` to
    ``(-1 + eps, 1 - eps)`` first.

    There is no closed-form entropy: ``entropy()`` returns the entropy of the *base* (pre-tanh)
    Gaussian, which is an upper bound of the true entropy, not the entropy itself. Use
    ``-log_prob`` of samples for a Monte-Carlo estimate (as SAC does).
    """

    loc: jax.Array
    scale: jax.Array

    @property
    def base(self) -> DiagNormal:
        """The pre-tanh Gaussian ``DiagNormal(loc, scale)``."""
        return DiagNormal(self.loc, self.scale)

    @property
    def batch_shape(self) -> tuple[int, ...]:
        """Shape of ``log_prob``: ``broadcast(loc, scale).shape[:-1]``."""
        return self.base.batch_shape

    @property
    def event_shape(self) -> tuple[int, ...]:
        """``(D,)``."""
        return self.base.event_shape

    def _log_prob_pre_tanh(self, u: jax.Array) -> jax.Array:
        return jnp.sum(_normal_log_prob(u, self.loc, self.scale) - _log_det_tanh(u), axis=-1)

    def sample(self, key: jax.Array) -> jax.Array:
        """``tanh(u)`` with ``u`` drawn from the base Gaussian, shape ``batch_shape + (D,)``."""
        return jnp.tanh(self.base.sample(key))

    def sample_and_log_prob(self, key: jax.Array) -> tuple[jax.Array, jax.Array]:
        """``(tanh(u) (..., D), log_prob (...))``, the log-prob computed from the pre-tanh ``u``."""
        u = self.base.sample(key)
        return jnp.tanh(u), self._log_prob_pre_tanh(u)

    def log_prob(self, x: jax.Array, eps: float = 1e-6) -> jax.Array:
        """Log-density of actions ``x`` in ``(-1, 1)`` (``(..., D)``) -> ``batch_shape``.

        ``x`` is clipped to ``(-1 + eps, 1 - eps)`` before ``atanh``; results near the boundary
        are therefore approximate. ``eps`` must be representable next to 1 in ``x``'s dtype.
        """
        x = _float(x)
        u = jnp.arctanh(jnp.clip(x, -1.0 + eps, 1.0 - eps))
        return self._log_prob_pre_tanh(u)

    def entropy(self) -> jax.Array:
        """Entropy of the base (pre-tanh) Gaussian, shape ``batch_shape`` — NOT the entropy of
        the squashed distribution, which has no closed form (see class docstring)."""
        return self.base.entropy()

    def mode(self) -> jax.Array:
        """``tanh(loc)``, shape ``batch_shape + (D,)`` (the image of the base mode)."""
        return jnp.tanh(self.base.mode())


# --------------------------------------------------------------------------------------------------
# Epsilon-greedy
# --------------------------------------------------------------------------------------------------


@_pytree_dataclass
class EpsilonGreedy:
    """Epsilon-greedy distribution over the last axis of ``preferences``.

    With probability ``1 - epsilon`` the greedy class ``argmax(preferences)`` is chosen, otherwise
    a class uniformly at random, so ``probs = epsilon / N + (1 - epsilon) * onehot(argmax)``.

    With a ``mask``, both the greedy class and the random class are drawn among the allowed
    classes only: ``probs = epsilon / N_allowed * mask + (1 - epsilon) * onehot(masked argmax)``.

    Attributes:
        preferences: scores (e.g. Q-values), shape ``(..., N)``; batch shape ``(...)``.
        epsilon: exploration rate in ``[0, 1]``, a scalar or an array broadcastable to ``(...)``.
        mask: optional boolean array broadcastable to ``preferences``, ``True`` = allowed; a row
            allowing nothing allows everything (``kitae.action_masks.allowed_actions``).
            ``None``: every class is allowed.

    Samples and ``mode()`` are ``int32`` arrays of shape ``(...)``.
    """

    preferences: jax.Array
    epsilon: jax.Array | float
    mask: jax.Array | None = None

    @property
    def num_classes(self) -> int:
        """``N``."""
        return self.preferences.shape[-1]

    @property
    def batch_shape(self) -> tuple[int, ...]:
        """``broadcast(preferences.shape[:-1], epsilon.shape)``."""
        return jnp.broadcast_shapes(self.preferences.shape[:-1], jnp.shape(self.epsilon))

    def _allowed(self) -> jax.Array | None:
        """The allowed classes ``(..., N)`` as booleans, or ``None`` without a mask."""
        if self.mask is None:
            return None
        shape = jnp.broadcast_shapes(self.batch_shape, jnp.shape(self.mask)[:-1]) + (self.num_classes,)
        return jnp.broadcast_to(allowed_actions(self.mask), shape)

    def _greedy(self) -> jax.Array:
        preferences = self.preferences
        allowed = self._allowed()
        if allowed is not None:
            preferences = jnp.where(allowed, preferences, jnp.finfo(_float(preferences).dtype).min)
        greedy = jnp.argmax(preferences, axis=-1).astype(jnp.int32)
        return jnp.broadcast_to(greedy, self.batch_shape)

    @property
    def probs(self) -> jax.Array:
        """Class probabilities, shape ``batch_shape + (N,)``."""
        n = self.num_classes
        eps = _float(self.epsilon)[..., None]
        onehot = jax.nn.one_hot(self._greedy(), n, dtype=eps.dtype)
        allowed = self._allowed()
        if allowed is None:
            return eps / n + (1.0 - eps) * onehot
        uniform = allowed.astype(eps.dtype) / jnp.sum(allowed, axis=-1, keepdims=True).astype(eps.dtype)
        return eps * uniform + (1.0 - eps) * onehot

    def sample(self, key: jax.Array) -> jax.Array:
        """Greedy class with prob ``1 - epsilon``, else uniform: ``int32`` of shape ``batch_shape``."""
        explore_key, action_key = jax.random.split(key)
        shape = self.batch_shape
        explore = jax.random.uniform(explore_key, shape) < self.epsilon
        allowed = self._allowed()
        if allowed is None:
            random_action = jax.random.randint(action_key, shape, 0, self.num_classes, dtype=jnp.int32)
        else:  # uniform among the allowed classes
            logits = jnp.where(allowed, 0.0, -jnp.inf)
            random_action = jax.random.categorical(action_key, logits, axis=-1).astype(jnp.int32)
        return jnp.where(explore, random_action, self._greedy())

    def log_prob(self, x: jax.Array) -> jax.Array:
        """``log probs[..., x]`` for integer classes ``x`` -> ``batch_shape``
        (``-inf`` for non-greedy classes when ``epsilon == 0``, and for masked-out classes)."""
        return _gather_last(jnp.log(self.probs), x)

    def sample_and_log_prob(self, key: jax.Array) -> tuple[jax.Array, jax.Array]:
        """``(sample, log_prob(sample))``, both of shape ``batch_shape``."""
        x = self.sample(key)
        return x, self.log_prob(x)

    def entropy(self) -> jax.Array:
        """``-sum p log p`` over classes, shape ``batch_shape``."""
        return _entropy_from_log_probs(jnp.log(self.probs))

    def mode(self) -> jax.Array:
        """The greedy (allowed) class ``argmax(preferences)``, ``int32`` of shape ``batch_shape``."""
        return self._greedy()


# --------------------------------------------------------------------------------------------------
# Deterministic
# --------------------------------------------------------------------------------------------------


@_pytree_dataclass(meta_fields=("event_ndim",))
class Deterministic:
    """Point mass at ``value``: a helper that lets deterministic policies share the interface.

    Attributes:
        value: the point, shape ``batch_shape + event_shape``.
        event_ndim: number of trailing axes of ``value`` forming one event (static; default 1, i.e.
            ``value`` is ``(..., D)`` like a continuous action).

    ``log_prob`` returns zeros of shape ``batch_shape`` whatever ``x`` is (a convention: the
    density is not defined), and ``entropy`` returns zeros too.
    """

    value: jax.Array
    event_ndim: int = 1

    @property
    def batch_shape(self) -> tuple[int, ...]:
        """``value.shape[:value.ndim - event_ndim]``."""
        shape = jnp.shape(self.value)
        return shape[: len(shape) - self.event_ndim]

    def sample(self, key: jax.Array) -> jax.Array:
        """Returns ``value``, shape ``batch_shape + event_shape`` (``key`` is ignored)."""
        del key
        return self.value

    def log_prob(self, x: jax.Array) -> jax.Array:
        """Zeros of shape ``batch_shape`` (``x`` is ignored)."""
        del x
        return jnp.zeros(self.batch_shape, _float(self.value).dtype)

    def sample_and_log_prob(self, key: jax.Array) -> tuple[jax.Array, jax.Array]:
        """``(value, zeros(batch_shape))``: shapes ``batch_shape + event_shape`` and ``batch_shape``."""
        return self.sample(key), self.log_prob(self.value)

    def entropy(self) -> jax.Array:
        """Zeros of shape ``batch_shape``."""
        return jnp.zeros(self.batch_shape, _float(self.value).dtype)

    def mode(self) -> jax.Array:
        """Returns ``value``, shape ``batch_shape + event_shape``."""
        return self.value


__all__ = [
    "Categorical",
    "MultiCategorical",
    "multi_categorical_valid",
    "DiagNormal",
    "TanhNormal",
    "EpsilonGreedy",
    "Deterministic",
]
