"""Sweeps: ``kitae sweep`` trains a grid x seeds of a JAX environment in one compiled program (the
swept floats traced, vmapped like seeds), host environments one combination after another or
several at a time in Ray tasks; each
combination is a run directory; diverged combinations are marked and the others go on; what
cannot be swept is refused before anything is written."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import psutil
import pytest

from kitae.cli import main
from kitae.config import sweepable_keys, traced_config
from kitae.loops.program import make_loop_functions, make_variant_functions
from kitae.runs.errors import RunError
from kitae.runs.grid import learning_rate_set
from kitae.runs.load import load_agent
from kitae.runs.resolve import preset_agent
from kitae.runs.signals import StopRequest
from kitae.runs.summary import describe_divergence
from kitae.runs.sweep import SweepSpec, parse_grid, sweep_run
from kitae.runs.sweep_resume import resume_sweep

pytestmark = pytest.mark.timeout(300)

LR = "update_cfg.learning_rate"


def _leaves(tree):
    return [np.asarray(x) for x in jax.tree_util.tree_leaves(tree)]


@pytest.mark.parametrize(
    ("item", "message"),
    [
        ("update_cfg.learning_rate", "is not KEY=V1,V2"),
        ("update_cfg.learning_rate=", "is not KEY=V1,V2"),
        ("update_cfg.learning_rate=1e-3,fast", "'fast' is not allowed; allowed: numbers"),
        ("update_cfg.learning_rate=1e-3,true", "'true' is not allowed"),
        ("update_cfg.learning_rate=1e-3,1e-3", "repeat one"),
        ("update_cfg.learning_rate=lin_1e-3,3e-4", r"mixes annealed \(lin_V\) and constant values; allowed: all"),
        ("algo_params.clip_coef=lin_0.1", "'lin_0.1' is not allowed; allowed: numbers, V1"),
    ],
)
def test_grid_items_are_refused_when_malformed(item, message):
    with pytest.raises(RunError, match=message):
        parse_grid([item])


def test_grid_keys_given_twice_are_refused_and_values_parse_as_floats():
    assert parse_grid(["update_cfg.learning_rate=1e-4,3e-4", "algo_params.clip_coef=0.1,1"]) == {
        LR: [1e-4, 3e-4],
        "algo_params.clip_coef": [0.1, 1.0],
    }
    with pytest.raises(RunError, match="given twice"):
        parse_grid([f"{LR}=1e-4", f"{LR}=1e-3"])
    with pytest.raises(RunError, match="at least one --grid"):
        parse_grid([])


def test_a_swept_learning_rate_anneals_as_set_reads_it():
    # plain values are constant rates (what --set update_cfg.learning_rate=V trains, whatever the
    # preset does), lin_V values annealed ones
    assert parse_grid([f"{LR}=lin_1e-4,lin_3e-4"]) == {LR: [1e-4, 3e-4]}
    assert learning_rate_set([f"{LR}=lin_1e-4,lin_3e-4"]) == f"{LR}=lin_1e-4"
    assert learning_rate_set(["algo_params.clip_coef=0.1,1", f"{LR}= 1e-4,3e-4"]) == f"{LR}=1e-4"
    assert learning_rate_set(["algo_params.clip_coef=0.1,1"]) is None


@pytest.mark.parametrize(
    ("value", "config_file", "annealed"),
    [("1e-3", False, False), ("lin_1e-3", False, True), ("1e-3", True, True)],
    ids=["constant", "annealed", "a config file's annealing"],
)
def test_a_host_sweeps_combination_is_the_run_kitae_train_set_makes(tmp_path, capsys, value, config_file, annealed):
    """PPO's CartPole preset anneals its rate (lin_1e-3): a swept plain value kept the preset's
    annealing where ``kitae train --set`` trains a constant rate, so the two runs differed. A
    config file's explicit ``learning_rate_annealing: true`` (``kitae config``'s output) stays, as
    with ``--set``."""
    sweep_dir, run_dir = tmp_path / "sweep", tmp_path / "train"
    common = ["ppo", "CartPole-v1", "--steps", "1024", "--quiet"]
    if config_file:
        assert main(["config", "ppo", "CartPole-v1"]) == 0
        (tmp_path / "ppo.yaml").write_text(capsys.readouterr().out)
        common += ["--config", str(tmp_path / "ppo.yaml")]
    grid = f"{LR}={value},{'lin_' if 'lin' in value else ''}3e-4"
    assert main(["sweep", *common, "--grid", grid, "--sweep-dir", str(sweep_dir)]) == 0
    assert main(["train", *common, "--set", f"{LR}={value}", "--run-dir", str(run_dir)]) == 0
    capsys.readouterr()
    combination = json.loads((sweep_dir / "learning_rate=0.001" / "summary.json").read_text())
    alone = json.loads((run_dir / "summary.json").read_text())
    assert combination["state_fingerprint"] == [alone["state_fingerprint"]]
    assert load_agent(sweep_dir / "learning_rate=0.001").config.update_cfg.learning_rate_annealing is annealed


def test_sweepable_keys_are_the_float_fields_and_traced_config_refuses_others():
    agent, env = preset_agent("ppo", "gymnax:CartPole-v1", steps=1024)
    keys = sweepable_keys(agent.config)
    assert LR in keys and "algo_params.clip_coef" in keys and "algo_params.gamma" in keys
    assert "update_cfg.batch_size" not in keys and "update_cfg.learning_rate_annealing" not in keys
    with pytest.raises(ValueError, match="'update_cfg.n_epochs' cannot be swept; allowed: .*learning_rate"):
        traced_config(agent.config, {"update_cfg.n_epochs": 2.0})
    changed = traced_config(agent.config, {LR: 1e-3})
    assert changed.update_cfg.learning_rate == 1e-3 and agent.config.update_cfg.learning_rate != 1e-3


def test_replay_keys_are_sweepable_only_where_they_are_read():
    """A sweep of ``replay.her_ratio`` for PPO ran and gave identical rows (PPO reads no replay
    field); prioritized replay's floats count with ``replay.prioritized``, ``her_ratio`` with HER."""
    prioritized = ("replay.priority_exponent", "replay.importance_exponent", "replay.priority_epsilon")
    for algo, sets, listed in (
        ("ppo", [], ()),
        ("dqn", [], ()),
        ("dqn", ["replay.prioritized=true"], prioritized),
    ):
        agent, env = preset_agent(algo, "gymnax:CartPole-v1", steps=1024, sets=sets)
        replay = {key for key in sweepable_keys(agent.config) if key.startswith("replay.")}
        assert replay == set(listed), (algo, sets, replay)
    agent, env = preset_agent("dqn", "gymnax:BitFlipping-v0", steps=1024, sets=["replay.her=future"])
    assert "replay.her_ratio" in sweepable_keys(agent.config)
    with pytest.raises(ValueError, match="'replay.her_ratio' cannot be swept"):
        traced_config(preset_agent("ppo", "gymnax:CartPole-v1", steps=1024)[0].config, {"replay.her_ratio": 0.5})


