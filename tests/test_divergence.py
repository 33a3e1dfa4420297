"""A diverged run is an outcome, not a success: in each executor, a run made to diverge (a learning
rate of 1e12, no gradient clipping) stops with one line naming the step and the loss, exits with
status 3, says so in ``summary.json`` and keeps its last finite parameters as its newest checkpoint;
seeds trained together go on where they did not diverge."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest

from kitae.cli import main
from kitae.loops.collect import all_finite
from kitae.runs.load import load_agent

pytestmark = pytest.mark.timeout(240)

DIVERGE = ["--set", "update_cfg.learning_rate=1e12", "--set", "update_cfg.max_grad_norm=null"]


def _check_diverged_run(run_dir, err, *, steps_at_most):
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert "kitae: diverged at step" in err and "loss_qvalue=nan" in err
    summary = json.loads((run_dir / "summary.json").read_text())
    (entry,) = summary["diverged"]
    assert f"step {entry['step']:,}" in err and entry["losses"]["loss_qvalue"] == "nan"
    assert entry["step"] <= steps_at_most
    agent = load_agent(run_dir)  # the newest checkpoint
    assert bool(all_finite(agent.state)) and agent.checkpoint_step >= entry["step"]
    assert entry["checkpoint"].endswith(str(agent.checkpoint_step))
    return entry


@pytest.mark.parametrize("env_id", ["CartPole-v1", "gymnax:CartPole-v1"])
def test_a_diverging_run_stops_exits_3_and_keeps_its_last_finite_parameters(tmp_path, capsys, env_id):
    run_dir = tmp_path / "run"
    code = main(["train", "dqn", env_id, "--steps", "20000", "--run-dir", str(run_dir), "--quiet", *DIVERGE])
    err = capsys.readouterr().err
    assert code == 3
    entry = _check_diverged_run(run_dir, err, steps_at_most=5120)
    assert entry["step"] >= 1000  # the preset learns from step 1,000 on: the first update diverges
    _check_resume_reports_it_again(run_dir, env_id, err, capsys)


def _check_resume_reports_it_again(run_dir, env_id, line, capsys):
    """``kitae resume`` (with or without ``--steps``) and ``agent.resume(env)`` of a diverged run
    report it again at once, with the line ``kitae train`` printed and exit status 3, and leave
    the run directory as it was: no new checkpoint, the same summary (they once trained on: the
    compiled loop to its next segment and a new checkpoint, the host loop until it diverged again)."""
    from kitae.envs.make import EnvSpec, make_env
    from kitae.runs import RunDiverged

    def snapshot():
        return {str(p): p.read_bytes() for p in sorted(run_dir.rglob("*")) if p.is_file()}

    before = snapshot()
    for flags in ([], ["--steps", "40000"]):
        assert main(["resume", str(run_dir), "--quiet", *flags]) == 3
        assert capsys.readouterr().err == line
    agent = load_agent(run_dir)
    assert bool(all_finite(agent.state))
    with pytest.raises(RunDiverged) as raised:
        agent.resume(make_env(EnvSpec.parse(env_id), agent.config.env_cfg.n_envs))
    assert f"kitae: {raised.value}\n" == line
    assert snapshot() == before


def _dqn_in_gymnax():
    import kitae.config as cfg
    from kitae.algos.collections.dqn import DQN, DQNParams
    from kitae.envs.make import make_jax_env

    env = make_jax_env("gymnax:CartPole-v1", 1)
    config = cfg.AlgoConfig(
        seed=0,
        algo_params=DQNParams(start_step=100, skip_steps=1),
        update_cfg=cfg.UpdateConfig(learning_rate=1e-3, max_buffer_size=1000, batch_size=32),
        train_cfg=cfg.TrainConfig(n_env_steps=600),
        env_cfg=cfg.EnvConfig("gymnax:CartPole-v1", env.single_observation_space, env.single_action_space),
    )
    return DQN("dqn", config, run_dir="unused"), env


def _seed_1_poisoned(state):
    """Seed 1's parameters hold a NaN, which its next update spreads: that update diverges."""
    return state._replace(
        agent_state=jax.tree_util.tree_map(
            lambda x: x.at[1].set(np.nan) if np.issubdtype(x.dtype, np.floating) else x, state.agent_state
        )
    )


