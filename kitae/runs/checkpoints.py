"""Checkpoints: the whole training state under ``<run_dir>/checkpoints/<step>/``, on orbax.

Why this module is long: it is one file format (writing, retention, checksums, restoring into a
target's tree), kept in one place so that what is written and what is checked on reading cannot
drift apart.

A checkpoint holds a ``kitae.loops.state.Payload``: the executor's ``LoopState`` (the agent's
parameters, target parameters, optimizer states and running statistics, the loop key, the replay
or rollout buffer, the step and update counters, and for the compiled loop the environments'
state and running episodes; a leading seed axis when seeds train together) and its metadata.
Every executor writes the same payload, so any checkpoint is read the same way.

Layout of one checkpoint (written by ``orbax.checkpoint.CheckpointManager``, which writes into a
temporary folder ``<step>.orbax-checkpoint-tmp-*`` and renames it when complete, so a
checkpoint folder either is whole or does not exist)::

    checkpoints/<step>/state/   the arrays (orbax's OCDBT / zarr array format)
    checkpoints/<step>/meta/    JSON: executor, counters, seeds, what wrote it (``made_with``:
                                ``kitae.runs.provenance``), and for every array its tree path,
                                shape, dtype and SHA-256

Nothing is pickled: arrays in orbax's array format, everything else JSON. Restoring never
builds Python objects from the file: the arrays are poured into the tree structure of an agent
rebuilt from ``config.yaml`` (``restore(step, target)``), after their paths, shapes and dtypes
were checked against it. Every array's SHA-256 is checked on restore, so a checkpoint truncated
or damaged on disk is detected (``CheckpointCorrupt``); ``restore_latest`` then warns
(``CheckpointWarning``, naming the bad step) and falls back to the previous checkpoint.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jax
import numpy as np

from kitae.loops.state import LoopState, Payload, payload_from_agent
from kitae.runs.provenance import made_with

FORMAT = "kitae-checkpoint/2"

__all__ = [
    "Checkpointer",
    "CheckpointError",
    "CheckpointCorrupt",
    "CheckpointMismatch",
    "CheckpointWarning",
    "Restored",
    "payload_items",
    "evaluation_score",
    "CHECKPOINT_MODULES",
]

# what saving imports (orbax: 0.15-0.25 s); a run imports it while it trains
# (kitae.runs.callbacks.ImportWhileTraining), so its last checkpoint does not wait for it
CHECKPOINT_MODULES = ("orbax.checkpoint",)


class CheckpointError(Exception):
    """No usable checkpoint: missing, unreadable or not matching the agent."""


class CheckpointCorrupt(CheckpointError):
    """A checkpoint whose files are missing, truncated or damaged (the previous one may be used)."""


class CheckpointMismatch(CheckpointError):
    """A whole checkpoint that does not fit the agent it is restored into (another config)."""


class CheckpointWarning(UserWarning):
    """A damaged checkpoint was skipped in favour of an older one."""


@dataclasses.dataclass
class Restored:
    """What ``Checkpointer.restore`` returns.

    Attributes:
        step: the checkpoint's step (environment transitions).
        meta: the checkpoint's JSON metadata (``executor``, ``env_saved``, ``diverged_saved``, ``env_step``,
            ``n_updates``, ``seeds``...).
        items: ``{name: tree}``: each restored item in the structure of the target given for it,
            or as the flat list of its arrays where no target was given.
        path: the checkpoint folder.
    """

    step: int
    meta: dict
    items: dict[str, Any]
    path: Path


# ---------------------------------------------------------------------------------------------
# Trees <-> flat named arrays
# ---------------------------------------------------------------------------------------------


def _to_numpy(leaf: Any) -> np.ndarray:
    if isinstance(leaf, jax.Array) and jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
        leaf = jax.random.key_data(leaf)
    return np.array(leaf, copy=True)  # a copy: host buffers are donated to the next update


def _sha256(array: np.ndarray) -> str:
    data = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
    return hashlib.sha256(data).hexdigest()  # type: ignore[arg-type]  # numpy stubs: __buffer__ on Python >= 3.12 only


def _describe(paths: list[str], arrays: list[np.ndarray], *, checksums: bool = True) -> list[dict]:
    return [
        {"path": path, "shape": list(a.shape), "dtype": str(a.dtype), **({"sha256": _sha256(a)} if checksums else {})}
        for path, a in zip(paths, arrays)
    ]


def _flatten(tree: Any) -> tuple[list[str], list[Any]]:
    with_paths, _ = jax.tree_util.tree_flatten_with_path(tree)
    return [jax.tree_util.keystr(path) for path, _ in with_paths], [leaf for _, leaf in with_paths]


def _unflatten_into(name: str, target: Any, arrays: list[np.ndarray], described: list[dict], step: int) -> Any:
    """Pours ``arrays`` into ``target``'s tree structure after checking paths, shapes and dtypes."""
    paths, leaves = _flatten(target)
    if len(paths) != len(described):
        raise CheckpointMismatch(
            f"checkpoint step {step}: {name!r} holds {len(described)} arrays but the agent built from the "
            f"config has {len(paths)}; the checkpoint was written by another configuration or version"
        )
    for path, leaf, entry in zip(paths, leaves, described):
        shape, dtype = tuple(np.shape(leaf)), np.dtype(getattr(leaf, "dtype", np.asarray(leaf).dtype))
        if jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
            raise CheckpointMismatch(f"{name}{path}: typed PRNG keys are not supported; use raw uint32 keys")
        # a Python scalar leaf (a fresh optimizer's step counter) takes the saved array's dtype
        python_scalar = isinstance(leaf, (bool, int, float, complex))
        if (
            path != entry["path"]
            or shape != tuple(entry["shape"])
            or (str(dtype) != entry["dtype"] and not python_scalar)
        ):
            raise CheckpointMismatch(
                f"checkpoint step {step}: {name}{entry['path']} {tuple(entry['shape'])} {entry['dtype']} does not "
                f"match the agent's {name}{path} {shape} {dtype}; the checkpoint was written by another "
                "configuration"
            )
    treedef = jax.tree_util.tree_structure(target)
    values = [  # a Python scalar leaf comes back as the same Python scalar; arrays as device arrays
        type(leaf)(a.item()) if isinstance(leaf, (bool, int, float, complex)) else jax.device_put(a)
        for leaf, a in zip(leaves, arrays)
    ]
    return jax.tree_util.tree_unflatten(treedef, values)


