"""``kitae eval --stochastic``: episodes of the policy as it explores at the checkpoint's step
(``kitae.loops.evaluate``'s ``explore_step``), in both loops, reproducible for a seed."""

from __future__ import annotations

import json

import pytest

from kitae.cli import main
from kitae.envs.make import EnvSpec
from kitae.loops.evaluate import evaluate_host, evaluate_jax
from kitae.runs import eval_run, preset_agent


@pytest.mark.parametrize("env_id", ["CartPole-v1", "gymnax:CartPole-v1"], ids=["host", "compiled"])
def test_kitae_eval_stochastic_samples_reproducibly_and_says_so(tmp_path, capsys, env_id):
    run_dir = tmp_path / "run"
    assert main(["train", "ppo", env_id, "--steps", "2048", "--run-dir", str(run_dir), "--quiet"]) == 0
    capsys.readouterr()
    assert main(["eval", str(run_dir), "--episodes", "6", "--stochastic"]) == 0
    line = capsys.readouterr().out.strip()
    assert line.endswith("over 6 episodes (stochastic policy, checkpoint step 2,048)"), line
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["eval_policy"] == "stochastic" and summary["eval_episodes"] == 6
    sampled = eval_run(run_dir, episodes=6, stochastic=True)
    assert sampled["mean"] == [summary["eval_return"]]  # the same seed, the same episodes
    greedy = eval_run(run_dir, episodes=6)
    assert greedy["policy"] == "deterministic"
    assert json.loads((run_dir / "summary.json").read_text())["eval_policy"] == "deterministic"
    # a policy 2,048 steps into training is far from deterministic: sampling its actions plays other episodes
    assert sampled["returns"] != greedy["returns"]


@pytest.mark.parametrize(("env_id", "evaluate"), [("CartPole-v1", evaluate_host), ("gymnax:CartPole-v1", evaluate_jax)])
def test_dqn_explores_with_the_epsilon_of_the_step_it_is_given(env_id, evaluate):
    """Epsilon falls from 1 to 0 over the first 500 of 1,000 steps: at step 1,000 the exploring
    policy is the greedy one, episode for episode; at step 0 it acts at random."""
    sets = ["algo_params.exploration=1.0", "algo_params.exploration_final=0.0", "algo_params.exploration_fraction=0.5"]
    agent, env = preset_agent("dqn", env_id, steps=1000, sets=sets)
    env.close()
    spec = EnvSpec.parse(env_id)
    greedy = evaluate(agent, spec, 8, seed=3)
    assert (evaluate(agent, spec, 8, seed=3, explore_step=1000) == greedy).all()
    assert (evaluate(agent, spec, 8, seed=3, explore_step=0) != greedy).any()


@pytest.mark.parametrize("step", [-1, 1.5, True])
def test_a_step_that_is_no_step_is_refused(step):
    agent, env = preset_agent("ppo", "CartPole-v1", steps=1000)
    env.close()
    with pytest.raises(ValueError, match=r"explore_step=.* is not allowed; allowed: None or an int >= 0"):
        evaluate_host(agent, EnvSpec.parse("CartPole-v1"), 2, explore_step=step)