def test_algo_params_fields_are_sweepable_only_where_the_run_reads_them():
    """A sweep of PPO's ``vtrace_rho_bar`` x ``log_std_init`` on CartPole gave four identical rows:
    PPO with GAE reads no V-trace clip, and a Discrete policy no log-std. Each field a config does
    not read is left out, decided on the config as set: with its switch set, it is sweepable."""
    unread = {
        ("ppo", "gymnax:CartPole-v1"): {"vtrace_rho_bar", "vtrace_c_bar", "log_std_init", "observation_clip",
                                        "reward_clip"},
        ("a2c", "gymnax:CartPole-v1"): {"log_std_init", "observation_clip", "reward_clip"},
        ("ddpg", "gymnax:Pendulum-v1"): {"ou_theta", "ou_dt"},
        ("sac", "gymnax:Pendulum-v1"): {"target_entropy_scale"},
    }  # fmt: skip
    for (algo, env_id), names in unread.items():
        keys = set(sweepable_keys(preset_agent(algo, env_id, steps=1024)[0].config))
        assert not {f"algo_params.{n}" for n in names} & keys, (algo, keys)
        assert "algo_params.gamma" in keys
    switched = (
        ("ppo", "gymnax:CartPole-v1", ["algo_params.advantage_estimator=vtrace"], {"vtrace_rho_bar", "vtrace_c_bar"}),
        ("ppo", "gymnax:CartPole-v1", ["algo_params.normalize_observations=true"], {"observation_clip"}),
        ("ppo", "gymnax:CartPole-v1", ["algo_params.normalize_rewards=true"], {"reward_clip"}),
        ("ppo", "gymnax:Pendulum-v1", [], {"log_std_init"}),
        ("a2c", "gymnax:CartPole-v1", ["algo_params.optimizer=rmsprop"], {"rms_prop_alpha", "rms_prop_eps"}),
        ("ddpg", "gymnax:Pendulum-v1", ["algo_params.noise_type=ornstein_uhlenbeck"], {"ou_theta", "ou_dt"}),
        ("sac", "gymnax:CartPole-v1", [], {"target_entropy_scale"}),
    )
    for algo, env_id, sets, names in switched:
        keys = set(sweepable_keys(preset_agent(algo, env_id, steps=1024, sets=sets)[0].config))
        assert {f"algo_params.{n}" for n in names} <= keys, (algo, env_id, sets, keys)
    adam = preset_agent("a2c", "gymnax:CartPole-v1", steps=1024, sets=["algo_params.optimizer=adam"])[0]
    assert "algo_params.rms_prop_alpha" not in sweepable_keys(adam.config)
    with pytest.raises(ValueError, match="'algo_params.vtrace_rho_bar' cannot be swept"):
        traced_config(
            preset_agent("ppo", "gymnax:CartPole-v1", steps=1024)[0].config, {"algo_params.vtrace_rho_bar": 0.5}
        )


def test_with_config_rebuilds_the_update_as_a_fresh_agent_of_that_config():
    agent, env = preset_agent("ppo", "gymnax:CartPole-v1", steps=1024, seed=3)
    config = dataclasses.replace(
        agent.config, update_cfg=dataclasses.replace(agent.config.update_cfg, learning_rate=1e-2)
    )
    fresh = type(agent)("other", config, run_dir="unused")
    clone = agent.with_config(config)
    assert clone.config is config and agent.config.update_cfg.learning_rate != 1e-2  # the original is unchanged
    _, _, run_clone = make_loop_functions(clone, env)
    f, _, run_fresh = make_loop_functions(fresh, env)
    start = jax.jit(f)(jnp.uint32(3))
    a = jax.jit(lambda s: run_clone(s, 2))(start)[0].agent_state
    b = jax.jit(lambda s: run_fresh(s, 2))(start)[0].agent_state
    assert all(np.array_equal(x, y) for x, y in zip(_leaves(a), _leaves(b)))


def test_vmapped_values_train_as_separate_programs_with_those_values():
    """Two learning rates x one clip coefficient vmapped in one program: each row is the plain
    program of that config (to float rounding: a traced value is not folded as a constant)."""
    agent, env = preset_agent("ppo", "gymnax:CartPole-v1", steps=1024, seed=0)
    keys = (LR, "algo_params.clip_coef")
    fresh, _, run = make_variant_functions(agent, env, keys)
    values = {LR: jnp.asarray([1e-3, 1e-2], jnp.float32), "algo_params.clip_coef": jnp.asarray([0.2, 0.1], jnp.float32)}
    seeds = jnp.asarray([0, 0], jnp.uint32)
    start = jax.vmap(fresh)(seeds, values)
    state, metrics = jax.jit(jax.vmap(lambda s, v: run(s, v, 3)))(start, values)
    assert metrics.updated.shape == (2, 3) and bool(np.all(metrics.updated))
    # row 1 against the plain program of its config (row 0 is the same program with other values)
    config = traced_config(agent.config, {k: float(v[1]) for k, v in values.items()})
    plain = type(agent)("plain", config, run_dir="unused")
    f, _, r = make_loop_functions(plain, env)
    expected = jax.jit(lambda s: r(s, 3))(jax.jit(f)(jnp.uint32(0)))[0].agent_state
    got = jax.tree_util.tree_map(lambda x: x[1], state.agent_state)
    for x, y in zip(_leaves(got), _leaves(expected)):
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)
    rows = _leaves(state.agent_state)
    assert any(not np.allclose(x[0], x[1]) for x in rows)  # the two configurations differ


