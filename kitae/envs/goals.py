"""Goal-conditioned environments: bit flipping, and the goal reward functions HER recomputes.

**Bit flipping** (Andrychowicz et al. 2017, the test bed of hindsight experience replay): a state
of ``n`` bits and a goal of ``n`` bits, both random at the start (never equal); the action
``i`` flips bit ``i``; the reward is 0 when the state equals the goal (the episode then
terminates) and -1 otherwise; an episode is cut after ``n`` steps. Observations are Gymnasium's
goal dicts: ``observation`` (the state), ``achieved_goal`` (the state again), ``desired_goal``,
each ``(n,)`` float32 of 0 and 1. A random policy almost never reaches a goal for large ``n``
(``2**-n`` per state): without relabelling, the rewards say nothing.

- Gymnasium: ``gym.make("BitFlipping-v0", n_bits=15)`` (15 bits by default) once this module
  is imported (``kitae.envs.make`` imports it), so ``kitae train dqn BitFlipping-v0`` finds it.
- JAX: ``make_jax_env("gymnax:BitFlipping-v0", n)`` (``JaxBitFlipping``), for the compiled loop.

``goal_reward_fn(task_name, observation_space)`` gives hindsight relabelling the environment's
``compute_reward(achieved_goal, desired_goal)`` as a JAX function: bit flipping's own
(``bit_flipping_reward``, pure), or for another Gymnasium goal environment its ``compute_reward``
run on the host through ``jax.pure_callback``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np

__all__ = [
    "NAME",
    "GOAL_KEYS",
    "BitFlippingEnv",
    "JaxBitFlipping",
    "bit_flipping_reward",
    "goal_reward_fn",
    "register",
]

NAME = "BitFlipping-v0"
DEFAULT_BITS = 15
GOAL_KEYS = ("observation", "achieved_goal", "desired_goal")
"""The keys of a goal-conditioned environment's ``Dict`` observations."""


def bit_flipping_reward(achieved_goal: Any, desired_goal: Any) -> Any:
    """0 where the achieved goal equals the desired one, else -1: ``(..., n), (..., n) -> (...)``
    float32 (numpy in, numpy out; JAX arrays in, JAX arrays out)."""
    xp = jnp if isinstance(achieved_goal, jax.Array) or isinstance(desired_goal, jax.Array) else np
    different = xp.any(xp.asarray(achieved_goal) != xp.asarray(desired_goal), axis=-1)
    return -xp.asarray(different, dtype=xp.float32)


def _spaces(n_bits: int) -> gym.spaces.Dict:
    bits = gym.spaces.Box(0.0, 1.0, (n_bits,), np.float32)
    return gym.spaces.Dict(dict.fromkeys(GOAL_KEYS, bits))


