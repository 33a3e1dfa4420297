"""The ``kitae`` command line.

Why this module is long: the seven commands' usage, examples and help texts, their parsers, their
handlers (thin calls into ``kitae.runs``) and ``main``'s one-line errors are read together, top to
bottom, as the command line's one description; the work itself is in ``kitae.runs``.

    kitae train [ALGO] [ENV] [--steps N] [--seed S] [--seeds K] [--n-envs E]
                [--config FILE.yaml] [--set KEY=VALUE ...] [--run-dir DIR] [--quiet]
    kitae sweep ALGO ENV --grid KEY=V1,V2,... [--grid ...] [--seeds K] [--steps N] [--seed S]
                [--n-envs E] [--config FILE.yaml] [--set KEY=VALUE ...] [--sweep-dir DIR] [--quiet]
                [--workers N [--address HOST:PORT]]
    kitae tune ALGO ENV --trials N [--space KEY=LOW:HIGH[:log] ...] [--seeds K] [--batch B]
               [--steps N] [--seed S] [--n-envs E] [--config FILE.yaml] [--set KEY=VALUE ...]
               [--study-dir DIR] [--quiet] [--workers N [--address HOST:PORT]]
    kitae resume RUN_DIR|SWEEP_DIR [--steps N] [--quiet]
    kitae eval RUN_DIR [--episodes N] [--video] [--seed S] [--checkpoint best|STEP] [--stochastic]
    kitae plot RUN_DIR|SWEEP_DIR [...] [-o FILE.png] [--window N]
    kitae config [ALGO] [ENV] [--steps N] [--seed S] [--n-envs E] [--config FILE.yaml]
                 [--set KEY=VALUE ...]

A mistake in the input prints one line (``kitae: error: ...``) that says what is wrong and what
is accepted, and exits with status 2, without a Python traceback and without changing the run
directory. Ctrl-C or SIGTERM during ``train`` / ``resume`` finishes the current step, saves a
checkpoint and exits with status 130 / 143 after saying how to resume. A run whose losses or
parameters become non-finite stops, keeps its last finite state as its newest checkpoint, writes
``summary.json`` (``diverged``) and exits with status 3 after one line naming the step and the loss;
``resume`` of such a run prints that line again, with status 3, before training anything.
What the file system refuses (a folder that cannot be written, a file where a folder goes, a full
disk) is one line too, with status 1. A reader that closes the pipe early (``kitae ... | head
-1``) ends the command quietly with status 141, as SIGPIPE ends other programs.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import sys
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

if TYPE_CHECKING:
    from kitae.runs import RunSpec

ALGORITHM_NAMES = ("a2c", "ddpg", "dqn", "mpo", "ppo", "ppo_lstm", "rnd_ppo", "sac", "td3")
"""kitae's own algorithms, as ``--help`` lists them without importing them (a test pins it to
``kitae.algos.collections.BUILT_IN``)."""

DEFAULT_ALGO = "ppo"
"""``kitae train``'s algorithm when neither ALGO nor a run's config.yaml as --config names one."""

DEFAULT_ENV = "gymnax:CartPole-v1"
"""``kitae train``'s environment when neither ENV nor a run's config.yaml as --config names one."""

EXAMPLES_TRAIN = """examples:
  kitae train                                   # PPO on gymnax:CartPole-v1, compiled, well under a minute
  kitae train dqn CartPole-v1 --steps 50000     # DQN on Gymnasium's CartPole in the host loop
  kitae train ppo gymnax:CartPole-v1 --seeds 8  # 8 seeds in one compiled program
  kitae train sac brax:inverted_pendulum        # a Brax environment, compiled (pip install 'kitae[brax]')
  kitae train sac Pendulum-v1 --set update_cfg.learning_rate=1e-3 --set algo_params.gamma=0.98
  kitae train ppo --set train_cfg.save_frequency=50000 --run-dir runs/ppo   # checkpoint every 50k steps
  kitae train ppo --set train_cfg.save_frequency=50000 --set train_cfg.eval_episodes=10  # and evaluate each
  kitae train ppo CartPole-v1 --set train_cfg.stop_return=475  # stop once the last 10 episodes reach 475
  kitae train ppo LunarLander-v3 --set env_kwargs.continuous=true  # an argument of the environment
  kitae train ppo Corridor-v0 --import my_envs  # your own Gymnasium id, registered by my_envs.py

