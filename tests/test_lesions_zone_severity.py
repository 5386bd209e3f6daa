"""The zone reader ``zone_prior_v2``: its film severity model (file, validation, formula, the recipe's choices),
that it listens to the lesion segmenter where ``zone_prior_v1`` does not, and ``anatomy zones --zone-model
zone_prior_v2`` on a tiny folder."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from cxrground.errors import ConfigError, InputError
from cxrground.lesions.zone_prior import (
    ZONE_PRIOR_READER,
    ZONE_PRIOR_V2_READER,
    PriorZoneReader,
    ZonePrior,
    combine,
)
from cxrground.lesions.zone_severity import (
    SEVERITY_CLIP,
    SeverityModel,
    logit,
    select_model,
    severity_features,
    shipped_severity_path,
    weighted_youden,
)
from masks_helpers import TOY_H, TOY_W, toy_lungs

BASAL = np.array([0.1, 0.15, 0.25, 0.1, 0.15, 0.25])
SIM = np.array([0.3, 0.3, 0.35, 0.3, 0.3, 0.35])


def _model(**kw) -> SeverityModel:
    args = {"features": ("logit_mean_sim", "max_share"), "coef": (1.0, 4.0), "intercept": 0.0, "threshold": 0.5}
    return SeverityModel(**{**args, **kw})


def test_severity_model_round_trip(tmp_path):
    model = _model(meta={"data": "test"})
    loaded = SeverityModel.load(model.save(tmp_path / "s.json"))
    assert loaded.features == model.features and loaded.coef == model.coef and loaded.threshold == 0.5
    assert loaded.meta["data"] == "test" and loaded.meta["path"].endswith("s.json")
    share = np.array([0.0, 0.1, 0.4, 0.0, 0.0, 0.2])
    assert np.allclose(loaded.severity(SIM, share), model.severity(SIM, share))


@pytest.mark.parametrize(("body", "error", "match"), [
    ({}, InputError, "not a severity model"),
    ({"features": ["max_share"], "coef": ["x"], "intercept": 0, "threshold": 0.5}, InputError, "not a severity"),
    ({"features": ["max_share"], "coef": [1.0], "intercept": 0, "threshold": 1.5}, ConfigError, "threshold"),
    ({"features": ["lesion_volume"], "coef": [1.0], "intercept": 0, "threshold": 0.5}, ConfigError, "features"),
    ({"features": ["max_share"], "coef": [1.0, 2.0], "intercept": 0, "threshold": 0.5}, ConfigError,
     "coefficients"),
    ({"features": ["max_share"], "coef": [1.0], "intercept": 0, "threshold": 0.5, "clip": 0}, ConfigError, "clip"),
])
def test_severity_model_file_errors(tmp_path, body, error, match):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(body))
    with pytest.raises(error, match=match):
        SeverityModel.load(path)


def test_severity_model_missing_file(tmp_path):
    with pytest.raises(InputError, match="not found"):
        SeverityModel.load(tmp_path / "missing.json")


def test_severity_is_the_logit_over_the_threshold_clipped():
    share = np.array([0.0, 0.1, 0.4, 0.0, 0.0, 0.2])
    model = _model(threshold=0.6)
    expected = logit(SIM.mean()) + 4.0 * 0.4 - logit(0.6)
    assert np.isclose(model.severity(SIM, share), expected)
    films = model.severity(np.stack([SIM, SIM]), np.stack([share, 10 * share]))
    assert films.shape == (2,) and np.isclose(films[0], expected) and films[1] == SEVERITY_CLIP
    assert severity_features(SIM, share, ("mean_share", "max_share")).tolist() == [share.mean(), 0.4]
    with pytest.raises(ValueError, match="six zones"):
        model.severity(SIM[:5], share[:5])


def test_combine_takes_a_given_severity():
    share = np.zeros(6)
    v1 = combine(SIM, share, 0.5, BASAL)
    assert np.allclose(combine(SIM, share, 0.5, BASAL, severity=logit(SIM.mean()) - logit(0.5)), v1)
    assert np.all(combine(SIM, share, 0.5, BASAL, severity=3.0) > 0.9)
    with pytest.raises(ValueError, match="one severity per film"):
        combine(np.stack([SIM, SIM]), np.stack([share, share]), 0.5, BASAL, severity=np.zeros(3))


class _StubClassifier:
    feature_names = ("z_mean",)
    threshold = 0.5

    @property
    def meta(self) -> dict:
        return {}

    def probability(self, x: np.ndarray) -> np.ndarray:
        return SIM


class _StubLesion:
    def __init__(self, share: float) -> None:
        self.share = share

    def read(self, pixels, right, left, heart):
        scores = dict.fromkeys("ABCDEF", self.share)
        return scores, {z: v >= 0.1 for z, v in scores.items()}, np.zeros(np.shape(pixels), np.float32)

    def provenance(self) -> dict:
        return {}


def test_v2_listens_to_the_lesion_segmenter_where_v1_does_not():
    """Same zone_sim_v1 reading, disease painted evenly over all six zones: v1's severity and zone evidence do not
    see it (the within-film evidence of equal shares is 0), v2's severity does and flags the zones."""
    from cxrground.lesions.normative import NormativeModel

    right, left = toy_lungs()
    film = np.where(right | left, 60, 190).astype(np.uint8)
    prior = ZonePrior(dict(zip("ABCDEF", BASAL / BASAL.sum(), strict=True)))

    def read(share: float, severity: SeverityModel | None):
        reader = PriorZoneReader(prior, _StubLesion(share), NormativeModel.load(), _StubClassifier(),
                                 severity=severity)
        return reader, reader.read_film(film, right, left, None)

    _, v1_clear = read(0.0, None)
    v1, v1_sick = read(0.6, None)
    _, v2_clear = read(0.0, _model())
    v2, v2_sick = read(0.6, _model())
    assert np.allclose(v1_clear.probability, v1_sick.probability) and not any(v1_sick.flags().values())
    assert np.all(v2_sick.probability > v2_clear.probability) and all(v2_sick.flags().values())
    assert np.isclose(v2_sick.severity, _model().severity(SIM, np.full(6, 0.6)))
    assert v1.reader_id == ZONE_PRIOR_READER and v2.reader_id == ZONE_PRIOR_V2_READER
    assert v2.name().startswith(ZONE_PRIOR_V2_READER) and v2.provenance()["severity"]["features"] == [
        "logit_mean_sim", "max_share"]
    # the ILS negative check keeps its meaning for both: flagged zones of a film where the segmenter finds a lesion
    assert v2.negative_flags(film, right, left, None) == v2_sick.flags()