class BitFlippingEnv(gym.Env):
    """Bit flipping with ``n_bits`` bits (Gymnasium API, goal dict observations).

    Args:
        n_bits: the number of bits (>= 1); the episode is cut after ``n_bits`` steps.
    """

    metadata = {"render_modes": []}

    def __init__(self, n_bits: int = DEFAULT_BITS) -> None:
        if isinstance(n_bits, bool) or not isinstance(n_bits, int) or n_bits < 1:
            raise ValueError(f"n_bits={n_bits!r} is not allowed; allowed: an int >= 1")
        self.n_bits = n_bits
        self.observation_space = _spaces(n_bits)
        self.action_space = gym.spaces.Discrete(n_bits)
        self._state = np.zeros(n_bits, np.float32)
        self._goal = np.zeros(n_bits, np.float32)
        self._steps = 0

    def _observation(self) -> dict[str, np.ndarray]:
        return {
            "observation": self._state.copy(),
            "achieved_goal": self._state.copy(),
            "desired_goal": self._goal.copy(),
        }

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        """Starts an episode: random bits and a random goal that differs from them.

        Args:
            seed: reseeds ``np_random`` (Gymnasium's ``reset``), or ``None``.
            options: not read.

        Returns:
            ``(observation, {})``: the goal dict, each entry ``(n_bits,)`` float32 of 0 and 1.
        """
        super().reset(seed=seed)
        self._state = self.np_random.integers(0, 2, self.n_bits).astype(np.float32)
        self._goal = self._state
        while np.array_equal(self._goal, self._state):  # a goal already reached is no task
            self._goal = self.np_random.integers(0, 2, self.n_bits).astype(np.float32)
        self._steps = 0
        return self._observation(), {}

    def step(self, action: Any) -> tuple[dict, float, bool, bool, dict]:
        """Flips bit ``action``.

        Args:
            action: the bit to flip, a scalar int in ``[0, n_bits)``.

        Returns:
            ``(observation, reward, terminated, truncated, info)``: the goal dict (each entry
            ``(n_bits,)`` float32), 0.0 when the bits equal the goal (the episode then terminates)
            else -1.0, whether it terminated, whether it was cut (``n_bits`` steps without reaching
            the goal), and ``{"is_success": terminated}``.

        Raises:
            ValueError: for an action outside ``[0, n_bits)``.
        """
        index = int(action)
        if not 0 <= index < self.n_bits:
            raise ValueError(f"action={action!r} is not allowed; allowed: an int in [0, {self.n_bits})")
        self._state = self._state.copy()
        self._state[index] = 1.0 - self._state[index]
        self._steps += 1
        reward = float(bit_flipping_reward(self._state, self._goal))
        terminated = reward == 0.0
        truncated = not terminated and self._steps >= self.n_bits
        return self._observation(), reward, terminated, truncated, {"is_success": terminated}

    def compute_reward(self, achieved_goal: Any, desired_goal: Any, info: Any = None) -> Any:
        """Gymnasium's goal-environment reward: ``bit_flipping_reward``."""
        del info
        return bit_flipping_reward(achieved_goal, desired_goal)


class BitFlippingState(NamedTuple):
    """``JaxBitFlipping``'s state: ``bits`` ``(n,)``, ``goal`` ``(n,)`` float32, ``steps`` int32."""

    bits: jax.Array
    goal: jax.Array
    steps: jax.Array


class JaxBitFlipping:
    """Bit flipping in JAX (``kitae.envs.jax_env.JaxEnv``): the same task as ``BitFlippingEnv``.

    Args:
        n_bits: the number of bits (>= 1).
    """

    default_params = None

    def __init__(self, n_bits: int = DEFAULT_BITS) -> None:
        if isinstance(n_bits, bool) or not isinstance(n_bits, int) or n_bits < 1:
            raise ValueError(f"n_bits={n_bits!r} is not allowed; allowed: an int >= 1")
        self.n_bits = n_bits
        self.observation_space = _spaces(n_bits)
        self.action_space: gym.spaces.Discrete = gym.spaces.Discrete(n_bits)

    def _observation(self, state: BitFlippingState) -> dict[str, jax.Array]:
        return {"observation": state.bits, "achieved_goal": state.bits, "desired_goal": state.goal}

    def reset(self, key: jax.Array, params: Any) -> tuple[dict, BitFlippingState]:
        """Starts an episode: random bits and a goal that differs from them in at least one bit.

        Args:
            key: a PRNG key (a raw ``(2,)`` uint32 key).
            params: not read (``default_params`` is ``None``).

        Returns:
            ``(observation, state)``: the goal dict (each entry ``(n_bits,)`` float32) and a
            ``BitFlippingState`` with ``steps`` 0.
        """
        del params
        bits_key, goal_key = jax.random.split(key)
        bits = jax.random.bernoulli(bits_key, 0.5, (self.n_bits,)).astype(jnp.float32)
        # a goal that differs from the state: flip a non-empty random subset of the bits
        flips = jax.random.bernoulli(goal_key, 0.5, (self.n_bits,))
        first = jax.random.randint(jax.random.fold_in(goal_key, 1), (), 0, self.n_bits)
        flips = jnp.where(jnp.any(flips), flips, jnp.arange(self.n_bits) == first)
        goal = jnp.where(flips, 1.0 - bits, bits)
        state = BitFlippingState(bits, goal, jnp.zeros((), jnp.int32))
        return self._observation(state), state

    def step(self, key: jax.Array, state: BitFlippingState, action: Any, params: Any) -> Any:
        """Flips bit ``action``; an episode that ends here is reset from ``key``.

        Args:
            key: a PRNG key (a raw ``(2,)`` uint32 key), used only by the reset.
            state: the ``BitFlippingState`` (``bits``, ``goal`` ``(n_bits,)``, ``steps`` scalar).
            action: the bit to flip, a scalar int in ``[0, n_bits)``.
            params: not read.

        Returns:
            A ``JaxTimeStep``: ``observation`` and ``next_observation`` goal dicts (each entry
            ``(n_bits,)`` float32; ``observation`` the new episode's where one ended), ``reward``
            a float32 scalar (0.0 at the goal, else -1.0), ``terminated`` (goal reached) and
            ``truncated`` (``n_bits`` steps without reaching it) bool scalars.
        """
        from kitae.envs.jax_env import JaxTimeStep

        bits = state.bits.at[action].set(1.0 - state.bits[action])
        after = BitFlippingState(bits, state.goal, state.steps + 1)
        reward = bit_flipping_reward(bits, state.goal)
        terminated = reward == 0.0
        truncated = jnp.logical_and(jnp.logical_not(terminated), after.steps >= self.n_bits)
        next_observation = self._observation(after)
        reset_observation, reset_state = self.reset(key, params)
        ended = jnp.logical_or(terminated, truncated)
        new_state = jax.tree_util.tree_map(lambda r, a: jnp.where(ended, r, a), reset_state, after)
        observation = jax.tree_util.tree_map(lambda r, a: jnp.where(ended, r, a), reset_observation, next_observation)
        return JaxTimeStep(observation, new_state, reward, terminated, truncated, next_observation)

    def __repr__(self) -> str:
        return f"JaxBitFlipping(n_bits={self.n_bits})"


