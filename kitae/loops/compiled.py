"""The compiled loop: a whole training run as one XLA program, for environments written in JAX.

Why this module is long: ``CompiledExecutor.run`` is one flow read top to bottom (seeds and their
sharding, the starting state made while the program compiles, segments pipelined with the
callbacks, divergence, the result) with its helpers beside it; the program itself is in
``kitae.loops.program``.

The same agent that trains in the host loop trains here, through the same pieces: its pure
``act`` and ``update_fn`` (``kitae.loops.collect``), the pure buffer functions of
``kitae.buffer``, the schedule of ``kitae.schedule``, all inside one ``jax.lax.scan`` inside one
``jax.jit`` (the program: ``kitae.loops.program``). Several seeds train together with
``jax.vmap`` (one program, one compile), and their axis can be sharded across devices.

The run state (``kitae.loops.state.LoopState``: agent state and key, buffer, counters and the
environment) is a pytree, so a run can be cut into segments and checkpointed between them: with
callbacks, ONE compiled program whose iteration count is an argument (``run(state, n, first,
length=L)``) runs segment after segment; the bits are those of the run in one piece.

Multi-agent environments (``kitae.envs.jaxmarl_env.VecJaxMARLEnv``) train a parameter-shared agent;
``IterationMetrics.return_sum`` then sums the team's return (the agents' returns added up) and
``agent_return_sum`` each agent's own.

Step units: ``n_env_steps`` counts environment transitions summed over all environments (one
transition of an environment moves all its agents).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from kitae.compilation_cache import use_compilation_cache
from kitae.compile_options import jit_once
from kitae.devices import shard_count
from kitae.envs.jax_env import VecJaxEnv
from kitae.loops.callbacks import Callback, CallbackList, LossMeans, Progress, RunInfo
from kitae.loops.program import (
    IterationMetrics,
    check_buffers_fit,
    loop_state_shape,
    make_loop_functions,
    make_variant_functions,
)
from kitae.loops.result import Divergence, Episodes, RunResult
from kitae.loops.state import (
    LoopState,
    Payload,
    apply_loop_state,
    payload_from_agent,
    pick_seed,
)
from kitae.validation import check_positive_int

__all__ = [
    "CompiledExecutor",
    "IterationMetrics",
    "MAX_SEGMENT_STEPS",
    "MIN_SEGMENT_CAPACITY",
    "compiled_train",
    "make_loop_functions",
    "loop_state_shape",
    "segment_capacity",
    "segment_plan",
]


def segment_plan(first: int, total: int, schedule: Any, max_length: int) -> list[tuple[int, int, bool]]:
    """Cuts iterations ``first .. total - 1`` into segments of at most ``max_length`` iterations.

    A segment ends after an iteration where ``schedule`` says a checkpoint is due
    (``Schedule.save_iterations``), and at the end.

    Returns:
        ``[(first iteration, iterations, save after it), ...]``.
    """
    saves = set(schedule.save_iterations(first, total))
    plan, start = [], first
    while start < total:
        end = min(start + max_length, total)
        due = [k for k in range(start + 1, end + 1) if k in saves]
        if due:
            end = due[0]
        plan.append((start, end - start, end == total or bool(due)))
        start = end
    return plan


MIN_SEGMENT_CAPACITY = 64
"""The fewest iterations a compiled segment program holds rows for (``segment_capacity``)."""

MAX_SEGMENT_STEPS = 1 << 20
"""The most environment steps (per seed) in one segment of a run with callbacks, unless the run
sets ``segment_iterations``: about ten seconds of a small gymnax task on a 2-core CPU, so that a
stop request is answered within seconds however long the run."""


def segment_capacity(length: int) -> int:
    """How many iterations' rows the compiled segment program holds, for segments of at most
    ``length`` iterations: the next power of two, at least ``MIN_SEGMENT_CAPACITY``.

    A segment's iteration count is an argument of the program (a ``fori_loop`` bound); only its
    rows of metrics have a static size. Rounding that size up lets runs whose segments differ
    in length share one compiled program through the persistent compilation cache (a run and
    a shorter one of a configuration whose program does not depend on the total, such as one
    without an annealed learning rate), for at most twice the rows' memory (a few dozen bytes
    per iteration and seed). The bits do not depend on it: each iteration computes the same
    whatever the capacity.
    """
    check_positive_int("length", length)
    return max(MIN_SEGMENT_CAPACITY, 1 << (length - 1).bit_length())


def _episodes_of(metrics: IterationMetrics, seed_index: int, batched: bool) -> Episodes:
    m = pick_seed(metrics, seed_index) if batched else metrics  # host metrics: numpy leaves
    episodes = np.asarray(m.episodes)
    rows = np.flatnonzero(episodes > 0)
    count = episodes[rows].astype(np.int64)
    agents = (
        None if m.agent_return_sum is None else {a: np.asarray(v)[rows] / count for a, v in m.agent_return_sum.items()}
    )
    return Episodes(
        np.asarray(m.env_step)[rows].astype(np.int64),
        np.asarray(m.return_sum)[rows] / count,
        np.asarray(m.length_sum)[rows] / count,
        count,
        agents,
        seed_index,
    )


def _update_steps(metrics: IterationMetrics, seed_index: int, batched: bool) -> np.ndarray:
    m = pick_seed(metrics, seed_index) if batched else metrics  # host metrics: numpy leaves
    return np.asarray(m.env_step)[np.asarray(m.updated)].astype(np.int64)


def _divergence(metrics: IterationMetrics, state: LoopState, seed_index: int, batched: bool) -> Divergence | None:
    """Where the seed's run diverged, as a ``Divergence`` (``None``: it has not): the step is the
    state's ``diverged_step``; the losses are those of that iteration's metrics, or none where it
    diverged before this run started (a resumed run: that part's logs have them)."""
    step = int(np.asarray(state.diverged_step)[seed_index] if batched else np.asarray(state.diverged_step))
    if step < 0:
        return None
    m = pick_seed(metrics, seed_index) if batched else metrics  # host metrics: numpy leaves
    rows = np.flatnonzero(np.logical_and(np.asarray(m.diverged), np.asarray(m.env_step) == step))
    if not len(rows):  # it diverged before this run started
        return Divergence(step, {}, before_resume=True)
    return Divergence(step, {k: float(v[rows[0]]) for k, v in m.info.items()})


def _variant_values(variants: dict[str, Any] | None, seeds: list[int], batched: bool) -> dict[str, jax.Array]:
    """``{key: float32 (S,)}`` from ``CompiledExecutor.run``'s ``variants``, checked."""
    if not variants:
        return {}
    if not batched:
        raise ValueError("variants need seeds: one row of values per seed of the batch")
    out = {}
    for key, column in variants.items():
        column = np.asarray(column, np.float32)
        if column.shape != (len(seeds),):
            raise ValueError(
                f"variants[{key!r}] has shape {column.shape}; allowed: one value per seed, ({len(seeds)},)"
            )
        out[key] = jnp.asarray(column)
    return out


def _first_of_each(values: dict[str, jax.Array], n_rows: int) -> list[int]:
    """The first row of each distinct configuration (``[0]`` without variants)."""
    seen: dict[tuple, int] = {}
    for row in range(n_rows):
        seen.setdefault(tuple(float(v[row]) for v in values.values()), row)
    return sorted(seen.values())


def _concat_metrics(chunks: list[IterationMetrics], batched: bool) -> IterationMetrics:
    return jax.tree_util.tree_map(lambda *xs: np.concatenate(xs, axis=1 if batched else 0), *chunks)


class CompiledExecutor:
    """Runs an agent in a JAX environment as one compiled program (see the module docstring)."""

    name = "compiled"
    batches_seeds = True  # several seeds train together in one program
    starting: str | None = "compiling the training program (one XLA program, run in segments)..."

    def run(
        self,
        agent: Any,
        env: VecJaxEnv,
        n_env_steps: int,
        *,
        start: LoopState | None = None,
        seeds: list[int] | None = None,
        callbacks: Any = (),
        use_cache: bool = True,
        shard: bool = True,
        segment_iterations: int | None = None,
        variants: dict[str, Any] | None = None,
    ) -> RunResult:
        """Trains ``agent`` in ``env`` until ``n_env_steps`` environment steps in all.

        Without callbacks (and without ``segment_iterations``) the whole run is one call of one
        program. With callbacks it runs in segments of whole iterations, all run by ONE compiled
        program whose iteration count is an argument; between segments the callbacks see the
        episodes, losses and progress, checkpoints are handed over when due
        (``kitae.schedule``) and ``should_stop`` is asked. The bits are those of the single program.

        Args:
            agent: a ``kitae.base.BaseAgent`` (any agent made from the four factories).
            env: a ``VecJaxEnv`` with ``num_envs == agent.config.env_cfg.n_envs``.
            n_env_steps: the run's total, counted from the start of training, rounded up to whole
                iterations.
            start: the ``LoopState`` to go on from: a compiled checkpoint's (with its environment;
                leading seed axis when ``seeds`` are given) or one without an environment part (a
                host checkpoint's, the agent facade's: the environments are reset). Default: the
                agent facade's state for one seed, a fresh state per seed for ``seeds``.
            seeds: train these seeds together (``jax.vmap``, one program); default
                ``[config.seed]`` without a seed axis.
            callbacks: ``kitae.loops.callbacks.Callback`` objects.
            use_cache: enable JAX's persistent compilation cache (``kitae.compilation_cache``).
            shard: shard the seed axis across devices (``kitae.devices.shard_count``).
            segment_iterations: the longest segment, in iterations (default: a twentieth of the
                whole run, resumed or not, and at most ``MAX_SEGMENT_STEPS`` environment steps;
                at most the checkpoint period). The program holds
                ``segment_capacity(segment_iterations)`` rows of metrics.
            variants: ``{dotted config key: values}``, one value per entry of ``seeds``: each row of
                the batch trains with its own values of these float hyperparameters (traced in the
                program: ``kitae.loops.program.make_variant_functions``), so a grid of
                configurations x seeds is one program (``kitae sweep``). The agent's config holds
                the other fields.

        Returns:
            A ``RunResult`` (its ``state`` is the final ``LoopState``; the agent is not changed).
        """
        check_positive_int("n_env_steps", n_env_steps)
        if use_cache:
            use_compilation_cache()
        callbacks = callbacks if isinstance(callbacks, Callback) else CallbackList(callbacks)
        segmented = bool(getattr(callbacks, "callbacks", [callbacks])) or segment_iterations is not None
        keys = tuple(variants or {})
        fresh, attach, run = make_variant_functions(agent, env, keys)
        schedule = agent.schedule
        per_iteration = schedule.steps_per_iteration
        n_iterations = schedule.n_iterations(n_env_steps)
        batched = seeds is not None
        seed_list = list(seeds) if seeds is not None else [agent.config.seed]
        for seed in seed_list:
            if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 2**32:
                raise ValueError(f"seed={seed!r} is not allowed; allowed: an int in [0, 2**32)")
        seed_array = jnp.asarray(seed_list if batched else seed_list[0], dtype=jnp.uint32)
        values = _variant_values(variants, seed_list, batched)
        sharding = None
        if batched and shard and shard_count(jax.device_count(), len(seed_list)) > 1:
            mesh = jax.sharding.Mesh(np.array(jax.devices()), ("seeds",))
            sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("seeds"))
            seed_array = jax.device_put(seed_array, sharding)

        clock = time.perf_counter()
        # The starting state is made by its own small program and handed to the training program:
        # a run in one piece, in segments or resumed then computes the same bits. The training
        # program needs only the state's shapes: it compiles in the background (XLA releases
        # the GIL) while this thread computes the state and the callbacks start.
        shape, make_state, first_step = self._start(agent, start, batched, seed_array, values, sharding, fresh, attach)
        if start is None and batched:  # a buffer per seed, allocated together
            check_buffers_fit(agent, shape, len(seed_list))
        if first_step % per_iteration:
            raise ValueError(
                f"the state is at step {first_step}, inside an iteration of {per_iteration} steps; the compiled "
                "loop goes on from iteration ends"
            )
        first = first_step // per_iteration
        if first >= n_iterations:
            raise ValueError(f"the run is already at step {first_step:,}; n_env_steps={n_env_steps:,} asks for no more")

        if not segmented:
            count = n_iterations - first

            def program(state: LoopState, values: dict) -> tuple[LoopState, IterationMetrics]:
                if batched:
                    return jax.vmap(lambda s, v: run(s, v, count, first))(state, values)
                return run(state, values, count, first)

            compiling = _Compiling(lambda state: jax.jit(program).lower(state, values), shape)
        else:
            # a twentieth of the whole run, not of what is left: a resumed run cuts its segments
            # like the run it continues, and finds that run's program in the compilation cache
            length = segment_iterations or max(1, -(-n_iterations // 20))
            check_positive_int("segment_iterations", length)
            # ... and at most MAX_SEGMENT_STEPS steps: a stop (Ctrl-C, a scheduler's SIGTERM) is
            # answered at a segment's end, which a twentieth of a billion-step run puts many
            # minutes away; the cut does not change the bits (docs/runs.md, "Stop")
            if segment_iterations is None:
                length = min(length, max(1, MAX_SEGMENT_STEPS // per_iteration))
            if schedule.save_frequency != -1:
                length = min(length, max(1, -(-schedule.save_frequency // per_iteration)))
            capacity = segment_capacity(length)

            def segment(
                state: LoopState, values: dict, n: jax.Array, index: jax.Array
            ) -> tuple[LoopState, IterationMetrics]:
                if batched:
                    return jax.vmap(lambda s, v: run(s, v, n, index, length=capacity))(state, values)
                return run(state, values, n, index, length=capacity)

            compiling = _Compiling(
                lambda state: jax.jit(segment).lower(state, values, jnp.int32(0), jnp.int32(0)), shape
            )
        state = make_state()
        callbacks.on_start(RunInfo(self.name, seed_list, first_step, n_iterations * per_iteration, agent))
        executable, state = compiling.result(state)
        compile_seconds = time.perf_counter() - clock

        if not segmented:
            clock = time.perf_counter()
            state, metrics = executable(state, values)
            jax.block_until_ready(state)
            train_seconds = time.perf_counter() - clock
            metrics = jax.tree_util.tree_map(np.asarray, metrics)
            stopped, done = False, n_iterations
        else:

            def segment_call(state: LoopState, n: jax.Array, index: jax.Array) -> tuple:
                return executable(state, values, n, index)

            state, metrics, train_seconds, stopped, done = self._segments(
                segment_call,
                state,
                first,
                n_iterations,
                length,
                schedule,
                seed_list,
                batched,
                agent,
                callbacks,
                _first_of_each(values, len(seed_list)),
            )

        env_steps = done * per_iteration
        if not segmented:
            callbacks.on_checkpoint(self._payload(state, seed_list if batched else None))
        result = RunResult(
            executor=self.name,
            seeds=seed_list,
            state=state,
            episodes=[_episodes_of(metrics, i, batched) for i in range(len(seed_list))],
            update_steps=[_update_steps(metrics, i, batched) for i in range(len(seed_list))],
            diverged=[_divergence(metrics, state, i, batched) for i in range(len(seed_list))],
            start_step=first_step,
            env_steps=env_steps,
            compile_seconds=compile_seconds,
            train_seconds=train_seconds,
            stopped=stopped,
            batched=batched,
            metrics=metrics,
            devices=1 if sharding is None else len(sharding.device_set),
        )
        callbacks.on_end(result)
        return result

    @staticmethod
    def _start(
        agent: Any,
        start: LoopState | None,
        batched: bool,
        seed_array: jax.Array,
        values: dict[str, jax.Array],
        sharding: Any,
        fresh: Callable,
        attach: Callable,
    ) -> tuple[Any, Callable[[], LoopState], int]:
        """``(shapes, make, first_step)`` of the state a run starts from: its
        ``jax.ShapeDtypeStruct`` leaves (placed as the run shards them), a function that computes
        it, and its environment step."""

        def placed(state: Any) -> Any:
            return state if sharding is None else jax.device_put(state, sharding)

        if start is None and batched:

            def make() -> LoopState:
                # one small program per seed, stacked: vmapped over seeds, jax's orthogonal init
                # makes batched QRs, which deadlock XLA:CPU (kitae/modules/initializers.py; seen in
                # recurrent PPO's, 3 seeds x 8 envs); so a user's own network is safe too. A seed's
                # own state is the same either way
                one = jit_once(fresh)
                states = [one(seed, {k: v[i] for k, v in values.items()}) for i, seed in enumerate(seed_array)]
                return placed(jit_once(lambda xs: jax.tree_util.tree_map(lambda *x: jnp.stack(x), *xs))(states))

            shape, first_step = jax.eval_shape(jax.vmap(fresh), seed_array, values), 0
        elif start is None:
            payload = payload_from_agent(agent, shapes=True).state

            def make() -> LoopState:
                return jit_once(attach)(payload_from_agent(agent).state, seed_array)

            shape, first_step = jax.eval_shape(attach, payload, seed_array), int(agent.env_step)
        elif start.env is None:
            with_env = jit_once(jax.vmap(attach) if batched else attach)

            def make() -> LoopState:
                return placed(with_env(start, seed_array))

            shape, first_step = jax.eval_shape(with_env, start, seed_array), int(np.max(np.asarray(start.env_step)))
        else:
            if start.diverged_step is None:  # a checkpoint older than the field: no seed had diverged
                start = start._replace(diverged_step=jnp.full(np.shape(start.env_step), -1, jnp.int32))
            state = placed(start)
            return state, lambda: state, int(np.max(np.asarray(state.env_step)))
        if sharding is not None:
            shape = jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding), shape)
        return shape, make, first_step

    def _payload(self, state: LoopState, seeds: list[int] | None) -> Payload:
        return Payload(state, {"executor": self.name, "seeds": seeds, "env_saved": True})

    def _segments(
        self,
        compiled: Any,
        state: LoopState,
        first: int,
        total: int,
        length: int,
        schedule: Any,
        seeds: list[int],
        batched: bool,
        agent: Any,
        callbacks: Callback,
        loss_rows: list[int],
    ) -> tuple:
        """Runs the plan's segments, reporting to the callbacks between them.

        Pipelined: a segment is dispatched before the callbacks see the one before it, so they
        run (on this thread) while XLA trains; their state is kept for the checkpoint. Where the
        callbacks stop the run after a segment, the one already dispatched is dropped: the run
        ends with the state they saw."""
        first_step = first * schedule.steps_per_iteration
        # losses are logged for the first seed of each configuration (of the run: seed index 0)
        losses = {row: LossMeans(agent.config.train_cfg.log_frequency, first_step) for row in loss_rows}
        chunks, stopped, done, train_seconds = [], False, first, 0.0
        plan = segment_plan(first, total, schedule, length)
        clock = time.perf_counter()
        ahead = compiled(state, jnp.int32(plan[0][1]), jnp.int32(plan[0][0]))
        for k, (index, n, save) in enumerate(plan):
            state, rows = ahead
            if k + 1 < len(plan):
                ahead = compiled(state, jnp.int32(plan[k + 1][1]), jnp.int32(plan[k + 1][0]))
            _wait_interruptibly(rows)
            rows = jax.tree_util.tree_map(lambda x, n=n: np.asarray(x)[:, :n] if batched else np.asarray(x)[:n], rows)
            train_seconds = time.perf_counter() - clock
            chunks.append(rows)
            done = index + n
            latest = []
            for i in range(len(seeds)):
                episodes = _episodes_of(rows, i, batched)
                if len(episodes):
                    callbacks.on_episodes(episodes)
                    latest.append(float(np.sum(episodes.return_ * episodes.count) / np.sum(episodes.count)))
            for row, means in losses.items():
                seed_rows = pick_seed(rows, row) if batched else rows
                for j in np.flatnonzero(seed_rows.updated):
                    logged = means.add(int(seed_rows.env_step[j]), {k: float(v[j]) for k, v in seed_rows.info.items()})
                    if logged is not None:
                        callbacks.on_losses(*logged, row if batched else None)
            step = done * schedule.steps_per_iteration
            callbacks.on_progress(
                Progress(
                    step, (step - first_step) / max(train_seconds, 1e-9), float(np.mean(latest)) if latest else None
                )
            )
            # a single run that diverged stops here (its state is the last finite one); seeds trained
            # together go on, the diverged ones no longer updating
            stopped = done < total and (callbacks.should_stop() or bool(not batched and rows.diverged[-1]))
            if save or stopped:
                for row, means in losses.items():
                    logged = means.flush(step)  # the loss points do not depend on where a run was cut
                    if logged is not None:
                        callbacks.on_losses(*logged, row if batched else None)
                callbacks.on_checkpoint(self._payload(state, seeds if batched else None))
            if stopped:
                break
        return state, _concat_metrics(chunks, batched), train_seconds, stopped, done


def _wait_interruptibly(tree: Any, poll_seconds: float = 0.01) -> None:
    """Returns once every array of ``tree`` is computed, waiting in short sleeps.

    Python runs a signal handler on the main thread between bytecodes, never inside a blocking
    call: waiting for a segment's results in one call (``np.asarray``) held Ctrl-C and a
    scheduler's SIGTERM until the segment ended, and a second Ctrl-C sent meanwhile was lost. A
    sleep returns to the interpreter when a signal arrives, so the first is acknowledged at once
    and a second aborts at once (docs/runs.md, "Stop"). Checking readiness costs nothing here: the
    next segment is already dispatched.
    """
    leaves = [x for x in jax.tree_util.tree_leaves(tree) if isinstance(x, jax.Array)]
    while not all(x.is_ready() for x in leaves):  # type: ignore[attr-defined]  # jax.Array's stub omits it
        time.sleep(poll_seconds)


def _aval(x: Any) -> tuple:
    return (tuple(x.shape), x.dtype, bool(getattr(x, "weak_type", False)))


class _Compiling:
    """A program compiling on a thread of its own (XLA's compiler releases the GIL, so the
    caller's thread computes meanwhile): ``lower(args)`` traces it here, now."""

    def __init__(self, lower: Callable[[Any], Any], args: Any) -> None:
        self._lower, self._args = lower, args
        lowered = lower(args)
        self._out: dict[str, Any] = {}
        self._thread = threading.Thread(target=self._compile, args=(lowered,), name="kitae-compile", daemon=True)
        self._thread.start()

    def _compile(self, lowered: Any) -> None:
        try:
            self._out["executable"] = lowered.compile()
        except BaseException as error:  # handed to the caller's thread
            self._out["error"] = error

    def result(self, args: Any) -> tuple[Any, Any]:
        """``(executable, args)``: the executable compiling and ``args``'s arrays in the structure
        it was lowered for (whose static parts, an optimizer's functions, were made from the same
        config), or, where the arrays differ from the shapes it was lowered for (a custom agent's
        state), one compiled for ``args`` now."""
        self._thread.join()
        if "error" in self._out:
            raise self._out["error"]
        leaves, like = jax.tree_util.tree_leaves(args), jax.tree_util.tree_leaves(self._args)
        if len(leaves) == len(like) and all(_aval(a) == _aval(b) for a, b in zip(leaves, like)):
            return self._out["executable"], jax.tree_util.tree_unflatten(
                jax.tree_util.tree_structure(self._args), leaves
            )
        return self._lower(args).compile(), args


def compiled_train(
    agent: Any,
    env: VecJaxEnv,
    n_env_steps: int,
    *,
    seeds: list[int] | None = None,
    callbacks: Any = (),
    start: LoopState | None = None,
    **options: Any,
) -> RunResult:
    """Trains ``agent`` in a JAX environment as one compiled program and sets the agent to the final
    state (for a single seed): ``CompiledExecutor().run`` then ``kitae.loops.state.apply_loop_state``.

    Takes ``CompiledExecutor.run``'s arguments; returns its ``RunResult``.
    """
    result = CompiledExecutor().run(agent, env, n_env_steps, seeds=seeds, callbacks=callbacks, start=start, **options)
    if seeds is None:
        apply_loop_state(agent, result.state)
    return result
