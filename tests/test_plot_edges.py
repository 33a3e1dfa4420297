"""The edges of ``kitae plot``'s curves: each seed's last mean held to the run's end, nothing drawn
before a seed's first episode."""

from __future__ import annotations

import numpy as np

from kitae.runs.plotting import _mean_and_band, _smooth


def test_a_seed_holds_its_last_mean_to_the_right_and_nothing_to_the_left():
    steps, returns = np.array([10.0, 20.0]), np.array([2.0, 4.0])
    grid = np.array([0.0, 10.0, 20.0, 30.0, 40.0])
    line = _smooth(steps, returns, grid, window=1)
    assert np.isnan(line[0])  # before its first episode: no value, not its first one held back
    assert line[1:].tolist() == [2.0, 4.0, 4.0, 4.0]


def test_seeds_without_an_episode_at_the_last_step_stay_in_the_mean_and_the_band():
    """The audit's run: seeds at 500 whose long episodes ended none in the last iteration had no
    row at the run's last step, and dropped out of the mean (427 fell to 382) and the band there."""
    last = 100_000.0
    curves = {
        0: (np.array([1_000.0, 60_000.0]), np.array([20.0, 500.0])),  # its last episode well before the end
        1: (np.array([1_000.0, 90_000.0]), np.array([20.0, 500.0])),
        2: (np.array([1_000.0, last]), np.array([20.0, 100.0])),  # one episode at the run's last step
    }
    grid, mean, low, high = _mean_and_band(curves, window=1)
    assert grid[-1] == last
    assert mean[-1] == (500.0 + 500.0 + 100.0) / 3 and (low[-1], high[-1]) == (100.0, 500.0)


def test_a_seed_that_starts_later_is_left_out_only_before_its_first_episode():
    curves = {
        0: (np.array([0.0, 100.0]), np.array([10.0, 10.0])),
        1: (np.array([50.0]), np.array([30.0])),  # one episode, halfway through the run
    }
    grid, mean, low, high = _mean_and_band(curves, window=1)
    before, after = grid < 50.0, grid >= 50.0
    assert np.all(mean[before] == 10.0) and np.all(high[before] == 10.0)
    assert np.all(mean[after] == 20.0) and np.all(high[after] == 30.0) and np.all(low[after] == 10.0)


def test_a_compiled_runs_curve_ends_at_its_final_return():
    """Compiled-loop rows each average several episodes. The plot took rows whole while they held
    at most 10 episodes (4 here), ``final_return`` takes them until they hold at least 10: the
    audit's run ended its curve at 306.8 against a final return of 309.9."""
    from kitae.runs.rundir import final_return_from_rows

    counts = [3, 2, 4, 4, 2, 6]
    returns = [10.0, 20.0, 30.0, 40.0, 50.0, 60.0]
    rows = [
        {"step": 512 * (i + 1), "seed": 0, "episodic_return": r, "episodes": n}
        for i, (r, n) in enumerate(zip(returns, counts))
    ]
    steps = np.array([row["step"] for row in rows], float)
    line = _smooth(steps, np.array(returns), steps, window=10, counts=np.array(counts, float))
    # the last row's window: 6 + 2 + 4 = 12 episodes (the rows whole until they hold 10)
    assert line[-1] == (60 * 6 + 50 * 2 + 40 * 4) / 12 == final_return_from_rows(rows, 0)
    # at the fourth row: 4 + 4 + 2 = 10 episodes; at the second, the 5 there are
    assert line[3] == (40 * 4 + 30 * 4 + 20 * 2) / 10 and line[1] == (10 * 3 + 20 * 2) / 5
