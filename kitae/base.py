"""Agents: the thin stateful shell around four pure functions.

Why this module is long: ``BaseAgent`` and its two kinds (``OffPolicyAgent``,
``OnPolicyAgent``) are the one public class hierarchy of the agents layer (seed 004 imports them
from here); each method is short and the long part is the documentation of the facade a user
holds (acting, keys, updates and the Python road of runs).

An agent is made from four factories (see ``docs/custom_agents.md``):

- ``train_state_factory(key, config, *, preprocess_fn=None, tabulate=False) -> state``
- ``explore_factory(config) -> explore_fn(state, key, observations, **hyper) -> (actions, log_probs)``
- ``process_experience_factory(config) -> process_fn(state, key, experience) -> tuple of arrays``
- ``update_step_factory(config) -> update_fn(state, key, batch) -> (state, info)``

``BaseAgent`` holds the state, the PRNG key and the buffer (the facade a user holds), and makes
from the factories the pure functions every executor runs (``docs/architecture.md``):

- ``initial_state(seed) -> (key, state)``: the state a run starts from;
- ``act(acting_params, key, observations, env_step, deterministic) -> (actions, log_probs)``: acting,
  with ``acting_params(state)`` the part of the state acting reads;
- ``update_fn(state, key, data) -> (state, info)``: one whole update (processing plus every
  gradient step, compiled as one call); ``update_data(buffer_state)`` is its ``data``;
- ``schedule``: when updates happen (``kitae.schedule.Schedule``).

Built-in algorithms define ``act``; an agent written as in the custom-agent guide defines
``explore(observation)`` and ``select_action(observation)`` against its attributes, and
``BaseAgent.act`` turns those into the pure function (the attributes are swapped for the given
values while the function is traced, so it compiles to a pure program).

``train``, ``resume``, ``save`` and ``unserialize`` are the Python road to what ``kitae train``
does: they hand the agent to the run service (``kitae.run_service``) that ``kitae.runs``, a layer
above this one, installs when ``kitae`` is imported, so a run started here writes the same run
directory as one started from the command line.

Step units: every step count here (``n_env_steps``, ``start_step``, ``skip_steps``) counts
environment transitions summed over all environments.
"""

from __future__ import annotations

import abc
import copy
import dataclasses
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from kitae.algos.checks import check_state, checked_update_step, factory_output
from kitae.algos.experience import ExperiencePipeline
from kitae.algos.factory import explore_general_factory
from kitae.algos.update import UpdateHooks, mean_over_steps, on_policy_update, process_rollout, with_update_hooks
from kitae.buffer import (
    BufferState,
    Experience,
    ReplayBuffer,
    RolloutBuffer,
    buffer_rollout,
    buffer_sample,
    check_buffer_memory,
    space_nbytes,
)
from kitae.compile_options import jit_once, one_blas_thread
from kitae.config import AlgoConfig, DistributedConfig
from kitae.envs.goals import goal_reward_fn
from kitae.envs.spaces import check_observation
from kitae.replay.prioritized import annealed_beta, update_priorities
from kitae.replay.sampling import sample_transitions
from kitae.run_service import RunService, install_run_service, run_service
from kitae.schedule import Schedule
from kitae.types import AlgoType

__all__ = [
    "AlgoType",
    "IAgent",
    "BaseAgent",
    "OffPolicyAgent",
    "OnPolicyAgent",
    "RunService",
    "install_run_service",
    "agent_keys",
    "step_array",
]

KEY_BLOCK = 256


def step_array(env_step: int | jax.Array) -> np.ndarray | jax.Array:
    """``env_step`` as an int32 array for a jitted function: a numpy scalar on the host (a Python
    int that changes would be a new static value; an array is not), a traced value as it is."""
    if isinstance(env_step, jax.core.Tracer):
        return env_step.astype(jnp.int32)
    return np.asarray(min(int(env_step), 2**31 - 1), np.int32)


def agent_keys(key: jax.Array, observation: Any, parallel: bool) -> Any:
    """The key ``act`` hands its explore function: ``key`` itself, or in multi-agent mode one key
    per agent, ``{agent: key}`` (split from ``key`` in the order of the observation's agents).

    Args:
        key: a PRNG key, a raw ``(2,)`` uint32 key.
        observation: read only in multi-agent mode, for its agents: a dict keyed by agent (each
            ``(E, *obs_shape)``).
        parallel: multi-agent mode.

    Returns:
        ``key`` ``(2,)``, or ``{agent: key (2,)}``.
    """
    if not parallel:
        return key
    agents = list(observation.keys())
    keys = jax.random.split(key, len(agents))
    return {agent: keys[i] for i, agent in enumerate(agents)}


@jax.jit
def _split_block(key: jax.Array) -> jax.Array:
    """``KEY_BLOCK + 1`` keys: the next agent key first, then ``KEY_BLOCK`` keys to hand out."""
    return jax.random.split(key, KEY_BLOCK + 1)


# ---------------------------------------------------------------------------------------------
# Agents
# ---------------------------------------------------------------------------------------------


