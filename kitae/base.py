"""Agents: the thin stateful shell around four pure functions.

An agent is made from four factories (see ``docs/custom_agents.md``):

- ``train_state_factory(key, config, *, preprocess_fn=None, tabulate=False) -> state``
- ``explore_factory(config) -> explore_fn(state, key, observations, **hyper) -> (actions, log_probs)``
- ``process_experience_factory(config) -> process_fn(state, key, experience) -> tuple of arrays``
- ``update_step_factory(config) -> update_fn(state, key, batch) -> (state, info)``

``BaseAgent`` holds the state, the PRNG key and the buffer, lifts the functions to vectorized and
multi-agent environments, and compiles the whole update (processing plus every gradient step)
into one call. ``OffPolicyAgent`` learns from a replay buffer, ``OnPolicyAgent`` from rollouts.

Step units: every step count here (``n_env_steps``, ``start_step``, ``skip_steps``) counts
environment transitions summed over all environments.
"""

from __future__ import annotations

import abc
from functools import partial
from pathlib import Path
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from kitae.algos.experience import ExperiencePipeline
from kitae.algos.factory import explore_general_factory
from kitae.buffer import Experience, ReplayBuffer, RolloutBuffer, buffer_sample
from kitae.config import AlgoConfig
from kitae.loops.update import batchify, update_epoch
from kitae.types import AlgoType

__all__ = ["AlgoType", "IAgent", "BaseAgent", "OffPolicyAgent", "OnPolicyAgent"]

KEY_BLOCK = 256


def step_array(env_step: int | jax.Array) -> np.ndarray | jax.Array:
    """``agent.env_step`` as an int32 array for a jitted explore function: a numpy scalar on the
    host (a Python int that changes would be a new static value; an array is not), the traced
    value itself inside the compiled loop."""
    if isinstance(env_step, jax.core.Tracer):
        return env_step.astype(jnp.int32)
    return np.asarray(env_step, np.int32)


@jax.jit
def _split_block(key: jax.Array) -> jax.Array:
    """``KEY_BLOCK + 1`` keys: the next agent key first, then ``KEY_BLOCK`` keys to hand out."""
    return jax.random.split(key, KEY_BLOCK + 1)


class IAgent(abc.ABC):
    """The interface every agent follows; the training loops rely on nothing else.

    Observations passed to ``explore`` and ``select_action`` have a leading environment axis
    ``(E, *obs_shape)`` (dicts of those keyed by agent in multi-agent environments).
    """

    config: AlgoConfig
    algo_type: AlgoType
    buffer: Any
    state: Any
    env_step: int
    """Environment transitions so far (summed over environments); set by the training loop
    before each ``explore`` call, so exploration can depend on it (random actions before
    ``start_step``, epsilon schedules)."""

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
    def train(self, env: Any, n_env_steps: int) -> Any:
        """Trains for ``n_env_steps`` environment transitions summed over all environments."""