@pytest.mark.parametrize(("key", "values"), [(LR, (1e-3, 1e-2)), ("algo_params.exploration", (0.1, 0.6))])
def test_the_guide_agent_sweeps_its_learning_rate_and_its_exploration(key, values):
    """The custom-agent guide's agent, swept in one program: each row trains as the plain program
    of its value. Two faults it found: the guide's state then kept ``optax.adam(lr)``, which
    computes ``-lr`` when it is made, and the sweep made it under ``jax.eval_shape``, whose dead
    trace value then failed the program ("Computation compiled for 50 inputs but called with
    49"); its ``explore`` reads ``self.algo_params``, which the sweep's copy kept from the original
    config, so every row explored at the original rate (the rows were bit-identical).

    A traced learning rate rounds otherwise than a constant one (docs/experiments.md): with the
    guide's [256, 256] network, one weight of 512 in the last layer ended 3.5e-6 (7e-5 relative)
    from the plain program's after 400 steps, hence ``atol=1e-5``; a row trained at the other
    value differs by orders of magnitude more."""
    sys.path.insert(0, str(Path(__file__).parents[1] / "examples"))
    try:
        import custom_dqn
    finally:
        sys.path.pop(0)
    import kitae.config as cfg
    from kitae.envs.make import make_jax_env
    from kitae.loops.compiled import compiled_train
    from kitae.loops.executor import CompiledExecutor

    env = make_jax_env("gymnax:CartPole-v1", 4)
    spaces = (env.single_observation_space, env.single_action_space)

    def agent(value):
        config = cfg.AlgoConfig(
            seed=0,
            algo_params=custom_dqn.DQNParams(exploration=0.1, gamma=0.99, skip_steps=4, start_step=64),
            update_cfg=cfg.UpdateConfig(learning_rate=1e-3, max_buffer_size=64, batch_size=32),
            train_cfg=cfg.TrainConfig(n_env_steps=400),
            env_cfg=cfg.EnvConfig("gymnax:CartPole-v1", *spaces, n_envs=4),
        )
        return custom_dqn.DQN("guide", traced_config(config, {key: value}))

    result = CompiledExecutor().run(
        agent(values[0]), env, 400, seeds=[0, 0], variants={key: list(values)}, use_cache=False
    )
    plain = agent(values[1])
    compiled_train(plain, env, 400, use_cache=False)
    rows = _leaves(result.state.agent_state.qvalue.params)
    for row, expected in zip(rows, _leaves(plain.state.qvalue.params)):
        np.testing.assert_allclose(row[1], expected, rtol=1e-5, atol=1e-5)
    assert any(not np.allclose(row[0], row[1], atol=1e-3) for row in rows)  # the two values train apart


def test_a_compiled_sweep_writes_one_run_directory_per_combination(tmp_path, capsys):
    sweep_dir = tmp_path / "sweep"
    code = main(
        ["sweep", "ppo", "gymnax:CartPole-v1", "--grid", f"{LR}=2.5e-4,1e-2", "--seeds", "2", "--steps", "4000",
         "--sweep-dir", str(sweep_dir), "--quiet"]
    )  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0
    assert "2 combinations x 2 seeds (one program)" in out and "learning_rate" in out.splitlines()[0]
    report = json.loads((sweep_dir / "sweep.json").read_text())
    assert report["one_program"] and report["seeds"] == [0, 1] and report["grid"] == {LR: [2.5e-4, 1e-2]}
    assert (sweep_dir / "table.txt").read_text().splitlines()[0].startswith("learning_rate")
    assert (sweep_dir / "curves.png").stat().st_size > 0
    for entry, lr in zip(report["combinations"], [2.5e-4, 1e-2]):
        run_dir = sweep_dir / f"learning_rate={lr:g}"
        assert entry["run_dir"] == str(run_dir) and entry["values"] == {LR: lr}
        for name in ("config.yaml", "metrics.jsonl", "summary.json", "curve.png", "logs", "checkpoints"):
            assert (run_dir / name).exists(), name
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["seeds"] == [0, 1] and summary["final_return"] == entry["final_return"]
        # 4,000 asked, 4,096 trained: whole PPO iterations of 4 envs x 128 steps
        assert report["steps"] == 4000 and entry["steps"] == summary["steps"] == 4096
        assert entry["mean"] == pytest.approx(np.mean(entry["final_return"]))
        rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        assert {r["seed"] for r in rows} == {0, 1}
        agent = load_agent(run_dir, seed_index=1)  # a combination's run loads like any run
        assert agent.config.update_cfg.learning_rate == lr and agent.env_step == summary["steps"]
        assert not entry["diverged_seeds"]
    # kitae plot takes the sweep directory for its runs; kitae eval names one of them
    assert main(["plot", str(sweep_dir), "-o", str(tmp_path / "all.png")]) == 0
    assert (tmp_path / "all.png").stat().st_size > 0
    capsys.readouterr()
    assert main(["eval", str(sweep_dir)]) == 2
    err = capsys.readouterr().err
    assert "is a sweep directory" in err and f"e.g. '{sweep_dir / 'learning_rate=0.00025'}'" in err, err


def test_a_sweep_started_in_the_same_second_as_another_claims_its_own_default_directory(tmp_path, capsys, monkeypatch):
    import kitae.runs.resolve

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(kitae.runs.resolve, "default_run_dir", lambda *args: Path("runs") / "ppo-CartPole-v1-s0-t")
    taken = tmp_path / "runs" / "sweep-ppo-CartPole-v1-s0-t"
    taken.mkdir(parents=True)
    (taken / "sweep-plan.json").write_text("{}")  # another sweep's, started that second
    code = main(
        [
            "sweep",
            "ppo",
            "gymnax:CartPole-v1",
            "--grid",
            f"{LR}=2.5e-4,1e-2",
            "--seeds",
            "2",
            "--steps",
            "4096",
            "--quiet",
        ]
    )
    assert code == 0 and capsys.readouterr().out.rstrip().endswith("-> runs/sweep-ppo-CartPole-v1-s0-t-2")
    assert [p.name for p in taken.iterdir()] == ["sweep-plan.json"]
    assert (tmp_path / "runs" / "sweep-ppo-CartPole-v1-s0-t-2" / "learning_rate=0.01" / "summary.json").is_file()