def test_weighted_youden_and_model_choice_on_separable_rows():
    rng = np.random.default_rng(0)
    n = 120
    y = np.arange(n) % 2 == 1
    share = np.where(y[:, None], 0.3, 0.02) + rng.uniform(0, 0.05, (n, 6))
    sim = np.clip(0.4 + rng.normal(0, 0.1, (n, 6)), 0.01, 0.99)  # no signal in zone_sim
    w = np.where(y, 1.0, 3.0)
    threshold, j = weighted_youden(np.where(y, 0.8, 0.2), y, w)
    assert threshold == 0.8 and j == 1.0
    with pytest.raises(ValueError, match="both"):
        weighted_youden(np.ones(4), np.ones(4, bool), np.ones(4))
    patients = [f"p{i // 2}" for i in range(n)]
    chosen, scores = select_model(sim, share, y.astype(float), w, patients,
                                  [("logit_mean_sim",), ("logit_mean_sim", "max_share")], [1.0])
    assert len(scores) == 2 and chosen.features == ("logit_mean_sim", "max_share")
    assert chosen.log_loss < min(s.log_loss for s in scores if s.features == ("logit_mean_sim",))


def test_shipped_severity_model_is_from_shippable_films_without_brixia():
    model = SeverityModel.load(shipped_severity_path())
    meta = model.meta
    assert meta["brixia_used"] is False and meta["recipe"].endswith("bench/zone_prior_v2_fit.py")
    assert not any("NC" in lic for lic in meta["licences"])
    assert set(meta["films"]) == {"no_finding", "covid", "nih_lesion"} and 0 < model.threshold < 1
    assert model.features == tuple(meta["chosen"]["features"])
    assert meta["lungs"]["name"].startswith("lung_unet") and len(meta["lungs"]["sha256"]) == 64