Checkpoints go to RUN_DIR/checkpoints/<step>/ every train_cfg.save_frequency steps (-1: only at
the end), at the end, and on Ctrl-C / SIGTERM, which stop the run cleanly; kitae resume goes on.
The newest train_cfg.keep_checkpoints (default 3; -1: every one) are kept, and with
train_cfg.eval_episodes=N (each checkpoint's deterministic policy evaluated over N episodes as it
is saved) the best-evaluated one too: kitae eval RUN_DIR --checkpoint best.
"""

EXAMPLES_SWEEP = """examples:
  kitae sweep ppo gymnax:CartPole-v1 --grid update_cfg.learning_rate=1e-4,3e-4,1e-3,3e-3 --seeds 4
  kitae sweep ppo gymnax:CartPole-v1 --grid update_cfg.learning_rate=3e-4,1e-3 --grid algo_params.clip_coef=0.1,0.2
  kitae sweep dqn CartPole-v1 --grid update_cfg.learning_rate=1e-4,1e-3   # host loop: one after another
  kitae sweep dqn CartPole-v1 --grid update_cfg.learning_rate=1e-4,1e-3 --workers 2   # two at a time on Ray

Every combination x seed of a JAX environment trains in ONE compiled program (the swept values
are traced, vmapped like seeds). Only float fields can be swept (integers, booleans and strings
decide shapes): the error lists those of the algorithm. Writes SWEEP_DIR/<combination>/ (a run
directory each: kitae resume, eval and plot take them), sweep.json, table.txt and curves.png.
A combination that diverges is marked in the table; the others go on. Ctrl-C stops the sweep;
kitae resume SWEEP_DIR finishes it.
"""

EXAMPLES_TUNE = """examples:
  kitae tune ppo gymnax:CartPole-v1 --trials 16                 # 8 trials per compiled program
  kitae tune ppo gymnax:CartPole-v1 --trials 32 --space update_cfg.learning_rate=1e-5:1e-2:log
  kitae tune dqn CartPole-v1 --trials 10 --steps 50000           # host loop: one trial at a time
  kitae tune dqn CartPole-v1 --trials 10 --steps 50000 --workers 2   # two at a time on Ray
  kitae tune sac Pendulum-v1 --trials 10 --set train_cfg.eval_episodes=5   # scored by evaluation
  kitae train ppo gymnax:CartPole-v1 --config runs/tune-ppo-CartPole-v1-s0/best.yaml

Optuna's TPE sampler and median pruner (intermediate returns, 20 per trial); a trial whose update
diverges is pruned. A trial's score is its seeds' final training return, or with
train_cfg.eval_episodes=N their final policy's deterministic evaluation over N episodes. The
study is STUDY_DIR/study.db (SQLite): the same command started again continues it until
--trials trials have finished. Writes STUDY_DIR/best.yaml and trials.csv.
"""

EXAMPLES_RESUME = """examples:
  kitae resume runs/ppo                 # finish an interrupted run (its own n_env_steps)
  kitae resume runs/ppo --steps 1000000 # train on to 1,000,000 steps in all
  kitae resume runs/lr-sweep            # finish a stopped sweep (a directory kitae sweep wrote)

--steps N is the run's new TOTAL of environment steps (not steps to add); config.yaml is updated.
metrics.jsonl and the TensorBoard logs continue from the checkpoint's step: what was logged after
it is dropped. A compiled (JAX environment) run resumes bit for bit; a host (Gymnasium) run
resets its environments, whose state cannot be saved, and marks the interrupted episodes
truncated. A run that diverged is reported again (exit status 3), not trained on.
"""

EXAMPLES_EVAL = """examples:
  kitae eval runs/ppo                        # 10 episodes, mean and std of the raw returns
  kitae eval runs/ppo --episodes 100 --video # and an MP4 of one episode in runs/ppo/videos/
  kitae eval runs/ppo --checkpoint best      # the checkpoint that evaluated best while training
  kitae eval runs/ppo --stochastic           # sampled actions, as the agent explores

Acts with the deterministic policy (agent.select_action) of the newest checkpoint (or of
--checkpoint; with --stochastic, as the agent explores at that checkpoint's step: PPO's and SAC's
sampled actions, DQN's epsilon then, TD3's noise) and writes eval_return (and eval_policy) into
summary.json. A run trained with --set
train_cfg.eval_episodes=N evaluated each checkpoint as it was saved and keeps the best one beside
the newest (train_cfg.keep_checkpoints). gymnax and brax environments are evaluated in JAX (all episodes vmapped).
Videos: gymnax runs are filmed in the Gymnasium environment of the same name where there is one
(gymnax:CartPole-v1 -> CartPole-v1), else drawn by gymnax's visualizer (MinAtar...); Brax runs
from their states, drawn by MuJoCo (without a display through MUJOCO_GL=egl, which kitae sets
where it is unset); JaxMARL MPE runs drawn by JaxMARL's MPE visualizer; EnvPool Atari runs from
EnvPool's screen (a whole game).
"""

EXAMPLES_PLOT = """examples:
  kitae plot runs/ppo                              # -> curves.png
  kitae plot runs/ppo-a runs/ppo-b -o compare.png  # several runs on one figure
  kitae plot runs/sweep-a runs/ppo -o compare.png  # a sweep directory: each of its combinations
  kitae plot runs/ppo --window 100                 # smoother: the mean of the last 100 episodes

