"""ILS negatives placed by the image (``--negative-check``): lung-lesion negatives never name a flagged Brixia zone,
a global lung-lesion negative is not emitted while a zone is flagged, effusion and cardiomegaly negatives are
untouched, placed and dropped negatives are counted (unit and card), builds stay deterministic, and a build without
flags is the one it always was."""

from __future__ import annotations

import json

import pytest

from cxrground.ils.compose import NegativePlacement, compose_pairs
from cxrground.ils.config import IlsConfig
from cxrground.ils.zone_map import OPACITY_TARGETS, brixia_zones, dropped_by_reader, placed_by_reader, zones_of
from cxrground.lesions.zone_prior import ZONE_PRIOR_READER
from cxrground.reports.findings import Finding
from cxrground.vocab.locations import BOTH_LUNGS

READER = ZONE_PRIOR_READER
#: Many study keys: the seeded draws cover every region, form and lesion.
KEYS = [f"s{i}" for i in range(300)]
#: A global share of 1 for every lesion: every negative of a lesion not mentioned takes the global form.
ALL_GLOBAL = {k: 1.0 for k in ("cardiomegaly", "pneumonia", "atelectasis", "opacity", "consolidation", "edema",
                                "effusion")}


def flags(*zones: str) -> dict[str, bool]:
    return {z: z in zones for z in "ABCDEF"}


def negatives(key: str, placement: NegativePlacement | None, config: IlsConfig | None = None,
              findings: list[Finding] | None = None):
    return compose_pairs(key, findings or [], [], [], 0.4, None, config or IlsConfig(), placement)


def checked(pair) -> bool:
    return pair["target"] in OPACITY_TARGETS


def test_brixia_mapping_of_labels():
    assert brixia_zones(["right lung"]) == ["A", "B", "C"]
    assert brixia_zones([BOTH_LUNGS]) == list("ABCDEF")
    assert brixia_zones(["left apical zone lung", "right lung base"]) == ["C", "D"]
    assert zones_of("left lung") == ["left upper zone lung", "left mid zone lung", "left lung base"]


@pytest.mark.parametrize("flagged", [("C", "F"), ("A",), ("B", "C", "E", "F"), ("A", "B", "C", "D", "E")])
def test_checked_negatives_never_name_a_flagged_zone(flagged):
    placement = NegativePlacement(flags(*flagged), READER)
    placed = 0
    for key in KEYS:
        out = negatives(key, placement)
        for pair in out.negative_pairs:
            if checked(pair):
                assert not set(brixia_zones(pair["location"])) & set(flagged), (key, pair)
        placed += out.placed.get(placed_by_reader(READER), 0)
    assert placed > 0  # the seeded draws did land on flagged zones, and were moved


def test_effusion_and_cardiomegaly_negatives_are_untouched():
    placement = NegativePlacement(flags("A", "B", "C", "D", "E", "F"), READER)
    seen = set()
    for key in KEYS[:100]:
        plain = negatives(key, None).negative_pairs
        placed = negatives(key, placement).negative_pairs
        keep = [p for p in plain if not checked(p)]
        assert [(p["instruction"], p["location"]) for p in placed] == [(p["instruction"], p["location"]) for p in keep]
        seen |= {p["target"] for p in keep}
    assert seen == {"effusion", "cardiomegaly"}


def test_no_global_lung_lesion_negative_while_a_zone_is_flagged():
    config = IlsConfig(negative_global_share=ALL_GLOBAL)
    plain = negatives("s1", None, config).negative_pairs
    assert any(p["type"] == "global" and p["location"] == [BOTH_LUNGS] and checked(p) for p in plain)
    out = negatives("s1", NegativePlacement(flags("F"), READER), config)
    lung = [p for p in out.negative_pairs if checked(p)]
    assert lung and all(p["type"] == "basic" and "F" not in brixia_zones(p["location"]) for p in lung)
    assert [p["type"] for p in out.negative_pairs if not checked(p)] == ["global", "global"]  # heart, effusion
    assert out.placed[placed_by_reader(READER)] == len(lung)
    unflagged = negatives("s1", NegativePlacement(flags(), READER), config).negative_pairs
    assert unflagged == plain  # nothing flagged: the global form stays


def test_dropped_only_when_no_unflagged_region_is_left():
    everything = NegativePlacement(flags(*"ABCDEF"), READER)
    out = negatives("s1", everything)
    plain = negatives("s1", None)
    lost = sum(checked(p) for p in plain.negative_pairs)
    assert lost > 0 and not any(checked(p) for p in out.negative_pairs)
    assert out.dropped == {dropped_by_reader(READER): lost} and not out.placed
    # empty locations restricted to flagged zones: no region is left for a lesion already reported
    pn = Finding("pneumonia", 1, "present", "pneumonia", (), ("right lung base",))
    el = ["right lung base", "left lung base"]
    out = compose_pairs("s2", [pn], [], el, 0.4, None, IlsConfig(), NegativePlacement(flags("C", "F"), READER))
    assert not any(checked(p) for p in out.negative_pairs) and out.dropped[dropped_by_reader(READER)] >= 1


