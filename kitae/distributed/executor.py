"""The distributed executor: collection workers, gradient workers and one updater on Ray.

Why this module is long: one run's driver (``_Run``: collection in two modes, the update in
three, worker faults, logging and checkpoints) is one class whose parts share the run's state.

The updater (this process) owns the authoritative ``LoopState``: the agent's state and loop key,
the buffer and the counters. Each iteration (``kitae.schedule``: the vector steps between two
update checks) it gathers experience from the collection workers, adds it to its buffer and to
the gradient workers' copies, and when the schedule says an update is due, has the gradient
workers make it:

- one gradient worker runs the whole update (the host loop's compiled call) on its copy of the
  state and buffer, which are the updater's, and the updater takes the result: with one worker
  there is nothing to average, and asynchronous gradients would have nothing to overlap with (each
  step would wait for the one before);
- otherwise the update runs gradient step by gradient step (the steps of the fused update, in the
  same order with the same keys: ``AgentAlgorithm``): synchronous gradients split each step's
  minibatch between the workers and apply their mean; asynchronous gradients deal the steps to
  workers as they come free and apply each result when it arrives. An on-policy agent's hooks
  (``OnPolicyAgent.prepare_update`` / ``finish_update``: running statistics such as PPO's
  normalisation) run on the updater's state where the fused update runs them: before the state
  goes to the workers, and after the last gradient step.

With one collection worker and one gradient worker in synchronous mode every key, minibatch and
update is the host loop's: the run ends with the host loop's state, bit for bit.

What the schedule, the experience, the update and the checkpoint are is not written here:
``kitae.schedule``, ``kitae.loops.host.HostCollector``, ``kitae.base`` and ``kitae.loops.state``.
"""

from __future__ import annotations

import functools
import sys
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from kitae.config import DistributedConfig
from kitae.distributed.algorithm import AgentAlgorithm
from kitae.distributed.gradients import average_gradients, gradient_plan
from kitae.distributed.runtime import check_local_room, ray_runtime
from kitae.distributed.workers import CollectionWorker, GradientWorker
from kitae.envs.make import EnvSpec, make_env
from kitae.envs.spaces import check_env_spaces
from kitae.loops.callbacks import Callback, CallbackList, LossMeans, Progress, RunInfo
from kitae.loops.evaluate import EvaluatesBySource
from kitae.loops.result import Divergence, Episodes, RunResult, concat_episodes
from kitae.loops.state import LoopState, Payload, mark_episodes_cut, payload_from_agent, strongly_typed
from kitae.validation import check_positive_int

__all__ = ["DistributedExecutor", "WorkersLost", "default_agent_factory", "check_spaces"]


class WorkersLost(RuntimeError):
    """Workers died after the run used its ``max_restarts`` replacements; the run stopped and
    saved a checkpoint first.

    Attributes:
        run_dir: the run directory to resume, where a run of ``kitae.runs`` set it, else ``None``.
    """

    run_dir: str | None = None


def default_agent_factory(agent: Any) -> Callable[[], Any]:
    """A picklable recipe of ``agent``: ``type(agent)(agent.run_name, agent.config)`` (the
    built-in algorithms' and the guide's constructor). Agents built otherwise pass their own."""
    cls: Any = type(agent)
    return functools.partial(cls, agent.run_name, agent.config)


