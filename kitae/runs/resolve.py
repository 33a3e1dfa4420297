"""A run resolved once: from what the user asked for to the values that flow down.

``resolve_train(RunSpec(...))`` (the command line's ``kitae train``) and ``resolve_run_dir``
(``kitae resume``, ``kitae eval``) read the algorithm name, the environment id, the presets, the
config file and the overrides once and return a ``ResolvedRun``: the agent class, the parsed
``EnvSpec``, the whole ``AlgoConfig``, the seeds, the run directory and the executor. Nothing
below reads the id or the presets again.
"""

from __future__ import annotations

import dataclasses
import textwrap
import warnings
from pathlib import Path
from typing import Any, cast

from kitae.algos.collections import ALGORITHMS, algorithm_name, algorithm_of_params_name, get_algorithm
from kitae.config import MAX_ENV_STEPS, AlgoConfig, UpdateConfig, unread_float_keys
from kitae.distributed.executor import DistributedExecutor, check_spaces
from kitae.distributed.runtime import check_local_room
from kitae.envs.make import EnvSpec, make_env
from kitae.loops.executor import Executor, executor_for
from kitae.runs.errors import RunError
from kitae.runs.presets import build_config, preset_ids, preset_path, resolve
from kitae.runs.rundir import default_run_dir, read_run_config, run_config_names
from kitae.schedule import Schedule, check_iteration_size
from kitae.types import AlgoType

__all__ = [
    "RunSpec",
    "ResolvedRun",
    "resolve_train",
    "resolve_run_dir",
    "resolve_agent",
    "make_run_env",
    "run_env_spec",
    "executor_of",
    "preset_agent",
    "config_text",
]

_WARNED_HOST_ONLY: set[str] = set()


@dataclasses.dataclass
class RunSpec:
    """What ``kitae train`` was asked for (the command line's flags)."""

    algo: str
    env_id: str
    steps: int | None = None
    seed: int | None = None
    seeds: int | None = None
    n_envs: int | None = None
    config_file: str | None = None
    sets: list[str] = dataclasses.field(default_factory=list)
    run_dir: str | None = None
    quiet: bool = False
    workers: int | None = None
    gradient_workers: int | None = None
    async_mode: bool = False
    address: str | None = None

    def distributed(self) -> dict:
        """The ``distributed`` section the flags ask for (empty without ``--workers``)."""
        if self.workers is None:
            flags = (("--gradient-workers", self.gradient_workers), ("--address", self.address))
            given = [flag for flag, value in flags if value is not None]
            if given or self.async_mode:
                raise RunError(f"{(given or ['--async'])[0]} needs --workers N (a distributed run)")
            return {}
        section: dict[str, Any] = {"workers": self.workers}
        if self.gradient_workers is not None:
            section["gradient_workers"] = self.gradient_workers
        if self.async_mode:
            section["async_collection"] = section["async_gradients"] = True
        if self.address is not None:
            section["address"] = self.address
        return section


def executor_of(config: AlgoConfig, env: Any) -> Executor:
    """The executor of a run: the distributed one when ``config.distributed`` is set, else the
    loop of the environment (``kitae.loops.executor.executor_for``)."""
    if config.distributed is not None:
        return DistributedExecutor(config.distributed)
    return executor_for(env)


@dataclasses.dataclass
class ResolvedRun:
    """A run, resolved once.

    Attributes:
        algo: the algorithm's name (``"ppo"``; a custom agent's class name, lower-cased).
        agent_cls: the agent class.
        env: the environment, parsed.
        config: the whole config (its ``train_cfg.n_env_steps`` is the run's total).
        seeds: the seeds of a run of several seeds (``config.seed``, ``config.seed + 1``, ...), or
            ``None`` for one seed.
        run_dir: the run directory.
        executor: the executor that trains it (``kitae.loops.executor.executor_for``).
    """

    algo: str
    agent_cls: type
    env: EnvSpec
    config: AlgoConfig
    seeds: list[int] | None
    run_dir: Path
    executor: Executor

    @property
    def total(self) -> int:
        """The run's total of environment steps."""
        return self.config.train_cfg.n_env_steps

    def with_total(self, total: int) -> ResolvedRun:
        """The same run with another total (``kitae resume --steps``)."""
        if total == self.total:
            return self
        train_cfg = dataclasses.replace(self.config.train_cfg, n_env_steps=total)
        return dataclasses.replace(self, config=dataclasses.replace(self.config, train_cfg=train_cfg))

    def make_agent(self, seed: int | None = None) -> Any:
        """A fresh agent of the run (of ``seed`` when given)."""
        config = self.config if seed is None else dataclasses.replace(self.config, seed=seed)
        try:
            return self.agent_cls(self.run_dir.name, config, run_dir=self.run_dir)
        except TypeError as error:  # a custom agent whose constructor takes no run_dir
            if "run_dir" not in str(error):
                raise
            agent = self.agent_cls(self.run_dir.name, config)
            agent.run_dir = self.run_dir
            return agent


