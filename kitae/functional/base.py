"""The stateless agent API of seed 002: ``BaseAgent``, ``OptimState`` and the network adapters.

Why this module is long: the base class, the collection agents' base and the network adapters
(Haiku, Flax, ``make_actor_critic``) are one contract, each documented with the checks it makes;
split, a reader would follow one call across three files.

A functional agent is made once from a network creator, an environment (for its spaces) and a
learning rate; after that it holds nothing that changes. Everything that does change is passed in
and handed back: the parameters (``init_params``), the policy state (``init_policy``: what acting
carries, such as a step count) and the optimizer state (``init_optimizer``). So ``predict`` and
``update`` are pure functions of their arguments: they work under ``jax.jit`` and ``jax.vmap``
(many agents in one call), and a user's own loop decides everything else.

Each algorithm (``kitae.functional.DQN``, ``PPO``, ``SAC``, ``TD3``) is a thin layer over the
collection's factories (``kitae.algos.collections``): the same explore, processing and
``compute_gradients`` / ``apply_gradients`` functions the executors run, so there is one
implementation of each algorithm with two faces.

Networks come from any JAX library, as a creator ``network(action_space) -> net``:

- a Haiku ``hk.Transformed`` (``hk.transform(f)`` or ``hk.without_apply_rng(hk.transform(f))``),
  applied without an rng (the network must be deterministic);
- a Flax ``flax.linen.Module`` (``module.init`` / ``module.apply``).

``rng`` arguments take a JAX PRNG key or a Haiku ``hk.PRNGSequence`` (its next key is used).
"""

from __future__ import annotations

import abc
import functools
import inspect
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import flax.linen as nn
import gymnasium as gym
import haiku as hk
import jax
import jax.numpy as jnp
import optax

import kitae.config as cfg
from kitae.compile_options import with_one_blas_thread
from kitae.envs.spaces import check_observation
from kitae.functional.checks import (
    check_action_values,
    check_evaluation,
    check_learning_rate,
    off_policy_experience,
    shape_text,
    update_key,
)
from kitae.modules.optimizer import optimizer_factory

__all__ = [
    "BaseAgent",
    "CollectionAgent",
    "OptimState",
    "Network",
    "make_network",
    "as_key",
    "env_spaces",
]


class Network(NamedTuple):
    """A network as two pure functions, whatever library made it.

    Attributes:
        init: ``init(key, *inputs) -> params`` (inputs with a batch axis ``(B, ...)``).
        apply: ``apply(params, *inputs) -> outputs`` (``(B, ...)`` leading).
    """

    init: Callable[..., Any]
    apply: Callable[..., Any]


NETWORKS_ALLOWED = (
    "a Haiku hk.Transformed (hk.transform(f) or hk.without_apply_rng(hk.transform(f))) or a flax.linen.Module"
)


def adapt_network(net: Any, what: str = "network(action_space)") -> Network:
    """A Haiku ``hk.Transformed`` or a Flax ``linen.Module`` as a ``Network``.

    Raises:
        TypeError: for anything else (a Haiku ``TransformedWithState`` included: network state is
            not supported), naming what is accepted.
    """
    if isinstance(net, hk.Transformed):
        if "rng" not in inspect.signature(net.apply).parameters:  # hk.without_apply_rng(...)
            return Network(net.init, net.apply)

        def apply_haiku(params: Any, *inputs: Any) -> Any:
            return net.apply(params, None, *inputs)

        return Network(net.init, apply_haiku)
    if isinstance(net, nn.Module):
        return Network(net.init, net.apply)
    raise TypeError(f"{what} returned {type(net).__name__}, which is not allowed; allowed: {NETWORKS_ALLOWED}")


def _check_creator(creator: Any, returns: str) -> None:
    """Refuses anything but a creator, a network itself included: a Flax module is callable, but
    calling it with the action space would fail inside Flax."""
    if isinstance(creator, nn.Module):
        raise TypeError(
            f"network={type(creator).__name__}(...), a Flax module, is not allowed; allowed: a callable "
            f"network(action_space) returning {returns} (pass the module through a creator: "
            "lambda action_space: module)"
        )
    if not callable(creator):
        raise TypeError(
            f"network={creator!r} is not allowed; allowed: a callable network(action_space) returning {returns}"
        )