def test_seeds_trained_together_go_on_where_they_did_not_diverge():
    from kitae.loops.compiled import CompiledExecutor

    agent, env = _dqn_in_gymnax()
    fresh = CompiledExecutor().run(agent, env, 200, seeds=[0, 1])
    state = _seed_1_poisoned(fresh.state)
    result = CompiledExecutor().run(agent, env, 600, seeds=[0, 1], start=state, segment_iterations=50)
    assert result.divergence(0) is None and result.divergence(1) is not None
    assert result.divergence(1).step == 201 and not result.stopped  # the first update after the restart
    assert len(result.update_steps[0]) == 400 and len(result.update_steps[1]) == 0  # seed 1 no longer learns
    assert "nan" in result.divergence(1).describe() and not result.divergence(1).before_resume
    np.testing.assert_array_equal(result.state.diverged_step, [-1, 201])


def test_a_diverged_seed_stays_so_through_a_checkpoint_and_a_resume(tmp_path):
    """Where each seed diverged is part of the loop state (``diverged_step``), so a checkpoint holds
    it: a run of seeds trained together, stopped after one diverged and resumed from its checkpoint
    on disk, keeps that seed where it was (no update made, the divergence at its first step) and
    ends with the bits of the run never stopped. A state marked diverged keeps no update even
    where its updates would be finite."""
    from kitae.loops.compiled import CompiledExecutor
    from kitae.loops.executor import EXECUTORS
    from kitae.loops.state import Payload
    from kitae.runs.checkpoints import Checkpointer
    from kitae.runs.load import restore_payload
    from kitae.runs.rundir import state_fingerprint

    agent, env = _dqn_in_gymnax()
    fresh = CompiledExecutor().run(agent, env, 200, seeds=[0, 1])
    np.testing.assert_array_equal(fresh.state.diverged_step, [-1, -1])
    state = _seed_1_poisoned(fresh.state)
    whole = CompiledExecutor().run(agent, env, 600, seeds=[0, 1], start=state, segment_iterations=50)
    part = CompiledExecutor().run(agent, env, 400, seeds=[0, 1], start=state, segment_iterations=50)
    with Checkpointer(tmp_path / "checkpoints") as checkpointer:
        checkpointer.save(400, Payload(part.state, {"executor": "compiled", "seeds": [0, 1]}))
    payload, restored = restore_payload(agent, env, EXECUTORS["compiled"], tmp_path / "checkpoints")
    assert restored.meta["diverged_saved"] and restored.step == 400
    np.testing.assert_array_equal(payload.state.diverged_step, [-1, 201])
    resumed = CompiledExecutor().run(agent, env, 600, seeds=[0, 1], start=payload.state, segment_iterations=50)
    assert state_fingerprint(resumed.state.agent_state) == state_fingerprint(whole.state.agent_state)
    assert resumed.divergence(1) == (201, {}, True) and resumed.divergence(1).describe() == "before the run was resumed"
    assert len(resumed.update_steps[0]) == 200 and len(resumed.update_steps[1]) == 0

    # a seed marked diverged with finite parameters: no update kept, its parameters unchanged
    marked = fresh.state._replace(diverged_step=np.asarray([-1, 150], np.int32))
    result = CompiledExecutor().run(agent, env, 300, seeds=[0, 1], start=marked)
    assert len(result.update_steps[0]) == 100 and len(result.update_steps[1]) == 0
    assert result.divergence(1) == (150, {}, True)
    seed_1 = [jax.tree_util.tree_map(lambda x: np.asarray(x)[1], s.agent_state) for s in (fresh.state, result.state)]
    assert state_fingerprint(seed_1[0]) == state_fingerprint(seed_1[1])


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_all_finite_finds_one_bad_number_in_any_leaf_under_jit_and_vmap(bad):
    tree = {"w": np.ones((3, 4), np.float32), "b": np.zeros(2, np.float16), "count": np.array(7, np.int32)}
    check = jax.jit(all_finite)
    assert bool(check(tree)) and bool(all_finite(tree))
    for leaf, index in (("w", (2, 3)), ("b", (0,))):
        broken = {**tree, leaf: tree[leaf].copy()}
        broken[leaf][index] = bad
        assert not bool(check(broken)) and not bool(all_finite(broken))
    stacked = jax.tree_util.tree_map(lambda x: np.stack([x, x, x]), tree)
    stacked["w"][1, 0, 0] = bad  # the middle seed only
    np.testing.assert_array_equal(np.asarray(jax.vmap(all_finite)(stacked)), [True, False, True])
    assert bool(all_finite({"count": np.array(1, np.int32)})) and bool(all_finite({}))