def run_env_spec(config: AlgoConfig) -> EnvSpec:
    """The environment a config trains on: its ``env_cfg.task_name``, made with its
    ``env_cfg.env_kwargs``.

    Raises:
        ValueError: for a task name that is not an environment id.
    """
    return EnvSpec.parse(config.env_cfg.task_name).with_kwargs(config.env_cfg.env_kwargs)


def make_run_env(env: EnvSpec, n_envs: int) -> Any:
    """The environments of a run (``kitae.envs.make.make_env``); a missing optional extra is a
    ``RunError``. EnvPool ids warn once, once made (a mistyped id is one line: its error), that
    they train in the host loop."""
    try:
        made = make_env(env, n_envs)
    except ImportError as error:  # an optional extra (brax, jaxmarl, envpool...) that is not installed
        raise RunError(str(error)) from None
    if env.source == "envpool" and env.source not in _WARNED_HOST_ONLY:
        _WARNED_HOST_ONLY.add(env.source)
        warnings.warn(
            "envpool: environments train in the host loop: EnvPool's XLA interface (a stateful handle, "
            "not a pure vmappable environment) does not fit kitae's compiled loop; see docs/envpool.md",
            stacklevel=3,
        )
    return made


def check_seed_range(seed: int, seeds: int) -> None:
    """Refuses ``--seeds`` from ``seed`` whose last seed (``seed + seeds - 1``) is past the seeds'
    range, before anything is written (it was refused at the last seed's agent, after).

    Raises:
        RunError: naming both flags and the largest ``--seed`` allowed.
    """
    last = seed + seeds - 1
    if last >= 2**32:
        raise RunError(
            f"--seeds {seeds} from seed {seed} is not allowed: its last seed would be {last}; allowed: "
            f"seed + seeds - 1 < 2**32 (--seed at most {2**32 - seeds})"
        )


def _check_iteration_before_envs(values: dict, off_policy: bool) -> None:
    """Refuses an ``n_envs`` whose one iteration is more steps than a run may make, before the
    environments are made (a host source made 10**8 Gymnasium environments first, for minutes,
    then ran out of memory). An on-policy iteration is ``max_buffer_size`` vector steps, an
    off-policy one at least one (``kitae.schedule.Schedule`` checks it again, exactly)."""
    n_envs = values.get("n_envs")
    if not isinstance(n_envs, int) or isinstance(n_envs, bool) or n_envs < 1:
        return  # make_run_env names what is allowed
    update = values.get("update_cfg")  # not a mapping: build_config names it
    rollout = update.get("max_buffer_size", UpdateConfig.max_buffer_size) if isinstance(update, dict) else 1
    vector_steps = 1 if off_policy or not isinstance(rollout, int) or rollout < 1 else rollout
    try:
        check_iteration_size(n_envs, vector_steps)
    except ValueError as error:
        raise RunError(str(error)) from None


def _check_local_room(section: Any, from_flag: bool) -> None:
    """A distributed run's worker processes against this machine's memory (``check_local_room``),
    before its environments are made here: ``--workers N`` asks for ``N`` times the per-worker
    environments, which this process makes once to read their spaces."""
    if not isinstance(section, dict):
        return
    workers, gradient = section.get("workers"), section.get("gradient_workers", 1)
    if type(workers) is not int or type(gradient) is not int or workers < 1 or gradient < 1:
        return  # refused with its own message where the config is built
    name = "--workers" if from_flag else "distributed.workers"
    flag = f"--workers {workers}" if from_flag else f"distributed.workers={workers}"
    try:
        check_local_room(workers, section.get("address"), flag, name=name, extra=gradient)
    except ValueError as error:
        raise RunError(str(error)) from None


