"""What a run leaves on disk: the run directory's files.

``runs/<run_name>/`` holds ``config.yaml`` (the resolved config), ``checkpoints/<step>/``
(``kitae.runs.checkpoints``), ``logs/`` (TensorBoard), ``metrics.jsonl`` (one JSON object per
logged point), ``summary.json`` (written when the run ends) and ``curve.png``
(``kitae.runs.plotting``). Nothing here is pickled. ``docs/runs.md`` describes each file.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import itertools
import json
import math
import os
import resource
import shutil
import sqlite3
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import jax
import numpy as np
import yaml

from kitae.config import AlgoConfig, load_yaml
from kitae.loops.result import RECENT_EPISODES, recent_return
from kitae.runs.errors import RunError


def state_fingerprint(state: Any) -> str:
    """A SHA-256 of every array leaf of ``state`` (dtype, shape and bytes, in tree order).

    Two runs with equal fingerprints hold bit-identical parameters, optimizer states and targets.
    """
    digest = hashlib.sha256()
    for leaf in jax.tree_util.tree_leaves(state):
        array = np.asarray(leaf)
        digest.update(str(array.dtype).encode())
        digest.update(str(array.shape).encode())
        digest.update(np.ascontiguousarray(array).tobytes())
    return digest.hexdigest()


def peak_rss_mb() -> float:
    """Peak resident memory of this process, in MiB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class MetricsFile:
    """Appends one JSON object per line to ``metrics.jsonl``."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("a")

    def write(self, **values: Any) -> None:
        """Appends ``values`` (named scalars, or arrays of any shape) as one JSON line (through
        ``json_safe``: arrays as nested lists, non-finite floats as ``null``); buffered until
        ``flush`` or ``close``."""
        self._file.write(json.dumps(json_safe(values), allow_nan=False) + "\n")

    def flush(self) -> None:
        """Pushes the written rows to disk (before a checkpoint, so it never runs ahead of them)."""
        self._file.flush()

    def close(self) -> None:
        """Flushes and closes the file."""
        self._file.close()


def _plain(value: Any) -> Any:
    if isinstance(value, (np.generic, np.ndarray)):
        return value.tolist()
    if isinstance(value, jax.Array):
        return np.asarray(value).tolist()
    return value


def json_safe(value: Any) -> Any:
    """``value`` with arrays as lists and every non-finite float (a ``final_return`` of a run whose
    episodes never ended, a diverged seed's) as ``None``: JSON has no NaN or infinity, and the
    ``NaN`` Python's ``json`` writes by default is refused by strict readers (``jq``, JavaScript's
    ``JSON.parse``). Read back, ``np.asarray(..., float)`` turns the ``null`` into ``nan`` again."""
    value = _plain(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def read_metrics(path: str | Path) -> list[dict]:
    """The objects of a ``metrics.jsonl`` file (blank or torn last lines skipped)."""
    rows = []
    for line in Path(path).read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def write_summary(run_dir: str | Path, **fields: Any) -> dict:
    """Writes ``summary.json`` (atomically: a temporary file renamed over the old one)."""
    path = Path(run_dir) / "summary.json"
    tmp = path.with_suffix(".json.tmp")
    data = json_safe(fields)
    tmp.write_text(json.dumps(data, indent=2, allow_nan=False))
    tmp.replace(path)
    return data


@contextlib.contextmanager
def summary_lock(run_dir: str | Path) -> Iterator[None]:
    """Holds the run's summary lock within the block: its two writers, the run as it ends and
    ``kitae eval`` adding its figures (a read, a merge, a write), take turns. Without it, an
    evaluation that read ``summary.json`` just before the run wrote its own replaced the run's with
    the old one plus its figures.

    The lock is a ``flock`` on ``config.yaml``: the run directory's contract adds no file, its
    directory lock is the training process's for the whole run (``kitae.runs.lock``), and
    ``config.yaml`` is there in every run from before training on, replaced only when a run
    (re)starts, never while one ends. Where it is missing the block runs unlocked.
    """
    try:
        descriptor = os.open(Path(run_dir) / "config.yaml", os.O_RDONLY)
    except OSError:
        descriptor = None
    try:
        if descriptor is not None:
            fcntl.flock(descriptor, fcntl.LOCK_EX)  # released as the descriptor closes
        yield
    finally:
        if descriptor is not None:
            os.close(descriptor)


def add_to_summary(run_dir: str | Path, **fields: Any) -> dict | None:
    """Adds ``fields`` to the run's ``summary.json`` (created if there is none), under
    ``summary_lock``; returns the new summary, or ``None`` (nothing written) where the file is
    not a JSON object as kitae writes it."""
    path = Path(run_dir) / "summary.json"
    with summary_lock(run_dir):
        try:
            summary = json.loads(path.read_text()) if path.exists() else {}
        except (json.JSONDecodeError, UnicodeDecodeError):
            return None
        if not isinstance(summary, dict):
            return None
        return write_summary(run_dir, **{**summary, **fields})


def training_summary(run_dir: str | Path) -> dict | None:
    """The run's ``summary.json`` as its training wrote it (it holds ``steps``), or ``None``: no
    summary yet, or one that holds only what ``kitae eval`` writes into a run it evaluates (an
    unfinished one among them), which does not say that training ended."""
    path = Path(run_dir) / "summary.json"
    try:
        summary = json.loads(path.read_text()) if path.is_file() else None
    except (OSError, json.JSONDecodeError):
        return None
    return summary if isinstance(summary, dict) and "steps" in summary else None


def claim_new_run_dir(path: Path) -> Path:
    """Creates ``path``, or else ``path-2``, ``path-3``, ... (the first that does not exist) and
    returns it: ``mkdir`` fails on an existing folder, so two processes never claim the same one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    for n in itertools.count(1):
        candidate = path if n == 1 else path.with_name(f"{path.name}-{n}")
        try:
            candidate.mkdir()
        except FileExistsError:
            continue
        return candidate
    raise AssertionError("unreachable")


