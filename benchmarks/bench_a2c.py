"""A2C learning benchmark (issue 14): ``kitae train a2c`` on CartPole-v1.

Cases (``--only NAME``):

- ``host``: ``kitae train a2c CartPole-v1 --seed S`` (the preset: rl-zoo's A2C for CartPole-v1,
  Stable-Baselines3's defaults, 8 envs, 500k steps), three seeds one after the other. Target: each
  reaches a mean return >= 475 (the running mean of the last 10 training episodes) within 500k
  steps; the final returns are reported beside it.
- ``compiled``: ``kitae train a2c gymnax:CartPole-v1 --seed 0`` (one seed, recorded).

Run::

    .venv/bin/python benchmarks/bench_a2c.py [--only host] [--seeds 0 1 2]

Results: ``benchmarks/results/a2c.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import curve_figures, kitae_train  # noqa: E402


def run_case(env_id: str, seeds: list[int], tmp: Path) -> dict:
    runs = []
    for seed in seeds:
        run_dir = tmp / f"{env_id.replace(':', '_')}-{seed}"
        summary = kitae_train(["a2c", env_id, "--seed", str(seed)], run_dir)
        runs.append(
            {
                "seed": seed,
                "final_return": summary["final_return"],
                **curve_figures(run_dir, seed),
                "compile_seconds": summary["compile_seconds"],
                "train_seconds": summary["train_seconds"],
                "steps": summary["steps"],
            }
        )
        print(json.dumps(runs[-1]), flush=True)
    return {
        "command": f"kitae train a2c {env_id} --seed S",
        "target": "reaches >= 475 (running mean of 10 episodes) within 500k steps",
        "runs": runs,
        "met": all(r["first_step_at_475"] is not None for r in runs),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", choices=["host", "compiled"], action="append")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    args = parser.parse_args()
    path = RESULTS / "a2c.json"
    report = json.loads(path.read_text()) if path.exists() else {}
    with tempfile.TemporaryDirectory() as tmp_name:
        for case in args.only or ["host", "compiled"]:
            env_id, seeds = ("CartPole-v1", args.seeds) if case == "host" else ("gymnax:CartPole-v1", [0])
            report[case] = run_case(env_id, seeds, Path(tmp_name))
            report[case]["machine"] = f"{platform.machine()}, {os.cpu_count()} cores"
            RESULTS.mkdir(exist_ok=True)
            path.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
