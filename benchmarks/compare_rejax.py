"""kitae against rejax, side by side: PPO on gymnax CartPole-v1 with PureJaxRL's settings (4 envs x
128 steps, 4 epochs of 4 minibatches, lr 2.5e-4, gamma 0.99, GAE lambda 0.95, clip 0.2, entropy
0.01, value 0.5, 64 x 64 tanh networks), 500k steps, whole processes, cold.

Cases, each a pair of whole processes run one after the other, kitae first, in each of
``--rounds`` rounds:

- ``one``: one seed. kitae: ``kitae train ppo gymnax:CartPole-v1``; rejax: ``PPO.create(...)``,
  ``jax.jit(algo.train)(key)``.
- ``seeds``: 16 seeds. kitae: ``kitae train ppo gymnax:CartPole-v1 --seeds 16``; rejax:
  ``jax.jit(jax.vmap(algo.train))(keys)``.
- ``sweep``: 4 learning rates x 4 seeds. kitae: ``kitae sweep ppo gymnax:CartPole-v1 --grid
  update_cfg.learning_rate=1e-4,2.5e-4,1e-3,2.5e-3 --seeds 4``; rejax: the 16 configurations
  vmapped (``algo.replace(learning_rate=lr).train(key)``).

Cold: kitae's persistent compilation cache points at an empty folder per process
(``KITAE_CACHE_DIR``); rejax does not turn JAX's on. The time is the whole process's wall time
(imports, building, compiling, training, writing). Differences kept: rejax 0.1.3 does not anneal
the learning rate (kitae's preset does, as PureJaxRL, in ``one`` and ``seeds``; ``sweep``'s plain
values are constant rates in both) and clips gradients element-wise where
kitae clips their global norm; rejax evaluates 128 episodes of its final policy once, kitae
writes its run directory (config, checkpoint, TensorBoard, metrics, summary, plot). rejax 0.1.3
expects gymnax's older five-value ``step`` (gymnax 1.0 returns ``terminated`` and ``truncated``
apart): ``FiveValueStep`` below joins them.

Run (rejax is in the ``compare`` extra; ``pip install --no-deps rejax==0.1.3`` is enough here)::

    .venv/bin/python benchmarks/compare_rejax.py one|seeds|sweep [--rounds 3] [--out PATH]

Results: ``benchmarks/results/compare_rejax.json`` (merged case by case), or ``--out``'s file (a
run on another machine, kept apart from the recorded one).
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
from pathlib import Path

from common import RESULTS

STEPS = 500_000
LEARNING_RATES = [1e-4, 2.5e-4, 1e-3, 2.5e-3]


class FiveValueStep:
    """gymnax 1.0's step -> the ``(obs, state, reward, done, info)`` rejax 0.1.3 reads."""

    def __init__(self, env):
        self._env = env

    def __getattr__(self, name):  # everything else is the environment's
        if name == "_env":  # not set yet (copy.deepcopy makes the object before its __dict__)
            raise AttributeError(name)
        return getattr(self._env, name)

    def step(self, key, state, action, params=None):
        import jax.numpy as jnp

        obs, state, reward, terminated, truncated, info = self._env.step(key, state, action, params)
        return obs, state, reward, jnp.logical_or(terminated, truncated), info


def rejax_ppo(env, params):
    """rejax's PPO with the settings above (imported here: the kitae side never imports rejax)."""
    from rejax import PPO

    return PPO.create(
        env=env,
        env_params=params,
        total_timesteps=STEPS,
        eval_freq=STEPS,
        skip_initial_evaluation=True,
        num_envs=4,
        num_steps=128,
        num_epochs=4,
        num_minibatches=4,
        learning_rate=2.5e-4,
        max_grad_norm=0.5,
        gamma=0.99,
        gae_lambda=0.95,
        clip_eps=0.2,
        ent_coef=0.01,
        vf_coef=0.5,
        agent_kwargs={"activation": "tanh", "hidden_layer_sizes": (64, 64)},
    )


