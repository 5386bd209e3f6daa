"""The position-prior zone reader ``zone_prior_v1``: the combination rule, the prior file, the reader on a film,
the ILS negative check it drives and the command-line options."""

from __future__ import annotations

import json

import numpy as np
import pytest

from cxrground.errors import ConfigError, InputError
from cxrground.ils.config import IlsConfig
from cxrground.ils.image_check import dropped_by_reader
from cxrground.lesions.zone_prior import (
    ZONE_PRIOR_READER,
    PriorReading,
    PriorZoneReader,
    ZonePrior,
    combine,
    prior_from_shares,
    shipped_prior_path,
    standardise,
)
from masks_helpers import TOY_H, TOY_W, toy_lungs

BASAL = np.array([0.1, 0.15, 0.25, 0.1, 0.15, 0.25])
UNIFORM = np.full(6, 1 / 6)


def test_combine_gives_one_probability_per_zone_deterministically():
    sim = np.array([0.2, 0.4, 0.7, 0.3, 0.5, 0.6])
    share = np.array([0.0, 0.05, 0.3, 0.0, 0.1, 0.2])
    p = combine(sim, share, 0.5, BASAL)
    assert p.shape == (6,) and np.all((p > 0) & (p < 1))
    assert np.array_equal(p, combine(sim, share, 0.5, BASAL))
    films = combine(np.stack([sim, sim[::-1]]), np.stack([share, share[::-1]]), 0.5, BASAL)
    assert films.shape == (2, 6) and np.allclose(films[0], p)
    with pytest.raises(ValueError, match="six zones"):
        combine(sim[:5], share[:5], 0.5, BASAL)


def test_the_prior_places_the_film_severity():
    """Same evidence in every zone: the prior alone orders the zones; a uniform prior would leave them equal."""
    sim, share = np.full(6, 0.5), np.zeros(6)
    p = combine(sim, share, 0.5, BASAL)
    assert p[2] > p[1] > p[0] and p[5] > p[4] > p[3]
    assert np.allclose(combine(sim, share, 0.5, UNIFORM), 0.5)


def test_the_image_sets_the_severity_and_breaks_ties_within_a_band():
    share = np.zeros(6)
    mild = combine(np.full(6, 0.2), share, 0.5, BASAL)
    sick = combine(np.full(6, 0.8), share, 0.5, BASAL)
    assert np.all(sick > mild) and (mild < 0.5).all() and (sick >= 0.5).all()
    # right base worse than left base in both readers: C above F despite the symmetric prior
    sim = np.array([0.5, 0.5, 0.7, 0.5, 0.5, 0.4])
    les = np.array([0.0, 0.0, 0.3, 0.0, 0.0, 0.05])
    p = combine(sim, les, 0.5, BASAL)
    assert p[2] > p[5]
    assert np.allclose(combine(sim, les, 0.5, BASAL, weight=0.0)[[2, 5]], combine(sim, les, 0.5, BASAL,
                                                                                   weight=0.0)[[5, 2]])


def test_standardise_is_zero_for_equal_zones():
    assert np.array_equal(standardise(np.full(6, 3.0)), np.zeros(6))
    z = standardise(np.arange(6.0))
    assert abs(z.mean()) < 1e-12 and abs(z.std() - 1) < 1e-12


def test_prior_from_shares_is_side_symmetric_and_normalised():
    lesion = np.array([[0.0, 0.1, 0.2, 0.02, 0.05, 0.4], [0.04, 0.05, 0.1, 0.0, 0.1, 0.2]])
    q = prior_from_shares(lesion)
    assert abs(q.sum() - 1) < 1e-12 and np.allclose(q[:3], q[3:]) and q[2] > q[1] > q[0]
    with pytest.raises(ValueError, match="band"):
        prior_from_shares(np.zeros((2, 6)))


