"""Experience helpers and the ``ExperiencePipeline``.

An agent collects experience as a ``NamedTuple`` of arrays (``observation``, ``action``,
``reward``, ...). Its leaves are shaped according to how the agent is run:

* single environment, single agent: ``(T, ...)``;
* vectorized (``E`` environments): ``(T, E, ...)``;
* parallel (``A`` agents sharing one state): every field is a dict keyed by agent, whose
  leaves are ``(T, ...)``, or ``(T, E, ...)`` when also vectorized.

Processing functions (advantages, returns, targets, ...) are written once for the simplest case,
one agent in one environment, and ``ExperiencePipeline`` maps them over environments and agents,
then flattens the result into a single batch of transitions ``(B, ...)``.

Shapes use ``T`` steps, ``E`` environments, ``A`` agents (see ``kitae.types``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from kitae.modules.pytree import AgentPyTree
from kitae.types import Array

__all__ = [
    "merge_n_first_dims",
    "stack_and_merge_n_first_dims",
    "dict_to_tuple",
    "tuple_to_dict",
    "ExperiencePipeline",
]


# --------------------------------------------------------------------------------------------
# Array helpers
# --------------------------------------------------------------------------------------------


def merge_n_first_dims(array: Array, n: int = 2) -> Array:
    """Merges the ``n`` first dimensions of an array into one (row-major, like ``reshape``).

    * ``n == 1``: no change, ``(T, ...) -> (T, ...)``;
    * ``n == 2``: ``(T, E, ...) -> (T * E, ...)``, element ``[t, e]`` goes to ``t * E + e``;
    * ``n == 3``: ``(T, E, A, ...) -> (T * E * A, ...)``, element ``[t, e, a]`` goes to
      ``(t * E + e) * A + a``.

    An array with fewer than ``n`` dimensions is flattened: all its dimensions are the first
    ones, so all are merged (``(T,)`` with ``n == 2`` stays ``(T,)``; a scalar becomes ``(1,)``).

    Args:
        array: an array ``(D_1, ..., D_n, ...)``.
        n: how many leading dimensions to merge. It must be a static Python ``int``: when jitting
            a function that takes ``n`` as an argument, mark it static
            (``jax.jit(merge_n_first_dims, static_argnums=1)``).

    Returns:
        The array reshaped to ``(D_1 * ... * D_n, ...)``.

    Raises:
        AssertionError: if ``n <= 0``, or ``n`` is not static when jitting (seed 000).
    """
    _check_n("merge_n_first_dims", n)
    array = jnp.asarray(array)
    if array.ndim < n:  # fewer dimensions than asked: all of them are merged
        return array.reshape((math.prod(array.shape),))
    if n == 1:
        return array
    # math.prod rather than -1 so that zero-sized dimensions are handled too.
    return array.reshape((math.prod(array.shape[:n]),) + array.shape[n:])


def _check_n(name: str, n: Any) -> None:
    """The documented ``AssertionError`` for an ``n`` traced by ``jax.jit`` (not static: the merged
    shape would depend on a value) or not positive."""
    assert not isinstance(n, jax.core.Tracer), (
        f"{name}: n must be static when jitting (jax.jit(..., static_argnums=1)); got a traced value"
    )
    assert n > 0, f"{name}: n must be a positive int, got n={n}"


def stack_and_merge_n_first_dims(arrays: Sequence[Array], n: int = 2) -> Array:
    """Stacks arrays on a new axis 1, then merges the ``n`` first dimensions.

    With ``A`` arrays shaped ``(T, E, ...)``, the stack is ``(T, A, E, ...)`` and:

    * ``n == 1``: ``(T, A, E, ...)``;
    * ``n == 2``: ``(T * A, E, ...)``, element ``arrays[a][t]`` goes to ``t * A + a``;
    * ``n == 3``: ``(T * A * E, ...)``, element ``arrays[a][t, e]`` goes to ``(t * A + a) * E + e``.

    Args:
        arrays: ``A`` arrays of identical shape ``(T, ...)`` (at least ``n - 1`` dimensions).
        n: how many leading dimensions of the stack to merge; a static Python ``int``
            (``static_argnums=1`` when jitting).

    Returns:
        The stacked and merged array.

    Raises:
        AssertionError: if ``n <= 0``, or ``n`` is not static when jitting (seed 000).
    """
    _check_n("stack_and_merge_n_first_dims", n)
    return merge_n_first_dims(jnp.stack(list(arrays), axis=1), n)


# --------------------------------------------------------------------------------------------
# Dict of tuples <-> tuple of dicts
# --------------------------------------------------------------------------------------------


def _rebuild_tuple(template: tuple, values: Sequence[Any]) -> tuple:
    """Builds a tuple of the same type as ``template`` (``NamedTuple`` or plain tuple)."""
    cls = type(template)
    if hasattr(cls, "_make"):  # NamedTuple
        return cls._make(values)
    if cls is tuple:
        return tuple(values)
    return cls(values)


def dict_to_tuple(experience: dict[str, tuple]) -> tuple:
    """Turns a dict of tuples keyed by agent into a tuple of dicts keyed by agent.

    ``{"a": Foo(x=xa, y=ya), "b": Foo(x=xb, y=yb)}`` becomes
    ``Foo(x={"a": xa, "b": xb}, y={"a": ya, "b": yb})``. The tuple type is taken from the first
    agent (a ``NamedTuple`` type is rebuilt with ``type._make``; a plain tuple stays a tuple), and
    every dict keeps the insertion order of ``experience``. Leaves are left untouched, so they can
    have any shape (``(T, ...)``, ``(T, E, ...)``, ...). Inverse of ``tuple_to_dict``.

    Args:
        experience: a non-empty dict ``{agent: tuple}``; every tuple has the same type and length.

    Returns:
        A tuple of the same type whose field ``i`` is ``{agent: experience[agent][i]}``.

    Raises:
        ValueError: if the dict is empty, or its values are not tuples of the same type and length.
    """
    if not isinstance(experience, dict) or not experience:
        raise ValueError("dict_to_tuple: expected a non-empty dict of tuples keyed by agent")
    agents = list(experience.keys())
    first = experience[agents[0]]
    if not isinstance(first, tuple):
        raise ValueError(
            f"dict_to_tuple: expected tuples as values, got {type(first).__name__} for agent {agents[0]!r}"
        )
    for agent in agents[1:]:
        value = experience[agent]
        if type(value) is not type(first) or len(value) != len(first):
            raise ValueError(
                f"dict_to_tuple: agent {agents[0]!r} has a {type(first).__name__} of length {len(first)} "
                f"but agent {agent!r} has a {type(value).__name__} of length "
                f"{len(value) if isinstance(value, tuple) else 'n/a'}"
            )
    fields = [
        None  # an optional field every agent leaves out stays out
        if all(experience[agent][i] is None for agent in agents)
        else {agent: experience[agent][i] for agent in agents}
        for i in range(len(first))
    ]
    return _rebuild_tuple(first, fields)


def tuple_to_dict(experience: tuple) -> dict[str, tuple]:
    """Turns a tuple of dicts keyed by agent into a dict of tuples keyed by agent.

    ``Foo(x={"a": xa, "b": xb}, y={"a": ya, "b": yb})`` becomes
    ``{"a": Foo(x=xa, y=ya), "b": Foo(x=xb, y=yb)}``. The agents are ordered like the keys of the
    first field's dict. Leaves are left untouched. Inverse of ``dict_to_tuple``.

    Args:
        experience: a non-empty ``NamedTuple`` (or plain tuple) whose fields are dicts with the same
            set of agent keys (``{agent: (T, E, ...)}``, say; leaves of any shape, kept as they are).

    Returns:
        A dict ``{agent: tuple}``, each tuple of the same type as ``experience``.

    Raises:
        ValueError: if ``experience`` is not a non-empty tuple of dicts, or if its fields have
            different key sets.
    """
    if not isinstance(experience, tuple) or len(experience) == 0:
        raise ValueError("tuple_to_dict: expected a non-empty tuple whose fields are dicts keyed by agent")
    names = getattr(type(experience), "_fields", None) or [str(i) for i in range(len(experience))]
    for name, value in zip(names, experience):
        if value is not None and not isinstance(value, dict):  # None: an optional field left out
            raise ValueError(
                f"tuple_to_dict: every field must be a dict keyed by agent (or None), field {name!r} is a "
                f"{type(value).__name__}"
            )
    first = next((i for i, value in enumerate(experience) if value is not None), None)
    if first is None:
        raise ValueError("tuple_to_dict: every field is None; expected dicts keyed by agent")
    agents = list(experience[first].keys())
    for name, value in zip(names, experience):
        if value is not None and set(value.keys()) != set(agents):
            raise ValueError(
                f"tuple_to_dict: fields have different agent keys: field {names[first]!r} has "
                f"{sorted(map(str, agents))} but field {name!r} has {sorted(map(str, value.keys()))}"
            )
    return {
        agent: _rebuild_tuple(experience, [None if value is None else value[agent] for value in experience])
        for agent in agents
    }


# --------------------------------------------------------------------------------------------
# ExperiencePipeline
# --------------------------------------------------------------------------------------------


def _axis_size(tree: Any, axis: int, what: str) -> int:
    """Size of ``axis`` shared by every leaf of ``tree``; raises ValueError otherwise."""
    leaves = jax.tree.leaves(tree)
    if not leaves:
        raise ValueError(f"ExperiencePipeline: the experience has no array leaf to map over {what}")
    sizes = set()
    for leaf in leaves:
        shape = jnp.shape(leaf)
        if len(shape) <= axis:
            raise ValueError(
                f"ExperiencePipeline: every leaf needs an axis {axis} ({what}), got a leaf of shape {shape}"
            )
        sizes.add(shape[axis])
    if len(sizes) != 1:
        raise ValueError(f"ExperiencePipeline: leaves disagree on the size of axis {axis} ({what}): {sorted(sizes)}")
    return sizes.pop()


def _stack_agents(experience: tuple) -> tuple[list, Any]:
    """Stacks the agents of a tuple of dicts on a new leading axis.

    Returns:
        ``(agents, stacked)``: the agent keys in order, and a tuple of the same type as
        ``experience`` whose leaves are ``(A, *leaf_shape)``.

    Raises:
        ValueError: if the agents' experiences have different structures, shapes or dtypes.
    """
    per_agent = tuple_to_dict(experience)
    agents = list(per_agent.keys())
    ref_agent = agents[0]
    ref_leaves, ref_def = jax.tree.flatten(per_agent[ref_agent])
    for agent in agents[1:]:
        leaves, treedef = jax.tree.flatten(per_agent[agent])
        if treedef != ref_def:  # type: ignore[operator]  # jaxlib has no stub for PyTreeDef (it has __eq__)
            raise ValueError(
                f"ExperiencePipeline: agents {ref_agent!r} and {agent!r} have experiences of different "
                f"structures: {ref_def} vs {treedef}"
            )
        ref_shapes = [jnp.shape(x) for x in ref_leaves]
        shapes = [jnp.shape(x) for x in leaves]
        if ref_shapes != shapes:
            raise ValueError(
                f"ExperiencePipeline: agents must have leaves of identical shapes to be run in parallel, "
                f"agent {ref_agent!r} has shapes {ref_shapes} but agent {agent!r} has shapes {shapes}"
            )
        ref_dtypes = [jnp.result_type(x) for x in ref_leaves]
        dtypes = [jnp.result_type(x) for x in leaves]
        if ref_dtypes != dtypes:
            raise ValueError(
                f"ExperiencePipeline: agents must have leaves of identical dtypes to be run in parallel, "
                f"agent {ref_agent!r} has dtypes {[str(d) for d in ref_dtypes]} but agent {agent!r} has "
                f"dtypes {[str(d) for d in dtypes]}"
            )
    stacked = jax.tree.map(lambda *xs: jnp.stack(xs, axis=0), *[per_agent[a] for a in agents])
    return agents, stacked


@dataclass
class ExperiencePipeline:
    """A sequence of experience transforms, mapped over environments and agents.

    Each transform is written for one agent in one environment::

        def transform(state: AgentPyTree, key: Array, experience: NamedTuple) -> NamedTuple

    where the leaves of ``experience`` are ``(T, ...)``. It returns a new ``NamedTuple`` (or a plain
    tuple of arrays) whose leaves all keep a leading time axis ``(T', ...)`` (``T'`` may differ from
    ``T``, e.g. ``T - 1`` when bootstrapping on the last step). The output of a transform is the input
    of the next one.

    ``run`` picks the mode from the flags:

    ======================  ======================  =================================  ==================
    ``vectorized``          ``parallel``            input leaves                        output leaves
    ======================  ======================  =================================  ==================
    ``False``               ``False``               ``(T, ...)``                       ``(T', ...)``
    ``True``                ``False``               ``(T, E, ...)``                    ``(T' * E, ...)``
    ``False``               ``True``                fields ``{agent: (T, ...)}``       ``(T' * A, ...)``
    ``True``                ``True``                fields ``{agent: (T, E, ...)}``    ``(T' * A * E, ...)``
    ======================  ======================  =================================  ==================

    The pipeline object is not a pytree; to compile it, jit a closure::

        run = jax.jit(lambda state, key, experience: pipeline.run(state, key, experience))

    Every method works both inside and outside ``jax.jit``.

    Attributes:
        transforms: the transforms, applied in order (with an empty list the experience is only
            merged, or returned unchanged by ``run_single_pipe``).
        vectorized: whether the experience has an environment axis ``E`` (axis 1 of every leaf).
        parallel: whether the experience's fields are dicts keyed by agent (agents sharing ``state``).
    """

    transforms: list[Callable[[AgentPyTree, Array, NamedTuple], NamedTuple]]
    vectorized: bool = True
    parallel: bool = False

    # ---- one agent, one environment ---------------------------------------------------------

    def run_single_pipe(self, state: AgentPyTree, key: Array, experience: NamedTuple) -> NamedTuple:
        """Applies the transforms in order to one agent's experience in one environment.

        ``key`` is split into one subkey per transform (``jax.random.split(key, len(transforms))``),
        subkey ``i`` going to transform ``i``.

        Args:
            state: the agent's state, passed unchanged to every transform.
            key: a PRNG key.
            experience: a ``NamedTuple`` whose leaves are ``(T, ...)``.

        Returns:
            The last transform's output, leaves ``(T', ...)``; ``experience`` itself when there is
            no transform.
        """
        if not self.transforms:
            return experience
        keys = jax.random.split(key, len(self.transforms))
        for i, transform in enumerate(self.transforms):
            experience = transform(state, keys[i], experience)
        return experience

    # ---- building blocks -----------------------------------------------------------------------

    def _map_envs(self, state: AgentPyTree, keys: Array, experience: NamedTuple) -> NamedTuple:
        """vmaps the single pipe over axis 1: ``keys (E,)``, leaves ``(T, E, ...) -> (T', E, ...)``."""
        return jax.vmap(lambda k, exp: self.run_single_pipe(state, k, exp), in_axes=(0, 1), out_axes=1)(
            keys, experience
        )

    # ---- vectorized ----------------------------------------------------------------------------

    def run_vectorized(self, state: AgentPyTree, key: Array, experience: NamedTuple) -> NamedTuple:
        """Runs the single pipe on each environment separately, then merges time and environments.

        ``key`` is split into ``E`` keys, one per environment; ``state`` is shared (broadcast). The
        single pipe is ``jax.vmap``-ed over axis 1 of the experience with ``out_axes=1``, giving
        ``(T', E, ...)``, which is merged into ``(T' * E, ...)``: the transition of step ``t`` in
        environment ``e`` lands at row ``t * E + e``.

        Args:
            state: the agent's state.
            key: a PRNG key.
            experience: a ``NamedTuple`` whose leaves are ``(T, E, ...)``.

        Returns:
            The processed experience, leaves ``(T' * E, ...)``.

        Raises:
            ValueError: if some leaf has no axis 1 or the leaves disagree on ``E``.
        """
        n_envs = _axis_size(experience, 1, "environments")
        keys = jax.random.split(key, n_envs)
        out = self._map_envs(state, keys, experience)
        return jax.tree.map(lambda x: merge_n_first_dims(x, 2), out)

    # ---- parallel ------------------------------------------------------------------------------

    def run_parallel(self, state: AgentPyTree, key: Array, experience: NamedTuple) -> NamedTuple:
        """Runs the single pipe on each agent separately (shared state), then merges time and agents.

        The agents (ordered like the keys of the first field's dict) are stacked on a new leading
        axis, ``key`` is split into ``A`` keys (one per agent, in that order) and the single pipe is
        ``jax.vmap``-ed over the agents with ``out_axes=1``, giving ``(T', A, ...)``, merged into
        ``(T' * A, ...)``: step ``t`` of agent ``a`` lands at row ``t * A + a``. This is the layout
        of ``stack_and_merge_n_first_dims([out_agent_0, out_agent_1, ...], n=2)``.

        Args:
            state: the state shared by all agents.
            key: a PRNG key.
            experience: a ``NamedTuple`` (or tuple) whose fields are dicts ``{agent: leaves (T, ...)}``.

        Returns:
            The processed experience, leaves ``(T' * A, ...)``.

        Raises:
            ValueError: if the fields have different agent keys, or if agents' leaves have different
                structures, shapes or dtypes.
        """
        agents, stacked = _stack_agents(experience)
        keys = jax.random.split(key, len(agents))
        out = jax.vmap(lambda k, exp: self.run_single_pipe(state, k, exp), in_axes=(0, 0), out_axes=1)(keys, stacked)
        return jax.tree.map(lambda x: merge_n_first_dims(x, 2), out)

    def run_parallel_vectorized(self, state: AgentPyTree, key: Array, experience: NamedTuple) -> NamedTuple:
        """Runs the single pipe for each agent in each environment, then merges all three axes.

        The agents are stacked on a new leading axis, ``key`` is split into ``(A, E)`` keys (one per
        agent and environment) and the single pipe is ``jax.vmap``-ed over environments (axis 1) and
        agents, giving ``(T', A, E, ...)``, merged into ``(T' * A * E, ...)``. Order: step ``t`` of
        agent ``a`` in environment ``e`` lands at row ``(t * A + a) * E + e`` (time-major, then
        agent, then environment), the layout of
        ``stack_and_merge_n_first_dims([out_agent_0, out_agent_1, ...], n=3)``: reshaping the
        output to ``(T', A, E, ...)`` gives each agent's and environment's rows back.

        Args:
            state: the state shared by all agents.
            key: a PRNG key.
            experience: a ``NamedTuple`` (or tuple) whose fields are dicts
                ``{agent: leaves (T, E, ...)}``.

        Returns:
            The processed experience, leaves ``(T' * A * E, ...)``.

        Raises:
            ValueError: if the fields have different agent keys, if agents' leaves have different
                structures, shapes or dtypes, or if some leaf has no environment axis.
        """
        agents, stacked = _stack_agents(experience)  # leaves (A, T, E, ...)
        n_envs = _axis_size(stacked, 2, "environments")
        keys = jax.random.split(key, (len(agents), n_envs))
        # Inner: (E,) keys, (T, E, ...) -> (T', E, ...); outer over agents: -> (T', A, E, ...).
        out = jax.vmap(lambda k, exp: self._map_envs(state, k, exp), in_axes=(0, 0), out_axes=1)(keys, stacked)
        return jax.tree.map(lambda x: merge_n_first_dims(x, 3), out)

    # ---- dispatch ------------------------------------------------------------------------------

    def run(self, state: AgentPyTree, key: Array, experience: NamedTuple) -> NamedTuple:
        """Processes the experience in the mode given by ``(vectorized, parallel)``.

        * ``(False, False)``: ``run_single_pipe``, ``(T, ...) -> (T', ...)``;
        * ``(True, False)``: ``run_vectorized``, ``(T, E, ...) -> (T' * E, ...)``;
        * ``(False, True)``: ``run_parallel``, ``{agent: (T, ...)} -> (T' * A, ...)``;
        * ``(True, True)``: ``run_parallel_vectorized``, ``{agent: (T, E, ...)} -> (T' * A * E, ...)``.

        Args:
            state: the agent's state (shared by all agents in parallel modes).
            key: a PRNG key.
            experience: the collected experience, shaped as above.

        Returns:
            The processed experience.
        """
        if self.parallel:
            if self.vectorized:
                return self.run_parallel_vectorized(state, key, experience)
            return self.run_parallel(state, key, experience)
        if self.vectorized:
            return self.run_vectorized(state, key, experience)
        return self.run_single_pipe(state, key, experience)