class BaseAgent(IAgent):
    """An agent built from the four factories.

    Args:
        run_name: name of the run; logs go to ``runs/<run_name>/`` unless ``run_dir`` says otherwise.
        config: the ``AlgoConfig``.
        train_state_factory: ``(key, config, *, preprocess_fn, tabulate) -> state``.
        explore_factory: ``config -> explore_fn``.
        process_experience_factory: ``config -> process_fn``.
        update_step_factory: ``config -> update_fn``.
        preprocess_fn: optional observation preprocessing handed to ``train_state_factory``.
        tabulate: print a table of each network's layers and parameter counts.
        experience_type: the NamedTuple stored in the buffer; its fields must be a subset of
            ``kitae.buffer.Experience``'s (the host loop fills them by name).
        run_dir: where logs go (default ``runs/<run_name>``).

    Attributes:
        state: the agent's ``AgentPyTree`` (parameters, optimizer states, target parameters).
        key: the host PRNG key from which every exploration and update key is split.
        explore_fn: ``explore_fn`` lifted to the environment's layout (vectorized / multi-agent).
        process_experience_pipeline: an ``ExperiencePipeline`` around ``process_fn``.
        update_step_fn: the user's one-minibatch update step.
        buffer: a ``ReplayBuffer`` (off-policy) or ``RolloutBuffer`` (on-policy).
        update_fn: the pure whole update ``(state, key, data) -> (state, info)``: for on-policy
            agents ``data`` is a rollout ``(T, E, ...)``, for off-policy agents a ``BufferState``.
    """

    algo_type: AlgoType

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
        if fields is None or not set(fields) <= set(Experience._fields):
            raise ValueError(
                f"experience_type={experience_type!r} is not allowed; allowed: a NamedTuple whose fields "
                f"are among {Experience._fields}"
            )

        self.run_name = run_name
        self.run_dir = Path(run_dir) if run_dir is not None else Path("runs") / run_name
        self.config = config
        self.experience_type = experience_type
        self.preprocess_fn = preprocess_fn
        self.parallel = config.env_cfg.n_agents > 1
        self.vectorized = True  # the host and compiled loops always hand over (E, ...) batches

        self.train_state_factory = train_state_factory
        self.key, self.state = self.initial_state(config.seed, tabulate=tabulate)
        self._key_block, self._key_index = np.zeros((0, 2), np.uint32), 0

        self.explore_fn = explore_general_factory(explore_factory(config), self.vectorized, self.parallel)
        self.process_experience_fn = process_experience_factory(config)
        self.update_step_fn = update_step_factory(config)
        self.process_experience_pipeline = ExperiencePipeline(
            [self.process_experience_fn],
            vectorized=self.algo_type is AlgoType.ON_POLICY,
            parallel=self.parallel,
        )
        self.buffer = self._make_buffer()
        self.update_fn = self._make_update_fn()
        self._update_fn = jax.jit(self.update_fn)
        self.n_updates = 0
        self.env_step = 0  # environment transitions so far; the training loop keeps it current

    def initial_state(self, seed: int | jax.Array, *, tabulate: bool = False) -> tuple[jax.Array, Any]:
        """The host key and state a fresh agent made with ``seed`` starts from.

        Pure and traceable (``seed`` may be a traced integer), so the compiled loop can build one
        state per seed inside ``jax.vmap``; with ``config.seed`` it gives exactly ``agent.state``.
        """
        key, state_key = jax.random.split(jax.random.PRNGKey(seed))
        state = self.train_state_factory(state_key, self.config, preprocess_fn=self.preprocess_fn, tabulate=tabulate)
        return key, state

    def explore_with(self, state: Any, key: jax.Array, observation: Any,
                     env_step: int | jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        """Runs ``self.explore`` as a pure function of ``(state, key, observation, env_step)``.

        The agent's ``state``, ``key`` and ``env_step`` are swapped for the given ones during the
        call and restored afterwards, so any ``explore`` written against the agent's attributes
        (as in the custom-agent guide) can be traced inside the compiled loop.

        Returns:
            ``(actions, log_probs, key)`` with ``key`` the agent key after the call.
        """
        saved = self.state, self.key, self.env_step
        self.state, self.key, self.env_step = state, key, env_step
        try:
            actions, log_probs = self.explore(observation)
            return actions, log_probs, self.key
        finally:
            self.state, self.key, self.env_step = saved

    # -- keys ---------------------------------------------------------------------------------

    def nextkey(self) -> jax.Array:
        """Returns a fresh PRNG key derived from the agent's key.

        On the host, keys are split from ``self.key`` a block of ``KEY_BLOCK`` at a time (one
        compiled call per block instead of one dispatch per key: splitting a key costs about as
        much as a whole explore call). Traced inside the compiled loop, ``self.key`` is split
        directly. Both are deterministic functions of the seed.
        """
        if isinstance(self.key, jax.core.Tracer):
            self.key, key = jax.random.split(self.key)
            return key
        if self._key_index >= len(self._key_block):
            keys = np.asarray(_split_block(self.key))
            self.key, self._key_block, self._key_index = keys[0], keys[1:], 0
        key = self._key_block[self._key_index]
        self._key_index += 1
        return key

    def interact_keys(self, observation: Any) -> jax.Array | dict[str, jax.Array]:
        """One key for a batch of observations, or one key per agent (a dict) in multi-agent mode."""
        if self.parallel:
            agents = list(observation.keys())
            keys = jax.random.split(self.nextkey(), len(agents))
            return {agent: keys[i] for i, agent in enumerate(agents)}
        return self.nextkey()

    # -- updates --------------------------------------------------------------------------------

    @abc.abstractmethod
    def _make_buffer(self) -> Any:
        """The buffer this kind of agent learns from."""

    @abc.abstractmethod
    def _make_update_fn(self) -> Callable:
        """The pure ``(state, key, data) -> (state, info)`` function that ``update`` compiles;
        the compiled loop calls the same function inside its program."""

    @abc.abstractmethod
    def _update_data(self, buffer: Any) -> Any:
        """What ``update`` hands the compiled update function from the buffer."""

    def update(self, buffer: Any) -> dict[str, float]:
        """Runs one compiled update (processing and every gradient step) on the buffer's data.

        Returns:
            The mean of each info entry over the gradient steps, as floats.
        """
        self.state, info = self._update_fn(self.state, self.nextkey(), self._update_data(buffer))
        self.n_updates += 1
        return {name: float(value) for name, value in jax.device_get(info).items()}  # one transfer

    # -- training -------------------------------------------------------------------------------

    def train(self, env: Any, n_env_steps: int | None = None, *, writer: Any = None,
              checkpointer: Any = None) -> Any:
        """Trains in ``env`` for ``n_env_steps`` environment transitions summed over all environments
        (default: ``config.train_cfg.n_env_steps``).

        A Gymnasium environment trains in the host loop (``kitae.loops.train.vectorized_train``,
        which closes ``env`` at the end); a JAX environment (``kitae.envs.jax_env.VecJaxEnv``,
        e.g. ``make_jax_env("gymnax:CartPole-v1", 4)``) trains in the compiled loop
        (``kitae.loops.compiled.compiled_train``): the whole run as one XLA program.

        Args:
            env: a Gymnasium environment or vector environment (see ``check_env``), or a ``VecJaxEnv``.
            n_env_steps: transitions to train for, summed over environments.
            writer: a ``tensorboardX.SummaryWriter``; default: one writing to ``<run_dir>/logs``.
            checkpointer: optional ``kitae.checkpoint.Checkpointer`` (or any object with
                ``save(step, agent)`` for the host loop): saves every ``train_cfg.save_frequency``
                steps and at the end; the compiled loop then runs in segments and saves its loop state.

        Returns:
            ``kitae.loops.train.TrainStats`` (host loop: every episode's return and length) or
            ``kitae.loops.compiled.CompiledRun`` (compiled loop: per-iteration metrics, compile
            and train seconds).
        """
        from kitae.envs.jax_env import VecJaxEnv
        from kitae.loops.compiled import compiled_train, log_compiled_metrics
        from kitae.loops.train import vectorized_train  # the loops import this module

        n_env_steps = self.config.train_cfg.n_env_steps if n_env_steps is None else n_env_steps
        if not isinstance(n_env_steps, int) or isinstance(n_env_steps, bool) or n_env_steps < 1:
            raise ValueError(f"n_env_steps={n_env_steps!r} is not allowed; allowed: an int >= 1")
        owns_writer = writer is None
        if owns_writer:
            from tensorboardX import SummaryWriter

            writer = SummaryWriter(str(self.run_dir / "logs"))
        try:
            if isinstance(env, VecJaxEnv):
                result = compiled_train(self, env, n_env_steps, checkpointer=checkpointer)
                log_compiled_metrics(writer, result)
                return result
            return vectorized_train(
                self.config.seed, self, env, n_env_steps, self.algo_type,
                checkpointer=checkpointer, writer=writer,
            )
        finally:
            if owns_writer:
                writer.close()

    # -- checkpoints ----------------------------------------------------------------------------

    def save(self, step: int | None = None, directory: str | Path | None = None) -> Path:
        """Saves the agent's whole state (``kitae.checkpoint``) to ``<directory>/<step>/``
        (default ``<run_dir>/checkpoints/<env_step>/``); returns the checkpoint folder."""
        from kitae.checkpoint import Checkpointer

        with Checkpointer(directory or self.run_dir / "checkpoints") as checkpointer:
            return checkpointer.save(self.env_step if step is None else step, self)

    def resume(self, env: Any, n_env_steps: int | None = None, *, writer: Any = None,
               checkpointer: Any = None) -> Any:
        """Restores the newest readable checkpoint of ``<run_dir>/checkpoints`` and trains on until
        ``n_env_steps`` transitions IN ALL (default ``config.train_cfg.n_env_steps``), as ``train``
        does (``kitae.runner.resume_agent``)."""
        from kitae.runner import resume_agent

        return resume_agent(self, env, n_env_steps, writer=writer, checkpointer=checkpointer)

    @classmethod
    def unserialize(cls, run_dir: str | Path, seed_index: int = 0) -> "BaseAgent":
        """Rebuilds an agent of this class from a run directory: ``config.yaml`` and the newest
        readable checkpoint (``kitae.runner.load_agent``)."""
        from kitae.runner import load_agent

        agent_cls = None if cls in (BaseAgent, OffPolicyAgent, OnPolicyAgent) else cls
        return load_agent(run_dir, seed_index, agent_cls=agent_cls)


def _mean_over_steps(infos: dict[str, jax.Array]) -> dict[str, jax.Array]:
    return jax.tree_util.tree_map(lambda x: jnp.mean(x, axis=0), infos)


class OffPolicyAgent(BaseAgent):
    """An agent that learns from a replay buffer.

    The buffer keeps ``max_buffer_size`` vector steps (``max_buffer_size * n_envs * n_agents``
    transitions). One update runs ``n_epochs`` gradient steps in one compiled call, each on
    ``batch_size`` transitions sampled uniformly from the buffer and processed with the current
    state (so targets use the latest parameters).

    Updates are gated by two fields of ``config.algo_params`` when it has them:
    ``start_step`` (no update before this many transitions; default 0) and ``skip_steps``
    (update once every ``skip_steps`` transitions, at most once per vector step; default 1).
    """

    algo_type = AlgoType.OFF_POLICY

    def _make_buffer(self) -> ReplayBuffer:
        return ReplayBuffer(self.config.update_cfg.max_buffer_size)

    def _make_update_fn(self) -> Callable:
        pipeline = self.process_experience_pipeline
        update_step_fn = self.update_step_fn
        batch_size = self.config.update_cfg.batch_size
        n_steps = self.config.update_cfg.n_epochs

        def update_fn(state: Any, key: jax.Array, buffer_state: Any) -> tuple[Any, dict]:
            def gradient_step(state: Any, key: jax.Array) -> tuple[Any, dict]:
                sample_key, process_key, update_key = jax.random.split(key, 3)
                sample = buffer_sample(buffer_state, sample_key, batch_size)
                batch = pipeline.run(state, process_key, sample)
                return update_step_fn(state, update_key, batch)

            state, infos = jax.lax.scan(gradient_step, state, jax.random.split(key, n_steps))
            return state, _mean_over_steps(infos)

        return update_fn

    def _update_data(self, buffer: ReplayBuffer) -> Any:
        return buffer.state

    def should_update(self, step: int, buffer: ReplayBuffer) -> bool:
        """True when ``step >= start_step``, the buffer holds a batch, and ``step`` has crossed a
        multiple of ``skip_steps`` during the last vector step."""
        params = self.config.algo_params
        start_step = getattr(params, "start_step", 0)
        skip_steps = max(1, getattr(params, "skip_steps", 1))
        per_step = self.config.env_cfg.n_envs
        if step < start_step or buffer.n_transitions < self.config.update_cfg.batch_size:
            return False
        return step // skip_steps > (step - per_step) // skip_steps


class OnPolicyAgent(BaseAgent):
    """An agent that learns from fresh rollouts.

    The rollout buffer collects ``max_buffer_size`` vector steps; when it is full, one compiled
    update processes the rollout (``(T, E, ...)`` lifted through the ``ExperiencePipeline``) and
    runs ``n_epochs`` epochs of shuffled minibatches of ``batch_size`` with ``update_epoch``; then
    the buffer is emptied.
    """

    algo_type = AlgoType.ON_POLICY

    def _make_buffer(self) -> RolloutBuffer:
        return RolloutBuffer(self.config.update_cfg.max_buffer_size)

    def _make_update_fn(self) -> Callable:
        pipeline = self.process_experience_pipeline
        update_step_fn = self.update_step_fn
        batch_size = self.config.update_cfg.batch_size
        n_epochs = self.config.update_cfg.n_epochs

        def update_fn(state: Any, key: jax.Array, rollout: Any) -> tuple[Any, dict]:
            process_key, epochs_key = jax.random.split(key)
            processed = pipeline.run(state, process_key, rollout)
            epoch = partial(
                update_epoch,
                experience=processed,
                batchify_fn=batchify,
                update_batch_fn=update_step_fn,
                experience_type=type(processed),
                batch_size=batch_size,
            )

            def one_epoch(state: Any, key: jax.Array) -> tuple[Any, dict]:
                return epoch(key, state)

            state, infos = jax.lax.scan(one_epoch, state, jax.random.split(epochs_key, n_epochs))
            return state, _mean_over_steps(infos)

        return update_fn

    def _update_data(self, buffer: RolloutBuffer) -> Any:
        return buffer.rollout()

    def should_update(self, step: int, buffer: RolloutBuffer) -> bool:
        """True when the rollout buffer is full."""
        return buffer.full

    def update(self, buffer: RolloutBuffer) -> dict[str, float]:
        """Updates on the full rollout, then empties the buffer."""
        info = super().update(buffer)
        buffer.reset()
        return info
