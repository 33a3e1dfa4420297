"""The ``Algorithm`` interface of distributed training (seed 003), and its one implementation.

Why this module is long: the interface is seed 003's, documented method by method, and its one
implementation over every agent sits beside it (acting, gradients, the update hooks, weights,
hyperparameters), each method short.

``Algorithm`` is what a distributed runtime asks of an algorithm: act on a batch of
observations (``acting_step``), compute gradients on one place and apply them on another
(``compute_gradients`` / ``apply_gradients``), move weights (``get_weights`` / ``set_weights``),
change a hyperparameter during training (``update_algorithm_parameter``) and say its schedule
(the properties). ``AgentAlgorithm`` implements it once, over any kitae agent: the built-in
DQN, PPO, SAC and TD3 and any agent written to the four factories (the guide's DQN). It holds a
copy of the agent's state and a PRNG key of its own; the agent's pure functions do the work.

Gradients of built-in algorithms are their ``compute_gradients_fn``'s (``kitae.algos.gradients``).
An agent that only has an ``update_step_fn`` has no separate gradients: its "gradients" are the
change one update step makes to every leaf of the state (``new - old``, a list in ``tree_leaves``
order), and applying them adds that change (averaging several is then averaging updates, as model averaging does).

Layer: agents (it imports ``kitae.base`` and the core, never the loops).
"""

from __future__ import annotations

import abc
import copy
import dataclasses
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np

from kitae.algos.checks import checked_update_step
from kitae.algos.experience import ExperiencePipeline
from kitae.algos.update import UpdateHooks
from kitae.base import BaseAgent, OnPolicyAgent
from kitae.config import AlgoConfig
from kitae.envs.spaces import check_observation
from kitae.modules.optimizer import learning_rate as read_learning_rate
from kitae.modules.optimizer import set_learning_rate
from kitae.types import AlgoType
from kitae.validation import check_positive_int

__all__ = ["Algorithm", "AgentAlgorithm"]


class Algorithm(abc.ABC):
    """Base class for all algorithms (seed 003's interface)."""

    @abc.abstractmethod
    def acting_step(self, obs: Any, rhs: Any, done: Any, deterministic: bool = False, *args: Any) -> tuple:
        """Acts on a batch of observations.

        Args:
            obs: current observations, ``(E, *obs_shape)``.
            rhs: recurrent hidden state, ``(E, H)`` (zeros if the policy is not recurrent).
            done: ``(E,)``, 1.0 where the previous step ended an episode, so that ``obs`` is the
                first observation of a new one (a recurrent policy starts from its initial state
                there), else 0.0. Seed 003 words it "1.0 if current obs is the last one in the
                episode"; kitae reads it as the mask a recurrent policy resets its state with,
                which is the observation after the end (docs/distributed.md).
            deterministic: take the mode instead of sampling.

        Returns:
            ``(action, clipped_action, rhs, other)``: ``action`` ``(E, ...)``, ``clipped_action``
            (within the action space), the next ``rhs`` and a dict of what the algorithm needs
            later (e.g. the action's log-probability).
        """

    @abc.abstractmethod
    def compute_gradients(self, batch: Any, grads_to_cpu: bool = True, *args: Any) -> tuple[Any, dict]:
        """Computes the gradients of the loss on ``batch`` without applying them.

        Returns:
            ``(grads, info)``: with ``grads_to_cpu`` the gradients are host numpy arrays (ready to
            send to another process); ``info`` holds the step's scalars as floats.
        """

    @abc.abstractmethod
    def apply_gradients(self, gradients: Any = None, *args: Any) -> None:
        """Takes one optimization step with ``gradients`` (default: the last ones computed)."""

    @abc.abstractmethod
    def set_weights(self, actor_weights: Any, *args: Any) -> None:
        """Sets the acting weights (what ``get_weights`` returns)."""

    @abc.abstractmethod
    def get_weights(self) -> Any:
        """The acting weights, as host numpy arrays."""

    @abc.abstractmethod
    def update_algorithm_parameter(self, parameter_name: str, new_parameter_value: float, *args: Any) -> None:
        """Changes a hyperparameter during training (see the implementation for which)."""

    @classmethod
    @abc.abstractmethod
    def create_factory(cls, *args: Any, **kwargs: Any) -> Callable[[], Algorithm]:
        """A function that builds a fresh instance (what a remote worker calls)."""

    @property
    @abc.abstractmethod
    def gamma(self) -> float:
        """The discount factor."""

    @property
    @abc.abstractmethod
    def start_steps(self) -> int:
        """Transitions collected before the first update."""

    @property
    @abc.abstractmethod
    def num_epochs(self) -> int:
        """Times the data of an update is reused (on-policy), or gradient steps per update."""

    @property
    @abc.abstractmethod
    def mini_batch_size(self) -> int:
        """Transitions per minibatch (seed 003's text reads "the number of mini batches per
        epoch", which is ``num_mini_batch``; kitae gives the size its name says)."""

    @property
    @abc.abstractmethod
    def num_mini_batch(self) -> int:
        """Minibatches per epoch."""

    @property
    @abc.abstractmethod
    def update_every(self) -> int:
        """Transitions collected between two updates."""

    @property
    @abc.abstractmethod
    def test_every(self) -> int:
        """Updates between two test evaluations (0: never)."""

    @property
    @abc.abstractmethod
    def num_test_episodes(self) -> int:
        """Episodes of a test evaluation."""


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float, np.floating, np.integer)) and not isinstance(value, bool)


