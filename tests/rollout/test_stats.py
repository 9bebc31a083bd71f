"""rollout/stats.py's pairwise agreement (the DSRL probes' measure of a critic's ranking at one state)."""

from __future__ import annotations

from rollcap.rollout.stats import pairwise_agreement


def test_pairwise_agreement_counts_only_pairs_whose_outcomes_differ():
    # state 0: scores order its one success first against both failures (2 of 2); state 1: wrong on 1 of 1;
    # state 2: all outcomes equal, no pair counts
    got = pairwise_agreement([[0.9, 0.1, 0.2], [0.5, 0.7], [0.3, 0.1]], [[1, 0, 0], [1, 0], [0, 0]])
    assert (got["states"], got["pairs"], got["agreement"]) == (2, 3, 2 / 3)
    assert 0 <= got["ci95"][0] <= got["agreement"] <= got["ci95"][1] <= 1
    assert pairwise_agreement([[0.1, 0.2]], [[1, 1]]) is None