def test_placement_is_deterministic_and_leaves_unflagged_negatives_as_they_were():
    placement = NegativePlacement(flags("B", "C"), READER)
    for key in KEYS[:100]:
        a, b = negatives(key, placement), negatives(key, placement)
        assert a.negative_pairs == b.negative_pairs and a.placed == b.placed and a.dropped == b.dropped
        plain = {p["target"]: p for p in negatives(key, None).negative_pairs}
        for p in a.negative_pairs:
            q = plain[p["target"]]
            if not checked(q) or not set(brixia_zones(q["location"])) & {"B", "C"}:
                assert p == q  # a negative the flags do not touch is the unchecked build's, same draw


def test_no_flags_or_no_placement_composes_as_without_the_check():
    for key in KEYS[:100]:
        plain = negatives(key, None)
        quiet = negatives(key, NegativePlacement(flags(), READER))
        assert quiet.negative_pairs == plain.negative_pairs and not quiet.placed and not quiet.dropped


class _FlagReader:
    """Stands in for the shipped ``zone_prior_v1`` reader: fixed negative flags."""

    flag = 0.5

    def __init__(self, zones: str) -> None:
        self.zones = zones

    def read_film(self, pixels, right, left, heart):
        return _FlagReading(self.zones)


class _FlagReading:
    def __init__(self, zones: str) -> None:
        self.zones = zones

    def negative_flags(self, threshold):
        return flags(*self.zones)


def _units(out):
    return [json.loads(p.read_text()) for p in sorted((out / "units").glob("*.json"))]


def _pairs(out):
    """(positive pairs, negative pairs) of a build, in dataset order."""
    data = json.loads((out / "mimic_ils_instruction_answer.json").read_text())
    studies = [s for split in data.values() for s in split.values()]
    return ([p for s in studies for p in s["instruction_answer_pairs"]["positive_pairs"]],
            [p for s in studies for p in s["instruction_answer_pairs"]["negative_pairs"]])


def test_ils_build_places_negatives_counts_them_on_the_card_and_none_is_unchanged(tmp_path, monkeypatch,
                                                                                  build_tiny_ils):
    from cxrground.lesions import zone_prior

    def build(name, check):
        return build_tiny_ils(tmp_path / name, negative_check=check)

    plain, again = build("plain", "none"), build("again", "none")
    assert (plain / "mimic_ils_instruction_answer.json").read_bytes() == \
        (again / "mimic_ils_instruction_answer.json").read_bytes()
    assert "placed away" not in (plain / "card.md").read_text()
    monkeypatch.setattr(zone_prior, "shipped_reader", lambda name="zone_prior_v1": _FlagReader("BCEF"))
    placed_dir, twice = build("placed", "zone_prior_v1"), build("twice", "zone_prior_v1")
    assert (placed_dir / "mimic_ils_instruction_answer.json").read_bytes() == \
        (twice / "mimic_ils_instruction_answer.json").read_bytes()
    _, negs = _pairs(placed_dir)
    assert negs and not any(checked(n) and set(brixia_zones(n["location"])) & set("BCEF") for n in negs)
    n_placed = sum(u.get("placed_negatives", {}).get(placed_by_reader(READER), 0) for u in _units(placed_dir))
    assert n_placed > 0
    card = (placed_dir / "card.md").read_text()
    assert f"| {placed_by_reader(READER)} | {n_placed} |" in card


def test_the_negative_check_reader_follows_the_option():
    from cxrground.errors import ConfigError
    from cxrground.lesions.zone_prior import shipped_reader

    assert IlsConfig(negative_check="zone_prior_v2").negative_check == "zone_prior_v2"
    with pytest.raises(ConfigError, match="unknown negative check"):
        IlsConfig(negative_check="zone_prior_v9")
    assert shipped_reader("zone_prior_v1").severity is None
    assert shipped_reader("zone_prior_v2").severity is not None
    assert shipped_reader("zone_prior_v3").severity != shipped_reader("zone_prior_v2").severity
    with pytest.raises(ConfigError, match="unknown position-prior zone reader"):
        shipped_reader("zone_sim_v1")


def test_ils_build_with_the_algorithm1_check_places_negatives_and_leaves_positives_alone(tmp_path, monkeypatch,
                                                                                     build_tiny_ils):
    from cxrground.ils import negative_flags

    plain_pos, _ = _pairs(build_tiny_ils(tmp_path / "plain", negative_check="none"))
    real_pos, _ = _pairs(build_tiny_ils(tmp_path / "real", negative_check="algorithm1"))
    assert real_pos == plain_pos  # the check reads the film; it never touches a positive
    monkeypatch.setattr(negative_flags, "algorithm1_flags", lambda *a, **k: {z: z in "BCEF" for z in "ABCDEF"})
    placed = build_tiny_ils(tmp_path / "placed", negative_check="algorithm1")
    pos, negs = _pairs(placed)
    assert pos == plain_pos and negs
    assert not any(checked(n) and set(brixia_zones(n["location"])) & set("BCEF") for n in negs)
    assert placed_by_reader("algorithm1") in (placed / "card.md").read_text()
