"""Learning on a Brax environment in the compiled loop, 3 seeds in one program.

The case: an algorithm on ``brax:inverted_pendulum`` (generalized backend, episodes truncated at
1000 steps, so the best return is 1000), with the preset of ``kitae/presets/<algo>.yaml`` for
that id; all seeds train together (``compiled_train(..., seeds=[0, 1, 2])``, one program).
Recorded per case: compile seconds (cold: the persistent compilation cache is off unless
``--cache``), train seconds, steps/s over all seeds, each seed's final return (mean of its last
10 finished episodes), the peak resident memory of the process.

Run: ``.venv/bin/python benchmarks/bench_brax.py [--algo sac] [--steps N] [--seeds 0 1 2]``;
writes ``benchmarks/results/brax_<algo>_<env>.json``. Needs ``pip install -e ".[brax]"``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import resource
import sys
import time

from common import RESULTS

from kitae.runs.provenance import made_with

# algo -> (env id, steps per seed, threshold on every seed's final return)
CASES = {
    "sac": ("brax:inverted_pendulum", 20_000, 950.0),
    "ppo": ("brax:inverted_pendulum", 300_000, 950.0),
}


def run_case(algo: str, env_id: str, steps: int, threshold: float, seeds: list[int], cache: bool) -> dict:
    from kitae.loops.compiled import compiled_train
    from kitae.runs import preset_agent

    agent, env = preset_agent(algo, env_id, steps=steps, run_dir=f"/tmp/kitae-bench/brax-{algo}")
    config = agent.config
    start = time.perf_counter()
    result = compiled_train(agent, env, steps, seeds=seeds, use_cache=cache)
    wall = time.perf_counter() - start
    finals = [result.final_return(i) for i in range(len(seeds))]
    curves = {}
    for i, seed in enumerate(seeds):
        x, y = result.episode_curve(i)
        every = max(1, len(x) // 50)
        curves[str(seed)] = [[int(a), round(float(b), 2)] for a, b in zip(x[::every], y[::every])]
    row = {
        "algo": algo,
        "env_id": env_id,
        "backend": env.env.backend,
        "episode_length": env.params.episode_length,
        "n_envs": env.num_envs,
        "steps_per_seed": result.env_steps,
        "seeds": seeds,
        "threshold": threshold,
        "final_returns": finals,
        "passed": all(f >= threshold for f in finals),
        "compile_seconds": result.compile_seconds,
        "compilation_cache": cache,
        "train_seconds": result.train_seconds,
        "wall_seconds": wall,
        "sps_all_seeds": result.sps,
        "sps_per_seed": result.sps / len(seeds),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "settings": {
            "n_envs": config.env_cfg.n_envs,
            "algo_params": dataclasses.asdict(config.algo_params),
            "update_cfg": config.update_cfg.to_dict(),
        },
        "curves": curves,
        "command": " ".join(["python", *sys.argv]),
        "made_with": made_with(),
    }
    print(
        f"{algo} {env_id}: final {[round(f, 1) for f in finals]} (threshold {threshold}), "
        f"compile {row['compile_seconds']:.1f} s, train {row['train_seconds']:.1f} s, "
        f"{row['sps_all_seeds']:,.0f} steps/s over {len(seeds)} seeds, peak {row['peak_rss_mb']:.0f} MB",
        flush=True,
    )
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--algo", choices=sorted(CASES), default="sac")
    parser.add_argument("--steps", type=int, default=None, help="steps per seed (default: the case's)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--cache", action="store_true", help="use the persistent compilation cache")
    args = parser.parse_args()
    env_id, steps, threshold = CASES[args.algo]
    row = run_case(args.algo, env_id, args.steps or steps, threshold, args.seeds, args.cache)
    path = RESULTS / f"brax_{args.algo}_{env_id.split(':')[1]}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(row, indent=2))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