def make_network(creator: Any, action_space: gym.Space) -> Network:
    """Calls the network creator with the action space and adapts what it returns.

    Args:
        creator: ``creator(action_space) -> net``, ``net`` a Haiku ``hk.Transformed`` or a Flax
            ``flax.linen.Module``.
        action_space: the environment's (single) action space.

    Returns:
        The ``Network``.

    Raises:
        TypeError: if ``creator`` is not callable, or returns anything else (a Haiku
            ``TransformedWithState`` included: network state is not supported).
    """
    _check_creator(creator, NETWORKS_ALLOWED)
    return adapt_network(creator(action_space))


def make_actor_critic(creator: Any, action_space: gym.Space) -> tuple[Network, Network]:
    """For actor-critic agents (SAC, TD3): ``creator(action_space) -> (actor, critic)``, each a
    Haiku ``hk.Transformed`` or a Flax module; ``actor.apply(params, obs)``,
    ``critic.apply(params, obs, action)``.

    Raises:
        TypeError: if ``creator`` is not callable or does not return such a pair.
    """
    returns = f"a pair (actor, critic), each {NETWORKS_ALLOWED}"
    _check_creator(creator, returns)
    nets = creator(action_space)
    if isinstance(nets, hk.Transformed) or not (isinstance(nets, tuple) and len(nets) == 2):  # Transformed: a pair too
        raise TypeError(
            f"network(action_space) returned {type(nets).__name__}, which is not allowed; allowed: {returns}"
        )
    return adapt_network(nets[0], "network(action_space)[0] (the actor)"), adapt_network(
        nets[1], "network(action_space)[1] (the critic)"
    )


def critic_ensemble(critic: Network, copies: int) -> Network:
    """``copies`` independently initialised copies of a critic, applied together.

    ``init(key, obs, action)``: one parameter set (``copies == 1``) or ``copies`` stacked ones (a
    ``jax.vmap`` of ``critic.init`` over ``split(key, copies)``). ``apply(params, obs, action) ->
    (n, B)``: each copy's Q-values ``(B,)`` or ``(B, 1)``, stacked; a copy that is itself an
    ensemble ``(k, B)`` (or ``(k, B, 1)``) adds its ``k`` rows. ``B`` is read from ``action``
    ``(B, d)``; a copy that returns anything else raises ``TypeError`` (while traced) naming the
    shape found.
    """

    def rows(params: Any, obs: Any, action: Any) -> jax.Array:
        q = critic.apply(params, obs, action)
        batch = jnp.shape(action)[0]
        shape = getattr(q, "shape", None)
        if shape == (batch,):
            return q[None]
        if shape == (batch, 1):
            return q[None, :, 0]
        if isinstance(shape, tuple) and len(shape) == 2 and shape[1] == batch:  # an ensemble (k, B)
            return q
        if isinstance(shape, tuple) and len(shape) == 3 and shape[1:] == (batch, 1):  # an ensemble (k, B, 1)
            return q[..., 0]
        raise TypeError(
            f"the critic returned {shape_text(q)} for a batch of B={batch} actions, which is not allowed; "
            f"required: Q-values of shape ({batch},) or ({batch}, 1), that is (B,) or (B, 1), or (k, {batch}) or "
            f"(k, {batch}, 1) for an ensemble of k critics"
        )

    if copies == 1:
        return Network(critic.init, rows)

    def init(key: jax.Array, obs: Any, action: Any) -> Any:
        return jax.vmap(lambda k: critic.init(k, obs, action))(jax.random.split(key, copies))

    def apply(params: Any, obs: Any, action: Any) -> jax.Array:
        q = jax.vmap(lambda p: rows(p, obs, action))(params)  # (copies, k, B)
        return q.reshape(-1, q.shape[-1])

    return Network(init, apply)


