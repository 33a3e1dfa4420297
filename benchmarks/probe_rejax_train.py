"""Training time only, kitae against rejax, in one process: PPO on gymnax CartPole-v1 with
compare_rejax.py's settings. rejax's ``train`` is compiled once; kitae's preset run (one program,
no callbacks) is compiled once through the persistent cache; then each trains ``--rounds`` times,
alternating, and the ratio of kitae's ``train_seconds`` to rejax's call (its final evaluation
included) is printed per round. ``--no-divergence-check`` makes kitae's update treat every
result as finite (``kitae.loops.collect.all_finite``), to see what the check costs.

Run: ``.venv/bin/python benchmarks/probe_rejax_train.py [--no-divergence-check] [--rounds 3]``
(rejax is in the ``compare`` extra.)
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp

sys.path.insert(0, str(Path(__file__).resolve().parent))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-divergence-check", action="store_true")
    args = parser.parse_args()
    if args.no_divergence_check:
        import kitae.loops.collect as collect

        collect.all_finite = lambda tree: jnp.ones((), bool)

    import gymnax
    from compare_rejax import FiveValueStep, rejax_ppo

    from kitae.loops.compiled import CompiledExecutor
    from kitae.runs.resolve import RunSpec, resolve_train

    env, params = gymnax.make("CartPole-v1")
    rejax_train = jax.jit(rejax_ppo(FiveValueStep(env), params).train).lower(jax.random.PRNGKey(0)).compile()
    run, kitae_env = resolve_train(RunSpec(algo="ppo", env_id="gymnax:CartPole-v1"))
    agent = run.agent_cls(run.algo, run.config, run_dir=tempfile.mkdtemp())
    ratios = []
    for i in range(args.rounds):
        result = CompiledExecutor().run(agent, kitae_env, run.config.train_cfg.n_env_steps)
        start = time.perf_counter()
        jax.block_until_ready(rejax_train(jax.random.PRNGKey(i)))
        rejax_seconds = time.perf_counter() - start
        ratios.append(result.train_seconds / rejax_seconds)
        print(f"round {i + 1}: kitae {result.train_seconds:.2f} s, rejax {rejax_seconds:.2f} s", flush=True)
    print(f"kitae / rejax per round {[round(r, 3) for r in ratios]}, median {statistics.median(ratios):.3f}")


if __name__ == "__main__":
    main()