def _with_params(config: AlgoConfig, values: dict[str, Any]) -> AlgoConfig:
    """``config`` with ``algo_params`` fields set to ``values`` (possibly traced), without the
    params' validation (which needs concrete values; ``update_algorithm_parameter`` validated them)."""
    params = copy.copy(config.algo_params)
    for name, value in values.items():
        object.__setattr__(params, name, value)
    out = copy.copy(config)
    object.__setattr__(out, "algo_params", params)
    return out


def _optimizer_states(state: Any) -> list[tuple[Any, str]]:
    """The ``(holder, attribute)`` of each optimizer state in an agent's state (each network's
    ``TrainState`` keeps one in ``opt_state``)."""
    found = []
    for name in getattr(state, "__dataclass_fields__", {}):
        value = getattr(state, name)
        if hasattr(value, "opt_state") and value.opt_state is not None:
            found.append((value, name))
    return found


class AgentAlgorithm(Algorithm):
    """``Algorithm`` over any kitae agent.

    Args:
        agent: a ``kitae.base.BaseAgent`` (built-in or made from the four factories). Its
            ``state`` is copied in; the agent object itself is only used for its pure functions.
        key: the PRNG key of acting and of gradient steps given no key (default: the agent's).
        test_every: updates between two test evaluations, an int >= 0 (0: never).
        num_test_episodes: episodes of a test evaluation, an int >= 1.

    Attributes:
        state: the authoritative copy of the agent's state on this instance.
        env_step: transitions acted on so far (``acting_step`` adds the batch size).
        n_gradient_steps: gradients applied so far.
    """

    def __init__(
        self, agent: BaseAgent, *, key: jax.Array | None = None, test_every: int = 0, num_test_episodes: int = 10
    ) -> None:
        if not isinstance(agent, BaseAgent):
            raise TypeError(f"agent={type(agent).__name__} is not allowed; allowed: a kitae.base.BaseAgent")
        if not (isinstance(test_every, int) and not isinstance(test_every, bool) and test_every >= 0):
            raise ValueError(f"test_every={test_every!r} is not allowed; allowed: an int >= 0 (0: never)")
        check_positive_int("num_test_episodes", num_test_episodes)
        self.agent = agent
        self.state = agent.state
        self.key = jnp.asarray(agent.key if key is None else key)
        self.env_step = 0
        self.n_gradient_steps = 0
        self._test_every, self._num_test_episodes = test_every, num_test_episodes
        self._acting = agent.acting_params(self.state)
        self._grads: Any = None
        self._params: dict[str, Any] = {}  # learning parameters changed during training
        self._functions: dict[tuple[str, ...], Any] = {}  # compiled functions per changed-parameter set
        self._act = jax.jit(agent.act, static_argnames=("deterministic",))
        self._extras = jax.jit(agent.act_extras)
        if agent.recurrent:
            self._act_recurrent = jax.jit(agent.act_recurrent, static_argnames=("deterministic",))

    # -- building --------------------------------------------------------------------------------

    @classmethod
    def create_factory(cls, agent_factory: Callable[[], BaseAgent], **kwargs: Any) -> Callable[[], AgentAlgorithm]:
        """A function that builds a fresh ``AgentAlgorithm`` (what a remote worker calls).

        Args:
            agent_factory: builds the agent, e.g. ``functools.partial(PPO, "run", config)``; it
                must be picklable to reach a remote worker (a class and a config are).
            kwargs: ``test_every``, ``num_test_episodes``.
        """
        if not callable(agent_factory):
            raise TypeError(f"agent_factory={agent_factory!r} is not allowed; allowed: a callable returning an agent")

        def factory() -> AgentAlgorithm:
            return cls(agent_factory(), **kwargs)

        return factory

    # -- acting ----------------------------------------------------------------------------------

    def acting_step(
        self, obs: Any, rhs: Any, done: Any, deterministic: bool = False, *args: Any
    ) -> tuple[Any, Any, Any, dict[str, Any]]:
        """Acts with the acting weights: ``(key, act_key) = split(key)``, then the agent's pure ``act``.

        ``rhs`` is the recurrent hidden state: a recurrent agent (``agent.recurrent``) acts from
        it (``None``: the initial state, ``agent.initial_hidden(E)``) and returns the state after
        the step; ``done`` ``(E,)`` says, per row, that the episode of the previous step ended, so
        ``obs`` is the first observation of a new one: the step starts from the initial state
        there. Feed-forward agents return ``rhs`` as it came (zeros ``(E, 1)`` if ``None``) and do
        not read ``done``. Multi-agent (``obs`` a dict keyed by agent): actions, ``rhs`` and
        ``other``'s entries are dicts keyed by agent; ``done`` ``(E,)`` holds for every agent (a
        copy's episode ends for all its agents at once) or is a dict keyed by agent.

        Returns:
            ``(action (E, ...), clipped_action (E, ...), rhs, other)``; actions are numpy arrays;
            ``clipped_action`` is ``action`` clipped to a ``Box`` action space (the same array
            for other spaces); ``other`` holds ``"log_prob"`` ``(E,)`` and what the agent's
            ``act_extras`` predicts besides: the actor-critics' (PPO, A2C, recurrent PPO)
            ``"value"`` ``(E,)``, RND-PPO's ``"value"`` and ``"value_intrinsic"``; nothing more
            for the others. Multi-agent: each a dict keyed by agent.

        Raises:
            ValueError: for observations that do not fit ``config.env_cfg.observation_space``;
                for a recurrent agent, a ``done`` without one flag per row.
        """
        del args
        check_observation(self.agent.config.env_cfg.observation_space, obs, self.agent.parallel)
        n = _batch_size(obs)
        self.key, act_key = jax.random.split(self.key)
        step = np.asarray(self.env_step, np.int32)
        if self.agent.recurrent:
            hidden, start = self._hidden_and_starts(obs, rhs, done, n)
            extras = self._extras(self._acting, obs, hidden, start)
            action, log_prob, rhs = self._act_recurrent(self._acting, act_key, obs, hidden, start, step, deterministic)
            rhs = jax.tree_util.tree_map(np.asarray, rhs)
        else:
            extras = self._extras(self._acting, obs)
            action, log_prob = self._act(self._acting, act_key, obs, step, deterministic)
            if rhs is None:
                rhs = np.zeros((n, 1), np.float32)
        self.env_step += n * (self.agent.config.env_cfg.n_agents if self.agent.parallel else 1)
        action = jax.tree_util.tree_map(np.asarray, action)
        space = self.agent.config.env_cfg.action_space
        clipped = action
        if isinstance(space, gym.spaces.Box):
            clipped = jax.tree_util.tree_map(lambda a: np.clip(a, space.low, space.high), action)
        other = {"log_prob": log_prob, **extras}
        return action, clipped, rhs, jax.tree_util.tree_map(np.asarray, other)

    def _hidden_and_starts(self, obs: Any, rhs: Any, done: Any, n: int) -> tuple[Any, Any]:
        """A recurrent agent's hidden state (``rhs``, or the initial one) and start flags from
        ``done`` ``(E,)``. Multi-agent: both keyed by agent, as ``act_recurrent`` takes them; a
        copy's episode ends for all its agents at once, so one ``done`` ``(E,)`` serves every
        agent (a dict keyed by agent is taken as it is)."""
        if not self.agent.parallel:
            return (self.agent.initial_hidden(n) if rhs is None else rhs), _flags(done, n, "done")
        hidden = {agent: self.agent.initial_hidden(n) for agent in obs} if rhs is None else rhs
        if isinstance(done, dict):
            missing = sorted(set(obs) - set(done))
            if missing:
                raise ValueError(f"done has no entry for agents {missing}; allowed: (E,) or a dict keyed by agent")
            return hidden, {agent: _flags(done[agent], n, f"done[{agent!r}]") for agent in obs}
        return hidden, dict.fromkeys(obs, _flags(done, n, "done"))

    def set_weights(self, actor_weights: Any, *args: Any) -> None:
        """Sets the acting weights from what ``get_weights`` returns: their arrays, in order, with
        the same shapes (any container of them: only the arrays are read)."""
        del args
        self._acting = _into(self._acting, actor_weights, "actor_weights", "get_weights")

    def get_weights(self) -> list[np.ndarray]:
        """The acting weights (``agent.acting_params(state)``) as a list of host numpy arrays, in
        ``jax.tree_util.tree_leaves`` order, each with its leaf's shape.

        A flat list, not the pytree: the pytree's structure holds the agent's functions (each
        ``TrainState``'s ``apply_fn`` and optimizer), which a pickled copy would rebuild as new
        objects in every message, so that the receiver's compiled functions would see a new
        structure and compile again each time. The receiver puts the arrays into its own structure.
        """
        return [np.asarray(x) for x in jax.tree_util.tree_leaves(jax.device_get(self._acting))]

    def get_state(self) -> list[np.ndarray]:
        """The whole state (parameters, optimizer states, targets) as a list of host numpy arrays,
        each with its leaf's shape (``tree_leaves`` order; see ``get_weights`` for why a list)."""
        return [np.asarray(x) for x in jax.tree_util.tree_leaves(jax.device_get(self.state))]

    def set_state(self, state: Any) -> None:
        """Sets the whole state from what ``get_state`` returns (or a state pytree of the agent's
        structure): each leaf of the shape of the current state's leaf in its place
        (``tree_leaves`` order); the acting weights follow."""
        self.state = _into(self.state, state, "state", "get_state")
        self._acting = self.agent.acting_params(self.state)

    # -- learning --------------------------------------------------------------------------------

    def _compiled(self) -> Any:
        """The compiled learning functions for the set of changed parameters (one compile per set;
        changing a value already in the set compiles nothing)."""
        names = tuple(sorted(self._params))
        fns = self._functions.get(names)
        if fns is not None:
            return fns
        agent = self.agent

        def learning(params: dict[str, Any]) -> tuple[ExperiencePipeline, Callable, Callable]:
            config = _with_params(agent.config, params) if params else agent.config
            pipeline = ExperiencePipeline(
                [agent.process_experience_factory(config)],
                vectorized=agent.algo_type is AlgoType.ON_POLICY,
                parallel=agent.parallel,
            )
            factories = getattr(agent, "gradient_factories", None)
            if factories is not None:
                return pipeline, factories[0](config), factories[1](config)
            update_step = checked_update_step(
                agent.update_step_factory(config), type(agent).__name__, config.replay.prioritized
            )

            # the change as a list of arrays (tree_leaves order), not a pytree of the state's
            # structure: that structure holds the agent's functions, which a pickled copy rebuilds
            # as new objects, and the receiver's compiled ``apply`` would compile again each time
            def delta(state: Any, key: jax.Array, batch: Any) -> tuple[Any, dict]:
                old = jax.tree_util.tree_map(lambda x: x, state)  # guide-style steps reassign fields in place
                new, info = update_step(state, key, batch)
                changes = jax.tree_util.tree_map(lambda a, b: a - b, new, old)
                return jax.tree_util.tree_leaves(changes), info

            def add(state: Any, change: list) -> Any:
                leaves, structure = jax.tree_util.tree_flatten(state)
                return jax.tree_util.tree_unflatten(
                    structure, [(a + d).astype(a.dtype) for a, d in zip(leaves, change, strict=True)]
                )

            return pipeline, delta, add

        def hooks(params: dict[str, Any]) -> UpdateHooks:
            if agent.algo_type is not AlgoType.ON_POLICY:
                return UpdateHooks()
            return agent.update_hooks(_with_params(agent.config, params) if params else agent.config)  # type: ignore[attr-defined]

        def prepare_update(params: dict, state: Any, rollout: Any) -> Any:
            prepare = hooks(params).prepare
            return state if prepare is None else prepare(state, rollout)

        def finish_update(params: dict, state: Any, rollout: Any) -> Any:
            finish = hooks(params).finish
            return state if finish is None else finish(state, rollout)

        def compute(params: dict, state: Any, key: jax.Array, batch: Any) -> tuple[Any, dict]:
            return learning(params)[1](state, key, batch)

        def apply(params: dict, state: Any, grads: Any) -> Any:
            return learning(params)[2](state, grads)

        def process_rollout(params: dict, state: Any, key: jax.Array, rollout: Any) -> tuple[Any, jax.Array]:
            return agent.process_rollout(state, key, rollout, pipeline=learning(params)[0])  # type: ignore[attr-defined]

        def gradient_batch(params: dict, state: Any, key: jax.Array, buffer_state: Any) -> tuple[Any, jax.Array]:
            return agent.gradient_batch(state, key, buffer_state, pipeline=learning(params)[0])  # type: ignore[attr-defined]

        fns = {
            "compute": jax.jit(compute),
            "apply": jax.jit(apply),
            "process_rollout": jax.jit(process_rollout),
            "gradient_batch": jax.jit(gradient_batch),
            "prepare_update": jax.jit(prepare_update),
            "finish_update": jax.jit(finish_update),
        }
        self._functions[names] = fns
        return fns

    def _param_args(self) -> dict[str, Any]:
        return {name: jnp.asarray(value, jnp.float32) for name, value in self._params.items()}

    def compute_gradients(
        self, batch: Any, grads_to_cpu: bool = True, *args: Any, key: jax.Array | None = None
    ) -> tuple[Any, dict[str, float]]:
        """The gradients of one update step on ``batch`` (a processed minibatch: see
        ``process_rollout`` and ``gradient_batch``), with ``key`` (default: split from this
        instance's key).

        Returns:
            ``(grads, info)``: ``grads`` has the structure the agent's ``apply_gradients_fn``
            takes (host numpy arrays with ``grads_to_cpu``); ``info`` the step's scalars as floats.
        """
        del args
        if key is None:
            self.key, key = jax.random.split(self.key)
        grads, info = self._compiled()["compute"](self._param_args(), self.state, key, batch)
        if grads_to_cpu:
            grads = jax.device_get(grads)
        self._grads = grads
        return grads, {name: float(value) for name, value in jax.device_get(info).items()}

    def apply_gradients(self, gradients: Any = None, *args: Any) -> None:
        """One optimization step with ``gradients`` (default: the last ``compute_gradients``'s).

        Raises:
            RuntimeError: with no gradients given and none computed yet.
        """
        del args
        if gradients is None:
            gradients = self._grads
        if gradients is None:
            raise RuntimeError("apply_gradients() has no gradients: pass some or call compute_gradients first")
        self.state = self._compiled()["apply"](self._param_args(), self.state, gradients)
        self._acting = self.agent.acting_params(self.state)
        self.n_gradient_steps += 1

    def process_rollout(self, rollout: Any, key: jax.Array) -> tuple[Any, jax.Array]:
        """On-policy: the rollout (leaves ``(T, E, ...)``) processed with this state, and one key
        per epoch (``kitae.base.OnPolicyAgent.process_rollout``)."""
        if self.agent.algo_type is not AlgoType.ON_POLICY:
            raise TypeError(f"{type(self.agent).__name__} is off-policy: its minibatches come from gradient_batch")
        return self._compiled()["process_rollout"](self._param_args(), self.state, key, rollout)

    def prepare_update(self, rollout: Any) -> None:
        """On-policy: what the agent does to the state before an update's processing
        (``kitae.base.OnPolicyAgent.prepare_update``: its running statistics of the rollout),
        compiled, on this instance's state. An update made gradient step by gradient step runs it
        first, then ``process_rollout`` and the steps, then ``finish_update``: the fused update's
        order. ``rollout``: leaves ``(T, E, ...)``."""
        self._on_policy("prepare_update")
        self.state = self._compiled()["prepare_update"](self._param_args(), self.state, rollout)
        self._acting = self.agent.acting_params(self.state)

    def finish_update(self, rollout: Any) -> None:
        """On-policy: what the agent does to the state after an update's last gradient step
        (``kitae.base.OnPolicyAgent.finish_update``), compiled, on this instance's state."""
        self._on_policy("finish_update")
        self.state = self._compiled()["finish_update"](self._param_args(), self.state, rollout)
        self._acting = self.agent.acting_params(self.state)

    def _on_policy(self, what: str) -> None:
        if self.agent.algo_type is not AlgoType.ON_POLICY:
            raise TypeError(f"{type(self.agent).__name__} is off-policy: it has no {what} (on-policy updates only)")

    def gradient_batch(self, step_key: jax.Array, buffer_state: Any) -> tuple[Any, jax.Array]:
        """Off-policy: one gradient step's minibatch sampled from ``buffer_state`` and processed
        with this state, and the key of its update step (``kitae.base.OffPolicyAgent.gradient_batch``).

        Args:
            step_key: the gradient step's key, one row ``(2,)`` of ``gradient_step_keys``.
            buffer_state: the replay buffer's ``BufferState`` (``data`` leaves ``(capacity, E, ...)``).

        Returns:
            ``(batch, update_key)``: the processed minibatch (leaves ``(batch_size, ...)``) and a
            raw ``(2,)`` uint32 PRNG key.
        """
        if self.agent.algo_type is not AlgoType.OFF_POLICY:
            raise TypeError(f"{type(self.agent).__name__} is on-policy: its minibatches come from process_rollout")
        return self._compiled()["gradient_batch"](self._param_args(), self.state, step_key, buffer_state)

    # -- hyperparameters -------------------------------------------------------------------------

    def changeable_parameters(self) -> tuple[str, ...]:
        """The names ``update_algorithm_parameter`` takes: ``learning_rate`` (when not annealed)
        and the agent's ``learning_params``."""
        lr = () if self.agent.config.update_cfg.learning_rate_annealing else ("learning_rate",)
        return lr + tuple(self.agent.learning_params)

    def update_algorithm_parameter(self, parameter_name: str, new_parameter_value: float, *args: Any) -> None:
        """Changes a hyperparameter during training.

        ``learning_rate`` sets every optimizer's rate in the state (nothing is compiled);
        a learning parameter of ``algo_params`` (PPO's ``clip_coef``, ``gamma``, ...; see
        ``changeable_parameters()``) becomes an input of the compiled learning functions: the first
        change of a parameter compiles them once, later changes of it compile nothing.

        Raises:
            ValueError: for a name not in ``changeable_parameters()`` (an annealed learning rate
                included) or a value the field does not allow (the params' own validation).
        """
        del args
        allowed = self.changeable_parameters()
        if parameter_name not in allowed:
            why = ""
            if parameter_name == "learning_rate":
                why = " (the learning rate is annealed: update_cfg.learning_rate_annealing=True)"
            raise ValueError(
                f"parameter_name={parameter_name!r} (new_parameter_value={new_parameter_value!r}) cannot change "
                f"during training{why}; allowed: {list(allowed)}"
            )
        if not _is_number(new_parameter_value) or not np.isfinite(new_parameter_value):
            raise ValueError(
                f"new_parameter_value={new_parameter_value!r} is not allowed for {parameter_name}; "
                "allowed: a finite number"
            )
        value = float(new_parameter_value)
        if parameter_name == "learning_rate":
            if value <= 0:
                raise ValueError(f"new_parameter_value={value} is not allowed for learning_rate; allowed: a float > 0")
            holders = _optimizer_states(self.state)
            for holder, name in holders:
                holder_new = holder.replace(opt_state=set_learning_rate(holder.opt_state, value))
                self.state = self.state.replace(**{name: holder_new})
            return
        # the params' own validation, on a concrete copy (raises the field's clear error)
        dataclasses.replace(self.agent.config.algo_params, **{parameter_name: value})
        self._params[parameter_name] = value

    def parameter(self, parameter_name: str) -> float | None:
        """The current value of a changeable parameter (``learning_rate``: the rate the last
        update used; ``None`` for one that is off, as PPO's ``value_clip_coef`` by default)."""
        if parameter_name == "learning_rate":
            holders = _optimizer_states(self.state)
            if not holders:
                raise ValueError("this agent's state holds no optimizer")
            return float(read_learning_rate(holders[0][0].opt_state))
        if parameter_name in self._params:
            return self._params[parameter_name]
        value = getattr(self.agent.config.algo_params, parameter_name)
        return None if value is None else float(value)

    # -- schedule --------------------------------------------------------------------------------

    @property
    def gamma(self) -> float:
        """The discount factor, ``parameter("gamma")``."""
        gamma = self.parameter("gamma")
        assert gamma is not None  # a discount is never off
        return gamma

    @property
    def start_steps(self) -> int:
        """Environment steps before the first update (the agent's ``schedule.start_step``)."""
        return self.agent.schedule.start_step

    @property
    def num_epochs(self) -> int:
        """``update_cfg.n_epochs``."""
        return self.agent.config.update_cfg.n_epochs

    @property
    def mini_batch_size(self) -> int:
        """``update_cfg.batch_size``."""
        return self.agent.config.update_cfg.batch_size

    @property
    def minibatch_rows(self) -> int:
        """Rows of ``process_rollout``'s experience per minibatch, the size to give
        ``kitae.algos.update.epoch_minibatches``: ``mini_batch_size`` transitions, except for a
        recurrent agent, whose rows are whole sequences (``batch_size / sequence_length``).
        Off-policy: ``mini_batch_size`` (``gradient_batch`` samples the minibatch itself)."""
        if isinstance(self.agent, OnPolicyAgent):
            return self.agent.minibatch_rows
        return self.mini_batch_size

    @property
    def num_mini_batch(self) -> int:
        """On-policy: the rollout's transitions over ``batch_size``; off-policy: 1 (each gradient
        step samples one minibatch)."""
        if self.agent.algo_type is AlgoType.ON_POLICY:
            u, e = self.agent.config.update_cfg, self.agent.config.env_cfg
            return (u.max_buffer_size * e.n_envs * e.n_agents) // u.batch_size
        return 1

    @property
    def update_every(self) -> int:
        """Environment steps between updates: on-policy, one iteration's transitions (its vector
        steps times ``n_envs``); off-policy, the schedule's ``skip_steps``."""
        schedule = self.agent.schedule
        if schedule.on_policy:
            return schedule.vector_steps_per_iteration * schedule.n_envs
        return schedule.skip_steps

    @property
    def test_every(self) -> int:
        """The constructor's ``test_every`` (0: never)."""
        return self._test_every

    @property
    def num_test_episodes(self) -> int:
        """The constructor's ``num_test_episodes``."""
        return self._num_test_episodes