def test_a_diverging_combination_is_marked_and_the_others_go_on(tmp_path, capsys, monkeypatch):
    """... and stays marked through a stop and ``kitae resume``: where it diverged is part of each
    combination's checkpoint, so the resumed sweep ends with the bits and the divergence step of
    the sweep never stopped."""
    sweep_dir = tmp_path / "sweep"
    command = ["sweep", "dqn", "gymnax:CartPole-v1", "--grid", f"{LR}=1e-3,1e12", "--steps", "1000",
               "--set", "update_cfg.max_grad_norm=null", "--set", "algo_params.start_step=200",
               "--set", "train_cfg.save_frequency=500", "--quiet"]  # fmt: skip
    code = main([*command, "--sweep-dir", str(sweep_dir)])
    out = capsys.readouterr().out
    assert code == 0 and "diverged (seeds 0)" in out
    report = json.loads((sweep_dir / "sweep.json").read_text())
    fine, diverged = report["combinations"]
    assert fine["diverged_seeds"] == [] and diverged["diverged_seeds"] == [0]
    summary = json.loads((sweep_dir / "learning_rate=1e+12" / "summary.json").read_text())
    assert 200 <= summary["diverged"][0]["step"] < 500  # before the first checkpoint
    assert json.loads((sweep_dir / "learning_rate=0.001" / "summary.json").read_text()).get("diverged") is None

    stopped = tmp_path / "stopped"
    with monkeypatch.context() as patch:
        patch.setattr("kitae.runs.sweep.stop_on_signals", _stop_at_first_checkpoint)
        assert main([*command, "--sweep-dir", str(stopped)]) == 130  # at step 500, past the divergence
    assert main(["resume", str(stopped), "--quiet"]) == 0
    assert _fingerprints(stopped) == _fingerprints(sweep_dir)
    again = json.loads((stopped / "learning_rate=1e+12" / "summary.json").read_text())["diverged"][0]
    assert again["step"] == summary["diverged"][0]["step"] and again["what"] == "before the run was resumed"
    assert json.loads((stopped / "sweep.json").read_text())["combinations"][1]["diverged_seeds"] == [0]


def test_a_diverged_combination_of_a_host_sweep_is_not_trained_on_by_a_resume(tmp_path, capsys):
    """A host-loop combination that diverged is done: ``kitae resume SWEEP_DIR --steps N`` trains
    the others on and leaves it as it was (it was once resumed from its last finite checkpoint
    and diverged again), still marked in the table; ``kitae resume`` of it alone reports it again."""
    sweep_dir = tmp_path / "sweep"
    command = ["sweep", "dqn", "CartPole-v1", "--grid", f"{LR}=1e-3,1e12", "--steps", "1500",
               "--set", "update_cfg.max_grad_norm=null", "--sweep-dir", str(sweep_dir), "--quiet"]  # fmt: skip
    assert main(command) == 0
    assert "diverged (seeds 0)" in capsys.readouterr().out
    diverged = sweep_dir / "learning_rate=1e+12"
    line = describe_divergence(json.loads((diverged / "summary.json").read_text())["diverged"][0], several=True)

    def snapshot():
        return {str(p): p.read_bytes() for p in sorted(diverged.rglob("*")) if p.is_file()}

    before = snapshot()
    assert main(["resume", str(sweep_dir), "--steps", "2500", "--quiet"]) == 0, capsys.readouterr().err
    assert snapshot() == before
    fine, marked = json.loads((sweep_dir / "sweep.json").read_text())["combinations"]
    assert fine["diverged_seeds"] == [] and marked["diverged_seeds"] == [0]
    assert json.loads((sweep_dir / "learning_rate=0.001" / "summary.json").read_text())["steps"] >= 2500
    capsys.readouterr()
    assert main(["resume", str(diverged), "--quiet"]) == 3
    assert capsys.readouterr().err == f"kitae: {line}\n"
    assert snapshot() == before


def test_a_host_sweep_on_ray_workers_gives_the_runs_of_one_after_another(tmp_path, capsys):
    """A host-loop sweep trains its combinations one after another, each a run directory with its
    values; with ``--workers 2`` at once in Ray tasks (a runtime the sweep starts and stops), each
    the run the sequential sweep makes, bit for bit; a diverging one is marked and the other goes
    on in both."""
    reports, outs = {}, {}
    for mode, extra in (("sequential", []), ("ray", ["--workers", "2"])):
        code = main(
            ["sweep", "dqn", "CartPole-v1", "--grid", f"{LR}=1e-3,1e12", "--steps", "1000",
             "--set", "algo_params.start_step=200", "--set", "update_cfg.max_grad_norm=null",
             "--sweep-dir", str(tmp_path / mode), "--quiet", *extra]
        )  # fmt: skip
        outs[mode] = capsys.readouterr().out
        assert code == 0, outs[mode]
        reports[mode] = json.loads((tmp_path / mode / "sweep.json").read_text())
        assert not reports[mode]["one_program"] and len(reports[mode]["combinations"]) == 2
        for lr in (1e-3, 1e12):
            assert load_agent(tmp_path / mode / f"learning_rate={lr:g}").config.update_cfg.learning_rate == lr
    assert "(one after another)" in outs["sequential"] and reports["sequential"]["workers"] is None
    assert "(2 at a time on Ray)" in outs["ray"] and reports["ray"]["workers"] == 2
    for name in ("learning_rate=0.001", "learning_rate=1e+12"):
        one, ray = (json.loads((tmp_path / mode / name / "summary.json").read_text()) for mode in ("sequential", "ray"))
        assert one["state_fingerprint"] == ray["state_fingerprint"]
        assert one["final_return"] == ray["final_return"]
        assert (one.get("diverged") is None) == (name == "learning_rate=0.001") == (ray.get("diverged") is None)
    fine, diverged = reports["ray"]["combinations"]
    assert fine["diverged_seeds"] == [] and diverged["diverged_seeds"] == [0]


