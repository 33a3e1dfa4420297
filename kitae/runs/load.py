"""Reading a run back: its checkpoint folders, its seeds, the structure a checkpoint is restored
into, its newest payload, its agent.

A run of one seed (or of several seeds trained together in one compiled program) keeps its
checkpoints in ``checkpoints/<step>/``; a host-loop run of several seeds trains them one after
the other and keeps one folder per seed, ``checkpoints/seed-<seed>/<step>/``.
"""

from __future__ import annotations

import ast
import warnings
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from kitae.buffer import BufferState
from kitae.loops.state import LoopState, Payload, apply_loop_state
from kitae.replay.prioritized import Priorities
from kitae.replay.sum_tree import SumTree
from kitae.runs.checkpoints import Checkpointer, CheckpointError, CheckpointMismatch, Restored
from kitae.runs.errors import RunError
from kitae.runs.provenance import ProvenanceWarning, differences
from kitae.runs.resolve import resolve_run_dir
from kitae.runs.rundir import check_run_dir, never_trained

__all__ = [
    "checkpoint_dirs",
    "run_seeds",
    "restore_target",
    "buffer_target",
    "restore_payload",
    "restore_error",
    "refuse_a_run_of_several_seeds",
    "load_agent",
    "checkpoint_step",
    "best_evaluations",
]


def buffer_target(experience_type: type[Any], entries: list[dict], prefix: str = ".buffer") -> BufferState | None:
    """The ``BufferState`` structure a saved buffer is poured into, rebuilt from the saved paths
    (``<prefix>.data.<field>``, ``<prefix>.position``, ``<prefix>.size``) and the agent's
    experience type; ``None`` when no buffer was saved (a run stopped before its first step)."""
    by_path = {
        entry["path"][len(prefix) :]: jax.ShapeDtypeStruct(tuple(entry["shape"]), np.dtype(entry["dtype"]))
        for entry in entries
        if entry["path"].startswith(prefix + ".")
    }
    if not by_path:
        return None

    def field(name: str) -> Any:
        """The field's array, or its dicts for dict leaves (keyed by agent, by ``Dict``
        observation key; paths ``.data.<name>['<key>']...``, the keys read back with
        ``ast.literal_eval``: no code runs); ``None`` for a field that holds no array
        (``Experience.truncated`` left out)."""
        if any(path == f".data.{name}" or path.startswith(f".data.{name}[") for path in by_path):
            return _nested(by_path, f".data.{name}")
        return None

    try:
        data = experience_type(**{f: field(f) for f in experience_type._fields})
        priorities = None
        if ".priorities.tree.nodes" in by_path:  # prioritized replay's
            priorities = Priorities(
                SumTree(by_path[".priorities.tree.nodes"]),  # type: ignore[arg-type]
                by_path[".priorities.max_priority"],  # type: ignore[arg-type]
                by_path[".priorities.steps"],  # type: ignore[arg-type]
            )
        # an abstract target: ShapeDtypeStruct leaves stand for the arrays the fields are typed as
        return BufferState(
            data=data,
            position=by_path[".position"],  # type: ignore[arg-type]
            size=by_path[".size"],  # type: ignore[arg-type]
            priorities=priorities,
        )
    except KeyError as error:
        raise CheckpointMismatch(
            f"the saved buffer does not hold the agent's experience fields {experience_type._fields} (missing {error})"
        ) from None


def _nested(by_path: dict[str, Any], prefix: str) -> Any:
    """Dicts and tuples nested under ``prefix`` (paths ``prefix['a'][0]``), keys read with
    ``ast.literal_eval``: string keys are a dict's (keyed by agent, by ``Dict`` observation key),
    integer ones a tuple's positions (an LSTM's hidden state, the pair ``(c, h)``; read back as
    a dict ``{0: c, 1: h}``, the core could not use it)."""
    if prefix in by_path:
        return by_path[prefix]
    out: dict[Any, Any] = {}
    for path in by_path:
        if path.startswith(prefix + "["):
            key_text = path[len(prefix) + 1 : path.index("]", len(prefix))]
            key = ast.literal_eval(key_text)
            if key not in out:
                out[key] = _nested(by_path, f"{prefix}[{key_text}]")
    if out and all(isinstance(key, int) for key in out) and sorted(out) == list(range(len(out))):
        return tuple(out[i] for i in range(len(out)))
    return out