def default_run_dir(algo: str, env_name: str, seed: int) -> Path:
    """``runs/<algo>-<env name>-s<seed>-<date>-<time>``."""
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    return Path("runs") / f"{algo.lower()}-{env_name.replace('/', '-')}-s{seed}-{stamp}"


SWEEP_PLAN = "sweep-plan.json"  # the sweep as asked, written before training: what kitae resume finishes


def sweep_run_dirs(sweep_dir: str | Path) -> list[Path]:
    """The run directories of a sweep directory's combinations, in the plan's order (those made so
    far); ``[]`` for a folder that is not a sweep directory (no ``sweep-plan.json``) or whose plan
    cannot be read."""
    sweep_dir = Path(sweep_dir)
    try:
        plan = json.loads((sweep_dir / SWEEP_PLAN).read_text())
        names = [str(c["name"]) for c in plan["combinations"]]
    except (OSError, ValueError, KeyError, TypeError):
        return []
    return [sweep_dir / name for name in names if (sweep_dir / name / "config.yaml").is_file()]


def _study_dir_message(study_dir: Path) -> str:
    """What to do with a ``kitae tune`` study directory given where a run directory was expected:
    the search's command, read from the study's ``spec`` (SQLite, without importing Optuna)."""
    algo, env, extra = "ALGO", "ENV", ""
    try:
        with contextlib.closing(sqlite3.connect(f"file:{study_dir / 'study.db'}?mode=ro", uri=True)) as db:
            row = db.execute("SELECT value_json FROM study_user_attributes WHERE key = 'spec'").fetchone()
        spec = json.loads(row[0])  # kitae.runs.tune's: algo, env, steps, seeds (a count), space
        algo, env = spec["algo"], spec["env"]
        extra = f" --steps {int(spec['steps'])}" + (f" --seeds {int(spec['seeds'])}" if spec["seeds"] != 1 else "")
    except (sqlite3.Error, TypeError, ValueError, KeyError, IndexError):
        pass
    best = study_dir / "best.yaml"
    return (
        f"{str(study_dir)!r} is a kitae tune study (its trials: {str(study_dir / 'trials.csv')!r}), not a run "
        f"directory; continue the search with the command that started it (kitae tune {algo} {env}{extra} "
        f"--study-dir {study_dir} --trials N, and its --space if it had one), or train its best "
        f"configuration: kitae train {algo} {env} --config {best}"
    )


def check_run_dir(run_dir: str | Path) -> Path:
    """``run_dir`` as a ``Path`` if it is a kitae run directory (it has ``config.yaml``); else
    ``RunError`` (for a sweep directory, naming one of its runs)."""
    run_dir = Path(run_dir)
    if not run_dir.exists():
        raise RunError(f"run directory {str(run_dir)!r} does not exist")
    if not run_dir.is_dir():
        raise RunError(f"{str(run_dir)!r} is not a directory; give a run directory (runs/<name>)")
    if (run_dir / SWEEP_PLAN).is_file() and not (run_dir / "config.yaml").is_file():
        runs = sweep_run_dirs(run_dir)
        example = f", e.g. {str(runs[0])!r}" if runs else ""
        raise RunError(
            f"{str(run_dir)!r} is a sweep directory (its results: {str(run_dir / 'table.txt')!r}); "
            f"give one of its run directories{example}"
        )
    if (run_dir / "study.db").is_file() and not (run_dir / "config.yaml").is_file():
        raise RunError(_study_dir_message(run_dir))
    if not (run_dir / "config.yaml").is_file():
        inside = sorted(p.parent for p in run_dir.glob("*/config.yaml"))
        holds = (
            f"; it holds run directories (a sweep directory without its {SWEEP_PLAN}?), e.g. {str(inside[0])!r}"
            if inside
            else ""
        )
        raise RunError(f"{str(run_dir)!r} is not a kitae run directory: it has no config.yaml{holds}")
    return run_dir