Each run is a line (mean over its seeds of a rolling mean of --window returns, 10 by default)
with a band from the lowest to the highest seed.
"""

EXAMPLES_CONFIG = """examples:
  kitae config ppo CartPole-v1                      # the preset's hyperparameters for this id
  kitae config dqn CartPole-v1 --set update_cfg.learning_rate=5e-4 > dqn.yaml
  kitae train dqn CartPole-v1 --config dqn.yaml     # edit dqn.yaml, then train with it

The comments above the YAML name the preset file and whether it has a section for ENV (and the
ids it has one for). Saved to a file, the output is a --config file for kitae train, sweep and
tune (its seed, n_envs and budget included; the flags given with it override them).
"""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, status 2
        self.exit(2, f"kitae: error: {message}\n")


# The subcommands, in the order the help lists them.
COMMANDS = ("train", "sweep", "tune", "resume", "eval", "plot", "config")


def _int(text: str) -> int:
    """An argparse type: an int. Its range is checked where the value is read, in the error that
    names the flag and what is allowed (``--steps 0 is not allowed; allowed: an int >= 1``)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an int") from None
    return value


def _steps(text: str) -> int:
    """``--steps``: an int, also written as a whole number in scientific notation (``1e6``, as
    rl-zoo's hyperparameter files write budgets) or with underscores (``1_000_000``). Its range is
    checked where it is read (``kitae.runs.resolve``), naming ``--steps``."""
    try:
        return int(text)
    except ValueError:
        pass
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value.is_integer():  # nan, inf and fractions alike
        raise argparse.ArgumentTypeError(
            f"{text!r} is not allowed; allowed: a whole number of environment steps (100000, 1e6, 1_000_000)"
        )
    return int(value)


def _seed(text: str) -> int:
    """An evaluation seed: an int in [0, 2**32), refused by argparse otherwise (Gymnasium's reset
    raised on a negative one, a traceback)."""
    value = _int(text)
    if not 0 <= value < 2**32:
        raise argparse.ArgumentTypeError(f"{value} is not allowed; allowed: an int in [0, 2**32)")
    return value


def _add_train_flags(parser: argparse.ArgumentParser, seeds: bool = False) -> None:
    """ALGO, ENV and the flags that decide a run's config, as ``kitae train`` and ``kitae config``
    take them (with ``seeds``, ``kitae train``'s ``--seeds`` in its place among them)."""
    parser.add_argument(
        "algo",
        nargs="?",
        help=f"{', '.join(ALGORITHM_NAMES)}, or a name an --import module registers (default: the "
        "algorithm of the run whose config.yaml is --config, else ppo)",
    )
    parser.add_argument(
        "env",
        nargs="?",
        help="SOURCE:ID, e.g. gymnax:CartPole-v1 or CartPole-v1 (default: the environment of the run whose "
        "config.yaml is --config, else gymnax:CartPole-v1)",
    )
    parser.add_argument("--steps", type=_steps, help="environment steps, summed over environments (e.g. 1e6)")
    parser.add_argument("--seed", type=_int, help="the seed (default from the preset: 0)")
    if seeds:
        parser.add_argument(
            "--seeds",
            type=_int,
            help="train K seeds (seed, seed+1, ...): vmapped in one program for JAX environments",
        )
    parser.add_argument("--n-envs", type=_int, help="number of environments")
    parser.add_argument("--config", help="a YAML file (n_envs, n_env_steps, algo_params, ...) or a run's config.yaml")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config value, e.g. update_cfg.learning_rate=1e-3 (repeatable)",
    )
    parser.add_argument(
        "--workers",
        type=_int,
        help="train on Ray with N collection workers, each stepping the preset's n_envs (docs/distributed.md)",
    )
    parser.add_argument("--gradient-workers", type=_int, help="with --workers: gradient workers (default 1)")
    parser.add_argument(
        "--async",
        dest="async_mode",
        action="store_true",
        help="with --workers: asynchronous collection, and gradients with 2+ gradient workers (lags are logged)",
    )
    parser.add_argument(
        "--address", help="with --workers: HOST:PORT of an existing Ray cluster (default: start one on 127.0.0.1)"
    )


def _add_shared_run_flags(parser: argparse.ArgumentParser, unit: str) -> None:
    """The flags ``kitae sweep`` and ``kitae tune`` take as ``kitae train`` does (what is not varied)."""
    parser.add_argument("--steps", type=_steps, help=f"environment steps of each {unit} (e.g. 1e6)")
    parser.add_argument("--seed", type=_int, help="the first seed (default from the preset: 0)")
    parser.add_argument("--n-envs", type=_int, help="number of environments")
    parser.add_argument("--config", help="a YAML file, as for kitae train")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="as for kitae train")
    _add_import_flag(parser)


def _add_import_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--import",
        dest="imports",
        action="append",
        default=[],
        metavar="MODULE",
        help="import this Python module (or .py file) first, e.g. one that registers your own Gymnasium "
        "environments (gymnasium.register); modules are found from the current directory too (repeatable)",
    )