class DistributedExecutor(EvaluatesBySource):
    """Runs an agent on Ray (see the module docstring).

    Args:
        config: the layout (``DistributedConfig``).
        agent_factory: ``agent -> () -> agent``, a picklable recipe the workers build their copy
            from (default ``default_agent_factory``).
    """

    name = "distributed"
    batches_seeds = False
    makes_envs = True  # each collection worker makes its own environments from the id
    starting: str | None = "starting the Ray runtime and its workers"

    def __init__(self, config: DistributedConfig, agent_factory: Callable[[Any], Callable[[], Any]] | None = None):
        if not isinstance(config, DistributedConfig):
            raise TypeError(f"config={config!r} is not allowed; allowed: a kitae.distributed.DistributedConfig")
        self.config = config
        self.agent_factory = agent_factory or default_agent_factory

    def check(self, env: Any, n_envs: int) -> EnvSpec:
        """Checks that this layout can train ``n_envs`` environments of ``env`` (an id or
        ``EnvSpec``; before a run starts, so that a bad one writes nothing); returns the spec.

        Raises:
            TypeError: for an environment object instead of an id.
            ValueError: for ``n_envs`` that is not a multiple of ``workers``, or, on a local
                runtime, more workers than this machine's memory holds (``check_local_room``).
        """
        if not isinstance(env, (str, EnvSpec)):
            raise TypeError(
                f"env={env!r} is not allowed here; allowed: an environment id or EnvSpec (each distributed "
                "worker makes its own environments)"
            )
        spec = EnvSpec.parse(env)
        workers = self.config.workers
        if n_envs % workers:
            raise ValueError(
                f"env_cfg.n_envs={n_envs} does not split over distributed.workers={workers}; allowed: a multiple "
                f"of {workers}"
            )
        check_local_room(
            workers,
            self.config.address,
            f"distributed.workers={workers}",
            name="distributed.workers",
            extra=self.config.gradient_workers,
        )
        return spec

    def restore_target(self, agent: Any, env: Any, meta: dict) -> LoopState | None:
        """Distributed checkpoints hold no environment part (the workers' environments are
        Python objects): the payload is restored from its own description."""
        del agent, env, meta
        return None

    # -- the run ---------------------------------------------------------------------------------

    def run(
        self,
        agent: Any,
        env: Any,
        n_env_steps: int,
        *,
        start: LoopState | None = None,
        seeds: list[int] | None = None,
        callbacks: Any = (),
    ) -> RunResult:
        """Trains ``agent`` until ``n_env_steps`` transitions in all (whole iterations).

        Args:
            agent: a ``kitae.base.BaseAgent``; ``config.env_cfg.n_envs`` environments in all,
                split evenly between the collection workers.
            env: the environment id (``"CartPole-v1"``, ``"envpool:Pong-v5"``,
                ``"gymnax:CartPole-v1"``, an ``EnvSpec``): each worker makes its own copies.
            n_env_steps: the transitions to train until, over all environments (>= 1; the run
                ends at the first whole iteration that reaches it).
            start: the ``LoopState`` to go on from (default: the agent's).
            seeds: ``[seed]`` of the environments' reset (default ``config.seed``).
            callbacks: ``kitae.loops.callbacks.Callback`` objects.

        Returns:
            A ``RunResult`` (the agent itself is not changed).

        Raises:
            TypeError: for an environment object instead of an id.
            ValueError: for ``n_env_steps`` < 1, ``n_envs`` not a multiple of the workers, spaces
                that differ from ``env_cfg``'s, or more than one seed.
        """
        check_positive_int("n_env_steps", n_env_steps)
        spec = self.check(env, agent.config.env_cfg.n_envs)
        check_spaces(agent.config.env_cfg, spec)
        seeds = [agent.config.seed] if seeds is None else list(seeds)
        if len(seeds) != 1:
            raise ValueError(f"seeds={seeds} is not allowed here; allowed: one seed per distributed run")
        callbacks = callbacks if isinstance(callbacks, Callback) else CallbackList(callbacks)
        with ray_runtime(self.config.address) as ray:
            return _Run(self, ray, agent, spec, n_env_steps, start, seeds[0], callbacks).run()