def _without_unwanted_parts(target: Any, entries: list[dict], arrays: list[np.ndarray]) -> tuple[list, list]:
    """A loop state saved with its environments (and the compiled loop's ``diverged_step``),
    restored into a target without them (an agent loaded for evaluation needs no environment):
    those arrays are left out."""
    if not isinstance(target, LoopState):
        return entries, arrays

    def unwanted(path: str) -> bool:
        return (target.env is None and path.startswith(".env.")) or (
            target.diverged_step is None and path == ".diverged_step"
        )

    keep = [i for i, entry in enumerate(entries) if not unwanted(entry["path"])]
    return [entries[i] for i in keep], [arrays[i] for i in keep]


def _drop_closed_loop_callbacks() -> None:
    """When orbax fails to read a damaged checkpoint, tensorstore's pending reads still call back
    into orbax's event loop after it closed; each callback reports ``RuntimeError('Event loop is
    closed')`` as an unraisable exception (a traceback on stderr, long after the error was
    raised and handled). Those reports, and only those, are dropped."""
    previous = sys.unraisablehook
    if getattr(previous, "_kitae_drops_closed_loop", False):
        return

    def hook(unraisable: Any) -> None:
        error = unraisable.exc_value
        if isinstance(error, RuntimeError) and str(error) == "Event loop is closed":
            return
        previous(unraisable)

    hook._kitae_drops_closed_loop = True  # type: ignore[attr-defined]
    sys.unraisablehook = hook


def _short(error: Exception, limit: int = 160) -> str:
    """A one-line gist of an orbax / tensorstore error."""
    import re

    text = str(error).splitlines()[0] if str(error) else type(error).__name__
    text = re.sub(r'Error opening "[^"]+" driver: ', "", text)
    text = re.sub(r"\s*\[tensorstore_spec.*$", "", text)
    return text if len(text) <= limit else text[: limit - 3] + "..."


@contextlib.contextmanager
def _quiet_orbax() -> Iterator[None]:
    """orbax logs through absl; keep its INFO/WARNING/ERROR lines off the user's terminal (every
    error it hits reaches us as an exception, reported in kitae's words)."""
    logger = logging.getLogger("absl")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)


