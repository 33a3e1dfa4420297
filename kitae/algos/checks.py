"""What a custom agent's factories and functions return, checked when the agent is made or
while its programs are traced (no cost per step): a factory that forgot its ``return``, a state
that cannot be an argument of a compiled function, an update step that does not return
``(state, info)`` (``kitae.base.BaseAgent`` runs these checks; ``kitae.loops.collect.check_act_output``
checks acting).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np

from kitae.config import AlgoConfig

__all__ = ["factory_output", "check_state", "check_update_step_output", "checked_update_step", "INFO_ALLOWED"]


def factory_output(name: str, factory: Callable, config: AlgoConfig, makes: str) -> Callable:
    """``factory(config)``, refused when it is not a function (a factory that forgot its
    ``return`` makes ``None``), when the agent is made rather than at its first step.

    Raises:
        TypeError: naming the factory, what it returned and what it must make.
    """
    made = factory(config)
    if not callable(made):
        found = "None" if made is None else f"{made!r:.60} (of type {type(made).__name__})"
        raise TypeError(f"{name}(config) returned {found}; allowed: a function {makes}")
    return made


def _is_state_leaf(x: Any) -> bool:
    """A leaf ``jax.jit`` takes as an argument: an array (traced or not, a PRNG key's included)
    or a number."""
    return isinstance(x, (jax.Array, jax.ShapeDtypeStruct, np.ndarray, np.generic, int, float, bool, complex))


def check_state(state: Any) -> None:
    """Refuses a ``train_state_factory`` output that cannot be the agent's state, when the agent
    is made: ``None`` (a factory without its ``return``) or a pytree with a leaf that is not an
    array (the state is an argument of every compiled update and act). ``state``: the agent's
    state pytree (an ``AgentPyTree`` of ``TrainState`` objects), leaves of any shape; each leaf must
    be an array (a PRNG key's included) or a number.

    Raises:
        TypeError: naming what was returned and what is allowed.
    """
    allowed = "the agent's state, a pytree of arrays (an AgentPyTree of TrainStates)"
    if state is None:
        raise TypeError(f"train_state_factory returned None; allowed: {allowed}")
    leaves_with_paths, _ = jax.tree_util.tree_flatten_with_path(state)
    for path, leaf in leaves_with_paths:
        if not _is_state_leaf(leaf):
            where = jax.tree_util.keystr(path) or "the state"
            raise TypeError(
                f"train_state_factory returned a state holding a {type(leaf).__name__} at {where}; allowed: {allowed} "
                "(functions and optimizers are static fields, as TrainState's apply_fn and tx)"
            )


def _type_of(value: Any) -> str:
    return f"a value of type {type(value).__name__}"


INFO_ALLOWED = "info a dict of scalars (each logged as losses/<name>)"


def check_update_step_output(
    out: Any, old_leaves: list, state_def: Any, given_type: str, agent_name: str, prioritized: bool = False
) -> None:
    """Checks what an update step returned (``update_step_factory``'s ``update_fn``), while it is
    traced (once per compiled update: no cost per step): ``(state, info)``, ``state`` of the
    structure and shapes of the state it was given, ``info`` a dict of scalars (averaged over the
    update's steps and logged as ``losses/<name>``; under prioritized replay also ``td_error``
    ``(B,)``).

    Args:
        out: what the update step returned.
        old_leaves: the leaves of the state it was given (``jax.tree_util.tree_flatten`` order),
            read before the call (a guide-style step reassigns the given state's fields in place):
            each new leaf must have the shape of the old one in its place.
        state_def: the tree structure of the state it was given.
        given_type: the type name of the state it was given (for the message).
        agent_name: the agent's name (for the message).
        prioritized: prioritized replay: ``info["td_error"]`` (``(B,)``) is allowed here (not a
            scalar); ``BaseAgent.update_with_replay``, which takes it as the new priorities,
            checks its shape against the minibatch's.

    Raises:
        TypeError: for an output that is not a pair, a state of another structure, or an ``info``
            that is not a dict.
        ValueError: for a state leaf of another shape or an ``info`` entry that is not a scalar.
    """
    name = f"{agent_name}'s update step (update_step_factory's update_fn)"
    if not isinstance(out, (tuple, list)) or len(out) != 2:
        found = f"a {type(out).__name__} of {len(out)}" if isinstance(out, (tuple, list)) else _type_of(out)
        raise TypeError(f"{name} returned {found}; allowed: (state, info) with {INFO_ALLOWED}")
    new_state, info = out
    if not isinstance(info, Mapping):
        found = "None" if info is None else _type_of(info)
        raise TypeError(f"{name} returned (state, {found}); allowed: (state, info) with {INFO_ALLOWED}")
    for key, value in info.items():
        if prioritized and key == "td_error":
            continue
        if not isinstance(value, (jax.Array, np.ndarray, np.generic, int, float, bool)) or np.size(value) != 1:
            found = f"of shape {tuple(np.shape(value))}" if hasattr(value, "shape") else f"as {_type_of(value)}"
            raise ValueError(f"{name} returned info[{key!r}] {found}; allowed: (state, info) with {INFO_ALLOWED}")
    new_leaves, new_def = jax.tree_util.tree_flatten(new_state)
    if new_def != state_def:
        raise TypeError(
            f"{name} returned a state ({type(new_state).__name__}, {len(new_leaves)} leaves) of another structure "
            f"than the state it was given ({given_type}, {len(old_leaves)} leaves); allowed: the state it updated, "
            "as (state, info)"
        )
    paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(new_state)[0]]
    for path, old, new in zip(paths, old_leaves, new_leaves):
        if np.shape(old) != np.shape(new):
            raise ValueError(
                f"{name} returned a state whose leaf {path} has shape {tuple(np.shape(new))} where the state it was "
                f"given has {tuple(np.shape(old))}; allowed: the state it updated, with the same shapes"
            )


def checked_update_step(update_step_fn: Callable, agent_name: str, prioritized: bool = False) -> Callable:
    """``update_step_fn`` with ``check_update_step_output`` on what it returns (its values are
    untouched: the same program, the same bits)."""

    def update_step(state: Any, key: jax.Array, batch: Any) -> tuple[Any, Any]:
        old_leaves, state_def = jax.tree_util.tree_flatten(state)
        given_type = type(state).__name__
        out = update_step_fn(state, key, batch)
        check_update_step_output(out, old_leaves, state_def, given_type, agent_name, prioritized)
        return out

    return update_step
