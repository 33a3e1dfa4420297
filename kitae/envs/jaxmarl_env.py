"""JaxMARL multi-agent environments as kitae JAX environments (the compiled loop).

``JaxMARLEnv`` adapts a JaxMARL ``MultiAgentEnv`` to the ``JaxEnv`` protocol of
``kitae.envs.jax_env`` in its multi-agent form: observations, actions, rewards, ``terminated``
and ``truncated`` are dicts keyed by agent (``"agent_0"``, ``"agent_1"``, ...), every agent has
the same Gymnasium observation and action spaces (the agents share one set of parameters:
``EnvConfig.n_agents > 1``, kitae's parallel mode), and ``step`` resets an environment whose
episode ended (JaxMARL's ``dones["__all__"]``) while handing back the episode's REAL final
observations in ``JaxTimeStep.next_observation``.

Termination is not truncation. JaxMARL reports one ``dones`` flag per agent plus ``"__all__"``
and does not say why an episode ended, so the adapter is told: ``episode_end="truncation"`` (the
episode is cut by a time limit: bootstrap from the final observation) or ``"termination"`` (a
terminal state: no bootstrap). MPE episodes end only when ``max_steps`` is reached, so every
``MPE_*`` environment defaults to ``"truncation"``; other environments must say.

``VecJaxMARLEnv`` is ``VecJaxEnv`` (``n_envs`` copies, vmapped) that also tells the loop its
``agents``; ``make_jaxmarl_env("MPE_simple_spread_v3", n_envs)`` builds one, and
``make_jax_env("jaxmarl:MPE_simple_spread_v3", n_envs)`` goes through it.

Shapes (one environment): observation ``{agent: (*obs_shape)}``, action ``{agent: ()}`` (Discrete)
or ``{agent: (D,)}`` (Box), reward / terminated / truncated ``{agent: ()}``. ``VecJaxMARLEnv``
adds a leading ``(E,)`` to every leaf.
"""

from __future__ import annotations

import contextlib
import io
import sys
from typing import Any

import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np

from kitae.envs.jax_env import JaxTimeStep, VecJaxEnv
from kitae.envs.options import LIBRARY_REFUSALS, check_options, constructor_options, refused
from kitae.validation import closest_names

EPISODE_ENDS = ("truncation", "termination")


def _import_jaxmarl() -> Any:
    try:
        with _quiet_jaxmarl_import():
            import jaxmarl
    except ImportError as error:  # an optional extra
        raise ImportError(
            f"JaxMARL environments need the 'jaxmarl' package ({error}); install kitae's extra: "
            "pip install -e '.[jaxmarl]'"
        ) from error
    return jaxmarl


@contextlib.contextmanager
def _quiet_jaxmarl_import() -> Any:
    """Imports jaxmarl 0.2.0 without its side effects on the process's streams.

    Importing it (1) prints two lines about optional "submoduled" environments, and (2) resets
    ``sys.stdout`` / ``sys.stderr`` to ``sys.__stdout__`` / ``sys.__stderr__`` (its MABrax module
    silences brax's import that way), which would undo any redirection in force (pytest's
    capture, a caller's ``redirect_stdout``). The streams, the original ones included, point to a
    sink during the import and are all restored afterwards.
    """
    saved = sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__
    sink = io.StringIO()
    # typeshed marks sys.__stdout__ / __stderr__ Final; jaxmarl writes them, so they are saved and restored here
    sys.stdout = sys.__stdout__ = sink  # type: ignore[misc, assignment]
    try:
        yield
    finally:
        sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__ = saved  # type: ignore[misc]


def registered_envs() -> list[str]:
    """The environment names JaxMARL registers (``jaxmarl.registered_envs``)."""
    return list(_import_jaxmarl().registered_envs)