def import_modules(names: list[str]) -> None:
    """Imports each module of ``--import`` (rl-zoo's ``--gym-packages``): what registers a user's
    own environments before their id is resolved. A name is a module (``my_envs``,
    ``package.envs``), looked for from the current directory first, as ``python -m`` does (the
    ``kitae`` script's own directory is ``.venv/bin``), or a ``.py`` file (its folder goes on
    ``sys.path``, which Ray workers of a local runtime get too).

    Raises:
        RunError: naming the module, for one that is missing or fails while it is imported.
    """
    import importlib

    from kitae.runs import RunError

    if names and os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    for name in names:
        if name.endswith(".py"):  # a file: its folder on sys.path, the module by its stem
            path = Path(name).resolve()
            if not path.is_file():
                raise RunError(f"--import {name}: no such file")
            if str(path.parent) not in sys.path:
                sys.path.insert(0, str(path.parent))
            name = path.stem
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as error:
            missing_itself = error.name == name.split(".")[0]  # not a module the user's module imports
            where = f" (looked for in {os.getcwd()} and the installed packages)" if missing_itself else ""
            raise RunError(f"--import {name}: {error}{where}") from None
        except Exception as error:  # the user's module raised: say which, in one line
            raise RunError(f"--import {name} failed: {type(error).__name__}: {error}") from None


def _version() -> str:
    """``kitae 0.1.0 (jax 0.10.2, jaxlib 0.10.2, Python 3.11.7)``: the versions a run's
    ``summary.json`` records (``kitae.runs.provenance.versions``)."""
    from kitae.runs.provenance import versions

    found = versions()
    return f"kitae {found['kitae']} (jax {found['jax']}, jaxlib {found['jaxlib']}, Python {found['python']})"