def _interrupt_once_training(command, metrics_files, before_signal=None):
    """Starts ``command``, sends SIGINT once every file has rows (after ``before_signal(process)``),
    returns (exit status, stderr)."""
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 200
    while not all(m.exists() and m.stat().st_size > 0 for m in metrics_files):
        assert process.poll() is None and time.monotonic() < deadline, process.stderr.read() if process.stderr else ""
        time.sleep(1)
    if before_signal is not None:
        before_signal(process)
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=200)
    return process.returncode, err


@pytest.mark.timeout(600)  # two Ray runtimes and four worker processes: 220 s once inside a loaded suite
def test_ctrl_c_stops_every_ray_worker_of_a_host_sweep_with_a_checkpoint(tmp_path):
    """SIGINT to ``kitae sweep --workers 2``: each running combination stops as ``kitae train``
    does on Ctrl-C (its checkpoint saved, loadable), the command exits 130 with one line, and no
    process of the sweep's Ray runtime is left; ``kitae resume SWEEP_DIR`` then finishes both on
    two Ray workers again."""
    sweep_dir = tmp_path / "sweep"
    command = [sys.executable, "-m", "kitae.cli", "sweep", "ppo", "CartPole-v1", "--grid", f"{LR}=1e-3,3e-4",
               "--steps", "400000", "--workers", "2", "--sweep-dir", str(sweep_dir), "--quiet"]  # fmt: skip
    combos = [sweep_dir / "learning_rate=0.001", sweep_dir / "learning_rate=0.0003"]
    ray_processes = []

    def the_runtime(process):  # the runtime and its workers, while both combinations train
        ray_processes.extend(psutil.Process(process.pid).children(recursive=True))

    # both combinations are training once each has written rows (buffered: a few thousand steps)
    code, err = _interrupt_once_training(command, [c / "metrics.jsonl" for c in combos], the_runtime)
    assert ray_processes
    assert code == 130, err
    assert "sweep stopped by SIGINT" in err and len(err.strip().splitlines()) == 2, err  # the notice, the line
    assert "; stopped with a checkpoint: learning_rate=0.001, learning_rate=0.0003; finish it with: kitae resume" in err
    assert "not started" not in err and "finished" not in err
    for combo in combos:
        agent = load_agent(combo)
        assert 0 < agent.env_step < 400_000
    assert not (sweep_dir / "sweep.json").exists()
    _, alive = psutil.wait_procs(ray_processes, timeout=30)
    assert alive == [], alive
    # kitae resume SWEEP_DIR finishes both on two Ray workers again (to a shorter total here)
    steps = max(load_agent(combo).env_step for combo in combos) + 2048
    assert main(["resume", str(sweep_dir), "--steps", str(steps), "--quiet"]) == 0
    assert json.loads((sweep_dir / "sweep.json").read_text())["workers"] == 2
    for combo in combos:
        summary = json.loads((combo / "summary.json").read_text())
        assert summary["steps"] >= steps and summary["resumed_from"] > 0


def test_ctrl_c_stops_a_compiled_sweep_with_every_combinations_checkpoint(tmp_path):
    sweep_dir = tmp_path / "sweep"
    combos = [sweep_dir / "learning_rate=0.001", sweep_dir / "learning_rate=0.0003"]
    code, err = _interrupt_once_training(
        [sys.executable, "-m", "kitae.cli", "sweep", "ppo", "gymnax:CartPole-v1", "--grid", f"{LR}=1e-3,3e-4",
         "--seeds", "2", "--steps", "5000000", "--set", "train_cfg.save_frequency=20480",  # segments of 20,480 steps
         "--sweep-dir", str(sweep_dir), "--quiet"],
        [c / "metrics.jsonl" for c in combos],
    )  # fmt: skip
    assert code == 130, err
    steps = {load_agent(c).env_step for c in combos}
    assert len(steps) == 1 and 0 < steps.pop() < 5_000_000  # one program: stopped at the same step
    assert (
        err.strip()
        .splitlines()[-1]
        .endswith(
            "stopped with a checkpoint: learning_rate=0.001, learning_rate=0.0003; "
            f"finish it with: kitae resume {sweep_dir}"
        )
    ), err
    assert not (sweep_dir / "sweep.json").exists()


def test_ctrl_c_stops_a_sequential_host_sweep_at_the_running_combination(tmp_path):
    """SIGINT to ``kitae sweep`` without workers: the combination that is training stops with its
    checkpoint, the next one is not started, and the one line says which is which."""
    sweep_dir = tmp_path / "sweep"
    command = [sys.executable, "-m", "kitae.cli", "sweep", "ppo", "CartPole-v1", "--grid", f"{LR}=1e-3,3e-4",
               "--steps", "400000", "--sweep-dir", str(sweep_dir), "--quiet"]  # fmt: skip
    first, second = sweep_dir / "learning_rate=0.001", sweep_dir / "learning_rate=0.0003"
    code, err = _interrupt_once_training(command, [first / "metrics.jsonl"])
    assert code == 130, err
    assert err.strip().splitlines()[-1] == (
        f"kitae: sweep stopped by SIGINT at step {load_agent(first).env_step:,} in {sweep_dir}; stopped with a "
        f"checkpoint: learning_rate=0.001; not started: learning_rate=0.0003; finish it with: kitae resume {sweep_dir}"
    ), err
    assert 0 < load_agent(first).env_step < 400_000
    assert [p.name for p in second.iterdir()] == ["config.yaml"]  # written up front; nothing trained
    assert not (sweep_dir / "sweep.json").exists()


@contextlib.contextmanager
def _sigint_at_first_call(monkeypatch, name):
    """A real SIGINT sent to this process the first time the function ``name`` is called, before
    it runs: the moment of a Ctrl-C chosen exactly. Python's own handler is installed meanwhile
    (a test process started in the background ignores SIGINT) and put back after."""
    module, _, attr = name.rpartition(".")
    original = getattr(__import__(module, fromlist=[attr]), attr)
    calls = []

    def interrupted(*args, **kwargs):
        if not calls:
            calls.append(name)
            os.kill(os.getpid(), signal.SIGINT)
        return original(*args, **kwargs)

    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with monkeypatch.context() as patch:
            patch.setattr(name, interrupted)
            yield calls
    finally:
        signal.signal(signal.SIGINT, before)


