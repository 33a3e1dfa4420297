"""The two kinds of Ray actor of a distributed run (plain classes here; the executor wraps them
with ``ray.remote``).

- ``CollectionWorker``: its own copies of the environments (its shard of the run's ``n_envs``)
  and of the agent; collects an iteration's vector steps with the acting weights it is sent: in
  Gymnasium, EnvPool and PettingZoo environments step by step with
  ``kitae.loops.host.HostCollector`` (the host loop's own step), in JAX environments (gymnax,
  Brax, JaxMARL) as one compiled rollout with ``kitae.loops.jax_collect.JaxCollector`` (the
  compiled loop's own step, scanned).
- ``GradientWorker``: a copy of the agent's state and of the buffer (the updater sends each
  iteration's new rows); either runs a whole update (one synchronous gradient worker: nothing to
  average) or computes the gradients of one gradient step (``kitae.distributed.AgentAlgorithm``).

Both rebuild the agent from a picklable factory (a class and a config), so nothing but arrays
crosses process boundaries during training.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from kitae.algos.update import epoch_minibatches
from kitae.compilation_cache import use_compilation_cache
from kitae.distributed.algorithm import AgentAlgorithm
from kitae.envs.make import EnvSpec, make_env
from kitae.envs.parallel import VecParallelEnv
from kitae.loops.collect import CompiledAct, FlatActing, compiled_steps
from kitae.loops.host import HostCollector, check_env
from kitae.loops.jax_collect import JaxCollector
from kitae.loops.state import env_reset_key, mark_episodes_cut, reset_seed
from kitae.types import AlgoType

__all__ = ["CollectionWorker", "GradientWorker", "stack_rows", "shard"]


def stack_rows(rows: list[Any]) -> Any:
    """Vector steps ``[(E, ...)] * T`` -> leaves ``(T, E, ...)``."""
    return jax.tree_util.tree_map(lambda *xs: np.stack(xs), *rows)


def shard(batch: Any, index: int, count: int) -> Any:
    """Rows ``[index * n // count, (index + 1) * n // count)`` of every leaf ``(n, ...)``."""
    n = jax.tree_util.tree_leaves(batch)[0].shape[0]
    lo, hi = index * n // count, (index + 1) * n // count
    return jax.tree_util.tree_map(lambda x: x[lo:hi], batch)


class CollectionWorker:
    """Collects experience in its own environments (see the module docstring).

    Args:
        agent_factory: builds the agent (picklable).
        env_id: the environment: an ``EnvSpec`` (with the run's ``env_kwargs``) or its id.
        n_envs: this worker's environments (its shard of the run's ``n_envs``).
        index: the worker's index in ``[0, n_workers)``.
        n_workers: how many workers collect.
    """

    def __init__(
        self, agent_factory: Callable[[], Any], env_id: str | EnvSpec, n_envs: int, index: int, n_workers: int
    ) -> None:
        use_compilation_cache()  # a worker started again finds its programs compiled
        self.agent = agent_factory()
        self.index, self.n_envs, self.n_workers = index, n_envs, n_workers
        # the acting weights arrive as a list of arrays and go into this agent's own structure
        self.acting_structure = jax.tree_util.tree_structure(self.agent.acting_params(self.agent.state))
        spec = EnvSpec.parse(env_id)
        fold = None if n_workers == 1 else index  # several workers: each acts with its own fold of the act key
        self.jax_collector: JaxCollector | None = None
        if spec.is_jax:
            self.jax_collector = JaxCollector(self.agent, make_env(spec, n_envs), fold)
            return
        env = check_env(make_env(spec, n_envs))
        self.collector = HostCollector(self.agent, env, isinstance(env, VecParallelEnv))
        # one worker acts with the host loop's own compiled act; several each with its fold of the
        # act key (the loop key advances as in the host loop)
        self.act = compiled_steps(self.agent).act if fold is None else CompiledAct(self.agent, fold)

    def pid(self) -> int:
        """The worker's process id (the fault tests kill it)."""
        return os.getpid()

    def reset(self, seed: int, step: int) -> None:
        """Resets the environments for a run of seed ``seed`` that starts or goes on at ``step``:
        sub-environment ``i`` of worker ``w`` is seeded ``reset_seed(seed, step) + w * n_envs + i``
        (the seeds of one vector environment of all workers' copies); a JAX environment's copies
        from ``env_reset_key(seed, step)`` (the compiled loop's key), folded with ``w`` when
        several workers collect."""
        if self.jax_collector is not None:
            key = env_reset_key(seed, step)
            self.jax_collector.reset(key if self.n_workers == 1 else jax.random.fold_in(key, self.index))
        else:
            self.collector.reset(reset_seed(seed, step) + self.index * self.n_envs)

    def collect(
        self, acting: Any, key: jax.Array, env_step: int, n_steps: int, total_envs: int, version: int
    ) -> dict[str, Any]:
        """Collects ``n_steps`` vector steps with the acting weights ``acting``.

        Args:
            acting: the acting weights as ``AgentAlgorithm.get_weights`` gives them (a list of
                arrays, each of its leaf's shape).
            key: the loop key at the first step (a raw ``(2,)`` uint32 PRNG key).
            env_step: the run's transitions before the first step.
            n_steps: vector steps to collect.
            total_envs: the run's environments over all workers (the steps a vector step counts).
            version: the number of updates behind ``acting`` (returned, for the policy lag).

        Returns:
            ``{"rows": leaves (n_steps, E_w, ...), "episodes": [(t, Episodes)], "key": next loop
            key, "version": version}``.
        """
        # on the device once per collection, not once per act call
        flat = FlatActing(jax.device_put(list(acting)), self.acting_structure)
        if self.jax_collector is not None:
            tree = jax.tree_util.tree_unflatten(flat.treedef, flat.leaves)
            rows, episodes, key = self.jax_collector.collect(tree, key, env_step, n_steps, total_envs)
            return {"rows": rows, "episodes": episodes, "key": np.asarray(key), "version": version}
        rows, episodes = [], []
        for t in range(n_steps):
            experience, ended, key = self.collector.step(
                self.act, flat, key, env_step + t * total_envs, env_step + (t + 1) * total_envs
            )
            rows.append(experience)
            if ended is not None:
                episodes.append((t, ended))
        return {
            "rows": stack_rows(rows),
            "episodes": episodes,
            "key": np.asarray(key),
            "version": version,
        }


class GradientWorker:
    """Computes updates or gradients on its copy of the state and of the buffer.

    Args:
        agent_factory: builds the agent (picklable).
    """

    def __init__(self, agent_factory: Callable[[], Any]) -> None:
        use_compilation_cache()
        self.agent = agent_factory()
        self.algorithm = AgentAlgorithm(self.agent)
        self.buffer = self.agent.make_buffer()
        self.steps = compiled_steps(self.agent)
        self.on_policy = self.agent.algo_type is AlgoType.ON_POLICY
        self.version = 0
        self._processed: Any = None
        self._epoch_keys: Any = None
        self._minibatches: dict[int, Any] = {}
        self._epoch_minibatches = jax.jit(epoch_minibatches, static_argnums=(2,))

    def pid(self) -> int:
        """The worker's process id (the fault tests kill it)."""
        return os.getpid()

    def set_state(self, state: Any, version: int) -> None:
        """Takes the updater's state (``AgentAlgorithm.get_state``'s list of arrays, each of the
        shape of its leaf of the agent's state pytree; ``version``: its number of applied gradient
        steps)."""
        self.algorithm.set_state(state)
        self.version = version

    def apply(self, grads: Any) -> None:
        """Applies gradients to this worker's state (synchronous mode: the updater's mean)."""
        self.algorithm.apply_gradients(grads)
        self.version += 1

    def add_rows(self, rows: Any) -> None:
        """Adds an iteration's rows (leaves ``(T, E, ...)``) to the buffer."""
        self.buffer.add_rows(rows)

    def cut_episodes(self, cut: np.ndarray) -> None:
        """Marks the newest row truncated where ``cut`` holds, ``(E,)`` (a replaced collection
        worker's environments)."""
        self.buffer.state = mark_episodes_cut(self.buffer.state, cut)

    def set_buffer(self, buffer_state: Any) -> None:
        """Replaces the buffer (a run that goes on from a checkpoint)."""
        self.buffer.state = buffer_state

    def reset_buffer(self) -> None:
        """Empties the buffer (on-policy: after each update, as the updater's)."""
        self.buffer.reset()

    def update(self, key: jax.Array) -> tuple[Any, np.ndarray, dict[str, float], Any, bool]:
        """One whole update with the loop key ``key`` (a raw ``(2,)`` uint32 PRNG key;
        ``kitae.loops.collect.update_step``, the host loop's compiled call): returns ``(state as
        get_state's list of arrays, next loop key (2,), info, priorities, finite)`` as host arrays
        (``priorities``: the buffer's new prioritized-replay priorities, which the updater's buffer
        takes too; ``None`` without them; ``finite``: false where the update was not finite, and so
        not kept)."""
        out = self.steps.update(self.algorithm.state, key, self.buffer.state)
        info, finite = jax.device_get((out.info, out.finite))
        self.buffer.set_priorities(out.priorities)  # the state before it where the update was not kept
        self.algorithm.set_state(out.agent_state)
        info = {k: float(v) for k, v in info.items()}
        return self.algorithm.get_state(), np.asarray(out.key), info, jax.device_get(out.priorities), bool(finite)

    def begin_update(self, update_key: jax.Array) -> None:
        """The first part of an update made gradient step by gradient step, from ``update_key`` (a
        raw ``(2,)`` uint32 PRNG key): on-policy, the rollout (leaves ``(T, E, ...)``) processed
        with the state at the update's start (leaves ``(N, ...)``) and one key per epoch
        ``(n_epochs, 2)``; off-policy, the keys of the gradient steps ``(n_epochs, 2)``."""
        self._minibatches = {}
        if self.on_policy:
            rollout = self.agent.update_data(self.buffer.state)
            self._processed, self._epoch_keys = self.algorithm.process_rollout(rollout, update_key)
        else:
            self._epoch_keys = self.agent.gradient_step_keys(update_key)

    def gradients(
        self, step: tuple[int, int], part: int, parts: int, apply_first: Any = None
    ) -> tuple[Any, dict[str, float], int]:
        """The gradients of gradient step ``step`` (on-policy ``(epoch, minibatch)``, off-policy
        ``(step, 0)``) on part ``part`` of ``parts`` of its minibatch, with this worker's state.

        Args:
            step: ``(epoch, minibatch)`` on-policy, ``(gradient step, 0)`` off-policy.
            part: which part of the minibatch, in ``[0, parts)``: its rows
                ``[part * n // parts, (part + 1) * n // parts)`` (``shard``).
            parts: how many parts the minibatch is cut into (1: all of it).
            apply_first: synchronous mode: the previous step's mean gradients, applied to this
                worker's state first (every worker and the updater apply the same gradients to the
                same state, so all hold the same bits without sending the state).

        Returns:
            ``(grads as host arrays, info, version of the state they were computed with)``.
        """
        if apply_first is not None:
            self.algorithm.apply_gradients(apply_first)
            self.version += 1
        epoch, j = step
        if self.on_policy:
            if epoch not in self._minibatches:
                self._minibatches = {
                    epoch: self._epoch_minibatches(self._epoch_keys[epoch], self._processed, self.agent.minibatch_rows)
                }
            step_keys, batches = self._minibatches[epoch]
            batch, key = jax.tree_util.tree_map(lambda x: x[j], batches), step_keys[j]
        else:
            batch, key = self.algorithm.gradient_batch(self._epoch_keys[epoch], self.buffer.state)
        if parts > 1:
            batch = shard(batch, part, parts)
        grads, info = self.algorithm.compute_gradients(batch, key=key)
        return grads, info, self.version
