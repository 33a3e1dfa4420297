"""Runs: from an algorithm name and an environment id (or an agent and its environments) to a
run directory, and back.

- ``train_run(RunSpec(...))``, ``resume_run(run_dir)``: ``kitae train`` and ``kitae resume``
  (``kitae.runs.session``, ``kitae.runs.resume``), and ``agent.train(env)`` / ``agent.resume(env)``
  on the same code;
- ``eval_run(run_dir)``: ``kitae eval`` (``kitae.runs.evaluation``);
- ``plot_runs(run_dirs)``: ``kitae plot`` (``kitae.runs.plotting``);
- ``load_agent(run_dir)``: the trained agent of a run (``Agent.unserialize``);
- ``preset_agent(algo, env_id, ...)``: an agent configured as ``kitae train`` would, and its
  environments.

The modules: ``resolve`` (a run resolved once), ``presets`` (presets and overrides), ``session``
(training into the run directory), ``callbacks`` (metrics and checkpoints as the executor runs),
``checkpoints`` (orbax checkpoints), ``load`` (reading them back), ``rundir`` (the directory's
files), ``plotting``, ``evaluation``, ``progress``, ``signals``, ``errors``, ``python_api``.

Importing this package installs the run service of the agent facade (``kitae.run_service``,
implemented by ``python_api.PythonRuns``).
"""

from __future__ import annotations

from kitae.run_service import install_run_service
from kitae.runs.errors import RunDiverged, RunError
from kitae.runs.evaluation import eval_run
from kitae.runs.load import load_agent
from kitae.runs.plotting import plot_runs
from kitae.runs.python_api import PythonRuns
from kitae.runs.resolve import ResolvedRun, RunSpec, preset_agent
from kitae.runs.resume import resume_run
from kitae.runs.session import train_run

__all__ = [
    "RunError",
    "RunDiverged",
    "RunSpec",
    "ResolvedRun",
    "train_run",
    "resume_run",
    "eval_run",
    "plot_runs",
    "load_agent",
    "preset_agent",
]

install_run_service(PythonRuns())
