"""Learning in the compiled loop: each algorithm on a gymnax environment, 3 seeds in one program.

Acceptance (issue: compiled training): PPO and DQN solve gymnax CartPole-v1 (mean return of the
last 10 episodes >= 475); SAC and TD3 reach >= -200 on gymnax Pendulum-v1 within 20k and 30k
steps. Settings: the presets in ``kitae/presets/<algo>.yaml`` for the gymnax ids (the same as the
host-loop benchmarks' tuned settings).

Run: ``.venv/bin/python benchmarks/bench_compiled_learning.py [--only ppo dqn sac td3]``; writes
``benchmarks/results/compiled_learning.json``.
"""

from __future__ import annotations

import argparse
import json
import resource
import time

from common import RESULTS

CASES = [
    # algo, env id, steps per seed, threshold
    ("ppo", "gymnax:CartPole-v1", 500_000, 475.0),
    ("dqn", "gymnax:CartPole-v1", 100_000, 475.0),  # the preset budget, as in the host-loop benchmark
    ("sac", "gymnax:Pendulum-v1", 20_000, -200.0),
    ("td3", "gymnax:Pendulum-v1", 30_000, -200.0),
]


def run_case(algo: str, env_id: str, steps: int, threshold: float, seeds: list[int]) -> dict:
    from kitae.loops.compiled import compiled_train
    from kitae.runs import preset_agent

    agent, env = preset_agent(algo, env_id, steps=steps, run_dir=f"/tmp/kitae-bench/compiled-{algo}")
    start = time.perf_counter()
    result = compiled_train(agent, env, steps, seeds=seeds)
    finals = [result.final_return(i) for i in range(len(seeds))]
    row = {
        "algo": algo,
        "env_id": env_id,
        "steps": result.env_steps,
        "seeds": seeds,
        "threshold": threshold,
        "final_returns": finals,
        "passed": all(f >= threshold for f in finals),
        "compile_seconds": result.compile_seconds,
        "train_seconds": result.train_seconds,
        "wall_seconds": time.perf_counter() - start,
        "sps_all_seeds": result.sps,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }
    print(
        f"{algo} {env_id}: final {[round(f, 1) for f in finals]} (threshold {threshold}), "
        f"compile {row['compile_seconds']:.1f} s, train {row['train_seconds']:.1f} s, "
        f"{row['sps_all_seeds']:,.0f} steps/s over {len(seeds)} seeds",
        flush=True,
    )
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="+", choices=[c[0] for c in CASES])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    args = parser.parse_args()
    path = RESULTS / "compiled_learning.json"
    rows = json.loads(path.read_text()) if path.exists() else {}
    for algo, env_id, steps, threshold in CASES:
        if args.only and algo not in args.only:
            continue
        rows[algo] = run_case(algo, env_id, steps, threshold, args.seeds)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