def jaxmarl_space_to_gym(space: Any, what: str) -> gym.Space:
    """Converts a JaxMARL ``Discrete`` or ``Box`` space to its Gymnasium twin.

    Observation boxes become float32 (kitae keeps observations float32).

    Raises:
        ValueError: for any other kind of space (``what`` names which space it was).
    """
    kind = type(space).__name__
    if kind == "Discrete":
        return gym.spaces.Discrete(int(space.n))
    if kind == "Box":
        shape = tuple(int(d) for d in space.shape)
        dtype = np.dtype(space.dtype) if getattr(space, "dtype", None) is not None else np.dtype(np.float32)
        if np.issubdtype(dtype, np.floating):
            dtype = np.dtype(np.float32)
        low = np.broadcast_to(np.asarray(space.low, dtype=dtype), shape)
        high = np.broadcast_to(np.asarray(space.high, dtype=dtype), shape)
        # Gymnasium types Box's dtype as a scalar type; it takes any np.dtype (it calls np.dtype(dtype))
        return gym.spaces.Box(low, high, shape, dtype)  # type: ignore[arg-type]
    raise ValueError(f"{what} is a JaxMARL {kind} space; allowed: Discrete or Box")


def _make(jaxmarl: Any, name: str, env_kwargs: dict[str, Any]) -> Any:
    """``jaxmarl.make(name, **env_kwargs)``, its options checked (``kitae.envs.options``).

    ``jaxmarl.make`` picks the class in code (no registry to read it from), so the options are
    checked once the environment is made (making an MPE environment takes milliseconds, and
    nothing outside it); where its constructor refuses them, an environment with the defaults tells
    the class, whose checks say what is allowed, else the library's message is passed on.
    """
    if not env_kwargs:
        return jaxmarl.make(name)
    where = f"JaxMARL's {name!r}"
    try:
        env = jaxmarl.make(name, **env_kwargs)
    except LIBRARY_REFUSALS as error:
        _check_kwargs(type(jaxmarl.make(name)), env_kwargs, where)
        raise refused(env_kwargs, where, error) from error
    _check_kwargs(type(env), env_kwargs, where)
    return env


def _check_kwargs(cls: type, env_kwargs: dict[str, Any], where: str) -> None:
    """``check_options`` with the options of JaxMARL's class ``cls`` (and ``JaxMARLEnv``'s
    ``episode_end``)."""
    choices: dict[str, tuple[str, ...]] = {}
    if cls.__module__.startswith("jaxmarl.environments.mpe."):
        # SimpleMPE takes these two action types (its module's constants) and raises
        # NotImplementedError, without naming them, for any other
        from jaxmarl.environments.mpe.default_params import CONTINUOUS_ACT, DISCRETE_ACT

        choices["action_type"] = (DISCRETE_ACT, CONTINUOUS_ACT)
    learned = constructor_options(cls)
    options = {**learned, "episode_end": None} if learned else {}  # episode_end: JaxMARLEnv's own
    check_options(env_kwargs, options, where, choices=choices)


