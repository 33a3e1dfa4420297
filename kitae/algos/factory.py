"""Factories that generalize per-agent, per-batch functions to other layouts.

* ``fn_parallel`` runs a function written for one agent over several agents that share one
  state, with inputs and outputs as dicts keyed by agent.
* ``explore_general_factory`` adapts a batched ``explore_fn`` to a single environment
  (no batch axis), to vectorized environments, and to parallel agents.

Shapes use ``E`` environments, ``A`` agents, ``B`` a batch (see ``kitae.types``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

__all__ = ["fn_parallel", "explore_general_factory"]


def _check_agent_dicts(trees: tuple[Any, ...], fn_name: str) -> list:
    """Checks that every tree is a dict with the same agent keys; returns the agents in order."""
    if not trees:
        raise ValueError(f"fn_parallel({fn_name}): expected at least one dict keyed by agent")
    for i, tree in enumerate(trees):
        if not isinstance(tree, dict):
            raise ValueError(
                f"fn_parallel({fn_name}): argument {i + 1} after the state must be a dict keyed by agent, "
                f"got {type(tree).__name__}"
            )
    agents = list(trees[0].keys())
    if not agents:
        raise ValueError(f"fn_parallel({fn_name}): the dicts keyed by agent are empty")
    for i, tree in enumerate(trees[1:], start=2):
        if set(tree.keys()) != set(agents):
            missing = sorted(map(str, set(agents) - set(tree.keys())))
            extra = sorted(map(str, set(tree.keys()) - set(agents)))
            raise ValueError(
                f"fn_parallel({fn_name}): mismatched agent keys, argument 1 has {sorted(map(str, agents))} "
                f"but argument {i} has {sorted(map(str, tree.keys()))} "
                f"(missing: {missing}, unexpected: {extra})"
            )
    return agents


def _stack(values: list[Any]) -> Any:
    """Stacks a list of identical pytrees on a new leading axis (PRNG key arrays included)."""
    return jax.tree.map(lambda *xs: jnp.stack(xs, axis=0), *values)


def _unstack(tree: Any, agents: list) -> dict:
    """Inverse of ``_stack``: ``{agent: tree[i]}`` for the leading axis of every leaf."""
    return {agent: jax.tree.map(lambda x, i=i: x[i], tree) for i, agent in enumerate(agents)}


def fn_parallel(fn: Callable) -> Callable:
    """Parallelizes a function written for one agent over several agents sharing one state.

    ``fn(state, *args, **hyperparameters)`` is written for one agent. The returned function is
    called as ``wrapped(state, *trees, **hyperparameters)`` where every tree is a dict
    ``{"agent_0": x_0, "agent_1": x_1, ...}`` (values are arrays or pytrees; all dicts have the
    same agent keys). It computes, for every agent::

        fn(state, trees[0][agent], trees[1][agent], ..., **hyperparameters)

    by stacking the agents on a new leading axis ``A`` (so each agent's leaves must have identical
    shapes and dtypes across agents) and calling ``jax.vmap`` over that axis; ``state`` is
    broadcast to every agent (like ``in_axes=None``) and the hyperparameters are closed over
    (Python floats or traced arrays, never mapped). PRNG keys are passed as one of the trees, one
    key per agent::

        actions, log_probs = fn_parallel(explore_fn)(
            state, {"a": key_a, "b": key_b}, {"a": obs_a, "b": obs_b}, exploration=0.1
        )

    Works inside and outside ``jax.jit``.

    Args:
        fn: ``fn(state, *args, **hyperparameters) -> output`` for one agent.

    Returns:
        ``wrapped(state, *trees, **hyperparameters)``. If ``fn`` returns a plain ``tuple``
        ``(out_0, out_1, ...)``, ``wrapped`` returns a tuple of dicts
        ``({agent: out_0}, {agent: out_1}, ...)``; otherwise (an array or any other pytree,
        ``NamedTuple`` and ``dict`` included) it returns one dict ``{agent: output}``. The dicts
        have the agent keys in the order of the first tree.

    Raises:
        ValueError: (when called) if the trees are not dicts or have different agent keys.
    """
    fn_name = getattr(fn, "__name__", repr(fn))

    @functools.wraps(fn)
    def wrapped(state: Any, *trees: dict, **hyperparameters: Any) -> Any:
        agents = _check_agent_dicts(trees, fn_name)
        stacked = tuple(_stack([tree[agent] for agent in agents]) for tree in trees)

        def one_agent(*args: Any) -> Any:
            return fn(state, *args, **hyperparameters)

        out = jax.vmap(one_agent, in_axes=(0,) * len(stacked))(*stacked)
        if type(out) is tuple:
            return tuple(_unstack(o, agents) for o in out)
        return _unstack(out, agents)

    return wrapped


def explore_general_factory(explore_fn: Callable, vectorized: bool, parallel: bool) -> Callable:
    """Generalizes a batched ``explore_fn`` to the layout given by ``(vectorized, parallel)``.

    ``explore_fn(state, key, *observations, **hyper) -> (actions, log_probs)`` is written for a
    batch: every observation is ``(B, ...)``, ``key`` is a single PRNG key and every output has a
    leading ``B``. The returned function has the same signature ``(state, key, *trees, **hyper)``:

    * ``vectorized=True, parallel=False``: ``explore_fn`` itself; observations ``(E, ...)``,
      outputs ``(E, ...)``.
    * ``vectorized=False, parallel=False``: one observation without batch axis ``(...)``: a leading
      axis of size 1 is added to every leaf of every tree, ``explore_fn`` is called, and the leading
      axis is removed from every leaf of the output, e.g. an action ``()`` and a log-prob ``()``.
    * ``parallel=True``: ``key`` is a dict of keys keyed by agent and every tree a dict keyed by
      agent (observations ``(E, ...)`` if vectorized, ``(...)`` otherwise); the function above is
      applied to each agent with ``fn_parallel`` (shared state, one key per agent) and the outputs
      are dicts keyed by agent, e.g. ``({agent: actions}, {agent: log_probs})``.

    Hyperparameters (``exploration=0.1``, ...) are keyword arguments, Python floats or traced
    arrays, passed unchanged to ``explore_fn``. Works inside and outside ``jax.jit``.

    Args:
        explore_fn: the batched exploration function.
        vectorized: whether observations have an environment axis ``E``.
        parallel: whether keys and observations are dicts keyed by agent.

    Returns:
        The generalized exploration function.
    """
    if vectorized:
        fn = explore_fn
    else:

        @functools.wraps(explore_fn)
        def fn(state: Any, key: Any, *trees: Any, **hyper: Any) -> Any:
            batched = tuple(jax.tree.map(lambda x: jnp.expand_dims(x, 0), tree) for tree in trees)
            out = explore_fn(state, key, *batched, **hyper)
            return jax.tree.map(lambda x: x[0], out)

    if parallel:
        return _jit_parallel(fn)
    return fn


_STATIC_HYPER = (bool, str, type(None))
"""Hyperparameter values compiled in as constants by ``_jit_parallel`` (flags such as PPO's
``deterministic``); every other value (numbers, arrays) is traced, so a new value is no new program."""


def _jit_parallel(fn: Callable) -> Callable:
    """``fn_parallel(fn)`` compiled as one XLA call. Unjitted, every call stacks the agents,
    traces ``jax.vmap`` and unstacks the outputs op by op from Python: about as long as stepping
    8 copies of an MPE environment. ``fn`` must be traceable, as every explore function already
    is for the compiled loop. Same signature and outputs as ``fn_parallel(fn)``."""
    parallel = fn_parallel(fn)

    def run(state: Any, trees: tuple, dynamic: dict, static: tuple) -> Any:
        return parallel(state, *trees, **dynamic, **dict(static))

    compiled = jax.jit(run, static_argnums=3)

    @functools.wraps(fn)
    def wrapped(state: Any, *trees: Any, **hyperparameters: Any) -> Any:
        static = tuple(sorted((k, v) for k, v in hyperparameters.items() if isinstance(v, _STATIC_HYPER)))
        dynamic = {k: v for k, v in hyperparameters.items() if not isinstance(v, _STATIC_HYPER)}
        return compiled(state, trees, dynamic, static)

    return wrapped