# ---------------------------------------------------------------------------------------------
# The checkpointer
# ---------------------------------------------------------------------------------------------


class Checkpointer:
    """Saves and restores whole training states under ``directory/<step>/``.

    Args:
        directory: the checkpoint folder (``<run_dir>/checkpoints``); created on the first save.
        max_to_keep: keep the newest this many checkpoints (older ones are deleted), >= 1, or
            ``None`` to keep every one; the best-evaluated checkpoint (``best_step``) is kept as
            well. A run's is its ``train_cfg.keep_checkpoints`` (``Checkpointer.for_run``).
        before_save: optional callable run before every save (the runner flushes metrics and
            TensorBoard files with it, so that what a checkpoint has seen is on disk first).
        meta: JSON-able fields written into every checkpoint's metadata (the runner records a
            run's seeds this way).

    ``save(step, payload)`` writes a ``kitae.loops.state.Payload`` (an agent is turned into one
    with ``payload_from_agent``); ``restore_latest(target)`` reads the newest readable one.
    """

    def __init__(
        self,
        directory: str | Path,
        max_to_keep: int | None = 3,
        *,
        before_save: Callable[[], None] | None = None,
        meta: dict | None = None,
    ) -> None:
        if max_to_keep is not None and (
            not isinstance(max_to_keep, int) or isinstance(max_to_keep, bool) or max_to_keep < 1
        ):
            allowed = "an int >= 1, or None (keep every one)"
            raise ValueError(f"max_to_keep={max_to_keep!r} is not allowed; allowed: {allowed}")
        self.directory = Path(directory).absolute()
        self.max_to_keep = max_to_keep
        self.before_save = before_save
        self.meta = dict(meta or {})
        self.saved: list[int] = []  # steps saved by this checkpointer

    @classmethod
    def for_run(cls, directory: str | Path, train_cfg: Any, **options: Any) -> Checkpointer:
        """The checkpointer of a run whose config's ``train_cfg`` is given: it keeps
        ``train_cfg.keep_checkpoints`` checkpoints (-1: every one). ``options``: as ``__init__``'s."""
        keep = train_cfg.keep_checkpoints
        return cls(directory, None if keep == -1 else keep, **options)

    # -- orbax ----------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _manager(self) -> Iterator[Any]:
        """An orbax ``CheckpointManager`` for one operation (closed after it: nothing stays open
        between saves, and a manager never works from a stale listing)."""
        import orbax.checkpoint as ocp

        # no max_to_keep for orbax: which checkpoints stay is decided in `_delete_old` (the newest
        # `max_to_keep` and the best-evaluated one)
        options = ocp.CheckpointManagerOptions(enable_async_checkpointing=False, create=True)
        with _quiet_orbax():
            manager = ocp.CheckpointManager(self.directory, options=options, item_names=("state", "meta"))
            try:
                yield manager
            finally:
                manager.close()

    def close(self) -> None:
        """Nothing to release (kept so a ``Checkpointer`` can be used as a context manager)."""

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- listing --------------------------------------------------------------------------------

    def all_steps(self) -> list[int]:
        """The steps of the checkpoints on disk, oldest first (unfinished writes are not listed)."""
        if not self.directory.is_dir():
            return []
        return sorted(int(p.name) for p in self.directory.iterdir() if p.is_dir() and p.name.isdigit())

    def latest_step(self) -> int | None:
        """The newest checkpoint's step, or ``None`` when there is none."""
        steps = self.all_steps()
        return steps[-1] if steps else None

    def path(self, step: int) -> Path:
        """The folder of the checkpoint at ``step`` (``<directory>/<step>``), whether on disk or not."""
        return self.directory / str(step)

    def best_step(self) -> int | None:
        """The step of the best-evaluated checkpoint on disk, or ``None`` when none was evaluated.

        A checkpoint saved with ``extra={"eval_return": ...}`` (``train_cfg.eval_episodes``: a mean
        return, or one per seed for seeds trained together, ranked by their mean) is a candidate;
        of equal ones the earliest wins, as in Stable-Baselines3's ``EvalCallback`` (a later
        checkpoint replaces the best only by doing better). Unreadable metadata and non-finite
        returns are passed over.
        """
        best: tuple[float, int] | None = None
        for step in self.all_steps():
            try:
                score = evaluation_score(self.read_meta(step))
            except CheckpointError:
                continue
            if score is not None and (best is None or score > best[0]):
                best = (score, step)
        return None if best is None else best[1]

    def _delete_old(self, manager: Any) -> None:
        """Deletes every checkpoint but the newest ``max_to_keep`` and the best-evaluated one."""
        if self.max_to_keep is None:
            return
        steps = self.all_steps()
        keep = set(steps[-self.max_to_keep :]) | {self.best_step()}
        for step in steps:
            if step not in keep:
                manager.delete(step)

    # -- saving ---------------------------------------------------------------------------------

    def save(self, step: int, payload: Any, *, extra: dict | None = None) -> Path:
        """Saves the whole training state at ``step`` (environment transitions).

        Args:
            step: the step, used as the folder name.
            payload: a ``kitae.loops.state.Payload`` (what the executors hand their checkpoint
                callback), or an agent (its facade's state, as ``agent.save()`` does).
            extra: more JSON metadata to keep with the checkpoint.

        Returns:
            The checkpoint folder. Saving a step already on disk replaces it.
        """
        import orbax.checkpoint as ocp

        step = int(step)
        if self.saved and self.saved[-1] == step and step in self.all_steps():
            return self.path(step)  # already saved at this step (a periodic save, then the final one)
        if not isinstance(payload, Payload):
            payload = payload_from_agent(payload)
        if self.before_save is not None:
            self.before_save()
        items, meta = payload_items(payload)
        meta.update({**self.meta, **{k: v for k, v in meta.items() if v is not None}})
        meta.update(step=step, written_at=time.strftime("%Y-%m-%dT%H:%M:%S"), made_with=made_with(), **(extra or {}))
        named = {name: [_to_numpy(x) for x in leaves] for name, (paths, leaves) in items.items()}
        meta["items"] = {name: _describe(items[name][0], arrays) for name, arrays in named.items()}
        # orbax stores every non-empty array; zero-size ones are rebuilt from their shape in meta
        stored = {name: {str(i): a for i, a in enumerate(arrays) if a.size} for name, arrays in named.items()}
        stored = {name: arrays for name, arrays in stored.items() if arrays}
        with self._manager() as manager:
            if step in manager.all_steps():
                manager.delete(step)
            manager.save(
                step,
                args=ocp.args.Composite(state=ocp.args.StandardSave(stored), meta=ocp.args.JsonSave(meta)),
                force=True,
            )
            manager.wait_until_finished()
            self._delete_old(manager)
        self.saved.append(step)
        return self.path(step)

    # -- restoring ------------------------------------------------------------------------------

    def read_meta(self, step: int) -> dict:
        """The JSON metadata of checkpoint ``step``; raises ``CheckpointCorrupt`` if unreadable."""
        import json

        path = self.path(step) / "meta" / "metadata"
        try:
            meta = json.loads(path.read_text())
        except (OSError, ValueError) as error:
            raise CheckpointCorrupt(
                f"checkpoint step {step} ({self.path(step)}): unreadable metadata: {error}"
            ) from None
        if not isinstance(meta, dict) or meta.get("format") != FORMAT:
            raise CheckpointCorrupt(f"checkpoint step {step} ({self.path(step)}): not a {FORMAT} checkpoint")
        return meta

    def restore(self, step: int, target: dict[str, Any] | None = None) -> Restored:
        """Restores checkpoint ``step``.

        Args:
            step: the step to restore.
            target: ``{item name: tree}``: each named item is poured into that tree's structure
                (its leaves, arrays or ``jax.ShapeDtypeStruct``, give the expected shapes and
                dtypes; static parts such as optimizer functions are kept). Items without a target
                come back as flat lists of arrays. The one item is ``loop_state``.

        Raises:
            CheckpointCorrupt: the checkpoint is missing, truncated or damaged on disk.
            CheckpointMismatch: it does not fit ``target`` (another configuration).
        """
        import orbax.checkpoint as ocp

        step = int(step)
        if not self.path(step).is_dir():
            raise CheckpointCorrupt(f"checkpoint step {step} does not exist in {self.directory}")
        meta = self.read_meta(step)
        described = meta.get("items", {})
        abstract = {
            name: {
                str(i): np.zeros(entry["shape"], entry["dtype"])
                for i, entry in enumerate(entries)
                if int(np.prod(entry["shape"])) > 0
            }
            for name, entries in described.items()
        }
        abstract = {name: arrays for name, arrays in abstract.items() if arrays}
        _drop_closed_loop_callbacks()
        try:
            with self._manager() as manager:
                restored = manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract)))
            stored = restored.state if abstract else {}
        except Exception as error:  # orbax / tensorstore report damage with many exception types
            raise CheckpointCorrupt(
                f"checkpoint step {step} ({self.path(step)}) is damaged or incomplete: {_short(error)}"
            ) from None
        items: dict[str, Any] = {}
        for name, entries in described.items():
            arrays = []
            for i, entry in enumerate(entries):
                if int(np.prod(entry["shape"])) == 0:
                    array = np.zeros(entry["shape"], entry["dtype"])
                else:
                    try:
                        array = np.asarray(stored[name][str(i)])
                    except (KeyError, TypeError):
                        raise CheckpointCorrupt(
                            f"checkpoint step {step}: array {name}{entry['path']} is missing"
                        ) from None
                if (
                    list(array.shape) != entry["shape"]
                    or str(array.dtype) != entry["dtype"]
                    or _sha256(array) != entry["sha256"]
                ):
                    raise CheckpointCorrupt(
                        f"checkpoint step {step} ({self.path(step)}) is damaged: array {name}{entry['path']} "
                        "does not match its checksum"
                    )
                arrays.append(array)
            if target is not None and target.get(name) is not None:
                entries, arrays = _without_unwanted_parts(target[name], entries, arrays)
                items[name] = _unflatten_into(name, target[name], arrays, entries, step)
            else:
                items[name] = arrays
        if target is not None:
            for name, tree in target.items():
                if tree is not None and name not in items:
                    raise CheckpointMismatch(f"checkpoint step {step} holds no {name!r} (it has {', '.join(items)})")
        return Restored(step=step, meta=meta, items=items, path=self.path(step))

    def restore_latest(
        self, target: dict[str, Any] | Callable[[dict], dict] | None = None, *, max_step: int | None = None
    ) -> Restored:
        """Restores the newest readable checkpoint, falling back to older ones.

        Args:
            target: as in ``restore``, or a function of the checkpoint's metadata returning it.
            max_step: ignore checkpoints past this step.

        A damaged checkpoint is skipped with a ``CheckpointWarning`` that names its step, once an
        older one restored.

        Raises:
            CheckpointError: no checkpoint at all, or none readable (the message lists why).
            CheckpointMismatch: a readable checkpoint does not fit the target.
        """
        steps = [s for s in self.all_steps() if max_step is None or s <= max_step]
        if not steps:
            raise CheckpointError(f"no checkpoint in {self.directory}")
        failures = []
        for step in reversed(steps):
            try:
                resolved = target(self.read_meta(step)) if callable(target) else target
                restored = self.restore(step, resolved)
            except CheckpointCorrupt as error:
                failures.append(str(error))
                continue
            for failure in failures:
                warnings.warn(f"{failure}; using checkpoint step {step} instead", CheckpointWarning, stacklevel=2)
            return restored
        raise CheckpointError(f"no readable checkpoint in {self.directory}: " + "; ".join(failures))