class JaxMARLEnv:
    """Adapts a JaxMARL ``MultiAgentEnv`` to kitae's ``JaxEnv`` protocol, keyed by agent.

    Args:
        env: a JaxMARL environment name (``jaxmarl.registered_envs``, e.g.
            ``"MPE_simple_spread_v3"``) or an already made ``MultiAgentEnv``.
        episode_end: what the end of an episode (``dones``) means: ``"truncation"`` (a time
            limit) or ``"termination"`` (a terminal state). Default: ``"truncation"`` for ``MPE_*``
            environments (they end only at ``max_steps``); required for the others.
        **env_kwargs: passed to ``jaxmarl.make`` (e.g. ``action_type="Continuous"``,
            ``max_steps=25``, ``num_agents=3``): the options of the environment's class
            (``kitae.envs.options.constructor_options``), each of its default's type.

    Attributes:
        agents: the agent names, in JaxMARL's order (a tuple).
        n_agents: ``len(agents)``.
        observation_space, action_space: the Gymnasium spaces of ONE agent (all agents share them).
        default_params: ``None`` (JaxMARL environments hold their parameters).

    Raises:
        ValueError: for an unknown name (the message lists the registered ones), an
            ``episode_end`` that is not allowed or missing, an option the environment does not
            take or a value its constructor refuses, agents whose spaces differ, or spaces
            other than ``Discrete`` / ``Box``.
        TypeError: for an option whose value has another type than its default.
    """

    default_params: Any = None

    def __init__(self, env: Any, *, episode_end: str | None = None, **env_kwargs: Any) -> None:
        if isinstance(env, str):
            jaxmarl = _import_jaxmarl()
            if env not in jaxmarl.registered_envs:
                hint = closest_names(env, jaxmarl.registered_envs)
                raise ValueError(
                    f"unknown JaxMARL environment {env!r}{hint}; registered: {', '.join(jaxmarl.registered_envs)}"
                )
            self.name = env
            self.env = _make(jaxmarl, env, env_kwargs)
        else:
            if env_kwargs:
                raise ValueError(
                    f"env_kwargs={sorted(env_kwargs)} are not allowed with an environment object; "
                    "allowed: keyword arguments only with a name (they go to jaxmarl.make)"
                )
            missing = [
                m for m in ("reset", "step_env", "agents", "observation_space", "action_space") if not hasattr(env, m)
            ]
            if missing:
                raise ValueError(
                    f"env={env!r} is not allowed: it lacks {missing}; allowed: a JaxMARL environment name or "
                    "MultiAgentEnv"
                )
            self.name = type(env).__name__
            self.env = env
        if episode_end is None:
            if not self.name.startswith("MPE_") and "MPE" not in type(self.env).__name__:
                raise ValueError(
                    f"env_kwargs.episode_end=None is not allowed for {self.name!r}: JaxMARL does not say whether its "
                    "episodes end by a time limit or in a terminal state; allowed: "
                    f"{', '.join(map(repr, EPISODE_ENDS))} (--set env_kwargs.episode_end=VALUE)"
                )
            episode_end = "truncation"
        if episode_end not in EPISODE_ENDS:
            raise ValueError(
                f"env_kwargs.episode_end={episode_end!r} is not allowed; allowed: {', '.join(map(repr, EPISODE_ENDS))}"
            )
        self.episode_end = episode_end

        self.agents = tuple(self.env.agents)
        self.n_agents = len(self.agents)
        if self.n_agents < 1:
            raise ValueError(f"{self.name!r} has no agents; allowed: an environment with at least one agent")
        obs_spaces = {
            a: jaxmarl_space_to_gym(self.env.observation_space(a), f"the observation space of {a!r}")
            for a in self.agents
        }
        act_spaces = {
            a: jaxmarl_space_to_gym(self.env.action_space(a), f"the action space of {a!r}") for a in self.agents
        }
        for kind, spaces in (("observation", obs_spaces), ("action", act_spaces)):
            first = self.agents[0]
            different = [a for a in self.agents if spaces[a] != spaces[first]]
            if different:
                raise ValueError(
                    f"the agents of {self.name!r} differ in their {kind} spaces ({first!r}: {spaces[first]}, "
                    + ", ".join(f"{a!r}: {spaces[a]}" for a in different)
                    + "); allowed: every agent with the same spaces (kitae's agents share one set of parameters)"
                )
        self.observation_space = obs_spaces[self.agents[0]]
        self.action_space = act_spaces[self.agents[0]]
        self._visualizer: Any = None

    # -- the JaxEnv protocol --------------------------------------------------------------------

    def _observations(self, obs: dict) -> dict:
        return {a: jnp.asarray(obs[a], jnp.float32) for a in self.agents}

    def _actions(self, action: dict) -> dict:
        if isinstance(self.action_space, gym.spaces.Box):
            # Gaussian policies hand over raw samples (kept in the buffer for their
            # log-probabilities); the environment gets them clipped to the bounds, as
            # make_vec_env's ClipAction does for Gymnasium.
            low, high = self.action_space.low, self.action_space.high
            return {a: jnp.clip(jnp.asarray(action[a], jnp.float32), low, high) for a in self.agents}
        return {a: jnp.asarray(action[a], jnp.int32) for a in self.agents}

    def reset(self, key: jax.Array, params: Any = None) -> tuple[dict, Any]:
        """``(observations {agent: (*obs_shape)} float32, state)``; ``params`` is unused."""
        obs, state = self.env.reset(key)
        return self._observations(obs), state

    def step(self, key: jax.Array, state: Any, action: dict, params: Any = None) -> JaxTimeStep:
        """One step of every agent; resets the environment where its episode ended.

        JaxMARL's own ``step`` resets too but returns only the first observation of the next
        episode, so this calls ``step_env`` (no reset) and ``reset`` and picks between them
        with ``dones["__all__"]``, as JaxMARL does, keeping the final observation.

        Args:
            key: a PRNG key (a raw ``(2,)`` uint32 key), split into the step's and the reset's.
            state: JaxMARL's state pytree of one environment.
            action: ``{agent: action}``, each a scalar (discrete) or ``(*action_shape)``.
            params: not read.

        Returns:
            A ``JaxTimeStep`` whose ``observation``, ``next_observation`` (each agent's
            ``(*obs_shape)`` float32), ``reward`` (float32 scalars), ``terminated`` and
            ``truncated`` (bool scalars) are dicts keyed by agent. With
            ``episode_end="truncation"``: ``truncated[a] = dones["__all__"]``, ``terminated`` all
            False. With ``"termination"``: ``terminated[a] = dones[a] or dones["__all__"]``,
            ``truncated`` all False.
        """
        step_key, reset_key = jax.random.split(key)
        ts, over = self._advance(step_key, state, action)
        obs_reset, state_reset = self.env.reset(reset_key)
        new_state = jax.tree_util.tree_map(lambda r, s: jax.lax.select(over, r, s), state_reset, ts.state)
        first_obs = self._observations(obs_reset)
        observation = {a: jax.lax.select(over, first_obs[a], ts.next_observation[a]) for a in self.agents}
        return ts._replace(observation=observation, state=new_state)

    def step_without_reset(self, key: jax.Array, state: Any, action: dict, params: Any = None) -> JaxTimeStep:
        """One step that keeps the state it reaches, even where the episode ends there (``step``
        resets it): what a video draws. ``key`` is the step's own (``step`` splits its key into
        this one and the reset's); ``observation`` and ``next_observation`` are both the
        observations reached.

        Args:
            key: a PRNG key (a raw ``(2,)`` uint32 key).
            state: JaxMARL's state pytree of one environment.
            action: ``{agent: action}``, each a scalar (discrete) or ``(*action_shape)``.
            params: not read.

        Returns:
            A ``JaxTimeStep`` of dicts keyed by agent: observations ``(*obs_shape)`` float32,
            rewards float32 scalars, ``terminated`` and ``truncated`` bool scalars.
        """
        return self._advance(key, state, action)[0]

    def _advance(self, key: jax.Array, state: Any, action: dict) -> tuple[JaxTimeStep, jax.Array]:
        """``(the step without a reset, whether the episode ended: dones["__all__"])``."""
        obs_step, state_step, rewards, dones, _ = self.env.step_env(key, state, self._actions(action))
        over = jnp.asarray(dones["__all__"], bool)
        final_obs = self._observations(obs_step)
        false = jnp.zeros((), bool)
        if self.episode_end == "truncation":
            truncated = dict.fromkeys(self.agents, over)
            terminated = dict.fromkeys(self.agents, false)
        else:
            terminated = {a: jnp.logical_or(jnp.asarray(dones[a], bool), over) for a in self.agents}
            truncated = dict.fromkeys(self.agents, false)
        ts = JaxTimeStep(
            observation=final_obs,
            state=state_step,
            reward={a: jnp.asarray(rewards[a], jnp.float32) for a in self.agents},
            terminated=terminated,
            truncated=truncated,
            next_observation=final_obs,
        )
        return ts, over

    @property
    def render_fps(self) -> float:
        """Steps per second of simulated time (``1 / dt``; 10 for MPE): a video's frame rate."""
        return round(1.0 / float(getattr(self.env, "dt", 0.1)), 3)

    def render(self, state: Any) -> np.ndarray:
        """``(500, 500, 3)`` uint8: one MPE environment's ``state`` (not a batch) drawn by JaxMARL's
        own ``MPEVisualizer`` (matplotlib: the entities as discs, the step, what speakers say).

        Raises:
            ValueError: for an environment other than MPE (JaxMARL's other visualizers draw
                their own kinds of scenes).
        """
        if not self.filmable:
            raise ValueError(f"JaxMARL environment {self.name!r} cannot be drawn; allowed: the MPE_* environments")
        if self._visualizer is None:
            from jaxmarl.environments.mpe.mpe_visualizer import MPEVisualizer

            with contextlib.redirect_stdout(io.StringIO()):  # it prints "Comm active? ..." when made
                self._visualizer = MPEVisualizer(self.env, [state])
        self._visualizer.state_seq = [state]
        with contextlib.redirect_stdout(io.StringIO()):
            self._visualizer.update(0)
        canvas = self._visualizer.fig.canvas
        canvas.draw()
        return np.asarray(canvas.buffer_rgba())[..., :3].copy()

    @property
    def filmable(self) -> bool:
        """Whether ``render`` draws this environment: JaxMARL's MPE environments."""
        return "MPE" in type(self.env).__name__

    def close(self) -> None:
        """Closes the figure ``render`` draws on (made again when ``render`` is called again)."""
        if self._visualizer is not None:
            import matplotlib.pyplot as plt

            plt.close(self._visualizer.fig)
        self._visualizer = None

    def __repr__(self) -> str:
        return f"JaxMARLEnv({self.name!r}, episode_end={self.episode_end!r})"