def restore_target(agent: Any, meta: dict, env_target: LoopState | None = None) -> dict[str, Any]:
    """The ``restore`` target of a checkpoint of ``agent``.

    With ``env_target`` (the executor's abstract ``LoopState``, for a payload with an environment
    part that a run goes on from), that. Otherwise a ``LoopState`` without environments: the
    agent's state structure (with a leading seed axis for a checkpoint of several seeds trained
    together), and the key, buffer and counters as the checkpoint describes them.
    """
    if env_target is not None:
        return {"loop_state": env_target}
    entries = meta.get("items", {}).get("loop_state", [])
    saved = {e["path"]: jax.ShapeDtypeStruct(tuple(e["shape"]), np.dtype(e["dtype"])) for e in entries}
    seeds = meta.get("seeds")
    agent_state = agent.state
    if seeds:
        agent_state = jax.tree_util.tree_map(
            lambda x: jax.ShapeDtypeStruct((len(seeds), *np.shape(x)), jnp.asarray(x).dtype), agent.state
        )
    scalar = jax.ShapeDtypeStruct((), np.int32)
    target = LoopState(  # an abstract target: ShapeDtypeStruct leaves stand for the arrays (the ignores)
        agent_state=agent_state,
        agent_key=saved.get(".agent_key", jax.ShapeDtypeStruct((2,), np.uint32)),  # type: ignore[arg-type]
        buffer=buffer_target(agent.experience_type, entries),
        env_step=saved.get(".env_step", scalar),  # type: ignore[arg-type]
        n_updates=saved.get(".n_updates", scalar),  # type: ignore[arg-type]
    )
    return {"loop_state": target}


def checkpoint_dirs(run_dir: Path) -> dict[int | None, Path]:
    """``{None: checkpoints/}`` or, for host runs of several seeds, ``{seed: checkpoints/seed-<seed>/}``."""
    root = run_dir / "checkpoints"
    per_seed = (
        sorted((int(p.name[5:]), p) for p in root.glob("seed-*") if p.is_dir() and p.name[5:].isdigit())
        if root.is_dir()
        else []
    )
    return dict(per_seed) if per_seed else {None: root}


def _newest_meta(directory: Path) -> dict:
    """The metadata of the newest readable checkpoint in ``directory`` (``{}`` if none)."""
    with Checkpointer(directory) as checkpointer:
        for step in reversed(checkpointer.all_steps()):
            try:
                return checkpointer.read_meta(step)
            except CheckpointError:
                continue
    return {}


def run_seeds(run_dir: Path) -> list[int] | None:
    """The seeds of a run of several seeds (``None`` for one seed), from its checkpoints: also the
    seeds a host run had not started when it stopped."""
    dirs = checkpoint_dirs(run_dir)
    if None in dirs:
        return _newest_meta(dirs[None]).get("seeds")
    per_seed = sorted(s for s in dirs if s is not None)
    recorded = _newest_meta(dirs[per_seed[0]]).get("run_seeds") or []
    return sorted(set(recorded) | set(per_seed))


def refuse_a_run_of_several_seeds(run_dir: Path, agent: Any, env: Any) -> None:
    """Refuses ``agent.train`` / ``agent.resume`` / ``agent.save()`` in a directory that holds a
    run of several seeds (``kitae train --seeds K``), closing ``env``: an agent is one seed, and
    the directory's checkpoints, metrics and summary are every seed's; one written there for one
    seed would replace the run's own.

    Raises:
        RunError: naming the seeds and the two ways on.
    """
    seeds = run_seeds(run_dir) if (run_dir / "checkpoints").is_dir() else None
    if not seeds:
        return
    if hasattr(env, "close"):
        env.close()
    raise RunError(
        f"{str(run_dir)!r} holds a run of seeds {', '.join(map(str, seeds))} trained as one run, which an agent (one "
        f"seed) does not go on in: resume the whole run with kitae resume {run_dir} (from Python, "
        f"kitae.runs.resume_run({str(run_dir)!r})), or give this agent (seed {agent.config.seed}) a directory of its "
        "own first (agent.run_dir = ...; agent.save(directory=...) saves elsewhere)"
    )


