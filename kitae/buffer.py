"""Experience storage: one fixed-capacity buffer of preallocated arrays, read two ways.

The core is pure: ``BufferState`` is a pytree and ``buffer_init`` / ``buffer_add`` /
``buffer_sample`` / ``buffer_rollout`` / ``buffer_reset`` are pure functions, so the same buffer
runs inside ``jax.jit`` (the compiled loop) and behind the host-side classes ``ReplayBuffer``
(uniform sampling, off-policy) and ``RolloutBuffer`` (whole rollouts in time order, on-policy).

Layout: every leaf of the stored experience has shape ``(capacity, E, ...)``, one row per vector
step, ``E`` environments per row. Multi-agent experience is stored as dicts keyed by agent (each
leaf ``(capacity, E, ...)``), so the same functions serve both.
"""

from __future__ import annotations

from functools import partial
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from kitae.devices import available_memory
from kitae.replay.prioritized import Priorities, add_at_max_priority, priorities_init
from kitae.validation import check_positive_int


class Experience(NamedTuple):
    """One step of interaction, for each environment (and agent).

    Leaves are batched over environments: ``(E, ...)`` when collected, ``(T, E, ...)`` in a
    rollout, ``(B, ...)`` when sampled.

    Attributes:
        observation: the observation the action was taken from, ``(E, *obs_shape)``.
        action: the action taken, ``(E, *action_shape)``.
        reward: the reward received, ``(E,)`` float32.
        done: the episode TERMINATED at this step (a terminal state: do not bootstrap), ``(E,)``.
            Truncation by a time limit is not ``done``; it is ``truncated``.
        next_observation: the real next observation, ``(E, *obs_shape)``: at the end of an
            episode, the episode's final observation, not the first of the next episode.
        log_prob: log-probability of the action under the acting policy, ``(E,)``.
        truncated: the episode was CUT at this step (time limit): bootstrap from
            ``next_observation``, but do not carry returns across into the next episode, ``(E,)``.
            Optional: ``Experience(observation, action, reward, done, next_observation,
            log_prob)``, the six fields of the custom-agent guide, leaves it ``None``, which
            ``kitae.timesteps`` reads as "never truncated". The training loops always fill it.
        n_steps: on a transition sampled with n-step replay (``kitae.replay``), the rewards
            summed in ``reward``, ``(B,)`` int32 (1 to ``n``): bootstrap from ``next_observation``
            with ``gamma ** n_steps`` (``kitae.timesteps.bootstrap_discounts``). ``None``: one
            step. Never stored.
        weight: on a transition sampled with prioritized replay, its importance weight ``(B,)``
            float32, by which its loss is multiplied. ``None``: 1. Never stored.
    """

    observation: Any
    action: Any
    reward: Any
    done: Any
    next_observation: Any
    log_prob: Any
    truncated: Any = None
    n_steps: Any = None
    weight: Any = None


class BufferState(NamedTuple):
    """A buffer's arrays and counters (a pytree).

    Attributes:
        data: the stored experience; every leaf ``(capacity, E, ...)``.
        position: the row the next ``buffer_add`` writes, int32 scalar.
        size: the number of filled rows, int32 scalar (at most ``capacity``).
        priorities: prioritized replay's ``kitae.replay.prioritized.Priorities`` over the
            ``capacity * E`` transitions (item ``row * E + env``), or ``None`` (uniform replay).
    """

    data: Any
    position: jax.Array
    size: jax.Array
    priorities: Priorities | None = None

    @property
    def capacity(self) -> int:
        """Rows the buffer holds (static)."""
        return jax.tree_util.tree_leaves(self.data)[0].shape[0]

    @property
    def n_envs(self) -> int:
        """Environments per row (static)."""
        return jax.tree_util.tree_leaves(self.data)[0].shape[1]


def buffer_init(example: Any, capacity: int, prioritized: bool = False) -> BufferState:
    """Allocates a buffer shaped after one step of experience.

    Args:
        example: one step, a pytree whose leaves have shape ``(E, ...)``.
        capacity: number of rows (vector steps) to keep, >= 1.
        prioritized: keep a priority per transition (prioritized replay).

    Returns:
        An empty ``BufferState`` with leaves ``(capacity, E, ...)``, dtypes those of ``example``.
    """
    check_positive_int("capacity", capacity)
    leaves = jax.tree_util.tree_leaves(example)
    if not leaves or any(jnp.ndim(x) < 1 for x in leaves):
        raise ValueError("every leaf of the example experience needs a leading environment axis (E, ...)")
    n_envs = {jnp.shape(x)[0] for x in leaves}
    if len(n_envs) != 1:
        raise ValueError(f"every leaf of the experience must have the same leading (environment) size, got {n_envs}")
    data = jax.tree_util.tree_map(lambda x: jnp.zeros((capacity, *jnp.shape(x)), dtype=jnp.asarray(x).dtype), example)
    priorities = priorities_init(capacity * n_envs.pop()) if prioritized else None
    return BufferState(data, jnp.zeros((), jnp.int32), jnp.zeros((), jnp.int32), priorities)


