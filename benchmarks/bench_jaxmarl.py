"""IPPO on JaxMARL MPE simple_spread in the compiled loop, 3 seeds in one program, against a
uniformly random policy measured the same way.

Acceptance (issue 6): PPO with one set of parameters shared by the 3 agents (IPPO), trained in
kitae's compiled loop, improves on a uniformly random policy by a recorded margin over three
seeds. Settings: the preset ``jaxmarl:MPE_simple_spread_v3`` of ``kitae/presets/ppo.yaml``
(JaxMARL's ``ippo_ff_mpe`` settings: 16 environments x 128 steps, 4 epochs of 4 minibatches).

Returns are TEAM returns: the sum of the three agents' returns over an episode (26 transitions).
Both policies are scored by ONE function (``kitae.loops.multi_agent.evaluate_team_returns``):
``--eval-envs`` environments run for ``--eval-episodes`` whole episodes each from keys that depend only on
``--eval-seed``, the
trained agents acting as they trained (sampling from the policy) and greedily (the mode), the
random policy drawing each agent's action uniformly from ``Discrete(5)``. The last training
episodes' mean team return (``CompiledRun.final_return``) is recorded too.

Run: ``.venv/bin/python benchmarks/bench_jaxmarl.py [--steps N] [--seeds 0 1 2]``; writes
``benchmarks/results/jaxmarl_simple_spread.json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import resource
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import numpy as np
from common import RESULTS

from kitae.runs.provenance import made_with

ENV_ID = "jaxmarl:MPE_simple_spread_v3"


def random_policy(env: Any) -> Callable:
    """Each agent's action uniform in its ``Discrete(n)`` space."""
    n = int(env.single_action_space.n)

    def act(key: jax.Array, observation: dict) -> dict:
        keys = jax.random.split(key, len(env.agents))
        return {a: jax.random.randint(k, (env.num_envs,), 0, n) for a, k in zip(env.agents, keys)}

    return act


def agent_policy(agent: Any, state: Any, deterministic: bool) -> Callable:
    """The trained agent's actions from ``state``: sampled as in training, or the policy's mode."""

    def act(key: jax.Array, observation: dict) -> dict:
        keys = dict(zip(observation, jax.random.split(key, len(observation))))
        actions, _ = agent.explore_fn(state, keys, observation, deterministic=deterministic)
        return actions

    return act


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=None, help="environment steps per seed (default: the preset)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--eval-envs", type=int, default=64)
    parser.add_argument("--eval-episodes", type=int, default=10)
    parser.add_argument("--eval-seed", type=int, default=12345)
    parser.add_argument("--output", default=str(RESULTS / "jaxmarl_simple_spread.json"))
    args = parser.parse_args()

    from kitae.envs.make import make_jax_env
    from kitae.loops.compiled import compiled_train
    from kitae.loops.multi_agent import evaluate_team_returns as evaluate
    from kitae.runs import preset_agent

    agent, env = preset_agent("ppo", ENV_ID, steps=args.steps, run_dir="/tmp/kitae-bench/ippo-spread")
    config = agent.config
    steps = config.train_cfg.n_env_steps
    start = time.perf_counter()
    result = compiled_train(agent, env, steps, seeds=args.seeds)
    wall = time.perf_counter() - start
    print(
        f"IPPO {ENV_ID}: {len(args.seeds)} seeds x {result.env_steps:,} steps, compile "
        f"{result.compile_seconds:.1f} s, train {result.train_seconds:.1f} s, "
        f"{result.sps:,.0f} env steps/s over all seeds",
        flush=True,
    )

    eval_env = make_jax_env(ENV_ID, args.eval_envs)
    eval_key = jax.random.PRNGKey(args.eval_seed)
    random_returns = evaluate(eval_env, random_policy(eval_env), eval_key, args.eval_episodes)
    random_mean = float(random_returns.mean())
    runs = []
    for i, seed in enumerate(args.seeds):
        state = jax.tree_util.tree_map(lambda x, i=i: x[i], result.state.agent_state)
        sampled = evaluate(eval_env, agent_policy(agent, state, False), eval_key, args.eval_episodes)
        greedy = evaluate(eval_env, agent_policy(agent, state, True), eval_key, args.eval_episodes)
        run = {
            "seed": seed,
            "final_training_return": result.final_return(i, last=100),
            "final_training_agent_returns": result.final_agent_returns(i, last=100),
            "eval_return_sampled": float(sampled.mean()),
            "eval_return_sampled_std": float(sampled.std()),
            "eval_return_greedy": float(greedy.mean()),
            "margin_sampled_vs_random": float(sampled.mean()) - random_mean,
            "margin_greedy_vs_random": float(greedy.mean()) - random_mean,
        }
        runs.append(run)
        print(
            f"  seed {seed}: training {run['final_training_return']:.1f}, eval sampled "
            f"{run['eval_return_sampled']:.1f}, greedy {run['eval_return_greedy']:.1f}; random {random_mean:.1f}; "
            f"margin (sampled) {run['margin_sampled_vs_random']:+.1f}",
            flush=True,
        )

    margins = [r["margin_sampled_vs_random"] for r in runs]
    row = {
        "name": "ippo_simple_spread_compiled",
        "env_id": ENV_ID,
        "command": " ".join(["python", *sys.argv]),
        "algo": "ppo (IPPO: one set of parameters shared by the 3 agents)",
        "n_envs": env.num_envs,
        "n_agents": env.n_agents,
        "steps_per_seed": result.env_steps,
        "seeds": args.seeds,
        "config": {"algo_params": dataclasses.asdict(config.algo_params), "update_cfg": config.update_cfg.to_dict()},
        "return_definition": "team return: the sum of the 3 agents' returns over one 26-step episode",
        "evaluation": {"envs": args.eval_envs, "episodes_per_env": args.eval_episodes, "seed": args.eval_seed},
        "random_policy_return": random_mean,
        "random_policy_return_std": float(random_returns.std()),
        "runs": runs,
        "min_margin_sampled_vs_random": float(min(margins)),
        "mean_margin_sampled_vs_random": float(np.mean(margins)),
        "improves_on_random_every_seed": bool(min(margins) > 0),
        "compile_seconds": result.compile_seconds,
        "train_seconds": result.train_seconds,
        "wall_seconds": wall,
        "env_steps_per_second_all_seeds": result.sps,
        "agent_transitions_per_second_all_seeds": result.sps * env.n_agents,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "made_with": made_with(),
    }
    print(
        f"margin over random (sampled policy): min {row['min_margin_sampled_vs_random']:+.1f}, "
        f"mean {row['mean_margin_sampled_vs_random']:+.1f}",
        flush=True,
    )
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(row, indent=2) + "\n")


if __name__ == "__main__":
    main()