def restore_error(error: Exception, run: Any = None, road: str = "resume") -> RunError:
    """A ``CheckpointError`` in the command line's words. For a run with no checkpoint at all,
    what to do depends on the ``road``: ``"resume"`` (``kitae resume``; ``run``: its
    ``ResolvedRun``, if known) gives the ``kitae train`` command that starts it again,
    ``"agent"`` (``agent.resume``) the calls that do, and ``"load"`` (``kitae eval``,
    ``Agent.unserialize``) says that there is nothing to load yet."""
    text = str(error)
    if not (isinstance(error, CheckpointError) and text.startswith("no checkpoint in")):
        return RunError(text)
    when = "checkpoints are written every train_cfg.save_frequency steps, at the end and on Ctrl-C/SIGTERM"
    if road == "load":
        return RunError(
            f"{text}: nothing to load yet ({when}; a run still training before its first one has none yet, "
            "and one that stopped before it holds none: kitae resume RUN_DIR says how to start it again)"
        )
    if road == "agent":
        if run is not None and not run.run_dir.is_dir():
            return RunError(f"{text}: {str(run.run_dir)!r} holds no run to go on from; agent.train(env) starts one")
        return RunError(
            f"{text}: the run stopped before its first checkpoint ({when}) and holds nothing to go on from; delete "
            "its run directory and call agent.train(env) to start it again, or give the agent another run_name or "
            "run_dir"
        )
    command = "kitae train ALGO ENV --config RUN_DIR/config.yaml --run-dir NEW_DIR [--seeds K]"
    if run is not None:
        target = run.run_dir if never_trained(run.run_dir) else "NEW_DIR"  # train takes such a directory
        seeds = f" --seeds {len(run.seeds)}" if run.seeds else ""
        command = f"kitae train {run.algo} {run.env.id} --config {run.run_dir}/config.yaml --run-dir {target}{seeds}"
    return RunError(
        f"{text}: the run stopped before its first checkpoint ({when}) and holds nothing to go on from; start it "
        f"again with {command}"
    )


def restore_payload(
    agent: Any,
    env: Any,
    executor: Any,
    directory: Path,
    max_step: int | None = None,
    step: int | None = None,
    *,
    resuming: bool = False,
) -> tuple[Payload, Restored]:
    """Restores the newest readable checkpoint in ``directory`` (or checkpoint ``step``) for ``agent``.

    Args:
        agent: the agent it was written by (rebuilt from ``config.yaml``): the structure to restore into.
        env: the run's environments, to restore a checkpoint's environment part too (a compiled
            run goes on from it), or ``None`` to restore the rest only (an agent to evaluate).
        executor: the run's executor (``kitae.loops.executor``).
        directory: the checkpoint folder.
        max_step: ignore checkpoints past this step.
        step: restore this checkpoint, not the newest (no falling back to another).
        resuming: training goes on from it: a checkpoint written with other software or on another
            kind of machine (``kitae.runs.provenance.differences``) gives a ``ProvenanceWarning``
            that says what differs (the run goes on, but not to an uninterrupted run's bits).

    Returns:
        ``(payload, restored)``.

    Raises:
        CheckpointError: no readable checkpoint, or one that does not fit.
    """

    def target(meta: dict) -> dict:
        env_target = executor.restore_target(agent, env, meta) if env is not None else None
        return restore_target(agent, meta, env_target)

    with Checkpointer(directory) as checkpointer:
        if step is None:
            restored = checkpointer.restore_latest(target, max_step=max_step)
        else:
            restored = checkpointer.restore(step, target(checkpointer.read_meta(step)))
    seeds = len(restored.meta.get("seeds") or [])
    if resuming and (found := differences(restored.meta.get("made_with"), seeds=seeds)):
        warnings.warn(
            f"checkpoint step {restored.step} ({restored.path}) was written with other software or on another "
            f"kind of machine ({'; '.join(found)}): the run goes on from its state, but not to the bits an "
            "uninterrupted run would have reached",
            ProvenanceWarning,
            stacklevel=2,
        )
    return Payload(restored.items["loop_state"], restored.meta), restored


