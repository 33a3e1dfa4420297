"""Learning benchmarks of the algorithms of issue 14, from the command line (whole processes).

For each algorithm: ``kitae train ALGO ENV --seed S`` with the preset ``kitae train`` uses, three
seeds one after the other in the host loop (Gymnasium), and one seed in the compiled loop on the
gymnax counterpart (recorded). The issue's words decide ``met``: the running mean of the last 10
training episodes "reaches" the target within the budget (the preset's ``n_env_steps``); the
final returns (that mean at the end) are reported beside it.

| algo | host env | compiled env | target | budget |
| --- | --- | --- | --- | --- |
| a2c | CartPole-v1 | gymnax:CartPole-v1 | >= 475 | 500k |
| ddpg | Pendulum-v1 | gymnax:Pendulum-v1 | >= -200 | 20k |
| sac (discrete) | CartPole-v1 | gymnax:CartPole-v1 | >= 450 | 200k |

Run::

    .venv/bin/python benchmarks/bench_algorithms.py ALGO [--only host|compiled] [--seeds 0 1 2]

Results: ``benchmarks/results/ALGO.json`` (merged case by case).
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

CASES = {
    "a2c": ("CartPole-v1", "gymnax:CartPole-v1", 475.0),
    "ddpg": ("Pendulum-v1", "gymnax:Pendulum-v1", -200.0),
    "sac": ("CartPole-v1", "gymnax:CartPole-v1", 450.0),  # a Discrete space: discrete SAC
}


def run_case(algo: str, env_id: str, seeds: list[int], threshold: float, tmp: Path) -> dict:
    runs = []
    for seed in seeds:
        run_dir = tmp / f"{algo}-{env_id.replace(':', '_')}-{seed}"
        summary = kitae_train([algo, env_id, "--seed", str(seed)], run_dir)
        curve = curve_figures(run_dir, seed, threshold)
        runs.append(
            {
                "seed": seed,
                "final_return": summary["final_return"],
                "first_step_at_target": curve[f"first_step_at_{threshold:g}"],
                "max_running_mean": curve["max_running_mean"],
                "steps": summary["steps"],
                "compile_seconds": summary["compile_seconds"],
                "train_seconds": summary["train_seconds"],
            }
        )
        print(json.dumps({"algo": algo, "env": env_id, **runs[-1]}), flush=True)
    return {
        "command": f"kitae train {algo} {env_id} --seed S",
        "target": f"reaches >= {threshold:g} (running mean of 10 episodes) within the preset's steps",
        "runs": runs,
        "met": all(r["first_step_at_target"] is not None for r in runs),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("algo", choices=sorted(CASES))
    parser.add_argument("--only", choices=["host", "compiled"], action="append")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    args = parser.parse_args()
    host_env, compiled_env, threshold = CASES[args.algo]
    path = RESULTS / f"{args.algo}.json"
    report = json.loads(path.read_text()) if path.exists() else {}
    with tempfile.TemporaryDirectory() as tmp_name:
        for case in args.only or ["host", "compiled"]:
            env_id, seeds = (host_env, args.seeds) if case == "host" else (compiled_env, [0])
            report[case] = run_case(args.algo, env_id, seeds, threshold, Path(tmp_name))
            report[case]["machine"] = f"{platform.machine()}, {os.cpu_count()} cores"
            RESULTS.mkdir(exist_ok=True)
            path.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