def space_nbytes(space: Any) -> int:
    """Bytes of one value of a Gymnasium ``space`` as JAX stores it (64-bit numbers as 32-bit
    unless ``jax_enable_x64``; ``Dict`` and ``Tuple`` spaces the sum of their parts); 0 for a space
    it cannot size (``Text``, ``Graph``, ``Sequence``...).

    Example: ``Box(0, 255, (96, 96, 3), uint8)`` -> 27,648; ``Discrete(4)`` -> 4."""
    import gymnasium as gym  # the spaces of the environments; kept out of the module's import

    if isinstance(space, gym.spaces.Dict):
        return sum(space_nbytes(part) for part in space.spaces.values())
    if isinstance(space, gym.spaces.Tuple):
        return sum(space_nbytes(part) for part in space.spaces)
    if not isinstance(space, (gym.spaces.Box, gym.spaces.Discrete, gym.spaces.MultiDiscrete, gym.spaces.MultiBinary)):
        return 0
    itemsize = np.dtype(space.dtype).itemsize
    if not jax.config.read("jax_enable_x64"):
        itemsize = min(itemsize, 4)
    return int(np.prod(space.shape or (), dtype=np.int64)) * itemsize


def check_buffer_memory(need: int, capacity: int, field: str, copies: int = 1) -> None:
    """Refuses a buffer that cannot fit in the memory JAX's device has available
    (``kitae.devices.available_memory``), before anything is allocated: XLA would otherwise stop
    the run later with "RESOURCE_EXHAUSTED: Out of memory" (or the system end the process), after
    the run directory was written.

    Args:
        need: bytes of the buffer (of all ``copies``), or a lower bound of them.
        capacity: rows each buffer holds (vector steps).
        field: the config field that sets ``capacity``, named in the error.
        copies: buffers allocated together (seeds, or a sweep's rows, trained in one program).

    Raises:
        ValueError: naming ``field``, the bytes the buffer needs and the most rows that fit.
    """
    available = available_memory()
    if available is None or need <= available:
        return
    whose = f"the {copies} buffers trained together (a seed's or a sweep row's each)" if copies > 1 else "the buffer"
    raise ValueError(
        f"{field}={capacity:,} is too large here: {whose} would take at least {need / 1e9:,.1f} GB and "
        f"{available / 1e9:,.1f} GB of memory is available ({jax.devices()[0].platform}); allowed: at most "
        f"{int(capacity * available / need):,} rows on this machine now"
    )


def buffer_add(state: BufferState, experience: Any) -> BufferState:
    """Writes one step (leaves ``(E, ...)``) at ``position``, overwriting the oldest row when full;
    with priorities, the row's transitions get the largest priority seen."""
    capacity = state.capacity
    data = jax.tree_util.tree_map(
        lambda buf, x: buf.at[state.position].set(jnp.asarray(x, dtype=buf.dtype)), state.data, experience
    )
    priorities = state.priorities
    if priorities is not None:
        priorities = add_at_max_priority(priorities, state.position * state.n_envs + jnp.arange(state.n_envs))
    return BufferState(
        data,
        (state.position + 1) % capacity,
        jnp.minimum(state.size + 1, capacity),
        priorities,
    )


def buffer_sample(state: BufferState, key: jax.Array, batch_size: int) -> Any:
    """Samples ``batch_size`` transitions uniformly (with replacement) from the filled rows.

    Each of the ``size * E`` stored transitions is equally likely. Returns leaves ``(B, ...)``.
    The buffer must hold at least one row.
    """
    n_envs = state.n_envs
    flat = jax.random.randint(key, (batch_size,), 0, jnp.maximum(state.size, 1) * n_envs)
    rows, envs = flat // n_envs, flat % n_envs
    return jax.tree_util.tree_map(lambda buf: buf[rows, envs], state.data)