def as_key(rng: Any) -> jax.Array:
    """The PRNG key to use from ``rng``: a JAX key as is, a Haiku ``hk.PRNGSequence``'s next key.

    Accepted JAX keys: a typed key array (``jax.random.key``) or a raw uint32 key, ``(2,)`` (a
    uint32 array whose last axis is 2, ``(..., 2)``, is returned as is too); the result has
    ``rng``'s shape, or ``(2,)`` from a sequence.

    Raises:
        TypeError: for anything else (a float array of two numbers is not a key).
    """
    if isinstance(rng, hk.PRNGSequence):
        return next(rng)
    if isinstance(rng, jax.Array) and (
        jax.dtypes.issubdtype(rng.dtype, jax.dtypes.prng_key) or (rng.dtype == jnp.uint32 and rng.shape[-1:] == (2,))
    ):
        return rng
    raise TypeError(f"rng={rng!r} is not allowed; allowed: a JAX PRNG key or a haiku.PRNGSequence")


def env_spaces(env: Any) -> tuple[gym.Space, gym.Space]:
    """``(observation_space, action_space)`` of one environment: a vector environment's
    ``single_*`` spaces, else the environment's own.

    Raises:
        TypeError: if ``env`` has no Gymnasium spaces.
    """
    observation_space = getattr(env, "single_observation_space", None) or getattr(env, "observation_space", None)
    action_space = getattr(env, "single_action_space", None) or getattr(env, "action_space", None)
    if not isinstance(observation_space, gym.Space) or not isinstance(action_space, gym.Space):
        raise TypeError(
            f"env={env!r} is not allowed; allowed: a Gymnasium environment or vector environment (with spaces)"
        )
    return observation_space, action_space


