"""The starting-state programs at XLA's default LLVM optimisation and at level 1
(``kitae.compile_options.jit_once``): compile seconds and whether their outputs are the same bits.

For each algorithm, the compiled loop's ``fresh(seed)`` (the agent's first state, the
environments' reset, an empty buffer) is lowered once and compiled with each setting, the
persistent compilation cache off. ``--training`` instead trains the preset's whole compiled run
twice, once with every ``Lowered.compile`` of the process at level 1, and prints compile and
train seconds and the final state's fingerprint (the training program's bits).

Run: ``.venv/bin/python benchmarks/probe_start_compile.py a2c ddpg dqn mpo ppo ppo_lstm rnd_ppo sac td3``
     ``.venv/bin/python benchmarks/probe_start_compile.py --training ppo``
"""

from __future__ import annotations

import argparse
import tempfile
import time

import jax
import jax.numpy as jnp
import jax.stages
import numpy as np

from kitae.compile_options import ONCE_OPTIONS
from kitae.loops.compiled import CompiledExecutor
from kitae.loops.program import make_loop_functions
from kitae.runs.resolve import RunSpec, resolve_train
from kitae.runs.rundir import state_fingerprint

ENVS = {
    "ppo": "gymnax:CartPole-v1",
    "dqn": "gymnax:CartPole-v1",
    "a2c": "gymnax:CartPole-v1",
    "rnd_ppo": "gymnax:CartPole-v1",
    "ppo_lstm": "gymnax:CartPoleNoVel-v1",
    "sac": "gymnax:Pendulum-v1",
    "td3": "gymnax:Pendulum-v1",
    "ddpg": "gymnax:Pendulum-v1",
    "mpo": "gymnax:Pendulum-v1",
}


def _agent(algo: str):
    run, env = resolve_train(RunSpec(algo=algo, env_id=ENVS[algo]))
    return run, env, run.agent_cls(run.algo, run.config, run_dir=tempfile.mkdtemp())


def starting_states(algo: str, seeds: list[int]) -> None:
    _, env, agent = _agent(algo)
    fresh, _, _ = make_loop_functions(agent, env)
    for s in seeds:
        seed = jnp.asarray(s, jnp.uint32)
        outs, times = [], []
        for options in (None, ONCE_OPTIONS):
            lowered = jax.jit(fresh).lower(seed)
            start = time.perf_counter()
            compiled = lowered.compile(compiler_options=options) if options else lowered.compile()
            times.append(time.perf_counter() - start)
            outs.append([np.asarray(x) for x in jax.tree_util.tree_leaves(compiled(seed))])
        same = all(a.tobytes() == b.tobytes() for a, b in zip(*outs))
        print(f"{algo} seed {s}: compile default {times[0]:.2f} s, level 1 {times[1]:.2f} s, same bits {same}")


def training(algo: str) -> None:
    original = jax.stages.Lowered.compile
    for level in (None, 1):

        def compile_at(self, compiler_options=None, level=level, **kwargs):
            options = dict(compiler_options or {})
            if level is not None:
                options.setdefault("xla_backend_optimization_level", level)
            return original(self, compiler_options=options or None, **kwargs)

        jax.stages.Lowered.compile = compile_at
        run, env, agent = _agent(algo)
        result = CompiledExecutor().run(agent, env, run.config.train_cfg.n_env_steps, use_cache=False)
        print(
            f"{algo} training program, level {level or 'default'}: compile {result.compile_seconds:.2f} s, "
            f"train {result.train_seconds:.2f} s, return {result.final_return():.1f}, "
            f"fingerprint {state_fingerprint(result.state.agent_state)[:16]}"
        )
    jax.stages.Lowered.compile = original


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("algos", nargs="+", choices=sorted(ENVS))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 7])
    parser.add_argument("--training", action="store_true")
    args = parser.parse_args()
    jax.config.update("jax_enable_compilation_cache", False)
    for algo in args.algos:
        training(algo) if args.training else starting_states(algo, args.seeds)


if __name__ == "__main__":
    main()