def test_a_float64_leaf_beyond_float32_range_is_finite():
    with jax.enable_x64(True):
        assert bool(jax.jit(all_finite)({"w": np.array([1e300], np.float64), "b": np.ones(2, np.float32)}))


def test_a_host_seed_that_diverged_is_not_trained_on_when_its_run_is_resumed(tmp_path, capsys, monkeypatch):
    """A host run of several seeds trains them one after the other; one whose update diverged
    stays so through ``kitae resume``: the others go on to the new total, the diverged one is not
    trained again (from its last finite checkpoint the same config diverges again, as it did before
    this was fixed), its ``diverged`` entry goes on into the new summary and the run exits with
    status 3 as it did; a resume with nothing left to train reports it again and writes nothing.
    Seed 1's updates are made to diverge (its learning rate 1e12, without gradient clipping)."""
    import dataclasses

    from kitae.runs.resolve import ResolvedRun

    make_agent = ResolvedRun.make_agent

    def seed_1_diverges(self, seed=None):
        agent = make_agent(self, seed)
        if agent.config.seed != 1:
            return agent
        update_cfg = dataclasses.replace(agent.config.update_cfg, learning_rate=1e12, max_grad_norm=None)
        return make_agent(dataclasses.replace(self, config=dataclasses.replace(self.config, update_cfg=update_cfg)), 1)

    monkeypatch.setattr(ResolvedRun, "make_agent", seed_1_diverges)
    run_dir = tmp_path / "run"
    flags = ["--run-dir", str(run_dir), "--quiet", "--set", "train_cfg.save_frequency=1024"]
    assert main(["train", "dqn", "CartPole-v1", "--seeds", "2", "--steps", "2048", *flags]) == 3
    line = capsys.readouterr().err
    assert line.startswith("kitae: seed 1 diverged at step") and len(line.splitlines()) == 1
    first = json.loads((run_dir / "summary.json").read_text())
    (entry,) = first["diverged"]
    seed_1_checkpoints = sorted((run_dir / "checkpoints" / "seed-1").iterdir())

    assert main(["resume", str(run_dir), "--steps", "3072", "--quiet"]) == 3
    assert capsys.readouterr().err == line  # the same seed, step and losses
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["diverged"] == [entry] and summary["resumed_from"] == 2048
    assert sorted((run_dir / "checkpoints" / "seed-1").iterdir()) == seed_1_checkpoints  # not trained
    assert max(int(p.name) for p in (run_dir / "checkpoints" / "seed-0").iterdir()) >= 3072  # seed 0 went on
    seed_1_rows = [r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()) if r["seed"] == 1]
    assert seed_1_rows and max(r["step"] for r in seed_1_rows) <= entry["step"]

    def snapshot():
        return {str(p): p.read_bytes() for p in sorted(run_dir.rglob("*")) if p.is_file()}

    before = snapshot()
    assert main(["resume", str(run_dir), "--steps", "3072", "--quiet"]) == 3  # nothing left to train
    assert capsys.readouterr().err == line
    assert snapshot() == before
