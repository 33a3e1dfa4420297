"""The functional DQN (``kitae.functional.DQN``) trained by a user-written loop (issue 13).

Acceptance: ``examples/functional_dqn.py``'s own loop reaches a mean return >= 475 (the running
mean of the last 10 training episodes) on Gymnasium ``CartPole-v1`` within 100k steps, for each of
3 seeds: ``met`` when every seed's first step at 475 is within the budget. The final returns (that
mean at the end) are reported beside it.

Run::

    .venv/bin/python benchmarks/bench_functional_dqn.py [--seeds 0 1 2] [--network haiku|flax]

Each seed runs in its own process (``examples/functional_dqn.py --seed S``), one after the
other; results go to ``benchmarks/results/functional_dqn_<network>.json``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from common import RESULTS

from kitae.runs.provenance import made_with

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--network", choices=["haiku", "flax"], default="haiku")
    args = parser.parse_args()
    runs = []
    for seed in args.seeds:
        command = [sys.executable, "examples/functional_dqn.py", "--seed", str(seed), "--steps", str(args.steps)]
        command += ["--network", args.network]
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=True)
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
        print(json.dumps(runs[-1]), flush=True)
    finals = [r["final_return"] for r in runs]
    report = {
        "command": (
            f".venv/bin/python examples/functional_dqn.py --seed S --steps {args.steps} --network {args.network}"
        ),
        "target": "reaches >= 475 (running mean of 10 episodes) within the budget, every seed",
        "final_returns": finals,
        "first_steps_at_475": [r["first_step_at_475"] for r in runs],
        "met": all(r["first_step_at_475"] is not None for r in runs),
        "runs": runs,
        "made_with": made_with(),
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"functional_dqn_{args.network}.json").write_text(json.dumps(report, indent=2))
    print(json.dumps({"final_returns": finals, "met": report["met"]}))


if __name__ == "__main__":
    main()