def _batch_size(obs: Any) -> int:
    leaves = jax.tree_util.tree_leaves(obs)
    if not leaves:
        raise ValueError("obs holds no array")
    return int(np.shape(leaves[0])[0])


def _flags(done: Any, n: int, name: str) -> np.ndarray:
    """``done`` as ``(E,)`` bools (one per row of the ``E`` observations); a clear error for
    another number of values."""
    flags = np.asarray(done, bool)
    if flags.size != n:
        raise ValueError(
            f"{name} of shape {flags.shape} is not allowed; allowed: ({n},), one flag per row of the "
            f"{n} observations (the previous step ended that row's episode)"
        )
    return flags.reshape(n)


def _into(like: Any, values: Any, name: str, getter: str) -> Any:
    """The arrays of ``values`` (``tree_leaves`` order) in the structure of ``like``, each as the
    dtype of the leaf it replaces; a clear error when their number or a shape differs."""
    leaves, reference = jax.tree_util.tree_leaves(values), jax.tree_util.tree_leaves(like)
    if len(leaves) != len(reference):
        raise ValueError(f"{name} has {len(leaves)} arrays; expected {len(reference)} (what {getter}() returns)")
    for i, (new, old) in enumerate(zip(leaves, reference, strict=True)):
        if np.shape(new) != np.shape(old):
            raise ValueError(f"{name}[{i}] has the shape {np.shape(new)}; expected {np.shape(old)} ({getter}()'s)")
    typed = [jnp.asarray(new, jnp.asarray(old).dtype) for new, old in zip(leaves, reference, strict=True)]
    return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(like), typed)