class _ToySegmenter:
    """Lung U-Net stand-in: the toy lungs, no heart, whatever the film."""

    name = "toy"

    def segment(self, image):
        from cxrground.anatomy.segment.base import LungHeartMasks

        right, left = toy_lungs()
        return LungHeartMasks(right, left, None, "none", self.name)


def test_cli_zone_model_zone_prior_v2_on_a_tiny_folder(tmp_path, monkeypatch):
    from click.testing import CliRunner

    import cxrground.anatomy.segment as segment
    from cxrground.cli import main
    from cxrground.io.image import write_image

    monkeypatch.setattr(segment, "get_segmenter", lambda name: _ToySegmenter())
    folder = tmp_path / "films"
    right, left = toy_lungs()
    rng = np.random.default_rng(1)
    for i in range(2):
        film = np.where(right | left, 60.0 + 40 * i, 190.0) + rng.normal(0, 3, (TOY_H, TOY_W))
        write_image(folder / f"f{i}.png", np.clip(film, 0, 255).astype(np.uint8))
    out = tmp_path / "o"
    result = CliRunner().invoke(main, ["anatomy", "zones", "--images", str(folder), "--out", str(out),
                                       "--zone-model", ZONE_PRIOR_V2_READER])
    assert result.exit_code == 0, result.output
    assert "2 images" in result.output and ZONE_PRIOR_V2_READER in result.output
    prov = json.loads((out / "zones.json").read_text())
    assert prov["reader"].startswith(ZONE_PRIOR_V2_READER) and "lesion-unet film severity" in prov["score"]
    assert prov["zone_model"]["severity"]["path"].endswith("zone_prior_v2_severity.json")
    rows = list(csv.DictReader((out / "zones.csv").open()))
    assert [r["image"] for r in rows] == ["f0.png", "f1.png"]
    for r in rows:
        for z in "ABCDEF":
            assert r[z] == str(int(float(r[f"{z}_score"]) >= 0.5))
    assert sorted(p.name for p in (out / "overlays").iterdir()) == ["f0.png", "f1.png"]


def test_zone_prior_v3_is_v2_refitted_on_the_shipped_lungs():
    from cxrground.anatomy.segment import get_segmenter
    from cxrground.lesions.zone_prior import ZONE_PRIOR_V3_READER, shipped_reader
    from cxrground.lesions.zone_severity import SEVERITY_V3_MODEL
    from cxrground.lesions.zones import resolve_zone_reader

    v2, v3 = SeverityModel.load(shipped_severity_path()), SeverityModel.load(shipped_severity_path(SEVERITY_V3_MODEL))
    assert v3.meta["recipe"].startswith(v2.meta["recipe"]) and v3.meta["brixia_used"] is False
    assert (v3.features, v3.meta["reader"]) == (tuple(v3.meta["chosen"]["features"]), ZONE_PRIOR_V3_READER)
    assert not any("NC" in lic for lic in v3.meta["licences"])
    assert v3.meta["lungs"] == get_segmenter("unet").identity() != v2.meta["lungs"]
    reader = resolve_zone_reader(ZONE_PRIOR_V3_READER)
    assert reader.reader_id == ZONE_PRIOR_V3_READER and reader.severity == v3
    assert shipped_reader(ZONE_PRIOR_V3_READER).provenance()["name"] == ZONE_PRIOR_V3_READER