def read_run_config(run_dir: str | Path) -> AlgoConfig:
    """The ``AlgoConfig`` of a run directory (``config.yaml``); ``RunError`` if it is unusable."""
    run_dir = check_run_dir(run_dir)
    try:
        return AlgoConfig.from_yaml(run_dir / "config.yaml")
    except (ValueError, TypeError, KeyError) as error:
        raise RunError(f"config.yaml in {str(run_dir)!r} is unusable: {error}".replace("\n", " ")) from None


def run_config_names(run_dir: str | Path) -> tuple[str | None, str | None]:
    """``(algo_params_class, env_cfg.task_name)`` as ``config.yaml`` of a checked run directory
    writes them, read without building the config: what a run of a custom agent whose params
    class is not registered in this process still tells (``None`` for what the file lacks)."""
    return config_file_names(Path(run_dir) / "config.yaml")


def config_file_names(path: str | Path) -> tuple[str | None, str | None]:
    """``(algo_params_class, env_cfg.task_name)`` of a run's ``config.yaml`` at ``path`` (``None``
    for what the file lacks, and both for a file that cannot be read or is not a run's config):
    ``kitae train --config RUN_DIR/config.yaml`` with ALGO or ENV left out trains that run's."""
    try:
        data = load_yaml(Path(path).read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        data = None
    data = data if isinstance(data, dict) else {}
    env_cfg = data.get("env_cfg")
    env_cfg = env_cfg if isinstance(env_cfg, dict) else {}
    kind, task_name = data.get("algo_params_class"), env_cfg.get("task_name")
    return (None if kind is None else str(kind)), (None if task_name is None else str(task_name))


def write_config(run_dir: Path, config: AlgoConfig) -> None:
    """Writes ``config.yaml`` atomically (a temporary file renamed over the old one)."""
    tmp = run_dir / "config.yaml.tmp"
    config.to_yaml(tmp)
    tmp.replace(run_dir / "config.yaml")


BEFORE_TRAINING = frozenset({"config.yaml", "logs", "metrics.jsonl"})
"""What a run writes before its first step: its config, TensorBoard's event file (the config as
text) and an empty ``metrics.jsonl``."""


def never_trained(run_dir: Path) -> bool:
    """``run_dir`` holds ``config.yaml`` and at most the rest of ``BEFORE_TRAINING``, with an empty
    ``metrics.jsonl``: a run written up front and never started (a sweep's combination the sweep
    had not reached when it stopped), or one that stopped before its first step (an environment
    its agent refused). It has no checkpoint to go on from and recorded nothing: training it
    again from the start loses nothing."""
    if not run_dir.is_dir():
        return False
    names = {p.name for p in run_dir.iterdir()}
    metrics = run_dir / "metrics.jsonl"
    return "config.yaml" in names and names <= BEFORE_TRAINING and (not metrics.exists() or metrics.stat().st_size == 0)


def clear_before_training(run_dir: Path) -> None:
    """Removes what a run that never trained (``never_trained``) wrote besides ``config.yaml``, so
    that training it again starts from the directory a new run has."""
    shutil.rmtree(run_dir / "logs", ignore_errors=True)
    (run_dir / "metrics.jsonl").unlink(missing_ok=True)


def final_return_from_rows(rows: list[dict], seed: int, last: int = RECENT_EPISODES) -> float:
    """Mean return of (about) the last ``last`` training episodes of ``seed`` in metrics rows
    (each row stands for ``episodes`` episodes, 1 if absent; ``kitae.loops.result.recent_return``)."""
    own = [row for row in rows if row.get("seed", seed) == seed and row.get("episodic_return") is not None]
    return recent_return([row["episodic_return"] for row in own], [row.get("episodes", 1) for row in own], last)[0]


def truncate_metrics(path: Path, keep_until: dict[Any, int]) -> None:
    """Keeps the rows of each seed logged at or before its step in ``keep_until`` (atomically)."""
    if not path.exists():
        return
    lines = []
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        seed = row.get("seed")
        limit = keep_until.get(seed, keep_until.get(None, 0))
        if row.get("step", 0) <= limit:
            lines.append(line)
    tmp = path.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(line + "\n" for line in lines))
    tmp.replace(path)
