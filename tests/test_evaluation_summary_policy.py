"""The evaluation training writes into ``summary.json``: the keys ``kitae eval`` writes."""

from __future__ import annotations

from kitae.runs.summary import _evaluation_summary


def test_the_evaluation_while_training_names_its_policy_as_kitae_eval_does():
    """``eval_policy`` was left out of ``summary.json`` while ``kitae eval`` writes it."""
    rows = [
        {"step": 100, "seed": 0, "episodic_return": 9.0, "episodic_length": 9.0, "episodes": 1},
        {"step": 200, "seed": 0, "eval_return": 12.0, "eval_return_std": 1.0, "eval_episodes": 3},
        {"step": 200, "seed": 1, "eval_return": 14.0, "eval_return_std": 2.0, "eval_episodes": 3},
    ]
    assert _evaluation_summary(rows, [0], several=False) == {
        "eval_return": 12.0, "eval_return_std": 1.0, "eval_episodes": 3, "eval_step": 200,
        "eval_policy": "deterministic",
    }  # fmt: skip
    assert _evaluation_summary(rows, [0, 1], several=True)["eval_policy"] == "deterministic"
    assert _evaluation_summary(rows[:1], [0], several=False) == {}