def check_replay(agent: Any, config: AlgoConfig, experience_type: type) -> Callable | None:
    """Refuses a ``config.replay`` the agent cannot learn from, when the agent is made; returns the
    goal reward function hindsight relabelling uses (``None`` without HER).

    Raises:
        ValueError: naming the field, the value and what is allowed: replay options for an
            on-policy agent or a multi-agent environment, a feature the agent's update does not
            read (``replay_features``), n-step returns without ``algo_params.gamma`` or a
            ``truncated`` field, HER without goal observations.
    """
    replay, name = config.replay, type(agent).__name__
    if replay.uniform_one_step:
        return None
    asked = (
        "replay.prioritized=True"
        if replay.prioritized
        else (f"replay.n_step={replay.n_step}" if replay.n_step > 1 else f"replay.her={replay.her!r}")
    )
    if agent.algo_type is not AlgoType.OFF_POLICY:
        raise ValueError(f"{asked} is not allowed for {name}: it is on-policy; allowed: the default replay")
    if config.env_cfg.n_agents > 1:
        raise ValueError(
            f"{asked} is not allowed in a multi-agent environment (n_agents={config.env_cfg.n_agents}); "
            "allowed: the default replay"
        )
    for feature, wanted in (("prioritized", replay.prioritized), ("n_step", replay.n_step > 1)):
        if wanted and feature not in agent.replay_features:
            supported = sorted(agent.replay_features) or "none"
            raise ValueError(
                f"replay.{feature}={getattr(replay, feature)!r} is not allowed for {name}: its update does not read "
                f"it (replay_features: {supported})"
            )
    if replay.n_step > 1:
        if not hasattr(config.algo_params, "gamma"):
            raise ValueError(f"replay.n_step={replay.n_step} is not allowed: algo_params has no gamma to discount with")
        if "truncated" not in getattr(experience_type, "_fields", ()):
            raise ValueError(
                f"replay.n_step={replay.n_step} is not allowed: {experience_type.__name__} stores no truncated field "
                "(n-step sums stop where episodes are cut)"
            )
    if replay.her is None:
        return None
    return goal_reward_fn(config.env_cfg.task_name, config.env_cfg.observation_space)


class IAgent(abc.ABC):
    """The facade every agent offers a user: acting, updating and training from its attributes.

    The executors (``kitae.loops``) run ``BaseAgent``'s pure functions instead: ``initial_state``,
    ``acting_params`` and ``act``, ``update_fn`` and ``update_data``, with its ``schedule``,
    ``experience_type`` and ``make_buffer``.

    Observations passed to ``explore`` and ``select_action`` have a leading environment axis
    ``(E, *obs_shape)`` (dicts of those keyed by agent in multi-agent environments).
    """

    config: AlgoConfig
    algo_type: AlgoType
    buffer: Any
    state: Any
    env_step: int
    """Environment transitions so far (summed over environments); exploration may depend on it
    (random actions before ``start_step``, epsilon schedules)."""

    @abc.abstractmethod
    def explore(self, observation: Any) -> tuple[jax.Array, jax.Array]:
        """Samples actions to explore: returns ``(actions (E, ...), log_probs (E,))``."""

    @abc.abstractmethod
    def select_action(self, observation: Any) -> tuple[jax.Array, jax.Array]:
        """Acts deterministically (greedy or mean action): returns ``(actions, log_probs)``."""

    @abc.abstractmethod
    def should_update(self, step: int, buffer: Any) -> bool:
        """Whether to update now, ``step`` environment transitions into training."""

    @abc.abstractmethod
    def update(self, buffer: Any) -> dict[str, float]:
        """Updates the state from the buffer; returns the losses and other update info."""

    @abc.abstractmethod
    def train(self, env: Any, n_env_steps: int | None = None) -> Any:
        """Trains for ``n_env_steps`` environment transitions summed over all environments."""


