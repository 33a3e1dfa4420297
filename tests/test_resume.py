"""Stop, resume, reload: a run loses nothing it had learned, and its logs go on at the right step."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import jax
import numpy as np
import pytest
from _agents import TinyDQN, TinyDQNParams, make_config

import kitae.config as cfg
from kitae.cli import main
from kitae.envs.make import EnvSpec, make_vec_env
from kitae.loops.state import mark_episodes_cut
from kitae.runs import RunError
from kitae.runs.checkpoints import Checkpointer
from kitae.runs.rundir import read_metrics, state_fingerprint


def _equal(a, b) -> bool:
    la, lb = jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)
    return len(la) == len(lb) and all(np.array_equal(x, y) for x, y in zip(la, lb))


def _kitae(*args: str, timeout: int = 280) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kitae.cli", *args], capture_output=True, text=True, timeout=timeout)


def _scalar_steps(run_dir: Path, tag: str) -> list[int]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "logs"))
    events.Reload()
    return [e.step for e in events.Scalars(tag)]


# ---------------------------------------------------------------------------------------------
# The library: agent.resume and Agent.unserialize
# ---------------------------------------------------------------------------------------------


def _dqn(run_dir, save_frequency=50):
    env = make_vec_env("CartPole-v1", 2)
    config = make_config(
        env, TinyDQNParams(start_step=32, skip_steps=2), max_buffer_size=64, batch_size=16, n_env_steps=200
    )
    config = dataclasses.replace(config, train_cfg=dataclasses.replace(config.train_cfg, save_frequency=save_frequency))
    return TinyDQN("t", config, run_dir=run_dir), env


def test_a_run_started_from_python_saves_resumes_and_loads_like_one_from_the_command_line(tmp_path):
    run_dir = tmp_path / "run"
    agent, env = _dqn(run_dir)  # save_frequency 50, n_env_steps 200
    result = agent.train(env, 100)
    assert result.env_steps == 100 and agent.env_step == 100
    for name in ("config.yaml", "metrics.jsonl", "summary.json", "curve.png", "logs"):
        assert (run_dir / name).exists(), name
    assert Checkpointer(run_dir / "checkpoints").all_steps() == [50, 100]  # every 50 steps and at the end
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 100 and summary["state_fingerprint"] == state_fingerprint(agent.state)

    loaded = TinyDQN.unserialize(run_dir)
    assert type(loaded) is TinyDQN and loaded.env_step == 100 and loaded.n_updates == agent.n_updates
    assert _equal(loaded.state, agent.state) and _equal(loaded.buffer.state, agent.buffer.state)

    resumed, env = _dqn(run_dir)
    result = resumed.resume(env)  # to the config's 200 steps in all
    assert result.start_step == 100 and result.env_steps == 200 and resumed.env_step == 200
    assert resumed.n_updates == agent.n_updates + result.n_updates and result.n_updates == 50
    assert Checkpointer(run_dir / "checkpoints").all_steps() == [100, 150, 200]
    assert json.loads((run_dir / "summary.json").read_text())["resumed_from"] == 100
    assert state_fingerprint(TinyDQN.unserialize(run_dir).state) == state_fingerprint(resumed.state)
    with pytest.raises(RunError, match="seed_index=1 is not allowed; the run trained one seed: allowed 0"):
        TinyDQN.unserialize(run_dir, seed_index=1)
    with pytest.raises(RunError, match=r"already reached step 200 .* agent.resume\(env, n_env_steps\) with"):
        _dqn(run_dir)[0].resume(make_vec_env("CartPole-v1", 2), 200)
    with pytest.raises(RunError, match="already holds a run"):  # a fresh agent does not overwrite it
        _dqn(run_dir)[0].train(make_vec_env("CartPole-v1", 2), 100)


@pytest.mark.parametrize("env_id", ["CartPole-v1", "gymnax:CartPole-v1"])
def test_agent_resume_to_a_new_total_is_kitae_resume_steps(tmp_path, capsys, env_id):
    """``agent.resume(env, n)`` past the config's total is ``kitae resume RUN_DIR --steps n``: the
    same bits (the learning rate is annealed over the new total: it was over the old one) and
    config.yaml records the new total (it kept the old one, which a later resume then read)."""
    import shutil

    from kitae.runs import preset_agent
    from kitae.runs.rundir import read_run_config

    agent, env = preset_agent("ppo", env_id, steps=1024, run_dir=tmp_path / "a")
    assert agent.config.update_cfg.learning_rate_annealing
    agent.train(env)
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    again, env = preset_agent("ppo", env_id, steps=1024, run_dir=tmp_path / "a")
    result = again.resume(env, 2048)
    assert result.env_steps == 2048 and again.config.train_cfg.n_env_steps == 2048
    assert main(["resume", str(tmp_path / "b"), "--steps", "2048", "--quiet"]) == 0
    summaries = [json.loads((tmp_path / d / "summary.json").read_text()) for d in "ab"]
    assert summaries[0]["state_fingerprint"] == summaries[1]["state_fingerprint"]
    assert [read_run_config(tmp_path / d).train_cfg.n_env_steps for d in "ab"] == [2048, 2048]
    assert state_fingerprint(again.state) == summaries[0]["state_fingerprint"]


def test_agent_train_past_the_configs_total_is_the_command_lines_run(tmp_path, capsys):
    """``agent.train(env, n)`` past the config's total extends the run's total: a second call is
    ``kitae resume --steps``, a first call past it is ``kitae train --steps`` (the same bits;
    before, the learning rate annealed over the old total stayed at zero past it)."""
    import shutil

    from kitae.runs import preset_agent
    from kitae.runs.rundir import read_run_config

    agent, env = preset_agent("ppo", "CartPole-v1", steps=1024, run_dir=tmp_path / "a")
    agent.train(env)
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    assert agent.train(env, 1024).env_steps == 2048 and agent.config.train_cfg.n_env_steps == 2048
    assert main(["resume", str(tmp_path / "b"), "--steps", "2048", "--quiet"]) == 0
    first, env = preset_agent("ppo", "CartPole-v1", steps=1024, run_dir=tmp_path / "c")
    first.train(env, 2048)
    assert main(["train", "ppo", "CartPole-v1", "--steps", "2048", "--run-dir", str(tmp_path / "d"), "--quiet"]) == 0
    prints = {d: json.loads((tmp_path / d / "summary.json").read_text())["state_fingerprint"] for d in "abcd"}
    assert prints["a"] == prints["b"] and prints["c"] == prints["d"] and prints["a"] != prints["c"]
    assert all(read_run_config(tmp_path / d).train_cfg.n_env_steps == 2048 for d in "abcd")


def test_the_command_line_names_a_custom_agents_run_and_plots_it(tmp_path, capsys):
    """kitae eval and resume cannot rebuild a custom agent (the class is the user's): one line
    says so and how to load it; kitae plot needs only the run's files, not its params class."""
    run_dir = tmp_path / "run"
    agent, env = _dqn(run_dir)
    agent.train(env, 100)
    capsys.readouterr()
    for command in (["eval", str(run_dir)], ["resume", str(run_dir)]):
        assert main(command) == 2
        err = capsys.readouterr().err
        assert "was trained by a custom agent" in err and "TinyDQNParams" in err, err
        assert "YourAgent.unserialize(run_dir)" in err and err.count("\n") == 1
    config = run_dir / "config.yaml"
    lines = config.read_text().splitlines(keepends=True)
    assert lines[1].startswith("algo_params_class: ") and lines[1].rstrip().endswith(":TinyDQNParams")
    config.write_text("".join([lines[0], "algo_params_class: gone_module:GoneParams\n", *lines[2:]]))
    assert main(["plot", str(run_dir), "-o", str(tmp_path / "curve.png")]) == 0
    assert (tmp_path / "curve.png").stat().st_size > 0


@cfg.register_algo_params
@dataclasses.dataclass
class ScriptParams(TinyDQNParams):
    """A params class no other module names so (``_agents`` is imported under two names in a full
    test run, so its ``TinyDQNParams`` is two registered classes: the ``__main__`` fallback then
    finds no single one, as it should)."""


def test_a_scripts_run_is_found_again_where_the_script_is_imported(tmp_path, capsys, monkeypatch):
    """``python my_agent.py`` writes ``__main__:MyParams``; ``kitae eval RUN_DIR --import
    my_agent.py`` registers the class as ``my_agent:MyParams``: the command line finds it as
    ``unserialize`` does (it said "trained by a custom agent", although the module was given)."""
    from kitae.algos.collections import ALGORITHMS

    run_dir = tmp_path / "run"
    env = make_vec_env("CartPole-v1", 2)
    config = make_config(env, ScriptParams(start_step=32, skip_steps=2), max_buffer_size=64, batch_size=16)
    TinyDQN("t", config, run_dir=run_dir).train(env, 100)
    config = run_dir / "config.yaml"
    lines = config.read_text().splitlines(keepends=True)
    assert lines[1].rstrip().endswith(":ScriptParams")
    text = "".join([lines[0], "algo_params_class: __main__:ScriptParams\n", *lines[2:]])
    config.write_text(text.replace("task_name: test\n", "task_name: CartPole-v1\n"))
    monkeypatch.setitem(ALGORITHMS, "kitae_test_script", (TinyDQN, ScriptParams))  # what --import registers
    capsys.readouterr()
    assert main(["eval", str(run_dir), "--episodes", "1"]) == 0, capsys.readouterr().err
    assert "checkpoint step 100" in capsys.readouterr().out


def test_a_run_that_crashed_before_its_first_checkpoint_says_how_to_start_again(tmp_path):
    """A run that raised after some steps but before its first checkpoint (a custom agent's bug)
    has recorded episodes and nothing to resume: a fresh agent.train and agent.resume say so and
    what to do (they pointed at each other: "go on with agent.resume" / "start it again")."""
    from kitae.loops.callbacks import Callback

    class Crash(Callback):
        def on_episodes(self, episodes):
            raise RuntimeError("a bug in the user's code")

    run_dir = tmp_path / "run"
    agent, env = _dqn(run_dir, save_frequency=1000)
    with pytest.raises(RuntimeError, match="a bug"):
        agent.train(env, 200, callbacks=[Crash()])
    assert not (run_dir / "checkpoints").exists() or not any((run_dir / "checkpoints").rglob("*"))
    fresh = "stopped before its first checkpoint (nothing to go on from): delete the directory"
    with pytest.raises(RunError, match=re.escape(fresh)):
        _dqn(run_dir)[0].train(make_vec_env("CartPole-v1", 2), 100)
    with pytest.raises(RunError, match=re.escape("delete its run directory and call agent.train(env)")):
        _dqn(run_dir)[0].resume(make_vec_env("CartPole-v1", 2))
    with pytest.raises(RunError, match=re.escape("holds no run to go on from; agent.train(env) starts one")):
        _dqn(tmp_path / "never")[0].resume(make_vec_env("CartPole-v1", 2))


def test_a_run_that_refused_its_environment_can_be_trained_again_in_its_directory(tmp_path):
    """``agent.train`` with the wrong environment fails before any step, having written only what a
    run writes before its first step; the call with the right one then trains in that directory
    (which a run with anything recorded would refuse, above)."""
    run_dir = tmp_path / "run"
    agent, env = _dqn(run_dir)
    with pytest.raises(ValueError, match="the environment has 3 sub-environments but env_cfg.n_envs=2"):
        agent.train(make_vec_env("CartPole-v1", 3), 100)
    assert sorted(p.name for p in run_dir.iterdir()) == ["config.yaml", "logs", "metrics.jsonl"]
    assert agent.train(env, 100).env_steps == 100
    assert len(list((run_dir / "logs").iterdir())) == 1  # the refused run's event file was cleared
    assert Checkpointer(run_dir / "checkpoints").all_steps() == [50, 100]
    with pytest.raises(RunError, match="already holds a run"):  # now it holds one
        _dqn(run_dir)[0].train(make_vec_env("CartPole-v1", 2), 100)


def test_a_resumed_host_run_marks_the_interrupted_episodes_truncated(tmp_path):
    agent, env = _dqn(tmp_path / "run")
    agent.train(env, 100)
    buffer = agent.buffer.state
    cut = mark_episodes_cut(buffer)
    last = (int(buffer.position) - 1) % buffer.capacity
    truncated = np.asarray(cut.data.truncated)
    assert truncated[last].all()
    np.testing.assert_array_equal(np.delete(truncated, last, 0), np.delete(np.asarray(buffer.data.truncated), last, 0))
    assert mark_episodes_cut(buffer, False) is not buffer and _equal(mark_episodes_cut(buffer, False), buffer)


@pytest.mark.parametrize("algo", ["ppo", "dqn"])
def test_unserialize_gives_identical_parameters_and_actions(tmp_path, algo):
    from kitae.algos.collections import get_algorithm
    from kitae.runs.presets import build_config, resolve

    agent_cls, params_cls = get_algorithm(algo)
    env = make_vec_env("CartPole-v1", 2)
    spec = EnvSpec.parse("CartPole-v1")
    resolved = resolve(
        algo,
        params_cls,
        spec,
        overrides={"n_envs": 2, "n_env_steps": 256},
        sets=["update_cfg.max_buffer_size=32", "update_cfg.batch_size=32"],
    )
    config = build_config(params_cls, spec, env, resolved)
    run_dir = tmp_path / "run"
    agent = agent_cls("run", config, run_dir=run_dir)
    agent.train(env, 256)
    path = agent.save()
    assert path == run_dir / "checkpoints" / "256"

    loaded = agent_cls.unserialize(run_dir)
    assert type(loaded) is agent_cls and loaded.env_step == 256 and loaded.n_updates == agent.n_updates
    assert state_fingerprint(loaded.state) == state_fingerprint(agent.state)
    observations = np.random.default_rng(0).normal(size=(5, 4)).astype(np.float32)
    for _ in range(2):  # keys are restored too: the same actions call after call
        np.testing.assert_array_equal(
            np.asarray(loaded.select_action(observations)[0]), np.asarray(agent.select_action(observations)[0])
        )
    from kitae.base import BaseAgent

    assert state_fingerprint(BaseAgent.unserialize(run_dir).state) == state_fingerprint(agent.state)


# ---------------------------------------------------------------------------------------------
# The command line: kill, stop, resume
# ---------------------------------------------------------------------------------------------

COMPILED = [
    "train",
    "ppo",
    "gymnax:CartPole-v1",
    "--steps",
    "61440",
    "--quiet",
    "--set",
    "train_cfg.save_frequency=4096",
]


@pytest.mark.slow
def test_a_killed_compiled_run_resumes_to_the_bits_of_an_uninterrupted_one(tmp_path):
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    result = _kitae(*COMPILED, "--run-dir", str(whole))
    assert result.returncode == 0, result.stderr[-3000:]

    process = subprocess.Popen(
        [sys.executable, "-m", "kitae.cli", *COMPILED, "--run-dir", str(cut)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 240
        while not (cut / "checkpoints" / "4096").is_dir():
            assert process.poll() is None, process.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "no checkpoint appeared"
            time.sleep(0.02)
        os.kill(process.pid, signal.SIGKILL)
    finally:
        process.wait(timeout=60)
    assert process.returncode == -signal.SIGKILL
    assert not (cut / "summary.json").exists()
    killed_at = max(int(p.name) for p in (cut / "checkpoints").iterdir() if p.name.isdigit())
    assert killed_at < 61440

    result = _kitae("resume", str(cut), "--quiet")
    assert result.returncode == 0, result.stderr[-3000:]
    a, b = (json.loads((d / "summary.json").read_text()) for d in (whole, cut))
    assert b["state_fingerprint"] == a["state_fingerprint"]
    assert b["steps"] == a["steps"] == 61440 and b["resumed_from"] == killed_at
    assert b["final_return"] == a["final_return"]
    # the logs continue at the right step: the same rows, the same TensorBoard points
    assert read_metrics(cut / "metrics.jsonl") == read_metrics(whole / "metrics.jsonl")
    assert _scalar_steps(cut, "charts/episodic_return") == _scalar_steps(whole, "charts/episodic_return")
    assert _scalar_steps(cut, "losses/loss_total") == _scalar_steps(whole, "losses/loss_total")


@pytest.mark.slow
def test_sigterm_stops_a_host_run_cleanly_and_resume_finishes_it(tmp_path):
    run_dir = tmp_path / "run"
    args = [
        "train",
        "ppo",
        "CartPole-v1",
        "--steps",
        "40000",
        "--quiet",
        "--set",
        "train_cfg.save_frequency=512",
        "--set",
        "update_cfg.n_epochs=2",
        "--run-dir",
        str(run_dir),
    ]
    process = subprocess.Popen(
        [sys.executable, "-m", "kitae.cli", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 240
        while not (run_dir / "checkpoints" / "512").is_dir():
            assert process.poll() is None, process.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "no checkpoint appeared"
            time.sleep(0.02)
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 128 + signal.SIGTERM, err[-3000:]
    assert "Traceback" not in err and "kitae: stopped by SIGTERM at step" in err and "kitae resume" in err
    stopped_at = max(int(p.name) for p in (run_dir / "checkpoints").iterdir() if p.name.isdigit())
    assert 512 <= stopped_at < 40000 and not (run_dir / "summary.json").exists()
    rows = read_metrics(run_dir / "metrics.jsonl")
    assert rows and max(r["step"] for r in rows) <= stopped_at  # what was saved had been logged

    assert main(["resume", str(run_dir), "--steps", "6000", "--quiet"]) == 0
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 6144 and summary["resumed_from"] == stopped_at  # whole rollouts of 32 x 8
    steps = [r["step"] for r in read_metrics(run_dir / "metrics.jsonl")]
    assert steps == sorted(steps) and steps[-1] <= 6144 and any(s > stopped_at for s in steps)
    tb = _scalar_steps(run_dir, "charts/episodic_return")
    assert tb == sorted(tb)  # the events logged past the checkpoint were purged
    from kitae.config import AlgoConfig

    assert AlgoConfig.from_yaml(run_dir / "config.yaml").train_cfg.n_env_steps == 6000


@pytest.mark.slow
def test_ctrl_c_stops_a_compiled_run_at_a_segment_with_a_checkpoint(tmp_path, capsys):
    run_dir = tmp_path / "run"

    ended = threading.Event()

    def interrupt_after_first_checkpoint() -> None:
        deadline = time.monotonic() + 240
        while not (run_dir / "checkpoints" / "4096").is_dir() and time.monotonic() < deadline:
            if ended.wait(0.01):  # the run ended first: no SIGINT into whatever test runs next
                return
        os.kill(os.getpid(), signal.SIGINT)

    before = signal.getsignal(signal.SIGINT)  # SIG_IGN when the test process was started in the background
    watcher = threading.Thread(target=interrupt_after_first_checkpoint, daemon=True)
    watcher.start()
    try:
        status = main([*COMPILED[:4], "409600", *COMPILED[5:], "--run-dir", str(run_dir)])
    finally:
        ended.set()
        watcher.join(timeout=10)
    err = capsys.readouterr().err
    assert status == 128 + signal.SIGINT, err
    assert "SIGINT received" in err and "kitae: stopped by SIGINT" in err
    steps = [int(p.name) for p in (run_dir / "checkpoints").iterdir() if p.name.isdigit()]
    assert max(steps) < 409600 and not (run_dir / "summary.json").exists()
    assert signal.getsignal(signal.SIGINT) is before  # handlers restored


@pytest.mark.parametrize("env_id", ["CartPole-v1", "gymnax:CartPole-v1"], ids=["host", "compiled"])
def test_an_agent_of_one_seed_does_not_go_on_in_a_run_of_several(tmp_path, env_id):
    """``Agent.unserialize(run_dir, seed_index=1)`` then ``agent.resume(env)``, ``agent.train(env)``
    or ``agent.save()`` once wrote one seed's checkpoint and summary into a run of two seeds,
    replacing the run's own (the compiled run's newest checkpoint; the host run's summary, then
    read as one seed's). Now they are refused and the directory is left as it was; the agent
    trains in a directory of its own, and the whole run resumes as ``kitae resume`` does."""
    import hashlib

    from kitae.algos.collections.ppo import PPO
    from kitae.envs.make import make_env
    from kitae.runs import resume_run

    run_dir = tmp_path / "run"
    argv = ["train", "ppo", env_id, "--seeds", "2", "--steps", "4096", "--run-dir", str(run_dir), "--quiet"]
    assert main([*argv, "--set", "train_cfg.save_frequency=2048"]) == 0

    def snapshot() -> dict:
        return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(run_dir.rglob("*")) if p.is_file()}

    before = snapshot()
    agent = PPO.unserialize(run_dir, seed_index=1)
    assert agent.config.seed == 1 and agent.env_step == 4096
    spec = EnvSpec.parse(env_id)
    for go_on in (lambda env: agent.resume(env, 8192), lambda env: agent.train(env, 2048)):
        with pytest.raises(RunError, match=r"holds a run of seeds 0, 1 trained as one run.* kitae resume "):
            go_on(make_env(spec, agent.config.env_cfg.n_envs))
    with pytest.raises(RunError, match=r"holds a run of seeds 0, 1 .* agent.save\(directory=...\) saves elsewhere"):
        agent.save()  # the newest checkpoint, step 4096, would have been this seed's alone
    assert snapshot() == before
    assert agent.save(directory=tmp_path / "elsewhere") == tmp_path / "elsewhere" / "4096"

    agent.run_dir = tmp_path / "seed-1-alone"
    agent.train(make_env(spec, agent.config.env_cfg.n_envs), 2048)
    assert agent.env_step > 4096 and (agent.run_dir / "config.yaml").exists()
    assert json.loads((agent.run_dir / "summary.json").read_text())["steps"] == agent.env_step
    summary = resume_run(run_dir, 6144, quiet=True)  # the whole run, both seeds
    assert summary["seeds"] == [0, 1] and summary["steps"] >= 6144