@pytest.mark.parametrize(
    "when",
    [
        "kitae.runs.session.run_divergences",  # the first combination's last step done, in its run
        "kitae.runs.session.plot_run",  # it writes its curve and summary, after its run's own handler
    ],
    ids=["as-it-ends", "writing-its-summary"],
)
def test_ctrl_c_between_two_combinations_of_a_host_sweep_stops_it_there(tmp_path, capsys, monkeypatch, when):
    """A Ctrl-C that comes as a combination of a sequential host sweep has trained its last step
    was acknowledged, then lost: the sweep trained every other combination and exited 0. One that
    came while it wrote its summary aborted it ("kitae: interrupted"), its checkpoint at the end but
    no summary.json, and ``kitae resume SWEEP_DIR`` then refused that combination as "past the
    total" (1,536 steps of 1,500: whole iterations). Now the combination finishes (its summary
    written), the sweep starts no other and says so in its one line (exit status 130), and ``kitae
    resume SWEEP_DIR`` finishes it; a combination left at its end without a summary (a process
    killed then) gets its summary written, without training."""
    sweep_dir = tmp_path / "sweep"
    first, second = sweep_dir / "learning_rate=0.001", sweep_dir / "learning_rate=0.0003"
    command = ["sweep", "dqn", "CartPole-v1", "--grid", f"{LR}=1e-3,3e-4", "--steps", "1500", "--quiet"]
    with _sigint_at_first_call(monkeypatch, when) as calls:
        code = main([*command, "--sweep-dir", str(sweep_dir)])
    err = capsys.readouterr().err
    assert calls and code == 130, err
    summary = json.loads((first / "summary.json").read_text())
    assert summary["steps"] == 1536  # whole iterations: where a run of 1,500 steps ends
    assert "SIGINT received" in err and err.strip().splitlines()[-1] == (
        f"kitae: sweep stopped by SIGINT at step 1,536 in {sweep_dir}; finished: learning_rate=0.001; not started: "
        f"learning_rate=0.0003; finish it with: kitae resume {sweep_dir}"
    ), err
    assert [p.name for p in second.iterdir()] == ["config.yaml"]  # written up front; nothing trained
    assert not (sweep_dir / "sweep.json").exists()
    # as a process killed while it wrote them leaves it: its last checkpoint, no summary or curve
    (first / "summary.json").unlink()
    (first / "curve.png").unlink()
    assert main(["resume", str(sweep_dir), "--quiet"]) == 0, capsys.readouterr().err
    report = json.loads((sweep_dir / "sweep.json").read_text())
    assert sorted(Path(c["run_dir"]).name for c in report["combinations"]) == [second.name, first.name]
    again = json.loads((first / "summary.json").read_text())
    assert again["steps"] == 1536 and "resumed_from" not in again  # nothing trained: its summary written
    assert again["state_fingerprint"] == summary["state_fingerprint"]
    assert again["final_return"] == summary["final_return"] and (first / "curve.png").exists()
    assert json.loads((second / "summary.json").read_text())["steps"] == 1536


@pytest.mark.parametrize(
    ("env_id", "flags", "message"),
    [
        ("gymnax:CartPole-v1", ["--workers", "2"], "gymnax:CartPole-v1 is a JAX environment, whose sweep is one"),
        ("CartPole-v1", ["--address", "127.0.0.1:6379"], "--address is for --workers: give --workers N too"),
        ("CartPole-v1", ["--workers", "0"], "--workers"),
    ],
)
def test_ray_workers_are_refused_where_they_do_not_apply(tmp_path, capsys, env_id, flags, message):
    sweep_dir = tmp_path / "sweep"
    code = main(["sweep", "dqn", env_id, "--grid", f"{LR}=1e-3,1e-4", "--sweep-dir", str(sweep_dir), "--quiet", *flags])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and message in err, err
    assert not sweep_dir.exists()


def test_sweep_run_refuses_a_bad_worker_count():
    with pytest.raises(RunError, match="--workers 0 is not allowed; allowed: an int >= 1"):
        sweep_run(SweepSpec("dqn", "CartPole-v1", [f"{LR}=1e-3"], workers=0))


@pytest.mark.parametrize(
    ("grid", "message"),
    [
        ("update_cfg.batch_size=32,64", "update_cfg.batch_size cannot be swept: not a float field"),
        ("algo_params.nope=0.1,0.2", "algo_params.nope cannot be swept: not a field of the config; allowed"),
        ("learning_rate=1e-3,1e-4", "not a field of the config; did you mean 'update_cfg.learning_rate'?"),
        ("algo_params.clip_cof=0.1,0.2", "did you mean 'algo_params.clip_coef'?"),
        ("update_cfg.learning_rate=1e-3,-1", "update_cfg.learning_rate=-1.0 is not allowed; allowed: a finite float"),
        ("algo_params.vtrace_rho_bar=0.5,1.0", "algo_params.vtrace_rho_bar cannot be swept: a float field this run "
         "does not read (read only with algo_params.advantage_estimator=vtrace); allowed: algo_params.clip_coef"),
        ("algo_params.log_std_init=-1.0,0.0", "a float field this run does not read (read only for a Box action "
         "space, this run's is Discrete(2))"),
        ("dqn: replay.priority_exponent=0.5,0.6", "replay.priority_exponent cannot be swept: a float field this run "
         "does not read (read only with replay.prioritized=true)"),
    ],
)  # fmt: skip
def test_what_cannot_be_swept_is_refused_before_anything_is_written(tmp_path, capsys, grid, message):
    algo, _, grid = grid.rpartition(": ")
    sweep_dir = tmp_path / "sweep"
    code = main(
        ["sweep", algo or "ppo", "gymnax:CartPole-v1", "--grid", grid, "--sweep-dir", str(sweep_dir), "--quiet"]
    )
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and message in err, err
    assert not sweep_dir.exists()


def test_sweep_run_refuses_bad_seed_counts():
    with pytest.raises(RunError, match="--seeds 0 is not allowed"):
        sweep_run(SweepSpec("ppo", "gymnax:CartPole-v1", [f"{LR}=1e-3"], seeds=0))


class _StopAtFirstCheckpoint(StopRequest):
    """``stop_on_signals``'s request, as if Ctrl-C came with the first checkpoint."""

    def on_checkpoint(self, payload):
        self.signal = self.signal or signal.SIGINT