class BaseAgent(IAgent):
    """An agent built from the four factories.

    Args:
        run_name: name of the run; its directory is ``runs/<run_name>/`` unless ``run_dir`` says
            otherwise.
        config: the ``AlgoConfig``.
        train_state_factory: ``(key, config, *, preprocess_fn, tabulate) -> state``.
        explore_factory: ``config -> explore_fn``.
        process_experience_factory: ``config -> process_fn``.
        update_step_factory: ``config -> update_fn``.
        preprocess_fn: optional observation preprocessing handed to ``train_state_factory``.
        tabulate: print a table of each network's layers and parameter counts.
        experience_type: the NamedTuple stored in the buffer; its fields must be a subset of
            ``kitae.buffer.Experience``'s (the loops fill them by name).
        run_dir: the run directory (default ``runs/<run_name>``).

    Attributes:
        state: the agent's ``AgentPyTree`` (parameters, optimizer states, target parameters).
        key: the host PRNG key of the facade's own ``explore``/``select_action``/``update`` calls.
        explore_fn: ``explore_fn`` lifted to the environment's layout (vectorized / multi-agent).
        process_experience_pipeline: an ``ExperiencePipeline`` around ``process_fn``.
        update_step_fn: the user's one-minibatch update step.
        buffer: a ``ReplayBuffer`` (off-policy) or ``RolloutBuffer`` (on-policy).
        update_fn: the pure whole update ``(state, key, data) -> (state, info)``: for on-policy
            agents ``data`` is a rollout ``(T, E, ...)``, for off-policy agents a ``BufferState``.
        schedule: the run's ``kitae.schedule.Schedule`` (when updates happen).
        env_step: environment transitions trained so far.
        n_updates: updates made so far.
    """

    algo_type: AlgoType
    learning_params: tuple[str, ...] = ()
    """``algo_params`` fields read only by learning (processing and the update step), which
    ``kitae.distributed.Algorithm.update_algorithm_parameter`` may change during training."""
    recurrent: bool = False
    """A recurrent agent acts with a hidden state: it defines ``initial_hidden(n)`` and
    ``act_recurrent(acting_params, key, observation, hidden, start, env_step, deterministic) ->
    (actions, log_probs, hidden)``, its experience type adds the fields ``start`` and ``hidden``,
    and every executor carries its ``kitae.loops.collect.Memory``."""

    RECURRENT_FIELDS = ("start", "hidden")
    """The experience fields a recurrent agent stores beside ``Experience``'s."""

    replay_features: frozenset[str] = frozenset()
    """What the agent's update reads of ``kitae.config.ReplayConfig``'s replay (off-policy agents):
    ``"prioritized"`` (its loss weights each transition by ``Experience.weight`` and its update
    step's ``info`` holds ``td_error`` ``(B,)`` when ``config.replay.prioritized``), ``"n_step"``
    (it bootstraps with ``gamma ** Experience.n_steps``). Hindsight relabelling needs nothing of
    the agent. A config asking for a feature the agent lacks is refused when the agent is made."""

    def __init__(
        self,
        run_name: str,
        config: AlgoConfig,
        train_state_factory: Callable,
        explore_factory: Callable,
        process_experience_factory: Callable,
        update_step_factory: Callable,
        *,
        preprocess_fn: Callable | None = None,
        tabulate: bool = False,
        experience_type: type = Experience,
        run_dir: str | Path | None = None,
    ) -> None:
        if not isinstance(run_name, str) or not run_name:
            raise ValueError(f"run_name={run_name!r} is not allowed; allowed: a non-empty str")
        if not isinstance(config, AlgoConfig):
            raise TypeError(f"config={type(config).__name__} is not allowed; allowed: a kitae.config.AlgoConfig")
        for name, factory in (
            ("train_state_factory", train_state_factory),
            ("explore_factory", explore_factory),
            ("process_experience_factory", process_experience_factory),
            ("update_step_factory", update_step_factory),
        ):
            if not callable(factory):
                raise TypeError(f"{name}={factory!r} is not allowed; allowed: a callable taking the config")
        fields = getattr(experience_type, "_fields", None)
        allowed = Experience._fields + (self.RECURRENT_FIELDS if self.recurrent else ())
        if fields is None or not set(fields) <= set(allowed):
            raise ValueError(
                f"experience_type={experience_type!r} is not allowed; allowed: a NamedTuple whose fields "
                f"are among {allowed}"
            )
        cls = type(self)
        if self.recurrent and not (
            callable(getattr(self, "act_recurrent", None)) and callable(getattr(self, "initial_hidden", None))
        ):
            raise TypeError(f"{cls.__name__} is recurrent but defines no act_recurrent and initial_hidden")
        if cls.act is BaseAgent.act and (
            cls.explore is BaseAgent.explore or cls.select_action is BaseAgent.select_action
        ):
            raise TypeError(
                f"{cls.__name__} defines no way to act; define act(acting_params, key, observation, env_step, "
                "deterministic) or both explore(observation) and select_action(observation)"
            )

        self.run_name = run_name
        self.run_dir = Path(run_dir) if run_dir is not None else Path("runs") / run_name
        self.config = config
        self.experience_type = experience_type
        self.goal_reward_fn = check_replay(self, config, experience_type)
        self.preprocess_fn = preprocess_fn
        self.parallel = config.env_cfg.n_agents > 1
        self.vectorized = True  # the executors always hand over (E, ...) batches

        self.train_state_factory = train_state_factory
        self._set_first_state(config.seed, tabulate)
        self._key_block, self._key_index = np.zeros((0, 2), np.uint32), 0
        self._pure_keys = False  # True while act() runs a guide-style explore as a pure function

        self.explore_factory = explore_factory
        self.process_experience_factory = process_experience_factory
        self.update_step_factory = update_step_factory
        self._build_functions()
        self.buffer = self.make_buffer()
        self.n_updates = 0
        self.env_step = 0

    def _build_functions(self) -> None:
        """Makes the agent's functions from ``self.config`` (its factories' outputs, the update
        and the compiled entry points). Run by ``__init__`` and by ``with_config``."""
        config = self.config
        self.schedule = Schedule.from_config(config, self.algo_type)
        explore_fn = factory_output(
            "explore_factory", self.explore_factory, config, "explore_fn(state, key, observations)"
        )
        self.explore_fn = explore_general_factory(explore_fn, self.vectorized, self.parallel)
        self.process_experience_fn = factory_output(
            "process_experience_factory", self.process_experience_factory, config, "process_fn(state, key, experience)"
        )
        self.update_step_fn = factory_output(
            "update_step_factory", self.update_step_factory, config, "update_fn(state, key, batch)"
        )
        self.process_experience_pipeline = ExperiencePipeline(
            [self.process_experience_fn],
            vectorized=self.algo_type is AlgoType.ON_POLICY,
            parallel=self.parallel,
        )
        self.update_fn = self._make_update_fn()
        self._update_jit = jax.jit(self.update_with_replay)
        self._act_jit = jax.jit(self.act, static_argnames=("deterministic",))
        self._configure()

    def _configure(self) -> None:
        """What a subclass makes from ``self.config`` beside the four factories' functions (its
        gradient functions, exploration constants...): run when the agent is made and by
        ``with_config``. Subclasses that override it call ``super()._configure()``."""

    def with_config(self, config: AlgoConfig) -> BaseAgent:
        """A copy of the agent whose functions are rebuilt from ``config`` (its state, key and
        counters are this agent's, shared, not copied).

        ``config`` may hold traced values (``kitae.config.traced_config``): inside ``jax.jit`` or
        ``jax.vmap``, the copy's update and acting then compute with them, which is how a sweep
        trains several hyperparameter values in one program. ``config`` must keep every shape
        of this agent's (spaces, sizes, counts); it is not validated again. An attribute that
        holds this agent's config or one of its sections (``self.algo_params =
        self.config.algo_params``) holds the new config's in the copy.
        """
        clone = copy.copy(self)
        clone._use_config(config)
        return clone

    def reconfigure(self, config: AlgoConfig) -> None:
        """Makes this agent, in place, the agent ``config`` makes, with its state's arrays, key
        and counters kept: its functions are rebuilt from ``config`` (as ``with_config``'s) and
        so are the state's static parts, made from the config when the state is (each
        ``TrainState``'s optimizer: a learning rate annealed over ``train_cfg.n_env_steps``).

        ``agent.resume(env, n)`` with a new total uses it, as ``kitae resume --steps n`` makes
        its agent from the config with that total. ``config`` must keep every shape of this
        agent's (spaces, sizes, counts).
        """
        state = self.state
        self._use_config(config)
        try:  # the structure alone, without computing a state
            _, template = jax.eval_shape(self.initial_state, np.uint32(self.config.seed))
        except (jax.errors.JAXTypeError, TypeError):  # a factory that cannot be traced
            with one_blas_thread():
                _, template = self.initial_state(self.config.seed)
        leaves = jax.tree_util.tree_leaves(state)
        self.state = jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(template), leaves)

    def _use_config(self, config: AlgoConfig) -> None:
        """Rebuilds this agent's functions from ``config``, in place (``with_config`` on its copy,
        ``reconfigure``)."""
        # functions compiled for this agent and kept on it (the loops' steps, the evaluation)
        # close over the old config: they are compiled again
        for cached in ("_compiled_steps", "_kitae_evaluation"):
            self.__dict__.pop(cached, None)
        # An attribute that is this agent's config or one of its sections (the custom-agent
        # guide's ``self.algo_params = self.config.algo_params``, read by its ``explore``) is the
        # new config's: kept, it made a swept exploration rate train every row with the old one.
        sections = {id(self.config): config}
        sections.update(
            (id(getattr(self.config, f.name)), getattr(config, f.name))
            for f in dataclasses.fields(self.config)
            if dataclasses.is_dataclass(getattr(self.config, f.name))
        )
        for name, value in list(vars(self).items()):
            if id(value) in sections:
                setattr(self, name, sections[id(value)])
        self.config = config
        self._build_functions()

    def _set_first_state(self, seed: int, tabulate: bool) -> None:
        """Checks ``initial_state(seed)`` by tracing it (``jax.eval_shape``: errors surface now)
        and leaves its values to be computed on first use of ``key`` or ``state``, as one compiled
        program (run op by op, a network's initialisation compiles dozens of tiny programs: a
        second or more of a cold start; the values are the same).

        Deferred because a compiled run needs only the state's shapes to start compiling its
        training program (``first_state_shape``) and computes the values meanwhile; a run of
        several seeds never needs this seed's. Eager where it cannot be traced (a custom factory
        with Python-side work) or to print the networks' tables."""
        self._first: tuple[jax.Array, Any] | None = None
        self._first_shape: tuple[Any, Any] | None = None
        self._first_seed = seed
        if not tabulate:
            try:
                self._first_shape = jax.eval_shape(self.initial_state, np.uint32(seed))
            except (jax.errors.JAXTypeError, TypeError):  # not traceable: op by op below
                pass
            else:
                check_state(self._first_shape[1])
                return
        with one_blas_thread():  # op by op: its QR (orthogonal init) single-threaded as in jit_once
            self._first = jax.block_until_ready(self.initial_state(seed, tabulate=tabulate))
        check_state(self._first[1])

    def _materialize(self) -> tuple[jax.Array, Any]:
        if self._first is None:
            try:
                first = jit_once(self.initial_state)(np.uint32(self._first_seed))
            except ValueError:  # inside a trace, which refuses compiler options (a factory error recurs below)
                first = None
            if first is None or any(isinstance(x, jax.core.Tracer) for x in jax.tree_util.tree_leaves(first)):
                # first asked for inside a trace (a sweep's traced agent): values, not tracers
                with jax.ensure_compile_time_eval(), one_blas_thread():
                    first = self.initial_state(self._first_seed)
            self._first = first
        return self._first

    @property
    def key(self) -> jax.Array:
        """The agent's PRNG key (the host loop's; a compiled run carries its own in its state)."""
        return self._materialize()[0]

    @key.setter
    def key(self, value: jax.Array) -> None:
        self._first = (value, self._materialize()[1])

    @property
    def state(self) -> Any:
        """The agent's state (``train_state_factory``'s pytree: parameters, optimizer states...)."""
        return self._materialize()[1]

    @state.setter
    def state(self, value: Any) -> None:
        self._first = (self._materialize()[0], value)

    @property
    def first_state_pending(self) -> bool:
        """``key`` and ``state`` are still ``initial_state(config.seed)``'s, not computed yet."""
        return self._first is None

    def first_state_shape(self) -> tuple[Any, Any]:
        """``(key, state)`` of ``initial_state(config.seed)`` as ``jax.ShapeDtypeStruct`` leaves:
        what ``key`` and ``state`` hold before any training, without computing them."""
        if self._first_shape is None:
            self._first_shape = jax.eval_shape(lambda: self._materialize())
        return self._first_shape

    def initial_state(self, seed: int | jax.Array, *, tabulate: bool = False) -> tuple[jax.Array, Any]:
        """The key and state a fresh agent made with ``seed`` starts from.

        Pure and traceable (``seed`` may be a traced integer), so the compiled loop can build one
        state per seed inside ``jax.vmap``; with ``config.seed`` it gives exactly ``agent.key`` and
        ``agent.state``.

        Args:
            seed: an int, or an integer scalar ``()`` (possibly traced).
            tabulate: passed to ``train_state_factory`` (print the networks' summary).

        Returns:
            ``(key, state)``: the agent's PRNG key ``(2,)`` uint32 and ``train_state_factory``'s
            state, split from ``PRNGKey(seed)``.
        """
        key, state_key = jax.random.split(jax.random.PRNGKey(seed))
        state = self.train_state_factory(state_key, self.config, preprocess_fn=self.preprocess_fn, tabulate=tabulate)
        return key, state

    def check_buffer_memory(self, copies: int = 1) -> None:
        """Refuses to train when ``copies`` buffers of this agent (seeds trained together) cannot
        fit in the memory available (``kitae.buffer.check_buffer_memory``): a lower bound of their
        bytes, the observations and actions of ``update_cfg.max_buffer_size`` rows of
        ``n_envs * n_agents`` transitions (``kitae.buffer.space_nbytes`` of the config's spaces).
        A run checks it before it writes anything (``kitae train``, ``agent.train``); making an
        agent does not (``kitae eval`` of a run trained on a larger machine needs no buffer).

        Raises:
            ValueError: naming ``update_cfg.max_buffer_size``, the bytes needed and the rows that fit.
        """
        env_cfg, capacity = self.config.env_cfg, self.config.update_cfg.max_buffer_size
        transition = space_nbytes(env_cfg.observation_space)
        transition *= 2 if "next_observation" in getattr(self.experience_type, "_fields", ()) else 1
        transition += space_nbytes(env_cfg.action_space)
        need = copies * capacity * env_cfg.n_envs * env_cfg.n_agents * transition
        check_buffer_memory(need, capacity, "update_cfg.max_buffer_size", copies)

    # -- acting ---------------------------------------------------------------------------------

    def acting_params(self, state: Any) -> Any:
        """The part of ``state`` that ``act`` reads (default: all of it). Algorithms return less
        (SAC: the policy without its optimizer state), so that acting hands a compiled function a
        few arrays and a remote actor needs only those.

        Args:
            state: the agent's train state (a pytree; each leaf returned keeps its shape).

        Returns:
            A pytree of some of ``state``'s leaves, unchanged.
        """
        return state

    def act(
        self, acting_params: Any, key: jax.Array, observation: Any, env_step: Any, deterministic: bool = False
    ) -> tuple[Any, Any]:
        """Acts as a pure function: the same inputs give the same actions.

        Args:
            acting_params: ``acting_params(state)``.
            key: a PRNG key (split per agent in multi-agent mode).
            observation: ``(E, *obs_shape)`` (dicts keyed by agent in multi-agent mode).
            env_step: environment transitions so far, an int32 scalar (possibly traced).
            deterministic: the greedy / mean action (``select_action``) instead of exploring.

        Returns:
            ``(actions (E, ...), log_probs (E,))``.

        Built-in algorithms override this. The default runs ``explore`` (or ``select_action``)
        with the agent's ``state``, ``key`` and ``env_step`` swapped for the given values during
        the call: meant to be traced (``jax.jit``, the compiled loop), which gives a pure program
        from an ``explore`` written against the agent's attributes.
        """
        # swapped whole, the agent's own (key, state) untouched: computed or not, it stays as it was
        saved = self._first, self.env_step, self._pure_keys
        self._first, self.env_step, self._pure_keys = (key, acting_params), env_step, True
        try:
            return self.select_action(observation) if deterministic else self.explore(observation)
        finally:
            self._first, self.env_step, self._pure_keys = saved

    def act_extras(self, acting_params: Any, observation: Any, hidden: Any = None, start: Any = None) -> dict[str, Any]:
        """What the acting parameters predict besides the action, as a pure function of them:
        seed 003's ``acting_step`` returns it in ``other`` beside the log-probability.

        Args:
            acting_params: ``acting_params(state)``.
            observation: ``(E, *obs_shape)`` (dicts keyed by agent in multi-agent mode).
            hidden, start: a recurrent agent's hidden state before the step and its ``start``
                flags ``(E,)`` (``act_recurrent``'s); feed-forward agents ignore them.

        Returns:
            A dict of arrays with a leading ``E`` (each a dict keyed by agent in multi-agent
            mode). Default ``{}``: agents without a state-value critic (DQN, SAC, ...) predict
            nothing else. The actor-critics return ``{"value": V(observation) (E,)}``.
        """
        del acting_params, observation, hidden, start
        return {}

    def initial_hidden(self, n: int) -> Any:
        """A recurrent agent's initial hidden state of ``n`` rows (leaves ``(n, ...)``)."""
        raise TypeError(f"{type(self).__name__} is feed-forward: it has no hidden state")

    def act_recurrent(
        self,
        acting_params: Any,
        key: jax.Array,
        observation: Any,
        hidden: Any,
        start: jax.Array,
        env_step: Any,
        deterministic: bool = False,
    ) -> tuple[Any, Any, Any]:
        """A recurrent agent's pure act: ``(actions (E, ...), log_probs (E,), hidden)`` from the
        observations, the hidden state (leaves ``(E, ...)``) and ``start`` ``(E,)`` (where it
        holds the observation starts an episode: act from the initial state)."""
        raise TypeError(f"{type(self).__name__} is feed-forward: it acts with act(), without a hidden state")

    def _acting_name(self, recurrent: bool = False) -> str:
        """What acting runs, as the messages of ``kitae.loops.collect.check_act_output`` name it:
        ``act_recurrent``, ``act``, or for an agent of the custom-agent guide (``BaseAgent.act``
        runs its ``explore``) its ``explore`` and the ``explore_fn`` that one calls."""
        cls = type(self)
        if recurrent:
            return f"{cls.__name__}.act_recurrent"
        if cls.act is BaseAgent.act:
            return f"{cls.__name__}.explore (explore_fn)"
        return f"{cls.__name__}.act"

    def explore(self, observation: Any) -> tuple[jax.Array, jax.Array]:
        """Samples actions to explore with the agent's state at ``self.env_step`` (one compiled
        call of ``act``): ``(actions (E, ...), log_probs (E,))``.

        Raises:
            ValueError: for observations that do not fit ``config.env_cfg.observation_space``.
        """
        check_observation(self.config.env_cfg.observation_space, observation, self.parallel)
        return self._act_jit(self.acting_params(self.state), self.nextkey(), observation, step_array(self.env_step))

    def select_action(self, observation: Any) -> tuple[jax.Array, jax.Array]:
        """Deterministic actions (greedy class / mean action): ``(actions (E, ...), log_probs (E,))``.

        Raises:
            ValueError: for observations that do not fit ``config.env_cfg.observation_space``.
        """
        check_observation(self.config.env_cfg.observation_space, observation, self.parallel)
        return self._act_jit(
            self.acting_params(self.state), self.nextkey(), observation, step_array(self.env_step), deterministic=True
        )

    # -- keys -----------------------------------------------------------------------------------

    def nextkey(self) -> jax.Array:
        """Returns a fresh PRNG key derived from the agent's key: a raw ``(2,)`` uint32 key (a NumPy
        array on the host, a JAX array when traced).

        On the host, keys are split from ``self.key`` a block of ``KEY_BLOCK`` at a time (one
        compiled call per block instead of one dispatch per key). Inside ``act`` (traced), the key
        given to ``act`` is split directly. Both are deterministic functions of the seed.
        """
        if self._pure_keys or isinstance(self.key, jax.core.Tracer):
            self.key, key = jax.random.split(self.key)
            return key
        if self._key_index >= len(self._key_block):
            keys = np.asarray(_split_block(self.key))
            self.key, self._key_block, self._key_index = keys[0], keys[1:], 0
        key = self._key_block[self._key_index]
        self._key_index += 1
        return key

    def interact_keys(self, observation: Any) -> jax.Array | dict[str, jax.Array]:
        """One key ``(2,)`` for a batch of observations ``(E, *obs_shape)``, or one key per agent,
        ``{agent: key (2,)}``, in multi-agent mode (``observation`` a dict keyed by agent)."""
        return agent_keys(self.nextkey(), observation, self.parallel)

    # -- updates --------------------------------------------------------------------------------

    @abc.abstractmethod
    def make_buffer(self) -> Any:
        """A new host-side holder of the buffer this kind of agent learns from (empty)."""

    @abc.abstractmethod
    def _make_update_fn(self) -> Callable:
        """The pure ``(state, key, data) -> (state, info)`` function that ``update`` compiles;
        the executors call the same function."""

    @abc.abstractmethod
    def update_data(self, buffer_state: BufferState) -> Any:
        """What ``update_fn`` takes from the buffer: the rollout (on-policy) or the buffer itself."""

    def update_with_replay(self, state: Any, key: jax.Array, buffer_state: BufferState) -> tuple[Any, Any, dict]:
        """One whole update from the buffer (pure): ``update_fn`` on ``update_data(buffer_state)``.

        Returns:
            ``(state, priorities, info)``: ``priorities`` the buffer's new prioritized-replay
            ``Priorities`` (an off-policy agent with ``config.replay.prioritized``), else ``None``.
        """
        state, info = self.update_fn(state, key, self.update_data(buffer_state))
        return state, None, info

    def update(self, buffer: Any) -> dict[str, float]:
        """Runs one compiled update (processing and every gradient step) on the buffer's data.

        Returns:
            The mean of each info entry over the gradient steps, as floats.
        """
        if buffer.size == 0:  # never filled, or emptied by reset()
            raise RuntimeError(f"cannot update from an empty {type(buffer).__name__}")
        self.state, priorities, info = self._update_jit(self.state, self.nextkey(), buffer.state)
        if priorities is not None:
            buffer.set_priorities(priorities)
        self.n_updates += 1
        if self.schedule.on_policy:
            buffer.reset()
        return {name: float(value) for name, value in jax.device_get(info).items()}  # one transfer

    def should_update(self, step: int, buffer: Any) -> bool:
        """Whether an update is due after the vector step that brought training to ``step``
        (``self.schedule.update_due``)."""
        return bool(self.schedule.update_due(step, buffer.size))

    # -- runs -----------------------------------------------------------------------------------

    def train(self, env: Any, n_env_steps: int | None = None, *, callbacks: Any = (), quiet: bool = True) -> Any:
        """Trains in ``env`` for ``n_env_steps`` more environment transitions summed over all
        environments (default: ``config.train_cfg.n_env_steps``), writing the run directory as
        ``kitae train`` does: ``config.yaml``, ``checkpoints/<step>/`` (every
        ``train_cfg.save_frequency`` steps and at the end), ``logs/``, ``metrics.jsonl``,
        ``summary.json`` and ``curve.png`` in ``self.run_dir``.

        A Gymnasium, EnvPool or PettingZoo environment trains in the host loop; a JAX environment
        (``kitae.envs.make.make_jax_env("gymnax:CartPole-v1", 4)``) in the compiled loop: the
        whole run as one XLA program. A run is whole iterations (``kitae.schedule``): the
        transitions are rounded up. The agent's state, keys, buffer and counters are those at the
        end, so a second call goes on from there. A call that ends past
        ``config.train_cfg.n_env_steps`` makes its end the run's total (``reconfigure``;
        ``config.yaml`` records it), as ``kitae resume --steps`` does.

        Args:
            env: a Gymnasium environment or vector environment, a PettingZoo ``ParallelEnv``, a
                ``kitae.envs.parallel.VecParallelEnv`` or a ``kitae.envs.jax_env.VecJaxEnv``.
            n_env_steps: transitions to train for, summed over environments.
            callbacks: more ``kitae.loops.callbacks.Callback`` objects (progress, logging, stopping).
            quiet: no progress bar.

        Returns:
            A ``kitae.loops.result.RunResult``.
        """
        return run_service().train(self, env, n_env_steps, callbacks=callbacks, quiet=quiet)

    def train_distributed(
        self,
        env_id: str,
        n_env_steps: int | None = None,
        *,
        workers: int = 2,
        gradient_workers: int = 1,
        async_collection: bool = False,
        async_gradients: bool = False,
        address: str | None = None,
        callbacks: Any = (),
        quiet: bool = True,
    ) -> Any:
        """Trains on Ray (``kitae.distributed``), as ``kitae train ... --workers N`` does: ``workers``
        collection workers each step ``env_cfg.n_envs / workers`` copies of ``env_id``, gradient
        workers compute the updates, and this process applies them and writes the run directory.
        The layout is recorded in the agent's ``config.distributed`` (and ``config.yaml``), and
        stays there: ``resume`` and later ``train`` calls go on distributed and take an environment
        id (an environment object is refused); ``agent.config = dataclasses.replace(agent.config,
        distributed=None)`` trains in this process again.

        Args:
            env_id: the environment id (``"CartPole-v1"``, ``"envpool:Pong-v5"``...); one other
                than the config's own must have ``env_cfg``'s spaces (checked before Ray starts)
                and becomes ``env_cfg.task_name`` in this agent's config and ``config.yaml``.
            n_env_steps: transitions to train for, summed over all environments.
            workers, gradient_workers, async_collection, async_gradients, address: see
                ``kitae.config.DistributedConfig``.
            callbacks, quiet: as ``train``.

        Returns:
            A ``kitae.loops.result.RunResult``.
        """
        layout = DistributedConfig(
            workers=workers,
            gradient_workers=gradient_workers,
            async_collection=async_collection,
            async_gradients=async_gradients,
            address=address,
        )
        self.config = dataclasses.replace(self.config, distributed=layout)
        return self.train(env_id, n_env_steps, callbacks=callbacks, quiet=quiet)

    def save(self, step: int | None = None, directory: str | Path | None = None) -> Path:
        """Saves the agent's whole state (``kitae.runs.checkpoints``) to ``<directory>/<step>/``
        (default ``<run_dir>/checkpoints/<env_step>/``); returns the checkpoint folder."""
        return run_service().save(self, step, directory)

    def resume(self, env: Any, n_env_steps: int | None = None, *, callbacks: Any = (), quiet: bool = True) -> Any:
        """Restores the newest readable checkpoint of ``<run_dir>/checkpoints`` and trains on until
        ``n_env_steps`` transitions IN ALL (default ``config.train_cfg.n_env_steps``), as
        ``kitae resume`` does. Another total becomes the run's, as with ``kitae resume --steps``:
        ``config.yaml`` and the agent's config record it (``reconfigure``)."""
        return run_service().resume(self, env, n_env_steps, callbacks=callbacks, quiet=quiet)

    @classmethod
    def unserialize(cls, run_dir: str | Path, seed_index: int = 0, checkpoint: int | str | None = None) -> BaseAgent:
        """Rebuilds an agent of this class from a run directory: ``config.yaml`` and a checkpoint
        (as ``kitae eval`` does).

        Args:
            run_dir: the run directory.
            seed_index: which seed of a run of several seeds.
            checkpoint: ``None`` (or ``"newest"``) for the newest readable checkpoint, ``"best"`` for the
                best-evaluated one (a run trained with ``train_cfg.eval_episodes``), or a step
                whose checkpoint is on disk.
        """
        agent_cls = None if cls in (BaseAgent, OffPolicyAgent, OnPolicyAgent) else cls
        return run_service().load(agent_cls, run_dir, seed_index, checkpoint)


