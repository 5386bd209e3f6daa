"""What the CheXpercept card says about drops and heart masks."""

from __future__ import annotations

from cxrground.percept.build import _reason_key
from cxrground.percept.card import heart_lines


def test_drop_reasons_group_by_cause_not_by_component():
    a = _reason_key("deformation failed: optimal_component_1 could not be deformed (§7): no overlapping anatomy")
    b = _reason_key("deformation failed: optimal_component_5 could not be deformed (§7): no overlapping anatomy")
    c = _reason_key("deformation failed: optimal_component_4 could not be deformed (§7): no anatomy got its "
                    "deformation points")
    assert a == b == "deformation failed: a component could not be deformed: no overlapping anatomy"
    assert c != a and c.endswith("no anatomy got its deformation points")
    assert _reason_key("candidate mask has no component of ≥ 1000 px after refinement (§6)") == \
        "candidate mask has no component of ≥ 1000 px after refinement"
    shapes = [_reason_key(f"deformer 'disc' returned a mask of ({n}, {n}) for a mask of (24, 24); expected the "
                          "shape of the mask it deforms") for n in (12, 13)]
    assert shapes[0] == shapes[1] == ("deformer 'disc' returned a mask of (…) for a mask of (…); expected the shape "
                                      "of the mask it deforms")  # not cut short at its first "("


def test_the_card_says_when_hearts_are_estimates():
    assert heart_lines(None) == [] and heart_lines({}) == []
    (line,) = heart_lines({"estimate": 7, "model": 2})
    assert "9 sampled positive cases" in line and "estimate 7, model 2" in line and "not a segmented heart" in line
    (line,) = heart_lines({"model": 3})
    assert "not a segmented heart" not in line


def test_the_card_counts_small_films():
    from cxrground.percept.card import size_lines

    assert size_lines([]) == []
    (line,) = size_lines([(1024, 1024), (328, 237)])
    assert "from 328×237 to 1024×1024" in line and "1 with a short side under 512 px" in line
    assert "short side" not in size_lines([(1024, 900)])[0]