def test_zone_prior_file_round_trip_and_errors(tmp_path):
    prior = ZonePrior(dict(zip("ABCDEF", BASAL / BASAL.sum(), strict=True)), {"data": "test"})
    loaded = ZonePrior.load(prior.save(tmp_path / "p.json"))
    assert np.allclose(loaded.vector, prior.vector) and loaded.meta["data"] == "test"
    with pytest.raises(ConfigError, match="sum to 1"):
        ZonePrior(dict(zip("ABCDEF", 2 * BASAL, strict=True)))
    with pytest.raises(InputError, match="not found"):
        ZonePrior.load(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(InputError, match="not a zone prior"):
        ZonePrior.load(tmp_path / "bad.json")


def test_shipped_prior_is_from_nih_films_and_orders_the_bands():
    prior = ZonePrior.load(shipped_prior_path())
    q = prior.vector
    assert q[2] > q[1] > q[0] and np.allclose(q[:3], q[3:])
    assert prior.meta["brixia_used"] is False and "NIH" in prior.meta["licence"]
    assert prior.meta["recipe"].endswith("bench/zone_prior_fit.py")
    assert prior.meta["lungs"]["name"].startswith("lung_unet") and len(prior.meta["lungs"]["sha256"]) == 64


class _FakeReader(PriorZoneReader):
    """A reader whose film reading is given (no models)."""

    def __init__(self, probability: np.ndarray, lesion_found: bool) -> None:
        self.flag = 0.5
        self._reading = PriorReading(probability, probability, np.zeros(6), np.zeros((2, 2)), lesion_found)

    def read_film(self, pixels, right, left, heart):  # type: ignore[override]
        return self._reading


def test_negative_flags_need_the_lesion_segmenter_to_find_a_lesion():
    probability = np.array([0.2, 0.6, 0.9, 0.2, 0.4, 0.7])
    flagged = _FakeReader(probability, True).negative_flags(None, None, None, None)
    assert flagged == {"A": False, "B": True, "C": True, "D": False, "E": False, "F": True}
    assert not any(_FakeReader(probability, False).negative_flags(None, None, None, None).values())


def test_negative_check_setting_is_validated():
    assert IlsConfig().negative_check == "none"
    assert IlsConfig(negative_check="zone_prior_v1").config_hash() != IlsConfig().config_hash()
    with pytest.raises(ConfigError, match="negative check"):
        IlsConfig(negative_check="other")


def test_ils_build_with_the_negative_check_drops_flagged_negatives_and_says_so(tmp_path, monkeypatch):
    from cxrground.datasets.synthetic import SynthConfig, write_cohort
    from cxrground.ils.build import BackendSpec, build_dataset
    from cxrground.ils.tasks import build_tasks
    from cxrground.lesions import zone_prior

    cohort = tmp_path / "cohort"
    write_cohort(cohort, 4, seed=7, config=SynthConfig(width=256), progress=False)
    tasks, failures = build_tasks(cohort / "files")
    spec = BackendSpec(synthesizer="pseudo-normal")
    # the fake reader stands in for the negative check only: masks come from Algorithm 1 alone in both builds
    plain = build_dataset(tasks, tmp_path / "plain", IlsConfig(seed=0, zone_guide="none"), spec,
                          scan_failures=failures, progress=False)
    monkeypatch.setattr(zone_prior, "shipped_reader", lambda name="zone_prior_v1": _FakeReader(np.full(6, 0.9), True))
    out = tmp_path / "checked"
    checked = build_dataset(tasks, out, IlsConfig(seed=0, negative_check="zone_prior_v1", zone_guide="none"), spec,
                            scan_failures=failures, progress=False)
    assert checked.failures == plain.failures == 0
    units = [json.loads(p.read_text()) for p in (out / "units").glob("*.json")]
    dropped = sum(u.get("dropped_pairs", {}).get(dropped_by_reader(ZONE_PRIOR_READER), 0) for u in units)
    assert dropped > 0 and checked.pairs == plain.pairs - dropped
    assert dropped_by_reader(ZONE_PRIOR_READER) in (out / "card.md").read_text()


def test_cli_options_name_the_reader_and_the_check():
    from click.testing import CliRunner

    from cxrground.cli import main

    runner = CliRunner()
    ils_help = runner.invoke(main, ["ils", "build", "--help"]).output
    assert "--negative-check" in ils_help and "zone_prior_v1" in ils_help
    assert "zone_prior_v3" in runner.invoke(main, ["anatomy", "zones", "--help"]).output
    bad = runner.invoke(main, ["ils", "build", "--images", ".", "--out", "x", "--negative-check", "other"])
    assert bad.exit_code != 0 and "negative-check" in bad.output


def test_anatomy_zones_resolves_the_prior_reader_and_reads_a_film():
    from cxrground.lesions.normative import NormativeModel
    from cxrground.lesions.zones import reader_name, resolve_zone_reader, zones_provenance

    reader = resolve_zone_reader(ZONE_PRIOR_READER)
    assert isinstance(reader, PriorZoneReader) and reader_name(reader).startswith(ZONE_PRIOR_READER)
    prov = zones_provenance(NormativeModel.load(), reader, 1, 0)
    assert prov["flag"] == "probability >= 0.5" and prov["zone_model"]["name"] == ZONE_PRIOR_READER
    right, left = toy_lungs()
    rng = np.random.default_rng(0)
    film = np.clip(np.where(right | left, 60.0, 190.0) + rng.normal(0, 3, (TOY_H, TOY_W)), 0, 255).astype(np.uint8)
    scores, flags, lesion_map = reader.read(film, right, left, None)
    again, _, _ = reader.read(film, right, left, None)
    assert list(scores) == list("ABCDEF") and scores == again and lesion_map.shape == film.shape
    assert all(0 < v < 1 for v in scores.values()) and flags == {z: v >= 0.5 for z, v in scores.items()}


class _StubClassifier:
    """zone_sim_v1 stand-in: fixed zone probabilities and threshold."""

    feature_names = ("z_mean",)
    threshold = 0.5

    def __init__(self, probability: np.ndarray) -> None:
        self.p = probability

    def probability(self, x: np.ndarray) -> np.ndarray:
        return self.p


class _StubLesion:
    """lesion-unet stand-in: fixed zone shares."""

    def __init__(self, share: np.ndarray) -> None:
        self.share = share

    def read(self, pixels, right, left, heart):
        scores = dict(zip("ABCDEF", (float(v) for v in self.share), strict=True))
        return scores, {z: v >= 0.1 for z, v in scores.items()}, np.zeros(np.shape(pixels), np.float32)


def test_the_reader_uses_its_prior_and_both_image_readers():
    from cxrground.lesions.normative import NormativeModel

    right, left = toy_lungs()
    film = np.where(right | left, 60, 190).astype(np.uint8)
    sim = np.array([0.6, 0.5, 0.5, 0.5, 0.5, 0.4])
    share = np.array([0.0, 0.0, 0.2, 0.0, 0.0, 0.0])

    def reader(prior, sim_p=sim, les=share):
        return PriorZoneReader(ZonePrior(dict(zip("ABCDEF", prior / prior.sum(), strict=True))), _StubLesion(les),
                               NormativeModel.load(), _StubClassifier(sim_p))

    base = reader(BASAL).read_film(film, right, left, None)
    assert base.lesion_found and np.allclose(base.sim_probability, sim) and np.allclose(base.lesion_share, share)
    assert np.allclose(base.probability, combine(sim, share, 0.5, BASAL))
    assert not np.allclose(reader(UNIFORM).read_film(film, right, left, None).probability, base.probability)
    assert not np.allclose(reader(BASAL, sim_p=sim + 0.2).read_film(film, right, left, None).probability,
                           base.probability)
    assert not np.allclose(reader(BASAL, les=share[::-1]).read_film(film, right, left, None).probability,
                           base.probability)
