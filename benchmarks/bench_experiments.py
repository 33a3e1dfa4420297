"""Benchmarks of issue 16 (experiments at XLA speed): sweeps in one program and tuning.

Cases (whole processes, PPO on gymnax CartPole-v1 with its preset: CleanRL / PureJaxRL settings,
4 envs x 128 steps, 4 epochs of 4 minibatches, annealed learning rate, 500k steps):

- ``sweep``: a 4 learning rates x 4 seeds sweep as ONE ``kitae sweep`` call against the 16
  ``kitae train --seed S --set update_cfg.learning_rate=X`` commands it replaces, one after the
  other in each round, each process with a cold compilation cache (an empty ``KITAE_CACHE_DIR``):
  the ratio of their wall times per round, median over ``--rounds`` rounds. Met when the median
  ratio is <= 0.35. Both sides train a constant learning rate: a swept plain value reads as
  ``--set`` reads it (the preset's annealing is dropped; ``docs/experiments.md``).
- ``tune``: ``kitae tune ppo gymnax:CartPole-v1 --trials 16`` (batches of 8 trials vmapped, the
  default PPO search space), then ``kitae train --config best.yaml --seeds 3`` to check the
  configuration it found. Met when the best trial's score (the mean of its last 10 training
  episodes) is >= 475.
- ``host-sweep``: a sweep of a host-loop environment, ``kitae sweep ppo CartPole-v1 --grid
  update_cfg.learning_rate=3e-4,1e-3 --seeds 2`` (rl-zoo's PPO settings, 100k steps), one
  combination after another against ``--workers 2`` (the combinations at once in Ray tasks, on a
  runtime the sweep starts), alternating, cold caches: the wall-time ratio per round (no target in
  the issue; it says where the workers pay), and whether both give the same final states.
- ``host-tune``: a search in a host-loop environment, ``kitae tune ppo CartPole-v1 --trials 4``
  (rl-zoo's PPO settings, 100k steps, the default PPO space), one trial after another against
  ``--workers 2``, alternating, cold caches: the wall-time ratio per round (no target in the
  issue), and whether both searches' trials (TPE's random start: the same values, asked in the
  same order) have the same scores.

Run::

    .venv/bin/python benchmarks/bench_experiments.py sweep [--rounds 3]
    .venv/bin/python benchmarks/bench_experiments.py tune
    .venv/bin/python benchmarks/bench_experiments.py host-sweep [--rounds 3]
    .venv/bin/python benchmarks/bench_experiments.py host-tune [--rounds 2]

Results: ``benchmarks/results/experiments.json`` (merged case by case).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from common import RESULTS

from kitae.runs.provenance import made_with

KITAE = [sys.executable, "-m", "kitae.cli"]
LEARNING_RATES = ["1e-4", "2.5e-4", "1e-3", "2.5e-3"]
SEEDS = 4


def _timed(command: list[str], cache: Path) -> tuple[float, str]:
    env = {**os.environ, "KITAE_CACHE_DIR": str(cache)}
    start = time.perf_counter()
    result = subprocess.run(command, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed: {result.stderr[-2000:]}")
    return wall, result.stdout


def case_sweep(rounds: int) -> dict:
    report: dict = {
        "sweep_command": "kitae sweep ppo gymnax:CartPole-v1 --grid update_cfg.learning_rate="
        + ",".join(LEARNING_RATES)
        + f" --seeds {SEEDS} --quiet",
        "train_command": "kitae train ppo gymnax:CartPole-v1 --seed S --set update_cfg.learning_rate=X --quiet "
        f"(16 processes: {len(LEARNING_RATES)} rates x seeds 0..{SEEDS - 1})",
        "rounds": [],
    }
    for r in range(rounds):
        with tempfile.TemporaryDirectory() as tmp_name:
            tmp = Path(tmp_name)
            sweep_wall, out = _timed(
                [*KITAE, "sweep", "ppo", "gymnax:CartPole-v1", "--grid",
                 "update_cfg.learning_rate=" + ",".join(LEARNING_RATES), "--seeds", str(SEEDS),
                 "--sweep-dir", str(tmp / "sweep"), "--quiet"],
                tmp / "cache-sweep",
            )  # fmt: skip
            sweep = json.loads((tmp / "sweep" / "sweep.json").read_text())
            train_walls, finals = [], {}
            for lr in LEARNING_RATES:
                for seed in range(SEEDS):
                    run_dir = tmp / f"train-{lr}-{seed}"
                    wall, _ = _timed(
                        [*KITAE, "train", "ppo", "gymnax:CartPole-v1", "--seed", str(seed),
                         "--set", f"update_cfg.learning_rate={lr}", "--run-dir", str(run_dir), "--quiet"],
                        tmp / f"cache-{lr}-{seed}",
                    )  # fmt: skip
                    train_walls.append(wall)
                    finals.setdefault(lr, []).append(json.loads((run_dir / "summary.json").read_text())["final_return"])
            row = {
                "sweep_wall_seconds": sweep_wall,
                "sweep_compile_seconds": sweep["compile_seconds"],
                "sweep_train_seconds": sweep["train_seconds"],
                "trains_wall_seconds": sum(train_walls),
                "train_wall_median_seconds": statistics.median(train_walls),
                "ratio": sweep_wall / sum(train_walls),
                "sweep_final_mean": {
                    f"{c['values']['update_cfg.learning_rate']:g}": c["mean"] for c in sweep["combinations"]
                },
                "trains_final_mean": {f"{float(lr):g}": statistics.mean(v) for lr, v in finals.items()},
            }
            print(json.dumps({"round": r, **row}), flush=True)
            report["rounds"].append(row)
    report["median_ratio"] = statistics.median(r["ratio"] for r in report["rounds"])
    report["met"] = report["median_ratio"] <= 0.35
    return report


def case_tune() -> dict:
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        study = tmp / "study"
        wall, out = _timed(
            [*KITAE, "tune", "ppo", "gymnax:CartPole-v1", "--trials", "16", "--study-dir", str(study), "--quiet"],
            tmp / "cache",
        )
        print(out, flush=True)
        trials = (study / "trials.csv").read_text()
        best_yaml = (study / "best.yaml").read_text()
        check_wall, check_out = _timed(
            [*KITAE, "train", "ppo", "gymnax:CartPole-v1", "--config", str(study / "best.yaml"), "--seeds", "3",
             "--run-dir", str(tmp / "best"), "--quiet"],
            tmp / "cache",
        )  # fmt: skip
        check = json.loads((tmp / "best" / "summary.json").read_text())
    best_line = next(line for line in out.splitlines() if line.startswith("best trial"))
    best_value = float(best_line.split("final return ")[1].split(" ")[0])
    return {
        "command": "kitae tune ppo gymnax:CartPole-v1 --trials 16",
        "wall_seconds": wall,
        "output": out.strip().splitlines(),
        "trials_csv": trials.strip().splitlines(),
        "best_yaml": best_yaml,
        "best_value": best_value,
        "check_command": "kitae train ppo gymnax:CartPole-v1 --config best.yaml --seeds 3",
        "check_final_return": check["final_return"],
        "check_wall_seconds": check_wall,
        "met": best_value >= 475,
    }


def _with_and_without_workers(
    rounds: int, base: list[str], dir_flag: str, read: Callable[[Path, str], dict], same: str, flag: str
) -> dict:
    """``base`` one after another, then with ``--workers 2``, in each of ``rounds`` rounds (cold
    caches, a directory each via ``dir_flag``): ``read(directory, stdout)`` gives each run's row;
    ``same`` names the key whose values both runs of a round should share, ``flag`` the round's
    entry that says whether they do."""
    report: dict = {"command": " ".join(["kitae", *base[3:]]) + " [--workers 2] --quiet", "rounds": []}
    for r in range(rounds):
        with tempfile.TemporaryDirectory() as tmp_name:
            tmp = Path(tmp_name)
            row: dict = {}
            for mode, extra in (("one_after_another", []), ("workers_2", ["--workers", "2"])):
                wall, out = _timed([*base, dir_flag, str(tmp / mode), "--quiet", *extra], tmp / f"cache-{mode}")
                row[mode] = {"wall_seconds": wall, **read(tmp / mode, out)}
            row["ratio"] = row["workers_2"]["wall_seconds"] / row["one_after_another"]["wall_seconds"]
            row[flag] = row["workers_2"][same] == row["one_after_another"][same]
            print(json.dumps({"round": r, **row}), flush=True)
            report["rounds"].append(row)
    report["median_ratio"] = statistics.median(r["ratio"] for r in report["rounds"])
    return report


def _sweep_row(sweep_dir: Path, _: str) -> dict:
    sweep = json.loads((sweep_dir / "sweep.json").read_text())
    prints = [
        json.loads((Path(c["run_dir"]) / "summary.json").read_text())["state_fingerprint"]
        for c in sweep["combinations"]
    ]
    return {"final_returns": [c["final_return"] for c in sweep["combinations"]], "fingerprints": prints}


def _study_row(study_dir: Path, out: str) -> dict:
    # TPE's first 10 trials are random draws from its seed, asked in the same order either way
    return {"trials_csv": (study_dir / "trials.csv").read_text().strip().splitlines(), "output": out.splitlines()}


def case_host_sweep(rounds: int) -> dict:
    base = [*KITAE, "sweep", "ppo", "CartPole-v1", "--grid", "update_cfg.learning_rate=3e-4,1e-3", "--seeds", "2"]
    return _with_and_without_workers(rounds, base, "--sweep-dir", _sweep_row, "fingerprints", "same_bits")


def case_host_tune(rounds: int) -> dict:
    base = [*KITAE, "tune", "ppo", "CartPole-v1", "--trials", "4"]
    return _with_and_without_workers(rounds, base, "--study-dir", _study_row, "trials_csv", "same_trials")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("case", choices=["sweep", "tune", "host-sweep", "host-tune"])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    cases = {
        "sweep": lambda: case_sweep(args.rounds),
        "tune": case_tune,
        "host-sweep": lambda: case_host_sweep(args.rounds),
        "host-tune": lambda: case_host_tune(args.rounds),
    }
    result = cases[args.case]()
    result.update(made_with=made_with(), date=time.strftime("%Y-%m-%d"))
    path = RESULTS / "experiments.json"
    data = json.loads(path.read_text()) if path.exists() else {}
    data[args.case] = result
    path.write_text(json.dumps(data, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k not in ("rounds", "trials_csv", "output")}, indent=2))


if __name__ == "__main__":
    main()