def _check_steps(steps: int) -> None:
    """Refuses a ``--steps`` outside ``[1, MAX_ENV_STEPS]``, naming the flag (the config would
    name ``train_cfg.n_env_steps``, which the user did not type).

    Raises:
        RunError: ``--steps 0 is not allowed; allowed: an int >= 1 and <= 2,147,483,647 ...``.
    """
    if not 1 <= steps <= MAX_ENV_STEPS:
        raise RunError(
            f"--steps {steps} is not allowed; allowed: an int >= 1 and <= {MAX_ENV_STEPS:,} (step counters are "
            "int32 in JAX)"
        )


def _check_sets_read(config: AlgoConfig, sets: list[str]) -> None:
    """``--set`` of a field ``config``'s run does not read (``kitae.config.unread_float_keys``:
    PPO's ``vtrace_rho_bar`` without V-trace, ``replay.her_ratio`` without ``replay.her``): refused,
    since the run would train as if it had not been given. A preset's or a config file's value of
    one is not: a file holds a whole config, read or not (a run's ``config.yaml`` holds them all).

    Raises:
        RunError: naming the key and what would make the run read it.
    """
    unread = unread_float_keys(config)
    for item in sets:
        key = item.partition("=")[0].strip()
        if key in unread:
            raise RunError(f"--set {item.strip()} would change nothing: this run does not read {key} ({unread[key]})")


def resolve_train(spec: RunSpec) -> tuple[ResolvedRun, Any]:
    """Resolves ``kitae train``: returns the run and its environments (made, for their spaces).

    Raises:
        RunError, ValueError, TypeError, FileNotFoundError: for bad input, before anything is
        written.
    """
    agent_cls, params_cls = get_algorithm(spec.algo)
    env_spec = EnvSpec.parse(spec.env_id)
    if spec.steps is not None:
        _check_steps(spec.steps)
    if spec.seeds is not None and spec.seeds < 1:
        raise RunError(f"--seeds {spec.seeds} is not allowed; allowed: an int >= 1")
    values = resolve(
        spec.algo,
        params_cls,
        env_spec,
        config_file=spec.config_file,
        sets=spec.sets,
        overrides={
            "seed": spec.seed,
            "n_envs": spec.n_envs,
            "n_env_steps": spec.steps,
            "distributed": spec.distributed(),
        },
    )
    env_kwargs = values.get("env_kwargs") or {}
    if not isinstance(env_kwargs, dict):
        raise RunError(f"env_kwargs={env_kwargs!r} is not allowed; allowed: a mapping of keyword arguments")
    env_spec = env_spec.with_kwargs(env_kwargs)
    off_policy = getattr(agent_cls, "algo_type", None) is AlgoType.OFF_POLICY
    _check_iteration_before_envs(values, off_policy)
    _check_local_room(values.get("distributed"), spec.workers is not None)
    env = make_run_env(env_spec, values["n_envs"])
    try:
        config = build_config(params_cls, env_spec, env, values, off_policy=off_policy)
        _check_sets_read(config, spec.sets)
    except Exception:
        env.close()
        raise
    run_dir = Path(spec.run_dir) if spec.run_dir else default_run_dir(spec.algo, env_spec.name, config.seed)
    seeds = [config.seed + i for i in range(spec.seeds)] if spec.seeds else None
    try:
        check_seed_range(config.seed, spec.seeds or 1)
    except RunError:
        env.close()
        raise
    executor = executor_of(config, env_spec)
    try:
        # a total that whole iterations take past the step counters' range: refused here, so that
        # `kitae config` does not print a config `kitae train` refuses
        Schedule.from_config(config, cast(Any, agent_cls).algo_type).n_iterations(config.train_cfg.n_env_steps)
        if isinstance(executor, DistributedExecutor):
            executor.check(env_spec, config.env_cfg.n_envs)
    except ValueError as error:
        env.close()
        raise RunError(str(error)) from None
    run = ResolvedRun(spec.algo.lower(), agent_cls, env_spec, config, seeds, run_dir, executor)
    return run, env