def evaluation_score(meta: dict) -> float | None:
    """What ``Checkpointer.best_step`` ranks a checkpoint by: the mean of its metadata's
    ``eval_return`` (one value, or one per seed), or ``None`` when it was not evaluated or its
    evaluation is not finite."""
    value = meta.get("eval_return")
    if value is None or (isinstance(value, list) and (not value or None in value)):
        return None
    score = float(np.mean(value))
    return score if np.isfinite(score) else None


# ---------------------------------------------------------------------------------------------
# The payload's items and restore targets
# ---------------------------------------------------------------------------------------------


def payload_items(payload: Payload) -> tuple[dict[str, tuple[list[str], list[Any]]], dict]:
    """The named array items and the JSON metadata of a payload."""
    state = payload.state
    env_step = np.asarray(state.env_step)
    n_updates = np.asarray(state.n_updates)
    meta: dict[str, Any] = {
        "format": FORMAT,
        "executor": payload.meta.get("executor", "host"),
        "seeds": payload.meta.get("seeds"),
        "env_saved": state.env is not None,
        "diverged_saved": state.diverged_step is not None,
        "env_step": int(env_step.max()) if env_step.size else 0,
        "n_updates": int(n_updates.max()) if n_updates.size else 0,
    }
    return {"loop_state": _flatten(state)}, meta