def buffer_rollout(state: BufferState) -> Any:
    """Returns the stored rows in the order they were written, leaves ``(T, E, ...)``.

    Meant for a full rollout buffer that is reset after each update (then ``position`` is 0 and
    the rows are already in order); for a buffer that wrapped around, the rows are rolled so the
    oldest comes first. A buffer that is not full has never wrapped: its rows are returned as
    they are, the ``size`` stored rows first (oldest first), then the unfilled rows.
    """
    shift = jnp.where(state.size == state.capacity, state.position, 0)
    return jax.tree_util.tree_map(lambda buf: jnp.roll(buf, -shift, axis=0), state.data)


def buffer_reset(state: BufferState) -> BufferState:
    """Empties the buffer (counters to zero; arrays are kept and overwritten later; priorities, if
    any, too: a row gets the largest priority again when it is written).

    Args:
        state: the buffer, leaves ``(capacity, E, ...)``.

    Returns:
        ``state`` with ``position`` and ``size`` zero (int32 scalars ``()``), the arrays unchanged.
    """
    return state._replace(position=jnp.zeros_like(state.position), size=jnp.zeros_like(state.size))


# ---------------------------------------------------------------------------------------------
# Host-side holders (the thin shell around the pure functions)
# ---------------------------------------------------------------------------------------------

_add = jax.jit(buffer_add, donate_argnums=0)  # donated: the write happens in place, not as a copy
_reset = jax.jit(buffer_reset, donate_argnums=0)


def _as_experience_arrays(experience: Any) -> Any:
    """Host arrays to JAX-friendly dtypes (float64 -> float32, int64 -> int32)."""

    def convert(x: Any) -> Any:
        x = np.asarray(x)
        if x.dtype == np.float64:
            return x.astype(np.float32)
        if x.dtype == np.int64:
            return x.astype(np.int32)
        return x

    return jax.tree_util.tree_map(convert, experience)


class _HostBuffer:
    """Holds a ``BufferState`` created on the first ``add``, and its counters on the host (so
    asking for the size never waits for the device)."""

    def __init__(self, capacity: int, prioritized: bool = False) -> None:
        check_positive_int("capacity", capacity)
        self.capacity = capacity
        self.prioritized = prioritized
        self._state: BufferState | None = None
        self._size = 0
        self._position = 0
        self._n_per_row = 0  # transitions per row: environments times agents

    @property
    def state(self) -> BufferState | None:
        """The pure ``BufferState`` (``None`` before the first ``add``)."""
        return self._state

    @state.setter
    def state(self, state: BufferState | None) -> None:
        self._state = state
        self._size = 0 if state is None else int(state.size)
        self._position = 0 if state is None else int(state.position)
        self._n_per_row = 0 if state is None else state.n_envs * _n_agents(state.data)

    def _advance(self) -> None:
        self._position = (self._position + 1) % self.capacity
        self._size = min(self._size + 1, self.capacity)

    def add(self, experience: Any) -> None:
        """Stores one step of experience (leaves ``(E, ...)``)."""
        experience = _as_experience_arrays(experience)
        if self._state is None:
            self.state = buffer_init(experience, self.capacity, self.prioritized)
        self._state = _add(self._state, experience)
        self._advance()

    def set_priorities(self, priorities: Priorities | None) -> None:
        """Takes the priorities an update changed (prioritized replay; the rows and counters are
        the same, so the host counters stay)."""
        if self._state is not None and priorities is not None:
            self._state = self._state._replace(priorities=priorities)

    def add_rows(self, rows: Any) -> None:
        """Stores ``T`` steps of experience (leaves ``(T, E, ...)``), in order."""
        for t in range(jax.tree_util.tree_leaves(rows)[0].shape[0]):
            self.add(jax.tree_util.tree_map(lambda x, t=t: x[t], rows))

    @property
    def size(self) -> int:
        """Filled rows (vector steps)."""
        return self._size

    @property
    def n_transitions(self) -> int:
        """Stored transitions: rows times environments (times agents for dict experience)."""
        return self._size * self._n_per_row

    def __len__(self) -> int:
        return self.size

    def reset(self) -> None:
        """Empties the buffer."""
        if self._state is not None:
            self._state = _reset(self._state)
        self._size = self._position = 0


def _n_agents(data: Any) -> int:
    """Agents per environment in stored experience: in multi-agent experience EVERY field is a dict
    keyed by agent, so the reward (or, failing that, the action or done) field tells; observations
    alone cannot, since single-agent ``Dict`` observations are dicts too."""
    for name in ("reward", "done", "action"):
        field = getattr(data, name, None)
        if field is not None:
            return len(field) if isinstance(field, dict) else 1
    observation = getattr(data, "observation", None)
    return len(observation) if isinstance(observation, dict) else 1