def resolve_agent(agent: Any, env: Any) -> ResolvedRun:
    """The run of an agent trained from Python (``agent.train(env)``): its class, its config, its
    ``run_dir`` and the executor of ``env``.

    An agent whose config trains distributed (``agent.train_distributed(env_id)``) takes an
    environment id, which its workers make: an id other than the config's own has its spaces
    checked against ``env_cfg``'s here, before anything is written, and becomes the run's and the
    agent's (``agent.config`` and ``config.yaml``'s ``env_cfg.task_name``, so ``kitae resume`` and
    ``agent.resume`` go on with it, and the executor, seeing the config's own id, makes no second
    copy to check).

    Raises:
        TypeError: an environment object for a distributed config (``env`` is closed).
        ValueError: ``env_cfg.n_envs`` that does not split over the workers.
    """
    config = agent.config
    env_spec = run_env_spec(config)
    algo = algorithm_name(config) or type(agent).__name__.lower()
    executor = executor_of(config, env)
    if isinstance(executor, DistributedExecutor):
        try:
            given = executor.check(env, config.env_cfg.n_envs)
        except (TypeError, ValueError):
            if hasattr(env, "close"):
                env.close()
            raise
        if given.id != env_spec.id:  # checked before the run directory is written
            check_spaces(config.env_cfg, given)
            env_spec = given
            env_cfg = dataclasses.replace(config.env_cfg, task_name=given.id, env_kwargs=dict(given.env_kwargs))
            config = agent.config = dataclasses.replace(config, env_cfg=env_cfg)
    return ResolvedRun(algo, type(agent), env_spec, config, None, Path(agent.run_dir), executor)


def resolve_run_dir(
    run_dir: Path, *, steps: int | None = None, agent_cls: type | None = None, seeds: list[int] | None = None
) -> ResolvedRun:
    """Resolves an existing run directory from its ``config.yaml`` (``kitae resume``, ``kitae eval``).

    Args:
        run_dir: a checked run directory.
        steps: a new total (``kitae resume --steps``).
        agent_cls: the agent class (default: the built-in algorithm of the config's params class).
        seeds: the run's seeds when it trained several.
    """
    if agent_cls is None:
        # Before building the config: a custom agent's params class is not registered here.
        kind = run_config_names(run_dir)[0]
        if kind is not None and algorithm_of_params_name(kind) is None:
            raise RunError(
                f"{str(run_dir)!r} was trained by a custom agent (its algo_params_class {kind!r} is no registered "
                "algorithm's); give --import MODULE, where MODULE calls kitae.algos.collections.register_algorithm"
                "(NAME, YourAgent, YourParams), or rebuild it in Python with YourAgent.unserialize(run_dir)"
            )
    config = read_run_config(run_dir)  # refuses a config.yaml without algo_params_class
    algo = algorithm_name(config)
    if agent_cls is None:
        assert algo is not None  # its params class is a built-in's: checked above
        agent_cls = ALGORITHMS[algo][0]
    try:
        env_spec = run_env_spec(config)
    except ValueError as error:
        raise RunError(f"config.yaml in {str(run_dir)!r}: {error}") from None
    run = ResolvedRun(
        algo or agent_cls.__name__.lower(), agent_cls, env_spec, config, seeds, run_dir, executor_of(config, env_spec)
    )
    if steps is not None:
        _check_steps(steps)
        run = run.with_total(steps)
    return run


def preset_agent(
    algo: str,
    env_id: str,
    *,
    run_dir: str | Path | None = None,
    steps: int | None = None,
    seed: int | None = None,
    n_envs: int | None = None,
    sets: list[str] | None = None,
    config_file: str | None = None,
) -> tuple[Any, Any]:
    """An agent configured as ``kitae train ALGO ENV`` would (preset, config file, overrides), and
    its environments: the command line's resolution, from Python.

    Args:
        algo: a name ``kitae train`` takes (``kitae.algos.collections.ALGORITHMS``: ``"ppo"``,
            ``"dqn"``, ``"sac"``, ``"mpo"``, ...).
        env_id: ``"SOURCE:ID"``.
        run_dir: the agent's run directory (default ``runs/<algo>-<env>-s<seed>-<time>``).
        steps, seed, n_envs: as ``--steps``, ``--seed``, ``--n-envs``.
        sets: ``["update_cfg.learning_rate=1e-3", ...]``, as ``--set``.
        config_file: as ``--config``.

    Returns:
        ``(agent, env)``: ``agent.train(env)`` then trains as ``kitae train`` does.
    """
    run, env = resolve_train(
        RunSpec(
            algo,
            env_id,
            steps=steps,
            seed=seed,
            n_envs=n_envs,
            sets=list(sets or []),
            config_file=config_file,
            run_dir=None if run_dir is None else str(run_dir),
        )
    )
    return run.make_agent(), env


_EXECUTOR_WORDS = {
    "host": "the host loop (a Python loop over the environments)",
    "compiled": "the compiled loop (the whole run one XLA program)",
    "distributed": "the distributed executor (Ray workers)",
}


