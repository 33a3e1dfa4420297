"""Learning benchmark: TD3 on Pendulum-v1 (acceptance: mean return of the last 10 training
episodes >= -200 within 30k environment steps, on every seed).

Settings: the rl-baselines3-zoo tuned TD3 hyperparameters for Pendulum-v1
(``hyperparams/td3.yml``: learning_rate 1e-3, gamma 0.98, buffer 2e5, Gaussian action noise std
0.1, train_freq 1 / gradient_steps 1, learning_starts 10000, net_arch [400, 300]) with the TD3 paper /
CleanRL defaults for the rest (batch 256, tau 0.005, policy_noise 0.2, noise_clip 0.5,
policy_delay 2), and two changes to fit 30k steps on a small CPU: learning starts after 5000
random-action steps instead of 10000, and both networks are [256, 256] (CleanRL's size) instead
of [400, 300]. No gradient clipping (``max_grad_norm=None``), as in every reference
implementation.

Run: ``.venv/bin/python benchmarks/bench_td3.py [--seeds 0 1 2]``; writes
``benchmarks/results/td3_pendulum.json``.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import run_learning, seeds_argument

import kitae.config as cfg
from kitae.algos.collections.td3 import TD3, TD3Params

ENV_ID = "Pendulum-v1"
N_ENVS = 1
N_ENV_STEPS = 30_000
THRESHOLD = -200.0

ALGO_PARAMS = TD3Params(
    gamma=0.98,
    tau=0.005,
    exploration_noise=0.1,
    policy_noise=0.2,
    noise_clip=0.5,
    policy_delay=2,
    start_step=5_000,
    skip_steps=1,
    actor_hidden=(256, 256),
    critic_hidden=(256, 256),
)

UPDATE_CFG = cfg.UpdateConfig(
    learning_rate=1e-3,
    learning_rate_annealing=False,
    max_grad_norm=None,
    max_buffer_size=200_000,
    batch_size=256,
    n_epochs=1,
)


def main() -> None:
    result = run_learning(
        "td3_pendulum",
        TD3,
        ALGO_PARAMS,
        UPDATE_CFG,
        env_id=ENV_ID,
        n_envs=N_ENVS,
        n_env_steps=N_ENV_STEPS,
        seeds=seeds_argument(),
        threshold=THRESHOLD,
    )
    print(f"passed: {result['passed']}, mean final return {result['mean_final_return']:.1f}")


if __name__ == "__main__":
    main()