class ReplayBuffer(_HostBuffer):
    """Fixed-capacity replay buffer (off-policy agents): uniform ``sample``; with ``prioritized``,
    it keeps a priority per transition for prioritized replay (``kitae.replay``).

    Args:
        capacity: rows (vector steps) kept; the buffer holds ``capacity * E`` transitions.
        prioritized: keep priorities (``BufferState.priorities``).
    """

    def sample(self, key: jax.Array, batch_size: int) -> Any:
        """``batch_size`` transitions drawn uniformly, leaves ``(B, ...)``."""
        if self.size == 0:  # never filled, or emptied by reset()
            raise RuntimeError("cannot sample from an empty ReplayBuffer")
        return _sample(self.state, key, batch_size)


@partial(jax.jit, static_argnums=2)
def _sample(state: BufferState, key: jax.Array, batch_size: int) -> Any:
    return buffer_sample(state, key, batch_size)


class RolloutBuffer(_HostBuffer):
    """Fixed-length rollout buffer (on-policy agents): filled, read whole, then reset.

    The rows are staged in preallocated numpy arrays on the host and cross to JAX once per
    rollout (one transfer instead of a compiled call per step); ``state`` gives the same
    ``BufferState`` as the pure functions would hold.

    Args:
        capacity: rollout length in vector steps.
    """

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self._rows: Any = None  # the staged data: leaves (capacity, E, ...) numpy arrays

    def add(self, experience: Any) -> None:
        """Stages one step of experience (leaves ``(E, ...)``) in the next host row; the first
        step decides the fields and dtypes (float64 stored as float32, int64 as int32).

        Raises:
            ValueError: the experience has another number of arrays than the rollout's first step.
        """
        if self._rows is None:
            experience = _as_experience_arrays(experience)  # the first row decides the dtypes
            self._rows = jax.tree_util.tree_map(lambda x: np.zeros((self.capacity, *x.shape), x.dtype), experience)
            leaves = jax.tree_util.tree_leaves(experience)
            self._n_per_row = leaves[0].shape[0] * _n_agents(experience)
        # NumPy's assignment casts to the staged dtypes (float64 -> float32, int64 -> int32, as
        # _as_experience_arrays does) without converting each leaf first: a host-loop step spent
        # about 30 µs converting
        rows, leaves = jax.tree_util.tree_leaves(self._rows), jax.tree_util.tree_leaves(experience)
        if len(rows) != len(leaves):
            raise ValueError(
                f"the experience has {len(leaves)} arrays ({jax.tree_util.tree_structure(experience)}) where the "
                f"rollout's first step had {len(rows)} ({jax.tree_util.tree_structure(self._rows)}); every step "
                "must have the same fields"
            )
        for row, x in zip(rows, leaves):
            row[self._position] = x
        self._advance()

    @property
    def state(self) -> BufferState | None:
        """The staged rows as a pure ``BufferState`` (a copy on the device, leaves
        ``(capacity, E, ...)``), or ``None`` before the first ``add``."""
        if self._rows is None:
            return None
        return BufferState(
            jax.tree_util.tree_map(lambda x: jnp.array(x, copy=True), self._rows),
            jnp.asarray(self._position, jnp.int32),
            jnp.asarray(self._size, jnp.int32),
        )

    @state.setter
    def state(self, state: BufferState | None) -> None:
        self._rows = None if state is None else jax.tree_util.tree_map(lambda x: np.array(x), state.data)
        self._size = 0 if state is None else int(state.size)
        self._position = 0 if state is None else int(state.position)
        self._n_per_row = 0 if state is None else state.n_envs * _n_agents(state.data)

    def reset(self) -> None:
        """Empties the rollout: the counters go to zero and the staged rows are overwritten by the
        next ``add`` calls."""
        self._size = self._position = 0

    @property
    def full(self) -> bool:
        """Whether a whole rollout has been collected."""
        return self.size == self.capacity

    def rollout(self) -> Any:
        """The collected rollout in time order, leaves ``(T, E, ...)``."""
        if self.size == 0:  # never filled, or emptied by reset()
            raise RuntimeError("the RolloutBuffer is empty")
        state = self.state
        assert state is not None  # size > 0: the rows were allocated by add() or the state setter
        return buffer_rollout(state)