def rejax_worker(case: str) -> None:
    """The rejax side, in its own process: prints ``{"returns": [...], "train_call_seconds": ...}``."""
    import gymnax
    import jax
    import jax.numpy as jnp

    env, params = gymnax.make("CartPole-v1")
    algo = rejax_ppo(FiveValueStep(env), params)
    start = time.perf_counter()
    if case == "one":
        _, (lengths, returns) = jax.jit(algo.train)(jax.random.PRNGKey(0))
    elif case == "seeds":
        keys = jax.random.split(jax.random.PRNGKey(0), 16)
        _, (lengths, returns) = jax.jit(jax.vmap(algo.train))(keys)
    else:
        rates = jnp.repeat(jnp.asarray(LEARNING_RATES), 4)
        keys = jnp.tile(jax.random.split(jax.random.PRNGKey(0), 4), (4, 1))
        _, (lengths, returns) = jax.jit(jax.vmap(lambda lr, k: algo.replace(learning_rate=lr).train(k)))(rates, keys)
    returns = jax.block_until_ready(returns)
    final = jnp.mean(returns, axis=-1).reshape(-1)  # the mean over the 128 evaluation episodes
    print(json.dumps({"returns": [float(x) for x in final], "train_call_seconds": time.perf_counter() - start}))


def _timed(command: list[str], env: dict) -> tuple[float, str]:
    start = time.perf_counter()
    result = subprocess.run(command, env={**os.environ, **env}, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed: {result.stderr[-3000:]}")
    return wall, result.stdout


def _kitae(case: str, tmp: Path) -> tuple[float, list[float], dict]:
    kitae = [sys.executable, "-m", "kitae.cli"]
    env = {"KITAE_CACHE_DIR": str(tmp / "cache")}
    if case == "sweep":
        grid = "update_cfg.learning_rate=" + ",".join(f"{lr:g}" for lr in LEARNING_RATES)
        command = [*kitae, "sweep", "ppo", "gymnax:CartPole-v1", "--grid", grid, "--seeds", "4",
                   "--sweep-dir", str(tmp / "run"), "--quiet"]  # fmt: skip
        wall, _ = _timed(command, env)
        report = json.loads((tmp / "run" / "sweep.json").read_text())
        finals = [r for c in report["combinations"] for r in c["final_return"]]
        return wall, finals, {"compile": report["compile_seconds"], "train": report["train_seconds"]}
    seeds = ["--seeds", "16"] if case == "seeds" else []
    command = [*kitae, "train", "ppo", "gymnax:CartPole-v1", *seeds, "--run-dir", str(tmp / "run"), "--quiet"]
    wall, _ = _timed(command, env)
    summary = json.loads((tmp / "run" / "summary.json").read_text())
    finals = summary["final_return"] if isinstance(summary["final_return"], list) else [summary["final_return"]]
    return wall, finals, {"compile": summary["compile_seconds"], "train": summary["train_seconds"]}


def run_case(case: str, rounds: int) -> dict:
    rows = []
    for r in range(rounds):
        with tempfile.TemporaryDirectory() as tmp_name:
            k_wall, k_finals, k_parts = _kitae(case, Path(tmp_name))
        r_wall, out = _timed([sys.executable, __file__, "--rejax-worker", case], {})
        rejax = json.loads(out.strip().splitlines()[-1])
        row = {
            "kitae_wall_seconds": k_wall,
            "kitae_compile_seconds": k_parts["compile"],
            "kitae_train_seconds": k_parts["train"],
            "kitae_final_returns": k_finals,
            "rejax_wall_seconds": r_wall,
            "rejax_train_call_seconds": rejax["train_call_seconds"],
            "rejax_eval_returns": rejax["returns"],
            "ratio": k_wall / r_wall,
        }
        print(json.dumps({"round": r, **row}), flush=True)
        rows.append(row)
    # imported here, not at the top: the rejax worker runs this file and must not import kitae
    from kitae.runs.provenance import made_with

    return {
        "case": case,
        "rounds": rows,
        "median_kitae_wall_seconds": statistics.median(r["kitae_wall_seconds"] for r in rows),
        "median_rejax_wall_seconds": statistics.median(r["rejax_wall_seconds"] for r in rows),
        "median_ratio": statistics.median(r["ratio"] for r in rows),
        "made_with": made_with(),
        "date": time.strftime("%Y-%m-%d"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("case", choices=["one", "seeds", "sweep"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--out", type=Path, default=RESULTS / "compare_rejax.json", help="the JSON file the case is merged into"
    )
    parser.add_argument("--rejax-worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rejax_worker:
        rejax_worker(args.case)
        return
    result = run_case(args.case, args.rounds)
    path = args.out
    path.parent.mkdir(parents=True, exist_ok=True)
    data = json.loads(path.read_text()) if path.exists() else {}
    data[args.case] = result
    path.write_text(json.dumps(data, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "rounds"}, indent=2))


if __name__ == "__main__":
    main()