class OffPolicyAgent(BaseAgent):
    """An agent that learns from a replay buffer.

    The buffer keeps ``max_buffer_size`` vector steps (``max_buffer_size * n_envs * n_agents``
    transitions). One update runs ``n_epochs`` gradient steps in one compiled call, each on
    ``batch_size`` transitions sampled uniformly from the buffer and processed with the current
    state (so targets use the latest parameters).

    When updates happen is ``kitae.schedule.Schedule``'s rule, which reads two fields of
    ``config.algo_params`` when it has them: ``start_step`` (no update before this many
    transitions; default 0) and ``skip_steps`` (one update per vector step that crosses a multiple
    of ``skip_steps`` transitions; default 1).
    """

    algo_type = AlgoType.OFF_POLICY

    def make_buffer(self) -> ReplayBuffer:
        """An empty ``ReplayBuffer`` of ``update_cfg.max_buffer_size`` rows (vector steps),
        prioritized when ``config.replay.prioritized``."""
        return ReplayBuffer(self.config.update_cfg.max_buffer_size, prioritized=self.config.replay.prioritized)

    def _make_update_fn(self) -> Callable:
        update_with_replay = self.update_with_replay

        def update_fn(state: Any, key: jax.Array, buffer_state: Any) -> tuple[Any, dict]:
            state, _, info = update_with_replay(state, key, buffer_state)
            return state, info

        return update_fn

    def update_with_replay(self, state: Any, key: jax.Array, buffer_state: BufferState) -> tuple[Any, Any, dict]:
        """One whole update (pure): ``n_epochs`` gradient steps, each on a minibatch sampled from
        ``buffer_state`` as ``config.replay`` says (``gradient_sample``) and processed with the
        current state. With prioritized replay each step's TD errors (``info["td_error"]``)
        become the sampled transitions' priorities before the next step samples.

        Returns:
            ``(state, priorities, info)``: the new state, the buffer's new ``Priorities`` (``None``
            without prioritized replay) and the mean of each ``info`` scalar over the steps.
        """
        replay = self.config.replay
        update_step_fn = checked_update_step(self.update_step_fn, type(self).__name__, replay.prioritized)

        def gradient_step(carry: tuple[Any, Any], key: jax.Array) -> tuple[tuple[Any, Any], dict]:
            state, priorities = carry
            batch, update_key, indices = self.gradient_sample(state, key, buffer_state._replace(priorities=priorities))
            state, info = update_step_fn(state, update_key, batch)
            if priorities is not None:
                td_error = info.pop("td_error", None)
                if td_error is None:
                    raise ValueError(
                        f"replay.prioritized=True needs {type(self).__name__}'s update step to return info['td_error'] "
                        "(B,), the TD errors of its minibatch"
                    )
                assert indices is not None  # prioritized sampling always says which items it drew
                if np.shape(td_error) != np.shape(indices):  # checked while traced: no cost per step
                    raise ValueError(
                        f"{type(self).__name__}'s update step returned info['td_error'] of shape "
                        f"{tuple(np.shape(td_error))}; allowed: ({np.shape(indices)[0]},), one TD error per "
                        "transition of its minibatch (replay.prioritized=True)"
                    )
                priorities = update_priorities(
                    priorities, indices, td_error, replay.priority_exponent, replay.priority_epsilon
                )
            return (state, priorities), info

        (state, priorities), infos = jax.lax.scan(
            gradient_step, (state, buffer_state.priorities), self.gradient_step_keys(key)
        )
        return state, priorities, mean_over_steps(infos)

    def gradient_step_keys(self, key: jax.Array) -> jax.Array:
        """The keys of an update's ``n_epochs`` gradient steps, ``(n_epochs, 2)``."""
        return jax.random.split(key, self.config.update_cfg.n_epochs)

    def gradient_sample(
        self, state: Any, step_key: jax.Array, buffer_state: BufferState, pipeline: ExperiencePipeline | None = None
    ) -> tuple[Any, jax.Array, jax.Array | None]:
        """The minibatch of one gradient step, the key of its update step and the sampled items
        (pure): ``(sample_key, process_key, update_key) = split(step_key, 3)``; ``batch_size``
        transitions sampled as ``config.replay`` says (uniform one-step transitions by default:
        ``kitae.buffer.buffer_sample``; else ``kitae.replay.sampling.sample_transitions``) and
        processed with ``state`` (so targets use the latest parameters) by ``pipeline`` (default the
        agent's ``process_experience_pipeline``).

        Returns:
            ``(batch, update_key, indices)``: the processed minibatch (leaves ``(batch_size, ...)``),
            and the sampled items ``(batch_size,)`` (``None`` for the default replay).
        """
        sample_key, process_key, update_key = jax.random.split(step_key, 3)
        replay, batch_size = self.config.replay, self.config.update_cfg.batch_size
        indices = None
        if replay.uniform_one_step:
            sample = buffer_sample(buffer_state, sample_key, batch_size)
        else:
            beta: float | jax.Array = 1.0
            if buffer_state.priorities is not None:
                horizon = self.schedule.n_gradient_steps(self.config.train_cfg.n_env_steps)
                beta = annealed_beta(replay.importance_exponent, buffer_state.priorities.steps, horizon)
            sample, indices = sample_transitions(
                buffer_state,
                sample_key,
                batch_size,
                replay,
                gamma=getattr(self.config.algo_params, "gamma", 1.0),
                beta=beta,
                reward_fn=self.goal_reward_fn,
            )
        pipeline = self.process_experience_pipeline if pipeline is None else pipeline
        return pipeline.run(state, process_key, sample), update_key, indices

    def gradient_batch(
        self, state: Any, step_key: jax.Array, buffer_state: BufferState, pipeline: ExperiencePipeline | None = None
    ) -> tuple[Any, jax.Array]:
        """``gradient_sample`` without the sampled items: ``(batch, update_key)`` (what a
        distributed gradient worker computes gradients on)."""
        batch, update_key, _ = self.gradient_sample(state, step_key, buffer_state, pipeline)
        return batch, update_key

    def update_data(self, buffer_state: BufferState) -> BufferState:
        """The whole buffer (the update samples its minibatches from it)."""
        return buffer_state