@contextlib.contextmanager
def _stop_at_first_checkpoint():
    yield _StopAtFirstCheckpoint()


def _fingerprints(sweep_dir):
    report = json.loads((sweep_dir / "sweep.json").read_text())
    names = [Path(e["run_dir"]).name for e in report["combinations"]]
    return {n: json.loads((sweep_dir / n / "summary.json").read_text())["state_fingerprint"] for n in names}


@pytest.mark.parametrize(
    ("where", "env_id", "flags"),
    [
        ("kitae.runs.sweep", "gymnax:CartPole-v1",
         ["--seeds", "2", "--steps", "4096", "--set", "train_cfg.save_frequency=1024"]),
        ("kitae.runs.session", "CartPole-v1",
         ["--steps", "2048", "--set", "train_cfg.save_frequency=1024"]),
    ],
    ids=["compiled", "host"],
)  # fmt: skip
def test_kitae_resume_finishes_a_stopped_sweep(tmp_path, capsys, monkeypatch, where, env_id, flags):
    """A sweep stopped at its first checkpoint (the compiled one: every combination at one step;
    the host one: the first combination stopped, the second not started) is finished by ``kitae
    resume SWEEP_DIR``: its table is written, and the compiled sweep ends at the bits of the same
    sweep never stopped (the host one's not-started combination too; the stopped one's Gymnasium
    environments are reset, as ``kitae resume`` resets them)."""
    command = ["sweep", "ppo", env_id, "--grid", f"{LR}=1e-3,3e-4", *flags, "--quiet"]
    assert main([*command, "--sweep-dir", str(tmp_path / "whole")]) == 0
    stopped = tmp_path / "stopped"
    with monkeypatch.context() as patch:
        patch.setattr(f"{where}.stop_on_signals", _stop_at_first_checkpoint)
        assert main([*command, "--sweep-dir", str(stopped)]) == 130
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.endswith(f"; finish it with: kitae resume {stopped}"), line
    assert "stopped with a checkpoint: learning_rate=0.001" in line
    assert ("not started: learning_rate=0.0003" in line) == (env_id == "CartPole-v1"), line
    assert not (stopped / "sweep.json").exists()
    assert json.loads((stopped / "sweep-plan.json").read_text())["grid"] == {LR: [1e-3, 3e-4]}
    assert 0 < load_agent(stopped / "learning_rate=0.001").env_step < 2048

    assert main(["resume", str(stopped), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith("learning_rate") and f"-> {stopped}" in out
    whole = json.loads((tmp_path / "whole" / "sweep.json").read_text())
    again = json.loads((stopped / "sweep.json").read_text())
    if env_id == "gymnax:CartPole-v1":  # one program: its checkpoints hold the environments too
        assert _fingerprints(stopped) == _fingerprints(tmp_path / "whole")
        assert [e["final_return"] for e in again["combinations"]] == [e["final_return"] for e in whole["combinations"]]
    else:  # the Gymnasium environments of a resumed host run are reset (docs/runs.md); the other is a whole run
        ours, theirs = _fingerprints(stopped), _fingerprints(tmp_path / "whole")
        assert ours["learning_rate=0.0003"] == theirs["learning_rate=0.0003"]
        assert ours["learning_rate=0.001"] != theirs["learning_rate=0.001"]
        summary = json.loads((stopped / "learning_rate=0.001" / "summary.json").read_text())
        assert summary["steps"] == 2048 and 0 < summary["resumed_from"] < 2048
    if env_id == "gymnax:CartPole-v1":  # its rows logged once each: none kept past the checkpoint twice
        rows = (stopped / "learning_rate=0.001" / "metrics.jsonl").read_text().splitlines()
        assert len(rows) == len((tmp_path / "whole" / "learning_rate=0.001" / "metrics.jsonl").read_text().splitlines())
    # finished: refused; killed between its last combination and its table: only the table is written
    total = 4096 if env_id.startswith("gymnax") else 2048
    assert f"already reached step {total:,} of {total:,}" in _resume_error(stopped, capsys)
    (stopped / "sweep.json").unlink()
    assert main(["resume", str(stopped), "--quiet"]) == 0
    assert json.loads((stopped / "sweep.json").read_text())["combinations"] == again["combinations"]
    # a total below where it is: refused, nothing touched
    (stopped / "sweep.json").unlink()
    (stopped / "learning_rate=0.001" / "summary.json").unlink()
    err = _resume_error(stopped, capsys, "--steps", "1024")
    assert f"a combination at step {total:,}, past the total of 1,024 asked" in err, err
    assert (stopped / "learning_rate=0.0003" / "summary.json").exists()


def _resume_error(sweep_dir, capsys, *flags):
    assert main(["resume", str(sweep_dir), *flags]) != 0
    return capsys.readouterr().err


def test_kitae_resume_refuses_a_compiled_sweep_whose_combination_trained_on_on_its_own(tmp_path, capsys):
    """A combination resumed on its own past the others (``kitae resume SWEEP_DIR/NAME --steps
    N``) was restored at the others' step by the next ``kitae resume SWEEP_DIR``: its training past
    it lost, its metrics cut back, silently. It is refused before anything changes; once the
    other combination is trained on to the same step, the sweep goes on from there."""
    sweep_dir = tmp_path / "sweep"
    command = ["sweep", "ppo", "gymnax:CartPole-v1", "--grid", f"{LR}=1e-3,3e-4", "--steps", "2048", "--quiet"]
    assert main([*command, "--sweep-dir", str(sweep_dir)]) == 0
    ahead, behind = sweep_dir / "learning_rate=0.001", sweep_dir / "learning_rate=0.0003"
    assert main(["resume", str(ahead), "--steps", "4096", "--quiet"]) == 0
    capsys.readouterr()
    before = {p: p.read_bytes() for p in sorted(sweep_dir.rglob("*")) if p.is_file()}
    err = _resume_error(sweep_dir, capsys, "--steps", "6144")
    assert len(err.strip().splitlines()) == 1, err
    assert "the newest they all have (step 2,048), but learning_rate=0.001 (to 4,096) was trained on past it" in err
    assert f"first train learning_rate=0.0003 on to step 4,096 on its own (kitae resume {sweep_dir}/NAME" in err
    assert {p: p.read_bytes() for p in sorted(sweep_dir.rglob("*")) if p.is_file()} == before  # nothing changed
    assert main(["resume", str(behind), "--steps", "4096", "--quiet"]) == 0
    assert main(["resume", str(sweep_dir), "--steps", "6144", "--quiet"]) == 0
    for combo in (ahead, behind):
        summary = json.loads((combo / "summary.json").read_text())
        assert summary["steps"] == 6144 and summary["resumed_from"] == 4096


def test_a_sweep_killed_while_it_saved_a_segment_goes_on_from_the_step_all_have(tmp_path, capsys):
    """A compiled sweep saves each segment's checkpoints one combination after another: killed in
    between, one combination is a checkpoint ahead with the sweep's own total. That is not training
    of its own: the sweep goes on from the step every combination has, and says so."""
    import shutil

    sweep_dir = tmp_path / "sweep"
    command = ["sweep", "ppo", "gymnax:CartPole-v1", "--grid", f"{LR}=1e-3,3e-4", "--steps", "4096", "--quiet"]
    assert main([*command, "--set", "train_cfg.save_frequency=2048", "--sweep-dir", str(sweep_dir)]) == 0
    behind = sweep_dir / "learning_rate=0.0003"
    shutil.rmtree(behind / "checkpoints" / "4096")  # as if killed before its checkpoint was written
    for name in ("summary.json", "table.txt", "sweep.json"):  # nor anything after it
        for path in (behind / name, sweep_dir / name):
            path.unlink(missing_ok=True)
    capsys.readouterr()
    assert main(["resume", str(sweep_dir)]) == 0
    err = capsys.readouterr().err  # a note about the run, where kitae resume's "resuming ..." goes
    assert "going on from step 2,048 for every combination: the checkpoints of learning_rate=0.001 (to 4,096)" in err
    assert json.loads((behind / "summary.json").read_text())["steps"] == 4096


def test_a_sweep_one_of_whose_unfinished_combinations_was_evaluated_resumes(tmp_path, capsys):
    """kitae eval writes its fields into the summary.json of the run it evaluates, an unfinished
    combination too: kitae resume SWEEP_DIR counted that combination as finished and failed with a
    KeyError traceback ('steps')."""
    import shutil

    sweep_dir = tmp_path / "sweep"
    command = ["sweep", "ppo", "gymnax:CartPole-v1", "--grid", f"{LR}=1e-3,3e-4", "--steps", "4096", "--quiet"]
    assert main([*command, "--set", "train_cfg.save_frequency=2048", "--sweep-dir", str(sweep_dir)]) == 0
    behind = sweep_dir / "learning_rate=0.0003"
    shutil.rmtree(behind / "checkpoints" / "4096")  # as if stopped after its checkpoint at 2,048
    for name in ("summary.json", "table.txt", "sweep.json"):
        for path in (behind / name, sweep_dir / name):
            path.unlink(missing_ok=True)
    assert main(["eval", str(behind), "--episodes", "1"]) == 0
    assert "steps" not in json.loads((behind / "summary.json").read_text())  # kitae eval's fields only
    capsys.readouterr()
    assert main(["resume", str(sweep_dir)]) == 0, capsys.readouterr().err
    assert json.loads((behind / "summary.json").read_text())["steps"] == 4096
    assert (sweep_dir / "sweep.json").exists()


@pytest.mark.parametrize(
    ("algo", "env_id", "key", "read"),
    [
        ("sac", "gymnax:Pendulum-v1", "algo_params.alpha", lambda s: np.exp(s.alpha.params["log_alpha"])),
        (
            "mpo",
            "gymnax:Pendulum-v1",
            "algo_params.init_temperature",
            lambda s: jax.nn.softplus(s.dual.params["temperature"]),
        ),
    ],
)
def test_initial_values_a_sweep_varies_start_each_row_from_its_own(tmp_path, algo, env_id, key, read):
    """A sweep makes each row's starting state from its traced values (``make_variant_functions``):
    SAC's initial alpha and MPO's initial duals went through Python's ``math`` and failed with
    JAX's "Abstract tracer value encountered"; each row now starts from its own value."""
    from kitae.config import traced_config
    from kitae.runs import preset_agent

    agent, env = preset_agent(algo, env_id, steps=1024, run_dir=tmp_path / "a")
    values = jnp.asarray([0.5, 2.0], jnp.float32)

    def start(value):
        return agent.with_config(traced_config(agent.config, {key: value})).initial_state(jnp.uint32(0))[1]

    states = jax.vmap(start)(values)
    np.testing.assert_allclose(read(states), values, rtol=1e-5)


def test_kitae_resume_refuses_a_directory_without_a_plan(tmp_path):
    with pytest.raises(RunError, match="is not a sweep directory: it has no sweep-plan.json"):
        resume_sweep(tmp_path)
    (tmp_path / "sweep-plan.json").write_text("{")
    with pytest.raises(RunError, match="sweep-plan.json is not valid JSON"):
        resume_sweep(tmp_path)


@pytest.mark.parametrize(
    ("plan", "message"),
    [
        ([1, 2], "holds a list, not the sweep's plan"),
        ({"algo": "ppo"}, "lacks 'seeds'; kitae sweep writes it"),
        (
            {"seeds": [0], "combinations": [{"name": "x"}], "grid": {}, "workers": None, "address": None},
            r"combinations=\[\{'name': 'x'\}\] is not allowed; allowed: a list of \{name, values\}",
        ),
        (
            {"seeds": ["0"], "combinations": [], "grid": {}, "workers": None, "address": None},
            r"seeds=\['0'\] is not allowed; allowed: a list of ints",
        ),
    ],
    ids=["a list", "no seeds", "a combination without values", "seeds of strings"],
)
def test_kitae_resume_names_what_a_damaged_plan_lacks(tmp_path, capsys, plan, message):
    """A plan missing a field gave a KeyError traceback (``plan["seeds"]``)."""
    (tmp_path / "sweep-plan.json").write_text(json.dumps(plan))
    with pytest.raises(RunError, match=message):
        resume_sweep(tmp_path)
    assert main(["resume", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kitae: error:") and len(err.strip().splitlines()) == 1, err