class BaseAgent(abc.ABC):
    """A stateless agent (seed 002): pure functions over explicit parameters, policy and
    optimizer state.

    To write your own agent, subclass it and define the seed's five methods (docs/functional.md,
    "An agent of your own"): ``init_params(rng)``, ``init_policy(rng)``,
    ``init_optimizer(params, rng)``, ``predict(params, policy_state, obs, key, evaluation)`` and
    ``update(params, optimizer_state, data)``. ``jit()`` then compiles your ``predict``
    (``evaluation`` static) and ``update``. The constructor gives ``self.network`` (a ``Network``:
    ``init(key, *inputs)``, ``apply(params, *inputs)``, whatever library made it),
    ``self.observation_space``, ``self.action_space`` and ``self.learning_rate``.

    Args:
        network: ``network(action_space) -> net``, a Haiku ``hk.Transformed`` or a Flax
            ``flax.linen.Module`` (``make_network``).
        env: a Gymnasium environment or vector environment, read for its spaces only.
        learning_rate: a float > 0 or an optax schedule ``count -> rate``.

    Raises:
        TypeError: for a network creator or environment that is not allowed.
        ValueError: for a learning rate that is not allowed, or an action space the algorithm
            cannot handle (subclasses).
    """

    class OptimState(NamedTuple):
        """The optimizer state an agent's ``update`` takes and returns.

        Attributes:
            count: gradient steps so far, an int32 scalar (what periodic rules such as DQN's target
                update count).
            opt_state: the optax optimizer state.
        """

        count: jax.Array  # type: ignore[assignment]  # the seed's field name shadows tuple.count
        opt_state: Any

    def __init_subclass__(cls, **kwargs: Any) -> None:
        # Each agent's init_params (the built-in ones and a user's subclass) runs with OpenBLAS on
        # one thread, as the executors' starting states do: an orthogonal initialiser's QR goes to
        # LAPACK, whose bits otherwise depend on OMP_NUM_THREADS (docs/runs.md, "Bits and thread
        # settings"). Called inside the user's jax.jit, the QR runs when that program does: there
        # the limit is the caller's to set.
        super().__init_subclass__(**kwargs)
        init = cls.__dict__.get("init_params")
        skip = getattr(init, "__isabstractmethod__", False) or getattr(init, "one_blas_thread", False)
        if callable(init) and not skip:
            cls.init_params = with_one_blas_thread(init)  # type: ignore[method-assign]

    def __init__(self, network: Callable[[gym.Space], Any], env: Any, learning_rate: float | optax.Schedule) -> None:
        check_learning_rate(learning_rate)
        self.observation_space, self.action_space = env_spaces(env)
        self.check_action_space(self.action_space)
        self.network = self.make_networks(network, self.action_space)
        self.learning_rate = learning_rate
        self._jitted = False

    def make_networks(self, creator: Any, action_space: gym.Space) -> Any:
        """The agent's networks from the creator (default ``make_network``: one ``Network``;
        actor-critic agents: ``make_actor_critic``)."""
        return make_network(creator, action_space)

    def check_action_space(self, action_space: gym.Space) -> None:  # noqa: B027  (optional hook)
        """Raises ``ValueError`` for an action space the algorithm cannot handle (default: none)."""

    @abc.abstractmethod
    def init_params(self, rng: Any) -> Any:
        """The initial parameters (the agent's ``Params`` pytree), from ``rng``: a PRNG key (a raw
        ``(2,)`` uint32 key) or an ``hk.PRNGSequence``."""

    @abc.abstractmethod
    def init_policy(self, rng: Any) -> Any:
        """The initial policy state (a pytree; the built-in agents' is ``PolicyState(count)``, an
        int32 scalar), from ``rng``: a PRNG key (a raw ``(2,)`` uint32 key) or an ``hk.PRNGSequence``."""

    @abc.abstractmethod
    def init_optimizer(self, params: Any, rng: Any) -> OptimState:
        """The initial optimizer state for ``params`` (the ``init_params`` pytree: the optax state's
        moments take its leaves' shapes): ``OptimState(count, opt_state)``, ``count`` an int32 scalar
        0. ``rng``: a PRNG key (a raw ``(2,)`` uint32 key) or an ``hk.PRNGSequence``."""

    @abc.abstractmethod
    def predict(
        self, params: Any, policy_state: Any, obs: Any, key: Any, evaluation: bool = False, **kwargs: Any
    ) -> tuple[Any, Any]:
        """Acts on a batch of observations ``(B, ...)``: ``(PolicyOutput, PolicyState)``.

        ``key`` is a JAX key (an ``hk.PRNGSequence`` too, outside ``jax.jit``); ``evaluation`` a
        Python bool, static under ``jit()``. ``kwargs``: a subclass's own keyword arguments (seed
        002's signature; ``jit()`` passes them on, traced); the built-in agents take none.
        """

    @abc.abstractmethod
    def update(
        self, params: Any, optimizer_state: OptimState, data: Mapping[str, Any], **kwargs: Any
    ) -> tuple[Any, Any, OptimState]:
        """Trains on ``data`` (a mapping of arrays ``(B, ...)``): ``(OptimOutput, Params,
        OptimState)``. ``kwargs``: as ``predict``'s."""

    def jit(self) -> None:
        """Compiles ``predict`` (``evaluation`` static) and ``update`` in place: each is then
        one XLA call. Calling it again changes nothing.

        After it, ``predict`` takes a JAX key or an ``hk.PRNGSequence`` (its next key is taken
        before the call) and refuses, with a ``TypeError``, an ``evaluation`` that is an array.
        """
        if self.__dict__.get("_jitted", False):  # a subclass's __init__ may not call ours
            return
        self.predict, self.update = self.jitted_methods()  # type: ignore[method-assign]
        self._jitted = True

    def jitted_methods(self) -> tuple[Callable[..., tuple[Any, Any]], Callable[..., tuple[Any, Any, OptimState]]]:
        """``(predict, update)`` for ``jit()``: the subclass's own ``predict`` and ``update`` under
        ``jax.jit``, ``evaluation`` (the fifth argument, whatever the subclass names it) static."""
        compiled_predict = jax.jit(self.predict, static_argnums=(4,))
        compiled_update = jax.jit(self.update)

        def predict(
            params: Any, policy_state: Any, obs: Any, key: Any, evaluation: bool = False, **kwargs: Any
        ) -> tuple[Any, Any]:
            check_evaluation(evaluation)
            return compiled_predict(params, policy_state, obs, as_key(key), evaluation, **kwargs)

        return predict, compiled_update