def config_text(spec: RunSpec, imports: list[str] | tuple[str, ...] = ()) -> str:
    """What ``kitae config`` prints: the config ``kitae train`` with the same arguments trains
    with, as the YAML it writes to ``RUN_DIR/config.yaml`` (``AlgoConfig.to_yaml``), after
    comment lines that say where its values come from (the preset file and its sections, the
    config file, the flags) and which executor trains it. Saved to a file, the text is a
    ``--config`` file: ``kitae train ALGO ENV --config FILE`` trains with this config.

    Args:
        spec: ``kitae train``'s arguments (its ``seeds``, ``run_dir`` and ``quiet`` say nothing
            about the config and are not read).
        imports: the modules ``--import`` gave (named in the commands the comments show).

    Raises:
        RunError, ValueError, TypeError, FileNotFoundError: for bad input, as ``resolve_train``.
    """
    run, env = resolve_train(spec)
    try:
        # the algorithm's own rules (A2C: one epoch over the whole rollout) are checked when its
        # agent is made: a config kitae train would refuse is refused here too (its state is
        # computed when first used, so nothing is compiled)
        run.make_agent()
    finally:
        env.close()  # made for its spaces only
    imported = [f"--import\N{NO-BREAK SPACE}{name}" for name in imports]
    command = " ".join(["kitae train", spec.algo, run.env.id, *_config_flags(spec), *imported])
    preset, tuned = preset_path(spec.algo), preset_ids(spec.algo)
    if not preset.exists():
        source = f"no preset file for {spec.algo} (kitae's defaults)"
    else:
        section = f" and its {run.env.id} section" if run.env.id in tuned else f" (no {run.env.id} section)"
        source = f"kitae/presets/{preset.name}: default{section}"
    if spec.config_file is not None:
        source += f", then {spec.config_file}"
    if _config_flags(spec, with_file=False):
        source += ", then the flags"
    lines = _comment(f"The config of `{command}`, as it writes it to RUN_DIR/config.yaml. Values from {source}.")
    same = [i.split(":", 1)[1] for i in tuned if i.startswith(f"{run.env.source}:")]
    others = sorted({i.split(":", 1)[0] for i in tuned} - {run.env.source})
    if same or others:
        of_source = f"for these {run.env.source} ids: {', '.join(same)}" if same else f"for no {run.env.source} id"
        n_others = len(tuned) - len(same)
        more = f"; and {n_others} id{'s' * (n_others > 1)} of {', '.join(others)}" if others else ""
        lines += _comment(f"{spec.algo}'s preset has a section {of_source}{more}.")
    lines += _comment(f"Trains in {_EXECUTOR_WORDS.get(run.executor.name, run.executor.name)}.")
    again = " ".join([f"kitae train {spec.algo} {run.env.id} --config FILE.yaml", *imported])
    lines += _comment(f"Saved as FILE.yaml, a config file: {again}")
    return "\n".join(lines) + "\n" + run.config.to_yaml()


def _comment(text: str) -> list[str]:
    """``text`` as YAML comment lines of at most 100 characters (ids and flags kept whole)."""
    # a flag and its value are joined by a no-break space, which textwrap does not break at
    wrapped = textwrap.wrap(text, width=98, break_on_hyphens=False, break_long_words=False)
    lines = [f"# {wrapped[0]}", *(f"#   {line}" for line in wrapped[1:])]
    return [line.replace("\N{NO-BREAK SPACE}", " ") for line in lines]


def _config_flags(spec: RunSpec, with_file: bool = True) -> list[str]:
    """The flags of ``spec`` that decide a config, as ``kitae train`` takes them."""
    pairs: list[tuple[str, Any]] = [("--config", spec.config_file if with_file else None)]
    pairs += [("--steps", spec.steps), ("--seed", spec.seed), ("--n-envs", spec.n_envs)]
    pairs += [("--set", item) for item in spec.sets]
    distributed = spec.distributed()
    if distributed:
        pairs += [("--workers", distributed["workers"]), ("--gradient-workers", distributed.get("gradient_workers"))]
        pairs += [("--async", "" if distributed.get("async_collection") else None)]
        pairs += [("--address", distributed.get("address"))]
    # a flag and its value joined by a no-break space: _comment keeps them on one line
    joined = [f"{flag}\N{NO-BREAK SPACE}{value}" for flag, value in pairs if value is not None]
    return [text.rstrip("\N{NO-BREAK SPACE}") for text in joined]