def _check_goal_space(task_name: str, observation_space: gym.Space) -> None:
    if not (isinstance(observation_space, gym.spaces.Dict) and set(GOAL_KEYS) <= set(observation_space.spaces)):
        raise ValueError(
            f"replay.her is not allowed for {task_name}: its observations are {observation_space}; allowed: a goal "
            f"environment's Dict observations with keys {GOAL_KEYS}"
        )


def goal_reward_fn(task_name: str, observation_space: gym.Space) -> Callable[[jax.Array, jax.Array], jax.Array]:
    """The environment's goal reward ``(achieved_goal (B, ...), desired_goal (B, ...)) -> (B,)``
    as a JAX function, for hindsight relabelling.

    Bit flipping (``BitFlipping-v0``, in Gymnasium or JAX): ``bit_flipping_reward``, pure. Another
    Gymnasium id: its environment's ``compute_reward(achieved, desired, info=None)`` (vectorised,
    as Gymnasium's goal environments define it), called on the host with ``jax.pure_callback``.

    Raises:
        ValueError: for observations that are not goal dicts, or an environment with no
            ``compute_reward``.
    """
    _check_goal_space(task_name, observation_space)
    name = task_name.split(":", 1)[1] if ":" in task_name else task_name
    if name == NAME:
        return bit_flipping_reward
    source = task_name.split(":", 1)[0] if ":" in task_name else "gymnasium"
    if source != "gymnasium":
        raise ValueError(
            f"replay.her is not allowed for {task_name}: kitae knows no JAX goal reward for it; allowed: "
            f"{NAME} (Gymnasium or gymnax) and Gymnasium goal environments with compute_reward"
        )
    env = gym.make(name).unwrapped
    compute_reward = getattr(env, "compute_reward", None)
    if not callable(compute_reward):
        raise ValueError(f"replay.her is not allowed for {task_name}: its environment defines no compute_reward")

    def host_reward(achieved: np.ndarray, desired: np.ndarray) -> np.ndarray:
        return np.asarray(compute_reward(achieved, desired, None), np.float32)

    def reward_fn(achieved: jax.Array, desired: jax.Array) -> jax.Array:
        shape = jax.ShapeDtypeStruct(achieved.shape[:-1], jnp.float32)
        return jax.pure_callback(host_reward, shape, achieved, desired, vmap_method="broadcast_all")

    return reward_fn


def register() -> None:
    """Registers ``BitFlipping-v0`` with Gymnasium (once)."""
    if NAME not in gym.registry:
        gym.register(NAME, entry_point=BitFlippingEnv)  # type: ignore[arg-type]  # a class is a creator


register()
