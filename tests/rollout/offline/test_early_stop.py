"""Early-stop accounting: the critic's stop predicate replayed on recorded values is what a run with the threshold does."""

from __future__ import annotations

import numpy as np
import pytest

import rollcap
from rollcap.rollout.offline.early_stop import Boundaries, boundaries_of, early_stop_rows, first_stop, table
from rollcap.rollout.predicates import BoundaryView, CriticBelow
from rollcap.rollout.recording import load_any
from tests.rollout._tiny import make_env, make_runners

KW = {"max_steps": 40}


def test_first_stop_is_critic_below():
    """first_stop fires where CriticBelow fires, with patience counted over consecutive boundaries."""
    values = np.array([-0.2, -0.9, -0.1, -0.9, -0.95, -0.99])
    assert (
        first_stop(values, -0.8, 1) == 1 and first_stop(values, -0.8, 2) == 4 and first_stop(values, -0.999, 1) is None
    )
    pred = CriticBelow(-0.8, 2)
    pred.reset()
    assert [pred.check(BoundaryView(k, 0, None, v, 0.0)) for k, v in enumerate(values)].index("critic") == 4


def test_rows_count_stops_lost_successes_and_saved_steps():
    """A stop at boundary k saves the steps from chunk_start[k] on; a stopped success is counted as lost."""
    eps = [
        Boundaries(np.array([-0.1, -0.1, -0.1]), np.array([0, 4, 8]), True, 10),  # never stopped
        Boundaries(
            np.array([-0.1, -0.9, -0.9]), np.array([0, 4, 8]), True, 12
        ),  # stopped at 2: 4 steps saved, a success lost
        Boundaries(np.array([-0.9, -0.9, -0.9, -0.9]), np.array([0, 4, 8, 12]), False, 500),  # stopped at 1: 496 saved
    ]
    (row,) = early_stop_rows(eps, [-0.8], patience=2)
    assert (row.episodes, row.stopped, row.stopped_would_succeed, row.successes, row.successes_with_stops) == (
        3,
        2,
        1,
        2,
        1,
    )
    assert (row.steps, row.steps_saved) == (522, 4 + 496)
    assert "would succeed" in table([row])


def test_replay_equals_a_run_with_the_threshold(tmp_path):
    """Every episode a threshold would stop stops there in a real run (stop reason critic, no action of that chunk); the rest are unchanged."""

    def run(out, **kw):
        p, c = make_runners(seed=3)
        return rollcap.run(
            6,
            out=tmp_path / out,
            env=make_env(**KW),
            policy=p,
            critic=c,
            seed=11,
            formats=("npz",),
            progress=False,
            **kw,
        )

    run("free")
    free = load_any(tmp_path / "free")
    values = np.concatenate([r.chunks["critic_value"] for r in free])
    thr = float(np.quantile(values, 0.4))  # some boundaries below it, some above
    expect = [first_stop(r.chunks["critic_value"], thr, 2) for r in free]
    assert any(k is not None for k in expect) and any(k is None for k in expect), expect
    run("cut", critic_threshold=thr, critic_patience=2)
    cut = load_any(tmp_path / "cut")
    for a, b, k in zip(free, cut, expect):
        if k is None:
            assert b.stop_reason == a.stop_reason and b.steps["actions"].tobytes() == a.steps["actions"].tobytes()
        else:
            assert b.stop_reason == "critic" and b.num_steps == int(a.chunks["chunk_start"][k])
            assert b.steps["actions"].tobytes() == a.steps["actions"][: b.num_steps].tobytes()
    (row,) = early_stop_rows([boundaries_of(r) for r in free], [thr], patience=2)
    assert row.stopped == sum(r.stop_reason == "critic" for r in cut)
    assert row.steps - row.steps_saved == sum(r.num_steps for r in cut)


def test_episodes_without_values_or_cut_short_are_refused(tmp_path):
    """A run without a critic, or one whose episodes a threshold already stopped, cannot answer the question."""
    p, _ = make_runners(seed=3)
    rollcap.run(
        1, out=tmp_path / "none", env=make_env(**KW), policy=p, critic=None, seed=1, formats=("npz",), progress=False
    )
    with pytest.raises(ValueError, match="no critic values"):
        boundaries_of(load_any(tmp_path / "none")[0])
    p, c = make_runners(seed=3)
    rollcap.run(
        1,
        out=tmp_path / "cut",
        env=make_env(**KW),
        policy=p,
        critic=c,
        seed=1,
        critic_threshold=0.0,
        critic_patience=1,
        formats=("npz",),
        progress=False,
    )
    with pytest.raises(ValueError, match="stopped \\(critic\\)"):
        boundaries_of(load_any(tmp_path / "cut")[0])


def test_inspect_early_stop_cli(tmp_path, capsys):
    """rollcap inspect RUN RUN --early-stop T T prints one table over both runs; a run without a critic is one line, exit 2."""
    from rollcap.rollout.cli import main

    for name in ("a", "b"):
        p, c = make_runners(seed=3)
        rollcap.run(
            2, out=tmp_path / name, env=make_env(**KW), policy=p, critic=c, seed=4, formats=("npz",), progress=False
        )
    assert (
        main(["inspect", str(tmp_path / "a"), str(tmp_path / "b"), "--early-stop", "-0.9", "-0.5", "--patience", "1"])
        == 0
    )
    out = capsys.readouterr().out
    assert "would succeed" in out and "/4" in out
    p, _ = make_runners(seed=3)
    rollcap.run(
        1, out=tmp_path / "none", env=make_env(**KW), policy=p, critic=None, seed=1, formats=("npz",), progress=False
    )
    capsys.readouterr()
    for args in (["--early-stop", "-0.9"], ["--early-stop", "0.5"], ["--early-stop", "-0.9", "--patience", "0"]):
        assert main(["inspect", str(tmp_path / "none"), *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and all(e.startswith("rollcap inspect: error: --") for e in err), err
    assert "no critic values" in err[0] and "[-1, 0]" in err[1] and "--patience" in err[2], err
