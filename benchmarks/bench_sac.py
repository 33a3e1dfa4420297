"""SAC learning benchmark on Pendulum-v1, and a speed comparison with SBX's SAC.

Learning (the acceptance run): the mean return of the last 10 training episodes must reach -200
within 20k environment steps, for each of 3 seeds::

    .venv/bin/python benchmarks/bench_sac.py [--seeds 0 1 2]

Settings: rl-baselines3-zoo's tuned SAC for Pendulum-v1 (hyperparams/sac.yml: n_timesteps 2e4,
learning_rate 1e-3, everything else Stable-Baselines3's SAC defaults: buffer 1e6, learning_starts
100, batch 256, tau 0.005, gamma 0.99, train_freq 1, gradient_steps 1, ent_coef "auto" (initial 1,
target entropy -|A|), [256, 256] ReLU actor and twin critics, no gradient clipping).

Speed (``--speed``): kitae's SAC and SBX's SAC (JAX) with the same settings (1 env, one gradient
step of batch 256 per environment step, [256, 256] networks, learning_starts 100), run one after
the other in fresh processes, alternating, ``--rounds`` times; each reports the steps per second
of the whole ``train`` / ``learn`` call (compilation included) and of the steady part (from 500
steps after learning starts to the end, with wall and process CPU time). SBX is not a kitae
dependency: point ``--sbx-python`` at a Python that has ``sbx-rl`` installed (and the same
jax/flax versions), e.g.::

    python3.11 -m venv /tmp/sbxenv && /tmp/sbxenv/bin/pip install sbx-rl==0.28.0 jax==0.10.2 \\
        flax==0.12.8 optax==0.2.8 gymnasium==1.3.0 torch==2.13.0
    .venv/bin/python benchmarks/bench_sac.py --speed --sbx-python /tmp/sbxenv/bin/python

Results go to ``benchmarks/results/sac_pendulum.json`` and ``benchmarks/results/sac_speed.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))

ENV_ID = "Pendulum-v1"
N_ENV_STEPS = 20_000
THRESHOLD = -200.0
LEARNING_STARTS = 100


def sac_settings():
    """The tuned settings (rl-zoo Pendulum-v1) as ``(SACParams, UpdateConfig)``."""
    import kitae.config as cfg
    from kitae.algos.collections.sac import SACParams

    params = SACParams(
        gamma=0.99,
        tau=0.005,
        start_step=LEARNING_STARTS,  # SB3's learning_starts: random actions and no update before
        skip_steps=1,  # train_freq 1
        alpha=1.0,  # ent_coef "auto": initial 1, learned
        autotune=True,
        target_entropy=None,  # -|A|
        policy_hidden=(256, 256),
        q_hidden=(256, 256),
        n_critics=2,
    )
    update_cfg = cfg.UpdateConfig(
        learning_rate=1e-3,  # zoo: 1e-3 for actor, critics and temperature
        learning_rate_annealing=False,
        max_grad_norm=None,  # SB3 does not clip
        max_buffer_size=1_000_000,
        batch_size=256,
        n_epochs=1,  # gradient_steps 1
    )
    return params, update_cfg


# ---------------------------------------------------------------------------------------------
# Learning
# ---------------------------------------------------------------------------------------------


def learning(seeds: list[int]) -> dict:
    import common

    from kitae.algos.collections.sac import SAC

    params, update_cfg = sac_settings()
    result = common.run_learning(
        "sac_pendulum",
        SAC,
        params,
        update_cfg,
        env_id=ENV_ID,
        n_envs=1,
        n_env_steps=N_ENV_STEPS,
        seeds=seeds,
        threshold=THRESHOLD,
    )
    print(
        f"[sac_pendulum] passed={result['passed']} mean final return {result['mean_final_return']:.1f} "
        f"per seed {[round(r['final_return'], 1) for r in result['runs']]} "
        f"sps per seed {[round(r['sps']) for r in result['runs']]}"
    )
    return result


# ---------------------------------------------------------------------------------------------
# Speed against SBX
# ---------------------------------------------------------------------------------------------


def _kitae_worker(steps: int, seed: int) -> dict:
    import kitae.config as cfg
    from kitae.algos.collections.sac import SAC

    marks: dict[int, tuple[float, float]] = {}
    steady_from = LEARNING_STARTS + 500

    class TimingWriter:
        """A real SummaryWriter (the default's logging cost is kept) that notes when steps pass."""

        def __init__(self, inner):
            self.inner = inner

        def add_scalar(self, tag, value, step):
            if step not in marks:
                marks[step] = (time.perf_counter(), time.process_time())
            self.inner.add_scalar(tag, value, step)

    from tensorboardX import SummaryWriter

    from kitae.envs.make import make_vec_env

    env = make_vec_env(ENV_ID, 1)
    params, update_cfg = sac_settings()
    config = cfg.AlgoConfig(
        seed=seed,
        algo_params=params,
        update_cfg=update_cfg,
        train_cfg=cfg.TrainConfig(n_env_steps=steps),
        env_cfg=cfg.EnvConfig(
            task_name=ENV_ID,
            observation_space=env.single_observation_space,
            action_space=env.single_action_space,
            n_envs=1,
        ),
    )
    agent = SAC("bench-sac-speed", config, run_dir=f"/tmp/kitae-bench/sac-speed-{seed}")
    writer = SummaryWriter(f"/tmp/kitae-bench/sac-speed-{seed}/logs")
    start = time.perf_counter()
    agent.train(env, steps, writer=TimingWriter(writer))
    total = time.perf_counter() - start
    writer.close()
    return _speed_record("kitae", steps, total, marks, steady_from)


def _sbx_worker(steps: int, seed: int) -> dict:
    import gymnasium as gym
    from sbx import SAC as SBXSAC
    from stable_baselines3.common.callbacks import BaseCallback

    marks: dict[int, tuple[float, float]] = {}
    steady_from = LEARNING_STARTS + 500

    class Timer(BaseCallback):
        def _on_step(self) -> bool:
            if self.num_timesteps > LEARNING_STARTS:
                marks[self.num_timesteps] = (time.perf_counter(), time.process_time())
            return True

    params, update_cfg = sac_settings()
    model = SBXSAC(
        "MlpPolicy",
        gym.make(ENV_ID),
        learning_rate=update_cfg.learning_rate,
        buffer_size=update_cfg.max_buffer_size,
        learning_starts=LEARNING_STARTS,
        batch_size=update_cfg.batch_size,
        tau=params.tau,
        gamma=params.gamma,
        train_freq=1,
        gradient_steps=1,
        ent_coef="auto",
        policy_kwargs=dict(net_arch=list(params.policy_hidden)),
        seed=seed,
        verbose=0,
    )
    start = time.perf_counter()
    model.learn(steps, callback=Timer())
    total = time.perf_counter() - start
    return _speed_record("sbx", steps, total, marks, steady_from)


def _speed_record(name: str, steps: int, total: float, marks: dict, steady_from: int) -> dict:
    (w0, c0), (w1, c1) = marks[steady_from], marks[steps]
    n = steps - steady_from
    walls = np.array([marks[s][0] for s in range(steady_from, steps + 1) if s in marks])
    return {
        "impl": name,
        "steps": steps,
        "sps_total": steps / total,
        "sps_steady": n / (w1 - w0),
        "cpu_ms_per_step_steady": (c1 - c0) / n * 1e3,
        # the median time between two consecutive steps: robust to bursts of load from other processes
        "median_step_ms": float(np.median(np.diff(walls)) * 1e3),
    }


def speed(sbx_python: str, rounds: int, steps: int) -> dict:
    """Alternates fresh kitae and SBX processes; reports per-run figures and medians."""
    runs = []
    for r in range(rounds):
        for impl, python in (("kitae", sys.executable), ("sbx", sbx_python)):
            command = [python, __file__, "--speed-worker", impl, "--steps", str(steps), "--seed", "0"]
            env = {**os.environ, "PYTHONPATH": str(ROOT)}
            out = subprocess.run(command, capture_output=True, text=True, env=env)
            line = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
            if out.returncode != 0 or not line:
                raise RuntimeError(f"{impl} speed run failed:\n{out.stderr[-3000:]}")
            record = json.loads(line[-1])
            runs.append(record)
            print(
                f"round {r}: {impl:5s} {record['sps_total']:.0f} sps overall, {record['sps_steady']:.0f} sps "
                f"steady, {record['cpu_ms_per_step_steady']:.2f} ms CPU per step, median step "
                f"{record['median_step_ms']:.2f} ms",
                flush=True,
            )
    summary = {}
    for impl in ("kitae", "sbx"):
        mine = [r for r in runs if r["impl"] == impl]
        summary[impl] = {
            k: float(np.median([r[k] for r in mine]))
            for k in ("sps_total", "sps_steady", "cpu_ms_per_step_steady", "median_step_ms")
        }
    result = {"env_id": ENV_ID, "steps": steps, "rounds": rounds, "median": summary, "runs": runs}
    from common import RESULTS

    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "sac_speed.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(summary, indent=2))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--speed", action="store_true", help="compare speed with SBX instead of learning")
    parser.add_argument("--sbx-python", default="python", help="a Python with sbx-rl installed (for --speed)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=5000)
    parser.add_argument("--speed-worker", choices=("kitae", "sbx"), help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.speed_worker:
        worker = _kitae_worker if args.speed_worker == "kitae" else _sbx_worker
        print(json.dumps(worker(args.steps, args.seed)))
    elif args.speed:
        speed(args.sbx_python, args.rounds, args.steps)
    else:
        learning(args.seeds)


if __name__ == "__main__":
    main()