class OnPolicyAgent(BaseAgent):
    """An agent that learns from fresh rollouts.

    The rollout buffer collects ``max_buffer_size`` vector steps; when it is full, one compiled
    update processes the rollout (``(T, E, ...)`` lifted through the ``ExperiencePipeline``) and
    runs ``n_epochs`` epochs of shuffled minibatches of ``batch_size`` with ``update_epoch``; then
    the buffer is emptied.

    Two pure hooks run around every update, in every executor: ``prepare_update(state, rollout)``
    before the processing and ``finish_update(state, rollout)`` after the last gradient step
    (both the identity unless ``update_hooks`` makes them: running statistics kept in the state,
    such as PPO's normalisation, change there). The fused update composes them
    (``_make_update_fn``); the distributed executor, which runs the update one gradient step at
    a time, runs them on the updater's state (``kitae.distributed.AgentAlgorithm``).
    """

    algo_type = AlgoType.ON_POLICY

    def make_buffer(self) -> RolloutBuffer:
        """An empty ``RolloutBuffer`` of ``update_cfg.max_buffer_size`` rows (vector steps): the
        rollout, cleared after each update."""
        return RolloutBuffer(self.config.update_cfg.max_buffer_size)

    @property
    def minibatch_rows(self) -> int:
        """Rows of the processed experience per minibatch: ``batch_size`` transitions (a recurrent
        agent's rows are whole sequences: it says how many)."""
        return self.config.update_cfg.batch_size

    def update_hooks(self, config: AlgoConfig) -> UpdateHooks:
        """The hooks run around the update, made from ``config`` (``kitae.algos.update.UpdateHooks``:
        ``prepare`` before processing, ``finish`` after the epochs, each ``(state, rollout) ->
        state`` or ``None``). Default: none. Agents with running statistics of the rollout
        override it; ``kitae.distributed.AgentAlgorithm`` calls it with a config whose learning
        parameters changed during training."""
        del config
        return UpdateHooks()

    def prepare_update(self, state: Any, rollout: Any) -> Any:
        """What happens to the state before an update's processing (pure; the identity unless
        ``update_hooks`` says otherwise). ``rollout``: leaves ``(T, E, ...)``."""
        prepare = self.update_hooks(self.config).prepare
        return state if prepare is None else prepare(state, rollout)

    def finish_update(self, state: Any, rollout: Any) -> Any:
        """What happens to the state after an update's last gradient step (pure; the identity
        unless ``update_hooks`` says otherwise). ``rollout``: leaves ``(T, E, ...)``."""
        finish = self.update_hooks(self.config).finish
        return state if finish is None else finish(state, rollout)

    def _make_update_fn(self) -> Callable:
        """``prepare_update``, ``on_policy_update`` (processing and the minibatch epochs), then
        ``finish_update``: one pure function."""
        update_fn = partial(
            on_policy_update,
            self.process_experience_pipeline,
            checked_update_step(self.update_step_fn, type(self).__name__),
            n_epochs=self.config.update_cfg.n_epochs,
            batch_size=self.minibatch_rows,
        )
        return with_update_hooks(self.update_hooks(self.config), update_fn)

    def process_rollout(
        self, state: Any, key: jax.Array, rollout: Any, pipeline: ExperiencePipeline | None = None
    ) -> tuple[Any, jax.Array]:
        """The first part of an update (pure): ``(process_key, epochs_key) = split(key)``; the
        rollout (leaves ``(T, E, ...)``) goes through ``pipeline`` (default the agent's
        ``process_experience_pipeline``) with ``state``.

        Returns:
            ``(processed, epoch_keys)``: the processed experience (leaves ``(N, ...)``) and one key
            per epoch, ``(n_epochs, 2)`` (each epoch's minibatches:
            ``kitae.algos.update.epoch_minibatches``).
        """
        pipeline = self.process_experience_pipeline if pipeline is None else pipeline
        return process_rollout(pipeline, state, key, rollout, self.config.update_cfg.n_epochs)

    def update_data(self, buffer_state: BufferState) -> Any:
        """The rollout in time order, leaves ``(T, E, ...)``."""
        return buffer_rollout(buffer_state)