class CollectionAgent(BaseAgent):
    """A ``BaseAgent`` over the collection's algorithm (``kitae.algos.collections``): kitae's
    built-in functional agents (DQN, PPO, SAC, TD3, ...).

    Subclasses define ``_predict`` and ``_update``, the pure act and update; ``predict`` and
    ``update`` run them through ``jax.jit`` on every call, after the checks that need concrete
    values (``check_data_values``; the shapes are checked while traced).
    """

    check_box_action_bounds = True
    """Whether ``update`` refuses ``Box`` actions outside the bounds (the off-policy agents: the
    actions the environment received)."""

    def collection_config(
        self, algo_params: Any, max_grad_norm: float | None, seed: int = 0, **update: Any
    ) -> cfg.AlgoConfig:
        """The ``AlgoConfig`` the collection's factories are made from: ``algo_params`` (the
        collection's params dataclass, which validates and names each field), this agent's spaces,
        ``UpdateConfig(max_grad_norm=..., **update)``.

        Raises:
            ValueError: for a ``max_grad_norm`` that is not a float > 0 or ``None``.
        """
        if max_grad_norm is not None and not max_grad_norm > 0:
            raise ValueError(f"max_grad_norm={max_grad_norm!r} is not allowed; allowed: a float > 0 or None")
        return cfg.AlgoConfig(
            seed=seed,
            algo_params=algo_params,
            update_cfg=cfg.UpdateConfig(max_grad_norm=max_grad_norm, **update),
            train_cfg=cfg.TrainConfig(),
            env_cfg=cfg.EnvConfig("functional", self.observation_space, self.action_space),
        )

    def use_collection(
        self,
        module: Any,
        config: cfg.AlgoConfig,
        learning_rate: Any,
        max_grad_norm: float | None,
        **optimizer: Any,
    ) -> None:
        """Takes the collection algorithm's functions (``module``: e.g.
        ``kitae.algos.collections.dqn``) for ``config``: its explore, processing and update step,
        and its optimizer (Adam after optional clipping, or ``optimizer_factory``'s other choices
        given as keywords; a schedule is read at the count)."""
        self.seed = config.seed
        self._explore = module.explore_factory(config)
        self._process = module.process_experience_factory(config)
        self._update_step = module.update_step_factory(config)
        self.tx = optimizer_factory(learning_rate, max_grad_norm=max_grad_norm, **optimizer)

    def off_policy_update(self, state: Any, data: Mapping[str, Any], count: jax.Array) -> tuple[Any, dict]:
        """The collection's processing then one update step on a batch (``OFF_POLICY_DATA_KEYS``),
        with ``(process_key, step_key) = split(update_key(data, seed, count))``."""
        experience = off_policy_experience(data, type(self).__name__, self.action_space, self.observation_space)
        process_key, step_key = jax.random.split(update_key(data, self.seed, count))
        return self._update_step(state, step_key, self._process(state, process_key, experience))

    @abc.abstractmethod
    def _predict(self, params: Any, policy_state: Any, obs: Any, key: jax.Array, evaluation: bool) -> tuple[Any, Any]:
        """The pure act: ``(PolicyOutput, PolicyState)`` for observations ``(B, ...)``."""

    @abc.abstractmethod
    def _update(self, params: Any, optimizer_state: OptimState, data: Mapping[str, Any]) -> tuple[Any, Any, OptimState]:
        """The pure update: ``(OptimOutput, Params, OptimState)``."""

    def predict(
        self, params: Any, policy_state: Any, obs: Any, key: Any, evaluation: bool = False, **kwargs: Any
    ) -> tuple[Any, Any]:
        """Acts on a batch of observations ``(B, ...)``; ``key`` a JAX key or an
        ``hk.PRNGSequence``; ``evaluation`` a Python bool (it picks the program: under your own
        ``jax.jit``, make it static, ``jax.jit(agent.predict, static_argnames="evaluation")``, or
        call ``agent.jit()``). ``kwargs``: none taken (seed 002's signature has them for agents
        of the user's own); any given is a ``TypeError`` naming it.

        Returns:
            ``(PolicyOutput, PolicyState)`` (the algorithm's types).

        Raises:
            TypeError: for an ``evaluation`` that is an array (traced by ``jax.jit(agent.predict)``).
            ValueError: for observations that do not fit the observation space.
        """
        self.check_no_kwargs("predict", kwargs)
        check_evaluation(evaluation)
        return self._compiled_predict(params, policy_state, obs, as_key(key), evaluation)

    def update(
        self, params: Any, optimizer_state: OptimState, data: Mapping[str, Any], **kwargs: Any
    ) -> tuple[Any, Any, OptimState]:
        """Trains on ``data`` (a mapping of arrays, the algorithm's ``DATA_KEYS``); ``kwargs`` as
        ``predict``'s.

        Returns:
            ``(OptimOutput, Params, OptimState)`` (the algorithm's types).

        Raises:
            ValueError: for data of another shape than the spaces require (checked while traced,
                under ``jax.jit`` too), or, where ``data`` is concrete (not under ``jax.jit`` /
                ``jax.vmap``, where values cannot be read), an action outside the action space
                (``check_action_values``).
        """
        self.check_no_kwargs("update", kwargs)
        self.check_data_values(data)
        return self._compiled_update(params, optimizer_state, data)

    def check_no_kwargs(self, method: str, kwargs: Mapping[str, Any]) -> None:
        """Raises ``TypeError`` naming the keyword arguments given to ``method``, which the
        built-in agents do not take."""
        if kwargs:
            raise TypeError(
                f"{type(self).__name__}.{method} got keyword arguments {sorted(kwargs)}; allowed: none "
                "(the built-in agents take only the documented arguments)"
            )

    def check_data_values(self, data: Mapping[str, Any]) -> None:
        """Checks the values of a concrete ``data["action"]`` against the action space
        (``check_action_values``); nothing for traced data."""
        if isinstance(data, Mapping) and "action" in data:
            check_action_values(self.action_space, data["action"], type(self).__name__, self.check_box_action_bounds)

    @functools.cached_property
    def _compiled_predict(self) -> Callable[..., tuple[Any, Any]]:
        def checked(params: Any, policy_state: Any, obs: Any, key: jax.Array, evaluation: bool) -> tuple[Any, Any]:
            # Checked while tracing (once per shape, nothing at run time): observations of another
            # shape would otherwise fail inside the user's network with the parameters' shapes.
            check_observation(self.observation_space, obs, False, "the environment's observation space")
            return self._predict(params, policy_state, obs, key, evaluation)

        return jax.jit(checked, static_argnames=("evaluation",))

    @functools.cached_property
    def _compiled_update(self) -> Callable[..., tuple[Any, Any, OptimState]]:
        return jax.jit(self._update)

    def jit(self) -> None:
        """Compiles ``predict`` (``evaluation`` static) and ``update`` in place: each is then
        one XLA call. Calling it again changes nothing.

        ``predict`` and ``update`` run the same compiled programs before and after (each call
        already goes through ``jax.jit``; ``jit()`` drops the Python wrapper in front), so
        ``jit()`` changes no result: bits are the same (tested). The checks stay: ``evaluation``
        a Python bool, the values of a concrete ``data["action"]``.
        """
        super().jit()

    def jitted_methods(self) -> tuple[Callable[..., tuple[Any, Any]], Callable[..., tuple[Any, Any, OptimState]]]:
        """The compiled ``_predict`` and ``_update`` behind their checks; a subclass that
        overrides ``predict`` or ``update`` gets ``BaseAgent``'s (its own methods compiled)."""
        if type(self).predict is not CollectionAgent.predict or type(self).update is not CollectionAgent.update:
            return super().jitted_methods()
        compiled_predict, compiled_update = self._compiled_predict, self._compiled_update

        def predict(
            params: Any, policy_state: Any, obs: Any, key: Any, evaluation: bool = False, **kwargs: Any
        ) -> tuple[Any, Any]:
            self.check_no_kwargs("predict", kwargs)
            check_evaluation(evaluation)
            return compiled_predict(params, policy_state, obs, as_key(key), evaluation)

        def update(
            params: Any, optimizer_state: OptimState, data: Mapping[str, Any], **kwargs: Any
        ) -> tuple[Any, Any, OptimState]:
            self.check_no_kwargs("update", kwargs)
            self.check_data_values(data)
            return compiled_update(params, optimizer_state, data)

        return predict, update


OptimState = BaseAgent.OptimState