def check_spaces(env_cfg: Any, spec: EnvSpec) -> None:
    """The rule of every executor (``kitae.envs.spaces.check_env_spaces``), before Ray starts, for
    an id other than the one the config was made from (``agent.train_distributed(env_id)`` takes
    any): the workers make their environments from the id, so one copy is made here to check.
    The config's own id (``kitae train``, ``preset_agent``) gave ``env_cfg`` its spaces: no copy
    is made for it (making one imports its library here, 1-3 s for Brax or JaxMARL).

    Raises:
        ValueError: for spaces that differ from ``env_cfg``'s.
    """
    try:
        own = EnvSpec.parse(env_cfg.task_name).id == spec.id
    except ValueError:  # a task name that is not an id ("CartPole-pixels")
        own = False
    if own:
        return
    env = make_env(spec, 1)
    try:
        check_env_spaces(env_cfg, env.single_observation_space, env.single_action_space)
    finally:
        if hasattr(env, "close"):
            env.close()


class _Run:
    """One distributed run's driver state (the updater)."""

    def __init__(
        self,
        executor: DistributedExecutor,
        ray: Any,
        agent: Any,
        spec: EnvSpec,
        n_env_steps: int,
        start: LoopState | None,
        seed: int,
        callbacks: Callback,
    ) -> None:
        self.ray, self.agent, self.cfg, self.callbacks, self.seed = ray, agent, executor.config, callbacks, seed
        self.begin = time.perf_counter()
        self.schedule = agent.schedule
        state = payload_from_agent(agent).state if start is None else start
        if state.env is not None:
            raise ValueError("the distributed executor goes on from a state without an environment part")
        self.first = int(np.asarray(state.env_step))
        self.end = self.schedule.run_steps(n_env_steps)
        if self.first >= self.end:
            raise ValueError(f"the run is already at step {self.first:,}; n_env_steps={n_env_steps:,} asks for no more")
        self.buffer = agent.make_buffer()
        self.buffer.state = mark_episodes_cut(state.buffer) if self.first > 0 else state.buffer
        self.algorithm = AgentAlgorithm(agent)
        self.algorithm.set_state(strongly_typed(state.agent_state))
        self.key = jnp.asarray(state.agent_key)
        self.n_updates = int(np.asarray(state.n_updates))
        self.env_step = self.first
        self.factory, self.spec = executor.agent_factory(agent), spec
        workers = self.cfg.workers
        self.remote_collector = ray.remote(num_cpus=0)(CollectionWorker)
        self.remote_gradients = ray.remote(num_cpus=0)(GradientWorker)
        self.collectors = [self._new_collector(w) for w in range(workers)]
        self.gradient_workers = [self.remote_gradients.remote(self.factory) for _ in range(self.cfg.gradient_workers)]
        self.restarts = 0
        self.first_collect_seconds = 0.0
        ray.get([c.reset.remote(seed, self.first) for c in self.collectors])
        state_ref = ray.put(self.algorithm.get_state())
        ray.get([g.set_state.remote(state_ref, 0) for g in self.gradient_workers])
        if self.buffer.state is not None:
            buffer_ref = ray.put(jax.device_get(self.buffer.state))
            ray.get([g.set_buffer.remote(buffer_ref) for g in self.gradient_workers])
        self.startup_seconds = time.perf_counter() - self.begin
        self.losses = LossMeans(agent.config.train_cfg.log_frequency, self.first)
        self.found: list[Episodes] = []
        self.update_steps: list[int] = []
        self.divergence: Divergence | None = None
        self.update_finite = True
        self.latest_return: float | None = None
        self.timings = {"collect": 0.0, "update": 0.0, "broadcast": 0.0}
        self.policy_lags: list[float] = []  # since the last scalars were logged
        self.gradient_lags: list[float] = []
        self.lag_totals = {"policy": [0.0, 0, 0.0], "gradient": [0.0, 0, 0.0]}  # sum, count, max over the run
        # asynchronous collection: each worker's own key chain and its batch in flight
        self.worker_keys = [jax.random.fold_in(self.key, 1_000_003 + w) for w in range(workers)]
        self.in_flight: dict[Any, int] = {}

    # -- faults ----------------------------------------------------------------------------------

    def _new_collector(self, w: int) -> Any:
        n_envs, workers = self.agent.config.env_cfg.n_envs, self.cfg.workers
        # the spec, not its id: its env_kwargs travel with it (the run's env_cfg.env_kwargs)
        return self.remote_collector.remote(self.factory, self.spec, n_envs // workers, w, workers)

    def _count_restart(self, what: str, error: BaseException) -> None:
        self.restarts += 1
        if self.restarts > self.cfg.max_restarts:
            raise WorkersLost(
                f"{what} died ({type(error).__name__}) and the run has used its "
                f"distributed.max_restarts={self.cfg.max_restarts} replacements; stopped at step {self.env_step:,} "
                "with a checkpoint"
            )
        print(
            f"kitae: warning: {what} died ({type(error).__name__}); replaced it "
            f"({self.restarts} of {self.cfg.max_restarts} replacements)",
            file=sys.stderr,
        )
        self.callbacks.on_scalars(self.env_step, {"distributed/restarts": float(self.restarts)})

    def _replace_collector(self, w: int, error: BaseException) -> None:
        """A new collection worker ``w``: its environments start afresh (seeded from the seed and
        the step) and the episodes its old environments were running are cut in the buffers."""
        self._count_restart(f"collection worker {w}", error)
        self.ray.kill(self.collectors[w])
        self.collectors[w] = self._new_collector(w)
        self.ray.get(self.collectors[w].reset.remote(self.seed, self.env_step))
        n_envs = self.agent.config.env_cfg.n_envs
        share = n_envs // self.cfg.workers
        cut = np.zeros(n_envs, bool)
        cut[w * share : (w + 1) * share] = True
        self.buffer.state = mark_episodes_cut(self.buffer.state, cut)
        self.ray.get([g.cut_episodes.remote(cut) for g in self.gradient_workers])

    def _replace_dead_gradient_workers(self, error: BaseException) -> None:
        """Replaces every gradient worker that does not answer, with the updater's state and buffer."""
        for i, worker in enumerate(self.gradient_workers):
            try:
                self.ray.get(worker.pid.remote(), timeout=60)
            except self.ray.exceptions.RayError:
                self._count_restart(f"gradient worker {i}", error)
                self.ray.kill(worker)
                self.gradient_workers[i] = self.remote_gradients.remote(self.factory)
                state, version = self.algorithm.get_state(), self.algorithm.n_gradient_steps
                self.ray.get(self.gradient_workers[i].set_state.remote(state, version))
                if self.buffer.state is not None:
                    self.ray.get(self.gradient_workers[i].set_buffer.remote(jax.device_get(self.buffer.state)))

    # -- collection --------------------------------------------------------------------------------

    def _acting_ref(self) -> Any:
        return self.ray.put(self.algorithm.get_weights())

    def _collect_call(self, w: int, acting: Any, key: jax.Array, per_worker_steps: int) -> Any:
        """Asks collection worker ``w`` for ``per_worker_steps`` vector steps from the loop key ``key``."""
        n_envs = self.agent.config.env_cfg.n_envs
        return self.collectors[w].collect.remote(acting, key, self.env_step, per_worker_steps, n_envs, self.n_updates)

    def _collect_sync(self, per_worker_steps: int) -> list[dict]:
        acting = self._acting_ref()
        refs = [self._collect_call(w, acting, self.key, per_worker_steps) for w in range(len(self.collectors))]
        batches = []
        for w in range(len(refs)):
            while True:
                try:
                    batches.append(self.ray.get(refs[w]))
                    break
                except self.ray.exceptions.RayActorError as error:
                    self._replace_collector(w, error)
                    refs[w] = self._collect_call(w, acting, self.key, per_worker_steps)
        self.key = jnp.asarray(batches[0]["key"])  # every worker advanced the same loop key
        return batches

    def _issue(self, w: int, per_worker_steps: int, acting: Any) -> None:
        self.in_flight[self._collect_call(w, acting, self.worker_keys[w], per_worker_steps)] = w

    def _collect_async(self, per_worker_steps: int) -> list[dict]:
        if not self.in_flight:
            acting = self._acting_ref()
            for w in range(len(self.collectors)):
                self._issue(w, per_worker_steps, acting)
        batches: list[dict] = []
        acting = None
        while len(batches) < len(self.collectors):
            ready, _ = self.ray.wait(list(self.in_flight), num_returns=1)
            w = self.in_flight.pop(ready[0])
            try:
                batch = self.ray.get(ready[0])
            except self.ray.exceptions.RayActorError as error:
                self._replace_collector(w, error)
                self._issue(w, per_worker_steps, acting if acting is not None else self._acting_ref())
                continue
            self.worker_keys[w] = jnp.asarray(batch["key"])
            batches.append(batch)
            if acting is None:
                acting = self._acting_ref()
            self._issue(w, per_worker_steps, acting)  # the worker goes on with the newest weights
        return batches

    def _add(self, batches: list[dict]) -> None:
        """Adds an iteration (the batches side by side, in the order given) to the buffers."""
        rows = jax.tree_util.tree_map(lambda *xs: np.concatenate(xs, axis=1), *[b["rows"] for b in batches])
        steps = jax.tree_util.tree_leaves(rows)[0].shape[0]
        self.buffer.add_rows(rows)
        rows_ref = self.ray.put(rows)
        self.ray.get([g.add_rows.remote(rows_ref) for g in self.gradient_workers])
        n_envs = self.agent.config.env_cfg.n_envs
        base = self.env_step
        # Episodes in step order over the workers (each worker's are in order; the workers' vector
        # steps run side by side): metrics.jsonl's rows, TensorBoard's points and the "last
        # episodes" of the summary and the plot read them as the host loop writes them.
        found = [(t, w, ended) for w, batch in enumerate(batches) for t, ended in batch["episodes"]]
        by_step = sorted(found, key=lambda item: item[:2])
        for t, _, ended in by_step:
            # the step an episode ended at, counted in the updater's order of the iteration
            step = np.full(len(ended.step), base + (t + 1) * n_envs)
            ended = Episodes(step, ended.return_, ended.length, ended.count, ended.agent_returns, ended.seed_index)
            self.found.append(ended)
            self.latest_return = float(np.mean(ended.return_))
            self.callbacks.on_episodes(ended)
        for batch in batches:
            self._lag("policy", float(self.n_updates - batch["version"]))
        self.env_step += steps * n_envs

    def _lag(self, kind: str, lag: float) -> None:
        (self.policy_lags if kind == "policy" else self.gradient_lags).append(lag)
        total = self.lag_totals[kind]
        total[0], total[1], total[2] = total[0] + lag, total[1] + 1, max(total[2], lag)

    # -- updates ---------------------------------------------------------------------------------

    def _update(self) -> dict[str, float]:
        """One update by the gradient workers; a worker that dies is replaced and the update made
        again from the state and key it started from (the same update: nothing is lost). An update
        whose losses or new state are not finite is not kept either: the updater goes back to the
        state before it and records the ``Divergence`` (the run then stops)."""
        state, key, steps = self.algorithm.get_state(), self.key, self.algorithm.n_gradient_steps
        while True:
            try:
                info = self._update_once()
            except self.ray.exceptions.RayActorError as error:
                self.algorithm.set_state(state)
                self.algorithm.n_gradient_steps = steps
                self.key = key
                self._replace_dead_gradient_workers(error)
                continue
            finite = self.update_finite and all(np.isfinite(v) for v in info.values())
            if not finite:
                self.algorithm.set_state(state)
                self.algorithm.n_gradient_steps = steps
                self.key = key
                self.divergence = Divergence(self.env_step, info)
            return info

    def _update_once(self) -> dict[str, float]:
        ray, workers = self.ray, self.gradient_workers
        if len(workers) == 1:  # nothing to average, nothing to overlap: the fused update, whatever the mode
            state, key, info, priorities, self.update_finite = ray.get(workers[0].update.remote(self.key))
            self.buffer.set_priorities(priorities)  # the worker's buffer has them already
            self.algorithm.set_state(state)
            self.key = jnp.asarray(key)
            return info
        self.key, update_key = jax.random.split(self.key)
        # the agent's hooks run where the fused update runs them, on the updater's state: prepare
        # before the workers get the state and process the rollout, finish after the last step
        rollout = self.agent.update_data(self.buffer.state) if self.schedule.on_policy else None
        if rollout is not None:
            self.algorithm.prepare_update(rollout)
        version = self.algorithm.n_gradient_steps
        t0 = time.perf_counter()
        state_ref = ray.put(self.algorithm.get_state())
        ray.get([g.set_state.remote(state_ref, version) for g in workers])
        ray.get([g.begin_update.remote(update_key) for g in workers])
        self.timings["broadcast"] += time.perf_counter() - t0
        infos: list[dict[str, float]] = []
        plan = gradient_plan(self.agent.config, self.schedule.on_policy)
        if not self.cfg.async_gradients:
            grads_ref = None
            for step in plan:
                outs = ray.get([g.gradients.remote(step, i, len(workers), grads_ref) for i, g in enumerate(workers)])
                grads = average_gradients([o[0] for o in outs], [1.0] * len(outs))  # equal parts of one minibatch
                self.algorithm.apply_gradients(grads)
                infos.append({k: float(np.mean([o[1][k] for o in outs])) for k in outs[0][1]})
                grads_ref = ray.put(grads)  # the workers apply it first thing in the next step
            if grads_ref is not None:  # the last step's, so the workers end where the updater does
                ray.get([g.apply.remote(grads_ref) for g in workers])
        else:
            pending = list(plan)
            running: dict[Any, int] = {}
            for i, g in enumerate(workers):
                if pending:
                    running[g.gradients.remote(pending.pop(0), 0, 1)] = i
            while running:
                ready, _ = ray.wait(list(running), num_returns=1)
                i = running.pop(ready[0])
                grads, info, computed_with = ray.get(ready[0])
                self._lag("gradient", float(self.algorithm.n_gradient_steps - computed_with))
                self.algorithm.apply_gradients(grads)
                infos.append(info)
                if pending:
                    state_ref = ray.put(self.algorithm.get_state())
                    workers[i].set_state.remote(state_ref, self.algorithm.n_gradient_steps)
                    running[workers[i].gradients.remote(pending.pop(0), 0, 1)] = i
        if rollout is not None:
            self.algorithm.finish_update(rollout)
        self.update_finite = all(
            bool(np.all(np.isfinite(x)))
            for x in self.algorithm.get_state()
            if np.issubdtype(np.asarray(x).dtype, np.floating)
        )
        return {k: float(np.mean([info[k] for info in infos])) for k in infos[0]} if infos else {}

    # -- the loop --------------------------------------------------------------------------------

    def _payload(self) -> Payload:
        logged = self.losses.flush(self.env_step)
        if logged is not None:
            self.callbacks.on_losses(*logged, None)
        state = LoopState(
            self.algorithm.state,
            self.key,
            self.buffer.state,
            np.asarray(self.env_step, np.int32),
            np.asarray(self.n_updates, np.int32),
        )
        return Payload(state, {"executor": "distributed", "seeds": None, "env_saved": False})

    def run(self) -> RunResult:
        callbacks, schedule = self.callbacks, self.schedule
        callbacks.on_start(RunInfo("distributed", [self.seed], self.first, self.end, self.agent))
        per_iteration = schedule.steps_per_iteration
        steps_per_worker = schedule.vector_steps_per_iteration
        compile_seconds, stopped, last_progress = self.startup_seconds, False, time.perf_counter()
        first_iteration = True
        lost: WorkersLost | None = None
        try:
            while self.env_step < self.end:
                t0 = time.perf_counter()
                collect = self._collect_async if self.cfg.async_collection else self._collect_sync
                batches = collect(steps_per_worker)
                self._add(batches)
                collect_seconds = time.perf_counter() - t0
                self.timings["collect"] += collect_seconds
                if schedule.update_due(self.env_step, self.buffer.size):
                    t0 = time.perf_counter()
                    info = self._update()
                    self.timings["update"] += time.perf_counter() - t0
                    if self.divergence is not None:  # not kept: the run stops with its last finite state
                        stopped = True
                        break
                    if schedule.on_policy:
                        self.buffer.reset()
                        self.ray.get([g.reset_buffer.remote() for g in self.gradient_workers])
                    self.n_updates += 1
                    self.update_steps.append(self.env_step)
                    logged = self.losses.add(self.env_step, info)
                    if logged is not None:
                        callbacks.on_losses(*logged, None)
                    callbacks.on_scalars(self.env_step, self._scalars(collect_seconds, per_iteration))
                if first_iteration:  # start-up and the first compiles (collection and update)
                    compile_seconds = time.perf_counter() - self.begin
                    self.first_collect_seconds = collect_seconds
                    first_iteration = False
                stopping = self.env_step < self.end and callbacks.should_stop()
                if (
                    self.env_step < self.end
                    and not stopping
                    and schedule.save_due(self.env_step - per_iteration, self.env_step)
                ):
                    callbacks.on_checkpoint(self._payload())
                now = time.perf_counter()
                if stopping or now - last_progress >= 0.5:
                    elapsed = max(now - self.begin - compile_seconds, 1e-9)
                    callbacks.on_progress(
                        Progress(self.env_step, (self.env_step - self.first) / elapsed, self.latest_return)
                    )
                    last_progress = now
                if stopping:
                    stopped = True
                    break
        except WorkersLost as error:  # out of replacements: save what was learned, then say so
            lost, stopped = error, True
        finally:
            for actor in self.collectors + self.gradient_workers:
                self.ray.kill(actor)
        train_seconds = max(time.perf_counter() - self.begin - compile_seconds, 0.0)
        callbacks.on_progress(
            Progress(self.env_step, (self.env_step - self.first) / max(train_seconds, 1e-9), self.latest_return)
        )
        final = self._payload()
        callbacks.on_checkpoint(final)
        result = RunResult(
            executor="distributed",
            seeds=[self.seed],
            state=final.state,
            episodes=[concat_episodes(self.found)],
            update_steps=[np.asarray(self.update_steps, np.int64)],
            start_step=self.first,
            env_steps=self.env_step,
            compile_seconds=compile_seconds,
            train_seconds=train_seconds,
            stopped=stopped,
            diverged=[self.divergence],
            metrics={
                "startup_seconds": self.startup_seconds,
                "restarts": self.restarts,
                "first_collect_seconds": self.first_collect_seconds,
                **{f"{k}_seconds": v for k, v in self.timings.items()},
                **{
                    f"{kind}_lag_{name}": value
                    for kind, (total, count, largest) in self.lag_totals.items()
                    if count
                    for name, value in (("mean", total / count), ("max", largest))
                },
            },
        )
        callbacks.on_end(result)
        if lost is not None:
            raise lost
        return result

    def _scalars(self, collect_seconds: float, per_iteration: int) -> dict[str, float]:
        scalars = {
            "distributed/collect_sps": per_iteration / max(collect_seconds, 1e-9),
            "distributed/time/collect": self.timings["collect"],
            "distributed/time/update": self.timings["update"],
            "distributed/time/broadcast": self.timings["broadcast"],
            "distributed/updates_per_second": self.n_updates / max(self.timings["update"], 1e-9),
        }
        if self.policy_lags:
            scalars["distributed/policy_lag"] = float(np.mean(self.policy_lags))
            scalars["distributed/policy_lag_max"] = float(np.max(self.policy_lags))
            self.policy_lags.clear()
        if self.gradient_lags:
            scalars["distributed/gradient_lag"] = float(np.mean(self.gradient_lags))
            self.gradient_lags.clear()
        return scalars
