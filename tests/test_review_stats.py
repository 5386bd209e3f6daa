"""Review statistics against hand-computed values, the RLE runs the pages exchange, the ILS card's review section."""

from __future__ import annotations

import math

import numpy as np
import pytest

from cxrground.ils.card import review_lines, with_review_section
from cxrground.io.masks import decode_rle
from cxrground.review.stats import (
    Rating,
    acceptance_table,
    cohen_kappa,
    consensus,
    dice,
    fleiss_kappa,
    pairwise_cohen,
)


def test_cohen_kappa_hand_computed() -> None:
    a = ["accept", "accept", "reject", "reject", "accept"]
    b = ["accept", "reject", "reject", "reject", "accept"]
    # p_o = 4/5; p_e = 3/5·2/5 + 2/5·3/5 = 0.48; κ = (0.8 - 0.48) / 0.52
    assert cohen_kappa(a, b) == pytest.approx(0.32 / 0.52)
    assert cohen_kappa(a, a) == pytest.approx(1.0)
    # complete disagreement on a balanced binary split: p_o = 0, p_e = 0.5 → κ = -1
    assert cohen_kappa(["accept", "reject"], ["reject", "accept"]) == pytest.approx(-1.0)
    assert math.isnan(cohen_kappa(["accept"] * 3, ["accept"] * 3))  # p_e = 1: undefined
    with pytest.raises(ValueError):
        cohen_kappa(["accept"], [])


def test_fleiss_kappa_matches_the_published_example() -> None:
    # Fleiss (1971) worked example as given on Wikipedia: 10 subjects, 14 raters, 5 categories, κ = 0.210.
    table = [[0, 0, 0, 0, 14], [0, 2, 6, 4, 2], [0, 0, 3, 5, 6], [0, 3, 9, 2, 0], [2, 2, 8, 1, 1],
             [7, 7, 0, 0, 0], [3, 2, 6, 3, 0], [2, 5, 3, 2, 2], [6, 5, 2, 1, 0], [0, 2, 2, 3, 7]]
    assert fleiss_kappa(table) == pytest.approx(0.20993, abs=1e-4)


def test_fleiss_kappa_with_two_raters_and_varying_counts() -> None:
    # two raters, 4 units: agree, agree, disagree, agree (categories accept/reject)
    table = [[2, 0], [0, 2], [1, 1], [2, 0]]
    # P_i = 1, 1, 0, 1 → P̄ = 0.75; p = (5/8, 3/8) → P_e = 34/64; κ = (0.75 - 0.53125) / 0.46875
    assert fleiss_kappa(table) == pytest.approx((0.75 - 34 / 64) / (30 / 64))
    # a unit with a single rating is left out; a 3-rater unit is weighted by its own n_i
    assert fleiss_kappa([*table, [1, 0]]) == pytest.approx(fleiss_kappa(table))
    varying = [[3, 0], [1, 1]]  # P_i = 1, 0 → P̄ 0.5; p = (4/5, 1/5) → P_e = 17/25
    assert fleiss_kappa(varying) == pytest.approx((0.5 - 17 / 25) / (8 / 25))
    assert math.isnan(fleiss_kappa([[2, 0], [3, 0]]))
    assert math.isnan(fleiss_kappa([[1, 0]]))


def test_dice_and_consensus() -> None:
    a = np.zeros((4, 5), bool)
    b = np.zeros((4, 5), bool)
    a[0, :4] = True   # 4 pixels
    b[0, 2:] = True   # 3 pixels, 2 shared → 2·2 / 7
    assert dice(a, b) == pytest.approx(4 / 7)
    assert dice(np.zeros((2, 2), bool), np.zeros((2, 2), bool)) == 1.0
    with pytest.raises(ValueError):
        dice(a, b[:2])
    assert consensus([]) == ""
    assert consensus(["accept", "correct", "reject"]) == "accept"
    assert consensus(["accept", "reject"]) == "reject"  # a tie rejects
    assert consensus(["reject", "reject", "accept"]) == "reject"


def _r(key: str, reviewer: str, decision: str, lesion: str = "edema", item_type: str = "basic positive",
       kind: str = "ils", part: str = "pair") -> Rating:
    return Rating(key, part, kind, lesion, item_type, reviewer, decision)


def test_acceptance_and_pairwise_tables() -> None:
    ratings = [_r("k1", "a", "accept"), _r("k1", "b", "reject"), _r("k2", "a", "correct"), _r("k2", "b", "accept"),
               _r("k3", "a", "accept", lesion="effusion", item_type="global negative"),
               _r("c1", "a", "reject", lesion="effusion", kind="bench", part="contour_eval", item_type="RR")]
    by_lesion = acceptance_table(ratings, "lesion")
    assert by_lesion["edema"] == {"ratings": 4, "accepted": 2, "corrected": 1, "rejected": 1, "acceptance": 0.75}
    assert by_lesion["effusion"]["acceptance"] == 0.5
    by_type = acceptance_table(ratings, "item_type")
    assert set(by_type) == {"basic positive", "global negative", "contour_eval"}  # bench units by question
    pairs = pairwise_cohen(ratings)
    assert [(p["a"], p["b"], p["shared"]) for p in pairs] == [("a", "b", 2)]
    assert pairs[0]["agreement"] == 0.0
    assert pairs[0]["kappa"] == pytest.approx(cohen_kappa(["accept", "correct"], ["reject", "accept"]))


def test_rle_runs_round_trip_through_coco() -> None:
    pytest.importorskip("fastapi")
    from cxrground.review.app import rle_runs

    rng = np.random.default_rng(0)
    for shape in ((5, 7), (1, 1), (13, 4)):
        mask = rng.random(shape) > 0.6
        for m in (mask, np.ones(shape, bool), np.zeros(shape, bool)):
            runs = rle_runs(m)
            assert sum(runs) == m.size
            np.testing.assert_array_equal(decode_rle({"size": list(shape), "counts": runs}), m)


def test_card_review_section() -> None:
    plain = review_lines(None, 3)
    assert "No split has been reviewed by experts" in plain[2] and "Exclusion list: 3 studies." in plain[2]
    summary = {"source": "decisions.csv", "reviewers": ["alice", "bob"], "ratings": 10,
               "splits": {"train": {"pairs": 40, "reviewed": 4, "reviewed_share": 0.1, "accepted": 3,
                                    "acceptance": 0.75},
                          "test": {"pairs": 8, "reviewed": 0, "reviewed_share": 0.0, "accepted": 0,
                                   "acceptance": None}},
               "fleiss_kappa": 0.5, "fleiss_units": 4, "mean_cohen_kappa": 0.4, "corrected": 1,
               "consensus_rule": "majority"}
    card = "# ILS dataset card\n\n## Backends and settings\n\nx\n\n" + "\n".join(plain) + "\n"
    out = with_review_section(card, summary)
    assert out.startswith("# ILS dataset card\n\n## Backends and settings\n\nx\n\n## Review status")
    assert "No split has been reviewed" not in out and "Exclusion list: 3 studies." in out
    assert "| train | 40 | 4 | 10.0 % | 3 | 75.0 % |" in out and "| test | 8 | 0 | 0.0 % | 0 | – |" in out
    assert "Fleiss' κ 0.500 over 4 pairs" in out and "Cohen's κ 0.400" in out and "alice, bob" in out
    assert with_review_section(out, summary) == out  # idempotent
    assert "No split has been reviewed" in with_review_section(out, None)