def checkpoint_step(directory: Path, checkpoint: int | str | None) -> int | None:
    """The step of the checkpoint named by ``checkpoint`` in ``directory``: ``None`` for the
    newest readable one (given as ``None`` or ``"newest"``), the best-evaluated one's for
    ``"best"`` (``Checkpointer.best_step``), and an int (or its digits) for that step.

    Raises:
        RunError: no such checkpoint; the message lists those there are.
    """
    if checkpoint is None or checkpoint == "newest":
        return None
    with Checkpointer(directory) as checkpointer:
        steps = checkpointer.all_steps()
        kept = ", ".join(str(s) for s in steps) or "none"
        if checkpoint == "best":
            best = checkpointer.best_step()
            if best is None:
                raise RunError(
                    f"checkpoint 'best': no checkpoint in {directory} was evaluated (checkpoints there: {kept}); "
                    "a run evaluates its checkpoints with --set train_cfg.eval_episodes=N"
                )
            return best
        text = str(checkpoint)
        if isinstance(checkpoint, bool) or not text.isdigit():
            raise RunError(f"checkpoint {checkpoint!r} is not allowed; allowed: 'best', 'newest' or a step ({kept})")
        if int(text) not in steps:
            raise RunError(f"no checkpoint of step {int(text):,} in {directory}; its checkpoints: {kept}")
        return int(text)


def best_evaluations(run_dir: Path, seeds: list[int] | None) -> dict:
    """``summary.json``'s ``best_eval_step`` and ``best_eval_return``: the step and evaluation of
    the checkpoint ``kitae eval RUN_DIR --checkpoint best`` loads (one value per seed for runs of
    several seeds; seeds trained together share a checkpoint, a host run's seeds each have their
    own); nothing when no checkpoint was evaluated."""
    dirs = checkpoint_dirs(run_dir)
    steps, returns = [], []
    for seed, directory in dirs.items():
        with Checkpointer(directory) as checkpointer:
            best = checkpointer.best_step()
            evaluated: Any = checkpointer.read_meta(best)["eval_return"] if best is not None else None
        if seed is None:  # one folder: one seed, or seeds trained together (a list, by seed)
            if best is None:
                return {}
            if seeds:
                return {"best_eval_step": [best] * len(seeds), "best_eval_return": list(evaluated)}
            return {"best_eval_step": best, "best_eval_return": evaluated}
        steps.append(best)
        returns.append(evaluated)
    if all(step is None for step in steps):
        return {}
    by_seed = dict(zip(dirs, zip(steps, returns)))
    chosen = [by_seed.get(seed, (None, None)) for seed in seeds or []]
    return {"best_eval_step": [c[0] for c in chosen], "best_eval_return": [c[1] for c in chosen]}


def load_agent(
    run_dir: str | Path, seed_index: int = 0, agent_cls: type | None = None, checkpoint: int | str | None = None
) -> Any:
    """Rebuilds the trained agent of a run directory: ``config.yaml``, then a checkpoint
    (parameters, optimizer and normalisation state, keys, counters, buffer): by default the
    newest readable one.

    Args:
        run_dir: the run directory.
        seed_index: which seed of a run of several seeds.
        agent_cls: the agent class (default: the built-in algorithm named by the config's
            params class); ``BaseAgent.unserialize`` passes its own class.
        checkpoint: ``None`` or ``"newest"`` (the newest), ``"best"`` (the best-evaluated one of a run trained
            with ``train_cfg.eval_episodes``: ``Checkpointer.best_step``; of a host run of several
            seeds, that seed's best) or a step that is on disk.

    Returns:
        The agent, with ``checkpoint_step`` set to the checkpoint's step.

    Raises:
        RunError: for a missing or unusable run directory or checkpoint.
    """
    run_dir = check_run_dir(run_dir)
    run = resolve_run_dir(run_dir, agent_cls=agent_cls)
    dirs = checkpoint_dirs(run_dir)
    per_seed = sorted(s for s in dirs if s is not None)
    seeds = per_seed or run_seeds(run_dir)
    if seeds and not 0 <= seed_index < len(seeds):
        raise RunError(f"seed_index={seed_index} is not allowed; the run has {len(seeds)} seeds: {seeds}")
    if not seeds and seed_index != 0:
        raise RunError(f"seed_index={seed_index} is not allowed; the run trained one seed: allowed 0")
    agent = run.make_agent(seeds[seed_index] if seeds else None)
    directory = dirs[per_seed[seed_index]] if per_seed else dirs[None]
    step = checkpoint_step(directory, checkpoint)
    try:
        payload, restored = restore_payload(agent, None, run.executor, directory, step=step)
    except CheckpointError as error:
        raise restore_error(error, road="load") from None
    apply_loop_state(agent, payload.state, seed_index if payload.meta.get("seeds") else None)
    agent.checkpoint_step = restored.step
    return agent