class VecJaxMARLEnv(VecJaxEnv):
    """``n_envs`` copies of a ``JaxMARLEnv`` stepped together with ``jax.vmap``.

    Every leaf of the observations, actions, rewards and flags is ``(E, ...)`` inside dicts
    keyed by agent. ``single_observation_space`` / ``single_action_space`` are ONE agent's
    spaces in ONE environment (what ``EnvConfig`` wants, with ``n_agents``).

    Attributes:
        agents: the agent names (a tuple).
        n_agents: how many (``EnvConfig.n_agents``).
    """

    env: JaxMARLEnv

    def __init__(self, env: JaxMARLEnv, n_envs: int) -> None:
        if not isinstance(env, JaxMARLEnv):
            raise TypeError(f"env={env!r} is not allowed; allowed: a JaxMARLEnv")
        super().__init__(env, n_envs)

    @property
    def agents(self) -> tuple[str, ...]:
        """The agent names, in the environment's order."""
        return self.env.agents

    @property
    def n_agents(self) -> int:
        """Agents per environment."""
        return self.env.n_agents

    def __repr__(self) -> str:
        return f"VecJaxMARLEnv({self.env!r}, n_envs={self.num_envs})"


def make_jaxmarl_env(name: str, n_envs: int, *, episode_end: str | None = None, **env_kwargs: Any) -> VecJaxMARLEnv:
    """``n_envs`` copies of the JaxMARL environment ``name`` (e.g. ``"MPE_simple_spread_v3"``).

    Raises:
        ValueError: for an unknown name (listing the registered ones), ``n_envs < 1``, or what
            ``JaxMARLEnv`` refuses.
    """
    return VecJaxMARLEnv(JaxMARLEnv(name, episode_end=episode_end, **env_kwargs), n_envs)
