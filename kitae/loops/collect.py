"""The collection and update steps, written once for every executor.

The compiled loop traces these functions inside its program; the host loop calls them compiled
(``compiled_steps(agent)``, one XLA call each). Both therefore split the loop key the same way
(``kitae.loops.state``), build the same experience and make the same updates.

Recurrent agents (``agent.recurrent``) carry a ``Memory`` per environment from one step to the
next: the hidden state and the flag ``start`` (the observation about to be acted on is the first
of an episode). The rule, the same in every executor: a fresh environment starts every row;
after a step, a row starts again where its episode ended (terminated or truncated alike), and
the agent's ``act_recurrent`` acts from the initial state where ``start`` holds
(``kitae.modules.recurrent.reset_hidden``). In a multi-agent environment each agent carries its
own hidden state: both fields are dicts keyed by agent, and an environment's episode ends for all
its agents at once (the copy resets when every agent is done). Feed-forward agents carry ``None``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from kitae.envs.spaces import element_shape

__all__ = [
    "Memory",
    "initial_memory",
    "next_memory",
    "act_step",
    "check_act_output",
    "describe",
    "update_step",
    "UpdateOutcome",
    "all_finite",
    "make_experience",
    "compiled_steps",
    "CompiledSteps",
    "CompiledAct",
    "FlatActing",
]


class Memory(NamedTuple):
    """What a recurrent agent carries per environment between two steps.

    Attributes:
        hidden: the hidden state, leaves ``(E, ...)`` (``agent.initial_hidden(E)``'s structure):
            the state after the last step, before any reset; ``{agent: ...}`` in a multi-agent
            environment.
        start: ``(E,)`` bool: the next observation is the first of an episode; ``{agent: (E,)}``
            in a multi-agent environment (the same flags for every agent).
    """

    hidden: Any
    start: Any


def initial_memory(agent: Any, n_envs: int, agents: tuple[str, ...] | None = None) -> Memory | None:
    """Fresh environments: the initial hidden state, every row starting; ``None`` for a
    feed-forward agent.

    Args:
        agent: the agent (its ``recurrent`` flag and ``initial_hidden``).
        n_envs: environments ``E``.
        agents: a multi-agent environment's agents (each gets its own state), or ``None``.
    """
    if not getattr(agent, "recurrent", False):
        return None
    start = jnp.ones((n_envs,), bool)
    if agents is None:
        return Memory(agent.initial_hidden(n_envs), start)
    return Memory({a: agent.initial_hidden(n_envs) for a in agents}, dict.fromkeys(agents, start))


def next_memory(memory: Memory | None, hidden: Any, ended: Any) -> Memory | None:
    """The memory after a step: the hidden state ``act_step`` returned, and ``start`` where the
    step ended an episode (``ended``: ``(E,)`` bool, terminated or truncated; in a multi-agent
    environment the copy's episode, for all its agents)."""
    if memory is None:
        return None
    ended = jnp.asarray(ended, bool)
    if isinstance(memory.start, dict):
        return Memory(hidden, dict.fromkeys(memory.start, ended))
    return Memory(hidden, ended)


def act_step(
    agent: Any,
    acting_params: Any,
    key: jax.Array,
    observation: Any,
    env_step: jax.Array,
    fold: int | None = None,
    memory: Memory | None = None,
) -> tuple[Any, Any, jax.Array, Any]:
    """One act of a run: ``(key, act_key) = split(key)``, then ``agent.act`` with ``act_key``
    (a recurrent agent: ``agent.act_recurrent`` with its ``memory``).

    Args:
        agent: the agent (its pure ``act``, or ``act_recurrent``).
        acting_params: ``agent.acting_params(state)``.
        key: the loop key.
        observation: ``(E, *obs_shape)`` (dicts keyed by agent in multi-agent mode).
        env_step: environment steps so far, an int32 scalar.
        fold: acting with ``fold_in(act_key, fold)`` instead (a distributed collection worker's
            own share of the step, when several collect with the same loop key); the loop key
            advances the same.
        memory: a recurrent agent's ``Memory`` (``None`` for a feed-forward agent).

    Returns:
        ``(actions, log_probs, next loop key, hidden)``; log-probabilities as float32; ``hidden``
        the recurrent agent's state after acting (``None`` for a feed-forward agent).
    """
    key, act_key = jax.random.split(key)
    if fold is not None:
        act_key = jax.random.fold_in(act_key, fold)
    hidden = None
    if memory is None:
        out = agent.act(acting_params, act_key, observation, env_step)
        check_act_output(agent, observation, out)
        actions, log_probs = out
    else:
        out = agent.act_recurrent(acting_params, act_key, observation, memory.hidden, memory.start, env_step)
        check_act_output(agent, observation, out, recurrent=True)
        actions, log_probs, hidden = out
    log_probs = jax.tree_util.tree_map(lambda x: jnp.asarray(x, jnp.float32), log_probs)
    return actions, log_probs, key, hidden


def _acting_name(agent: Any, recurrent: bool) -> str:
    """What the messages of ``check_act_output`` name: the agent's own name for it
    (``BaseAgent._acting_name``: ``explore`` and its ``explore_fn`` for an agent of the
    custom-agent guide), else its ``act`` or ``act_recurrent``."""
    named = getattr(agent, "_acting_name", None)
    if callable(named):
        return str(named(recurrent))
    return f"{type(agent).__name__}.{'act_recurrent' if recurrent else 'act'}"


def describe(value: Any) -> str:
    """A returned value in a message: ``None``, an array's shape, a tuple's length or a type."""
    if value is None:
        return "None"
    if isinstance(value, (jax.Array, np.ndarray, np.generic)):
        return f"an array of shape {_shape_text(tuple(np.shape(value)))}"
    if isinstance(value, (tuple, list)):
        return f"a {type(value).__name__} of {len(value)}"
    return f"a value of type {type(value).__name__}"


def _shape_text(shape: tuple[int, ...]) -> str:
    return "(" + ", ".join(str(n) for n in shape) + ("," if len(shape) == 1 else "") + ")"


def check_act_output(agent: Any, observation: Any, out: Any, recurrent: bool = False) -> None:
    """Checks what an agent's act returned against ``config.env_cfg.action_space``, before an
    environment or a buffer sees it: a pair ``(actions, log_probs)`` (a triple with the hidden
    state for ``act_recurrent``), actions ``(E, *action_shape)`` (``kitae.envs.spaces.element_shape``: ``(E,)`` for
    a ``Discrete`` space, ``(E, *shape)`` for a ``Box``, ``(E, n)`` for a ``MultiDiscrete`` of
    ``n`` components) and log-probabilities ``(E,)``, where ``E`` is the observations' leading
    axis; in a multi-agent environment (``env_cfg.n_agents > 1``) dicts keyed by agent, each entry
    so. Only shapes are read: traced (the loops compile acting once), it costs nothing per step.
    Spaces of another kind (``Dict``, ``Tuple``) are not checked; neither are an agent without a
    config and observations without a leading axis.

    Raises:
        TypeError: for an output that is not the pair (triple), or multi-agent actions or
            log-probabilities that are not dicts keyed by agent.
        ValueError: one line naming the function, the output, its shape, the space and the
            shape allowed.
    """
    name = _acting_name(agent, recurrent)
    arity, returns = (3, "(actions, log_probs, hidden)") if recurrent else (2, "(actions, log_probs)")
    if not isinstance(out, (tuple, list)) or len(out) != arity:
        raise TypeError(f"{name} returned {describe(out)}; allowed: {returns}")
    config = getattr(agent, "config", None)
    env_cfg = getattr(config, "env_cfg", None)
    leaves = jax.tree_util.tree_leaves(observation)
    if env_cfg is None or not leaves or np.ndim(leaves[0]) == 0:
        return
    n_envs = int(np.shape(leaves[0])[0])
    space = env_cfg.action_space
    expected = element_shape(space)
    parallel = bool(getattr(agent, "parallel", getattr(env_cfg, "n_agents", 1) > 1))
    per_agent = " per agent" if parallel else ""
    layout = f"with {n_envs} environment{'s' if n_envs != 1 else ''}{per_agent}"
    for what, value, shape, allowed in (
        ("actions", out[0], expected, f"allowed for {space} {layout}"),
        ("log_probs", out[1], (), f"allowed {layout}"),
    ):
        if shape is None:
            continue
        if parallel:
            if not isinstance(value, Mapping):
                raise TypeError(
                    f"{name} returned {what} as {describe(value)}; allowed in a multi-agent environment "
                    f"(env_cfg.n_agents={env_cfg.n_agents}): a dict keyed by agent"
                )
            entries = [(f"{what}[{agent_name!r}]", v) for agent_name, v in value.items()]
        else:
            entries = [(what, value)]
        wanted = (n_envs, *shape)
        for label, entry in entries:
            found = tuple(np.shape(entry)) if _is_array_like(entry) else None
            if found != wanted:
                given = f"of shape {_shape_text(found)}" if found is not None else f"as {describe(entry)}"
                raise ValueError(f"{name} returned {label} {given}; {allowed}: {_shape_text(wanted)}")


def _is_array_like(x: Any) -> bool:
    """An array, a traced value or a number (what ``np.shape`` reads without converting a list)."""
    return isinstance(x, (jax.Array, np.ndarray, np.generic, int, float, bool))


def all_finite(tree: Any) -> jax.Array:
    """Whether every floating-point leaf of ``tree`` holds only finite numbers, a bool scalar
    (computed where the arrays are: inside a compiled program it costs no transfer)."""
    by_dtype: dict[Any, list[jax.Array]] = {}
    for x in jax.tree_util.tree_leaves(tree):
        if isinstance(x, (jax.Array, np.ndarray)) and jnp.issubdtype(x.dtype, jnp.floating):
            by_dtype.setdefault(x.dtype, []).append(jnp.ravel(x))
    if not by_dtype:
        return jnp.ones((), bool)
    # One reduction over all the leaves of a dtype: XLA fuses the concatenation into it, where a
    # check per leaf made two kernels per leaf for XLA to compile (74 of the 529 in PPO's compiled
    # training program). Leaves are not cast, so a finite float64 never reads as an overflow.
    flags = [jnp.all(jnp.isfinite(jnp.concatenate(xs))) for xs in by_dtype.values()]
    return jnp.all(jnp.stack(flags))


class UpdateOutcome(NamedTuple):
    """What one update of a run gives (``update_step``).

    Attributes:
        agent_state: the state after the update, or the state before it where the update was not
            kept (its result was not finite, or ``active`` was false).
        key: the next loop key.
        info: the mean of each entry of the update's info over its gradient steps (as computed,
            not finite values included: they say what diverged).
        priorities: the buffer's prioritized-replay priorities after the update (before it where
            it was not kept); ``None`` unless the agent samples by priority.
        finite: whether the update's losses and the new state were all finite (bool scalar).
    """

    agent_state: Any
    key: jax.Array
    info: dict
    priorities: Any
    finite: jax.Array


def update_step(agent: Any, agent_state: Any, key: jax.Array, buffer_state: Any, active: Any = True) -> UpdateOutcome:
    """One update of a run: ``(key, update_key) = split(key)``, then ``agent.update_with_replay``
    (``agent.update_fn`` on ``agent.update_data(buffer_state)``). An update whose losses or new
    state hold a non-finite number is not kept (the run has diverged: every executor stops it,
    keeping the last finite state); neither is one made while ``active`` (bool, possibly traced)
    is false (a compiled run that diverged earlier).

    Returns:
        An ``UpdateOutcome``; the executor puts its ``priorities`` in its buffer.
    """
    key, update_key = jax.random.split(key)
    new_state, priorities, info = agent.update_with_replay(agent_state, update_key, buffer_state)
    finite = jnp.logical_and(all_finite(new_state), all_finite(info))
    keep = jnp.logical_and(finite, active)

    def kept(new: Any, old: Any) -> Any:
        # A conditional, not a select per leaf: the same values, without a kernel per leaf for
        # XLA to compile (under vmap, with seeds or configurations, it becomes those selects).
        return jax.lax.cond(keep, lambda: new, lambda: old)

    agent_state = kept(new_state, agent_state)
    if priorities is not None:
        priorities = kept(priorities, buffer_state.priorities)
    return UpdateOutcome(agent_state, key, info, priorities, finite)


def make_experience(
    experience_type: type[Any],
    *,
    observation: Any,
    action: Any,
    reward: Any,
    done: Any,
    next_observation: Any,
    log_prob: Any,
    truncated: Any,
    memory: Memory | None = None,
) -> Any:
    """One vector step as the agent's experience type (its fields are a subset of
    ``kitae.buffer.Experience``'s, filled by name; a recurrent agent's type adds ``start`` and
    ``hidden``, the ``memory`` it acted with). ``done`` is termination; ``truncated`` a cut;
    ``next_observation`` the real next observation (the final one where an episode ended).

    Every array is one vector step: ``observation`` and ``next_observation`` ``(E, *obs_shape)``,
    ``action`` ``(E, ...)``, ``reward``, ``done``, ``truncated`` and ``log_prob`` ``(E,)`` (in
    multi-agent mode, dicts keyed by agent of these); they are stored as given."""
    fields = {
        "observation": observation,
        "action": action,
        "reward": reward,
        "done": done,
        "next_observation": next_observation,
        "log_prob": log_prob,
        "truncated": truncated,
    }
    if memory is not None:  # stored only where the type has the fields (a recurrent PPO's, not DDPG's noise)
        fields.update(start=memory.start, hidden=memory.hidden)
    # fields the loops do not fill (n_steps, weight: set on sampled transitions only) stay None
    return experience_type(**{name: fields.get(name) for name in experience_type._fields})


class FlatActing(NamedTuple):
    """Acting parameters flattened once (``CompiledAct.prepare``): the host loop acts many times
    with the same parameters, and flattening an agent's state (dataclasses and dicts, flattened
    in Python) on every call cost about a third of a call's dispatch (PPO on CartPole: 46 -> 26
    µs per call)."""

    leaves: list
    treedef: Any


class CompiledAct:
    """``act_step`` of one agent as one XLA call: ``act(acting, key, observation, env_step,
    memory=None) -> (actions, log_probs, key, hidden)``, where ``acting`` is
    ``agent.acting_params(state)`` or, faster when it is used for many calls, ``prepare(acting)``
    of it. Both give the same program and the same bits.

    Args:
        agent: the agent (its pure ``act``, or ``act_recurrent``).
        fold: ``act_step``'s ``fold`` (a distributed collection worker's share of the step).
    """

    def __init__(self, agent: Any, fold: int | None = None) -> None:
        self.agent, self.fold = agent, fold
        self._by_treedef: dict[Any, Callable[..., Any]] = {}

    @staticmethod
    def prepare(acting: Any) -> FlatActing:
        """``acting`` flattened for repeated calls."""
        leaves, treedef = jax.tree_util.tree_flatten(acting)
        return FlatActing(leaves, treedef)

    def __call__(
        self, acting: Any, key: jax.Array, observation: Any, env_step: Any, memory: Memory | None = None
    ) -> tuple[Any, Any, jax.Array, Any]:
        """``act_step`` compiled (one program per structure of ``acting``).

        Args:
            acting: ``agent.acting_params(state)``, or ``prepare`` of it.
            key: the loop key, a raw ``(2,)`` uint32 key.
            observation: ``(E, *obs_shape)`` (dicts keyed by agent in multi-agent mode).
            env_step: environment steps so far, an int32 scalar ``()``.
            memory: a recurrent agent's ``Memory`` (``None`` for a feed-forward agent).

        Returns:
            ``(actions (E, ...), log_probs (E,) float32, next loop key (2,), hidden)``, as
            ``act_step``.
        """
        flat = acting if isinstance(acting, FlatActing) else self.prepare(acting)
        act = self._by_treedef.get(flat.treedef)
        if act is None:
            treedef, agent, fold = flat.treedef, self.agent, self.fold
            act = jax.jit(
                lambda leaves, key, obs, step, memory=None: act_step(
                    agent, jax.tree_util.tree_unflatten(treedef, leaves), key, obs, step, fold, memory
                )
            )
            self._by_treedef[treedef] = act
        return act(flat.leaves, key, observation, env_step, memory)

    def _cache_size(self) -> int:
        """Programs compiled so far (for tests: a run compiles its act once)."""
        return sum(act._cache_size() for act in self._by_treedef.values())  # type: ignore[attr-defined]


class CompiledSteps(NamedTuple):
    """``act_step`` and ``update_step`` of one agent, each compiled as one XLA call (the host
    loop's)."""

    act: Callable[..., tuple[Any, Any, jax.Array, Any]]
    update: Callable[[Any, jax.Array, Any], UpdateOutcome]


def compiled_steps(agent: Any) -> CompiledSteps:
    """The agent's compiled ``act_step`` (a ``CompiledAct``) and ``update_step`` (made once per
    agent and kept on it, so later runs of the same agent reuse the compiled programs)."""
    steps = agent.__dict__.get("_compiled_steps")
    if steps is None:
        steps = CompiledSteps(
            act=CompiledAct(agent),
            update=jax.jit(lambda state, key, buffer: update_step(agent, state, key, buffer)),
        )
        agent.__dict__["_compiled_steps"] = steps
    return steps