def build_parser() -> argparse.ArgumentParser:
    """The ``kitae`` command line: ``--version`` and one subcommand of ``COMMANDS`` (``train``,
    ``sweep``, ``tune``, ``resume``, ``eval``, ``plot``, ``config``), each with its flags, help
    and examples. Its usage errors are one line (``kitae: error: ...``) and exit with status 2.

    Returns:
        The parser; ``parse_args`` gives a namespace whose ``command`` is the subcommand's name
        (``None`` when none was given).
    """
    parser = _Parser(
        prog="kitae",
        description="Train, resume, evaluate and plot kitae agents. Each run lives in a run directory "
        "(runs/<name>/: config.yaml, checkpoints/, logs/ for TensorBoard, metrics.jsonl, summary.json, curve.png).",
        epilog="examples:\n  kitae train\n  tensorboard --logdir runs\n  kitae resume runs/<name>\n"
        "  kitae eval runs/<name> --video\n  kitae plot runs/<a> runs/<b> -o compare.png\n\n"
        "kitae COMMAND --help tells more.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=_version(), help="kitae's version and its JAX's")
    sub = parser.add_subparsers(dest="command", parser_class=_Parser, metavar="{" + ",".join(COMMANDS) + "}")

    train = sub.add_parser(
        "train",
        help="train an agent",
        description="Train an agent; writes runs/<run_name>/ (config.yaml, checkpoints/, logs/, metrics.jsonl, "
        "summary.json, curve.png). JAX environments (gymnax:..., brax:...) train as one compiled program, "
        "Gymnasium ones in "
        "a Python loop.",
        epilog=EXAMPLES_TRAIN,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_train_flags(train, seeds=True)
    train.add_argument("--run-dir", help="where to write the run (default runs/<algo>-<env>-s<seed>-<date>-<time>)")
    train.add_argument(
        "--quiet",
        action="store_true",
        help="no progress bar; after the result line, one JSON line: run_dir, final_return, sps, state_fingerprint",
    )
    _add_import_flag(train)

    sweep = sub.add_parser(
        "sweep",
        help="train a grid of hyperparameters x seeds (one compiled program for JAX environments)",
        description="Train every combination of --grid values with every seed; writes a sweep directory with "
        "one run directory per combination, sweep.json, table.txt and curves.png.",
        epilog=EXAMPLES_SWEEP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sweep.add_argument("algo", help="a kitae train algorithm (ppo, dqn, sac, ...)")
    sweep.add_argument("env", help="SOURCE:ID, e.g. gymnax:CartPole-v1")
    sweep.add_argument(
        "--grid",
        action="append",
        default=[],
        required=True,
        metavar="KEY=V1,V2,...",
        help="a float field and its values, e.g. update_cfg.learning_rate=1e-4,3e-4 (repeatable: the product); "
        "a learning rate reads as --set reads it: plain values constant, lin_1e-4,lin_3e-4 annealed",
    )
    sweep.add_argument("--seeds", type=_int, default=1, help="seeds per combination (default 1)")
    _add_shared_run_flags(sweep, "run")
    sweep.add_argument(
        "--sweep-dir", help="where to write the sweep (default runs/sweep-<algo>-<env>-s<seed>-<date>-<time>)"
    )
    sweep.add_argument("--quiet", action="store_true", help="no progress bar")
    sweep.add_argument(
        "--workers",
        type=_int,
        help="host-loop environments: train N combinations at a time in Ray tasks (default: one after another)",
    )
    sweep.add_argument(
        "--address", help="with --workers: HOST:PORT of an existing Ray cluster (default: start one on 127.0.0.1)"
    )

    tune = sub.add_parser(
        "tune",
        help="search hyperparameters with Optuna (trials vmapped in batches for JAX environments)",
        description="Search float hyperparameters with Optuna (TPE, median pruning); the study is kept in "
        "STUDY_DIR/study.db and the best configuration written as STUDY_DIR/best.yaml.",
        epilog=EXAMPLES_TUNE,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    tune.add_argument("algo", help="a kitae train algorithm (ppo, dqn, sac, ...)")
    tune.add_argument("env", help="SOURCE:ID, e.g. gymnax:CartPole-v1")
    tune.add_argument("--trials", type=_int, required=True, help="trials to finish in the study, in all")
    tune.add_argument(
        "--space",
        action="append",
        default=[],
        metavar="KEY=LOW:HIGH[:log]",
        help="a float field's range (repeatable; default: the algorithm's, see kitae.runs.tune.DEFAULT_SPACES)",
    )
    tune.add_argument("--seeds", type=_int, default=1, help="seeds per trial, scored by their mean")
    tune.add_argument("--batch", type=_int, default=8, help="trials per compiled program (default 8)")
    _add_shared_run_flags(tune, "trial")
    tune.add_argument("--study-dir", help="where the study goes (default runs/tune-<algo>-<env>-s<seed>)")
    tune.add_argument("--quiet", action="store_true", help="no progress bar")
    tune.add_argument("--workers", type=_int, help="host-loop environments: N trials at a time on Ray")
    tune.add_argument("--address", help="with --workers: HOST:PORT of an existing Ray cluster")

    resume = sub.add_parser(
        "resume",
        help="continue a stopped run from its newest checkpoint",
        description="Continue the run in RUN_DIR from its newest readable checkpoint (a damaged one is skipped "
        "with a warning) and finish it: parameters, optimizer, buffer, keys and counters come back. Given a "
        "sweep directory, finish every combination and write the sweep's table.",
        epilog=EXAMPLES_RESUME,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    resume.add_argument("run_dir", metavar="RUN_DIR", help="the run directory, e.g. runs/ppo-CartPole-v1-s0-...")
    resume.add_argument(
        "--steps", type=_steps, help="the run's new TOTAL of environment steps (default: its n_env_steps)"
    )
    resume.add_argument(
        "--quiet",
        action="store_true",
        help="no progress bar; after the result line, one JSON line, as kitae train --quiet",
    )
    _add_import_flag(resume)

    evaluate = sub.add_parser(
        "eval",
        help="evaluate a run's agent (mean and std of episode returns, optional video)",
        description="Evaluate the agent of RUN_DIR with its deterministic policy over N episodes; prints the mean "
        "and std of the raw episode returns and writes eval_return into summary.json.",
        epilog=EXAMPLES_EVAL,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    evaluate.add_argument("run_dir", metavar="RUN_DIR", help="the run directory")
    evaluate.add_argument("--episodes", type=_int, default=10, help="episodes to run (default: 10)")
    evaluate.add_argument("--video", action="store_true", help="record one episode as an MP4 in RUN_DIR/videos/")
    evaluate.add_argument(
        "--seed",
        type=_seed,
        default=0,
        help="seed of the evaluation episodes (default: 0; episode i of a Gymnasium env uses seed+i)",
    )
    evaluate.add_argument(
        "--checkpoint",
        metavar="best|newest|STEP",
        help="which checkpoint: the best-evaluated one of a run trained with train_cfg.eval_episodes, or a step "
        "(default: the newest)",
    )
    evaluate.add_argument(
        "--stochastic",
        action="store_true",
        help="act as the agent explores at the checkpoint's step (sampled actions, DQN's epsilon, TD3's noise) "
        "instead of with the deterministic policy",
    )
    _add_import_flag(evaluate)

    plot = sub.add_parser(
        "plot",
        help="plot the training curves of one or more runs on one figure",
        description="Plot episodic return against environment steps for each RUN_DIR on one figure.",
        epilog=EXAMPLES_PLOT,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    plot.add_argument(
        "run_dirs", nargs="+", metavar="RUN_DIR", help="run directories (a sweep directory: each of its runs)"
    )
    plot.add_argument(
        "-o",
        "--output",
        default="curves.png",
        metavar="FILE.png",
        help="the image to write (.png, .pdf or .svg; default: curves.png)",
    )
    plot.add_argument(
        "--window",
        type=_int,
        default=10,
        help="each seed's curve is the mean of its last N episodes (default: 10; 1: every episode)",
    )

    config = sub.add_parser(
        "config",
        help="print the config kitae train would run with, as a config file",
        description="Print the config that kitae train with the same arguments trains with (the preset, then "
        "--config, then the flags, resolved), as the YAML it writes to RUN_DIR/config.yaml, after comments "
        "saying where the values come from and which executor trains it. Nothing is trained or written.",
        epilog=EXAMPLES_CONFIG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_train_flags(config)
    _add_import_flag(config)
    return parser


def _run_spec(args: argparse.Namespace) -> RunSpec:
    """``kitae train``'s (or ``kitae config``'s) arguments as a ``RunSpec``."""
    from kitae.algos.collections import algorithm_of_params_name
    from kitae.runs import RunSpec
    from kitae.runs.rundir import config_file_names

    # ALGO or ENV left out: a run's config.yaml given as --config trains that run's again
    kind, env_id = config_file_names(args.config) if args.config else (None, None)
    algo = algorithm_of_params_name(kind) if kind else None
    return RunSpec(
        algo=args.algo or algo or DEFAULT_ALGO,
        env_id=args.env or env_id or DEFAULT_ENV,
        steps=args.steps,
        seed=args.seed,
        seeds=getattr(args, "seeds", None),
        n_envs=args.n_envs,
        config_file=args.config,
        sets=args.set,
        run_dir=getattr(args, "run_dir", None),
        quiet=getattr(args, "quiet", False),
        workers=args.workers,
        gradient_workers=args.gradient_workers,
        async_mode=args.async_mode,
        address=args.address,
    )


def _train(args: argparse.Namespace) -> int:
    from kitae.runs import train_run

    return _report(train_run(_run_spec(args)), args.quiet)


def _sweep(args: argparse.Namespace) -> int:
    from kitae.runs.sweep import SweepSpec, sweep_run

    spec = SweepSpec(
        algo=args.algo,
        env_id=args.env,
        grid=args.grid,
        seeds=args.seeds,
        steps=args.steps,
        seed=args.seed,
        n_envs=args.n_envs,
        config_file=args.config,
        sets=args.set,
        sweep_dir=args.sweep_dir,
        quiet=args.quiet,
        workers=args.workers,
        address=args.address,
    )
    return _sweep_report(sweep_run(spec))


def _sweep_report(report: dict) -> int:
    """A sweep's table and one line, or when a signal stopped it one line on stderr."""
    from kitae.runs.sweep_report import outcome

    out, err = outcome(report)
    print(out, file=sys.stderr if err else sys.stdout)
    return 128 + int(report["signum"]) if err else 0


def _tune(args: argparse.Namespace) -> int:
    from kitae.runs.tune import TuneSpec, tune_run

    report = tune_run(
        TuneSpec(
            algo=args.algo,
            env_id=args.env,
            trials=args.trials,
            space=args.space,
            seeds=args.seeds,
            batch=args.batch,
            steps=args.steps,
            seed=args.seed,
            n_envs=args.n_envs,
            config_file=args.config,
            sets=args.set,
            study_dir=args.study_dir,
            quiet=args.quiet,
            workers=args.workers,
            address=args.address,
        )
    )
    counts = (
        f"{report['finished']}/{report['trials']} trials finished ({report['pruned']} pruned, "
        f"{report['diverged']} diverged), wall {report['wall_seconds']:.1f} s"
    )
    if report["stopped"]:
        print(
            f"kitae: tune stopped by {report['signal']}: {counts}; the same command continues the study",
            file=sys.stderr,
        )
        return 128 + int(report["signum"])
    if report["best"] is None:
        print(f"{counts}; no trial completed -> {report['study_dir']}")
        return 0
    best = report["best"]
    values = ", ".join(f"{k}={v:.4g}" for k, v in best["params"].items())
    print(f"best trial {best['number']}: {report['score']} {best['value']:.1f} with {values}")
    print(f"{counts} -> {report['best_config']}")
    return 0


def _resume(args: argparse.Namespace) -> int:
    from kitae.runs import resume_run
    from kitae.runs.sweep_resume import is_sweep_dir, resume_sweep

    if is_sweep_dir(args.run_dir):
        return _sweep_report(resume_sweep(args.run_dir, args.steps, quiet=args.quiet))
    return _report(resume_run(args.run_dir, args.steps, quiet=args.quiet), args.quiet)


def _report(summary: dict, quiet: bool) -> int:
    if summary.get("stopped"):
        where = f"; checkpoint {summary['checkpoint']}" if summary.get("checkpoint") else ""
        print(
            f"kitae: stopped by {summary['signal']} at step {summary['steps']:,}{where}; "
            f"continue with: kitae resume {summary['run_dir']}",
            file=sys.stderr,
        )
        return 128 + int(summary["signum"])
    finals = summary["final_return"] if isinstance(summary["final_return"], list) else [summary["final_return"]]
    # None (or NaN): no training episode ended in the run
    final_text = ", ".join("- (no episode ended)" if v is None or v != v else f"{v:.1f}" for v in finals)
    # no speed (None, or NaN): a resume that found the run at its end trained nothing, only wrote its summary
    sps = summary["sps"]
    speed = (
        "nothing left to train"
        if sps is None or sps != sps
        else f"{sps:,.0f} steps/s, compile {summary['compile_seconds']:.1f} s"
    )
    print(
        f"{summary['algo']} on {summary['env']}: {summary['steps']:,} steps{_early_text(summary)}, "
        f"final return {final_text}, {_evaluation_text(summary)}{speed}, "
        f"wall {summary['wall_seconds']:.1f} s -> {summary['run_dir']}"
    )
    if quiet:
        from kitae.runs.rundir import json_safe

        line = {k: summary[k] for k in ("run_dir", "final_return", "sps", "state_fingerprint")}
        print(json.dumps(json_safe(line), allow_nan=False))
    return 0


def _early_text(summary: dict) -> str:
    """``" (stopped at step 41,984: every seed reached train_cfg.stop_return=475.0)"`` for a run
    that ended before its last step, one entry per seed (or seeds trained together); else ``""``."""
    parts = []
    for entry in summary.get("stopped_early", []):
        listed = ", ".join(map(str, entry["seeds"]))
        seeds = "" if len(summary.get("seeds", [])) < 2 else f"seed{'s' * (len(entry['seeds']) > 1)} {listed} "
        if entry["by"] == "train_cfg.stop_return":
            reached = f"reached train_cfg.stop_return={entry['target']:g}"
        else:
            reached = "stopped by a callback"
        parts.append(f"{seeds}at step {entry['step']:,}: {reached}")
    return f" (stopped early, {'; '.join(parts)})" if parts else ""


def _evaluation_text(summary: dict) -> str:
    """``"evaluation 500.0 (best 500.0 at step 120,320), "`` for a run trained with
    ``train_cfg.eval_episodes`` (one value per seed for runs of several), else ``""``."""
    if "eval_return" not in summary:
        return ""

    def listed(key: str) -> list:
        return summary[key] if isinstance(summary[key], list) else [summary[key]]

    def returns(values: list) -> str:
        return ", ".join("-" if v is None else f"{v:.1f}" for v in values)

    text = f"evaluation {returns(listed('eval_return'))}"
    if "best_eval_step" in summary:
        steps, best = listed("best_eval_step"), listed("best_eval_return")
        if len(set(steps)) == 1:  # one checkpoint (seeds trained together share theirs)
            text += f" (best {returns(best)} at step {steps[0]:,})"
        else:  # a host run's seeds: each its own best checkpoint
            pairs = ", ".join(f"{returns([v])} at step {s:,}" for v, s in zip(best, steps) if s is not None)
            text += f" (best {pairs})"
    return text + ", "


def _count(n: int, noun: str) -> str:
    """``"1 episode"``, ``"3 episodes"``."""
    return f"{n:,} {noun}" if n == 1 else f"{n:,} {noun}s"


def _eval(args: argparse.Namespace) -> int:
    from kitae.runs import eval_run

    result = eval_run(args.run_dir, args.episodes, args.video, args.seed, args.checkpoint, args.stochastic)
    for i, (mean, std, step) in enumerate(zip(result["mean"], result["std"], result["step"])):
        who = f" seed {result['seeds'][i]}" if result["seeds"] else ""
        which = "best checkpoint" if args.checkpoint == "best" else "checkpoint"
        print(
            f"{result['env']}{who}: return {mean:.2f} +- {std:.2f} over {_count(result['episodes'], 'episode')} "
            f"({result['policy']} policy, {which} step {step:,})"
        )
    if result["video"]:
        of = f" (seed {result['seeds'][0]})" if result["seeds"] else ""  # a run of several seeds films its first
        print(f"video{of}: {result['video']}")
    return 0


def _config(args: argparse.Namespace) -> int:
    from kitae.runs.resolve import config_text

    sys.stdout.write(config_text(_run_spec(args), args.imports))
    return 0


def _plot(args: argparse.Namespace) -> int:
    from kitae.runs import plot_runs

    print(plot_runs(args.run_dirs, args.output, args.window))
    return 0


def _warnings_in_one_line(previous):
    """``warnings.showwarning`` for the command line: kitae's own warnings (a checkpoint that could
    not be read, EnvPool's ids training in the host loop) as one ``kitae: warning:`` line, without
    the file and source line Python shows; other libraries' warnings as before."""
    from kitae.runs.checkpoints import CheckpointWarning

    package = Path(__file__).resolve().parent

    def show(message, category, filename, lineno, file=None, line=None):
        ours = issubclass(category, CheckpointWarning) or Path(filename).resolve().is_relative_to(package)
        if ours:
            print(f"kitae: warning: {message}".replace("\n", " "), file=sys.stderr)
        else:
            previous(message, category, filename, lineno, file, line)

    return show


def main(argv: list[str] | None = None) -> int:
    """Runs one ``kitae`` command; an error is one line on stderr, not a traceback.

    Args:
        argv: the arguments after the program name (default ``sys.argv[1:]``).

    Returns:
        The exit status: 0 done (``--help``, ``--version`` included); 2 a usage error, no
        command, or a ``RunError``, ``CheckpointError``, ``ValueError``, ``TypeError`` or
        ``FileNotFoundError``; 3 the run diverged; 1 another ``OSError``, lost distributed
        workers, or XLA out of memory; 130 Ctrl-C that aborted; ``128 + signal number`` a run
        stopped by SIGINT / SIGTERM (after its checkpoint) or whose output pipe was closed
        (SIGPIPE).
    """
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:  # --help (0) or a usage error (2, already printed in one line)
        return int(exit_.code or 0)
    if args.command is None:  # a wrong input is one line, as every other
        print(
            f"kitae: error: a command is needed; allowed: {', '.join(COMMANDS)} (kitae --help tells more)",
            file=sys.stderr,
        )
        return 2
    from kitae.compilation_cache import use_compilation_cache
    from kitae.distributed.executor import WorkersLost
    from kitae.runs import RunDiverged, RunError
    from kitae.runs.checkpoints import CheckpointError, CheckpointWarning

    commands = {
        "train": _train,
        "sweep": _sweep,
        "tune": _tune,
        "resume": _resume,
        "eval": _eval,
        "plot": _plot,
        "config": _config,
    }
    with warnings.catch_warnings():  # restores the warning filters and display afterwards
        warnings.simplefilter("always", CheckpointWarning)
        warnings.showwarning = _warnings_in_one_line(warnings.showwarning)
        try:
            import_modules(getattr(args, "imports", []))
            if args.command not in ("plot", "config"):
                # from the start, not only once a loop runs: making or loading the agent and its
                # environments compiles programs too (Brax's loading of its system, the evaluation
                # of `kitae eval`), which a second command then loads from disk
                use_compilation_cache()
            return commands[args.command](args)
        except RunDiverged as error:  # summary.json and the last finite checkpoint are written
            print(f"kitae: {error}".replace("\n", " "), file=sys.stderr)
            return 3
        except (RunError, CheckpointError, ValueError, TypeError, FileNotFoundError) as error:
            print(f"kitae: error: {error}".replace("\n", " "), file=sys.stderr)
            return 2
        except OSError as error:  # the file system refused (permissions, a file where a folder goes, a full disk)
            if isinstance(error, BrokenPipeError) and _stdout_closed():
                # `kitae ... | head -1`: the reader went away, as it may; the command's work is
                # done (its last act is to print). Quiet, with the status of a process SIGPIPE ended.
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
                return 128 + signal.SIGPIPE
            where = f": {error.filename!r}" if error.filename else ""
            print(f"kitae: error: {error.strerror or error}{where}".replace("\n", " "), file=sys.stderr)
            return 1
        except WorkersLost as error:  # the run saved a checkpoint before stopping
            print(f"kitae: error: {error}; continue with: kitae resume {error.run_dir or 'RUN_DIR'}", file=sys.stderr)
            return 1
        except RuntimeError as error:  # XLA's "RESOURCE_EXHAUSTED: Out of memory allocating N bytes."
            if "RESOURCE_EXHAUSTED" not in str(error):
                raise
            print(
                f"kitae: error: out of memory: {str(error).strip().splitlines()[0]} (smaller buffers, batches or "
                "networks need less: update_cfg.max_buffer_size, update_cfg.batch_size, n_envs, fewer --seeds)",
                file=sys.stderr,
            )
            return 1
        except KeyboardInterrupt:
            print("kitae: interrupted", file=sys.stderr)
            return 130


def _stdout_closed() -> bool:
    """Whether standard output is a pipe whose reader has closed it (``poll`` reports an error on
    its writing end); ``False`` when it cannot tell (no file descriptor, as under pytest's capture)."""
    import select

    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & select.POLLERR for _, events in poller.poll(0))
    except (OSError, ValueError, AttributeError):
        return False


def entry() -> int:
    """The ``kitae`` program (and ``python -m kitae.cli``): one XLA device per CPU core for this
    process (``kitae.devices.use_cpu_cores``), then ``main()``. ``main`` itself leaves JAX's
    devices alone, so calling it inside another program changes nothing there."""
    from kitae.devices import use_cpu_cores

    try:
        use_cpu_cores()
    except ValueError as error:  # KITAE_CPU_DEVICES
        print(f"kitae: error: {error}", file=sys.stderr)
        return 2
    code = main()
    # Everything the command wrote is closed by now (run directory, checkpoints, TensorBoard, a
    # Ray runtime it started). The interpreter's own teardown with XLA loaded takes about 0.4 s
    # here (freeing every module and the compiled programs one by one), a twentieth of a cold
    # `kitae train`: skip it, after what the atexit hooks that matter would do.
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed pipe: nothing more can be said
            stream.flush()
    os._exit(code)


if __name__ == "__main__":
    sys.exit(entry())
