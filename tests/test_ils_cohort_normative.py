"""The normative model fitted on a build's own report-normal studies: selection, shrinkage, fit once before the
workers, saved in the output folder, reused on resume, recorded on the card, fallback and pinning."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from cxrground.errors import ConfigError
from cxrground.ils.build import BackendSpec, build_dataset
from cxrground.ils.cohort_normative import FITTED_FILE, is_report_normal
from cxrground.ils.config import IlsConfig
from cxrground.ils.spatial import get_synthesizer
from cxrground.ils.tasks import build_tasks
from cxrground.lesions.normative import NormativeModel, shrink_toward
from cxrground.reports.findings import Finding

OUTPUTS = ("mimic_ils_instruction_answer.json", "masks.jsonl", "card.md", FITTED_FILE, "normative_fitted.json")


@pytest.fixture(scope="module")
def cohort(tmp_path_factory) -> Path:
    from cxrground.datasets.synthetic import SynthConfig, write_cohort

    out = tmp_path_factory.mktemp("cohort")
    write_cohort(out, 10, seed=5, config=SynthConfig(width=320, normal_fraction=0.6), progress=False)
    return out


def _spec(**options: str) -> BackendSpec:
    return BackendSpec(synthesizer="normative", synthesizer_kwargs={"min_normals": "3", **options})


def _build(cohort: Path, out: Path, spec: BackendSpec, **kwargs) -> None:
    tasks, failures = build_tasks(cohort / "files")
    build_dataset(tasks, out, IlsConfig(seed=3), spec, scan_failures=failures, progress=False, **kwargs)


def test_report_normal_means_no_finding_but_a_heart_only_one():
    def f(assertion: str, lesion: str | None) -> Finding:
        return Finding(entity="x", sent_idx=1, assertion=assertion, lesion=lesion)

    assert is_report_normal([]) and is_report_normal([f("absent", "opacity"), f("absent", None)])
    assert is_report_normal([f("present", "cardiomegaly"), f("absent", "edema")])
    assert not is_report_normal([f("uncertain", "opacity")])
    assert not is_report_normal([f("present", None)])  # a nodule, a pneumothorax: not normal lungs
    assert not is_report_normal([], reads_film=False)  # "Fever and odynophagia": says nothing about the film


def test_shrinkage_keeps_the_prior_for_a_look_alike_cohort_and_the_cohort_when_it_differs():
    prior = NormativeModel.load()
    rng = np.random.default_rng(0)
    alike = NormativeModel(prior.median + rng.normal(0, 0.01, prior.median.shape), prior.scale, 1.0)
    kept = shrink_toward(alike, prior, films=5)
    assert np.abs(kept.median - prior.median).max() < 0.005
    other = NormativeModel(prior.median - 0.2, np.maximum(prior.scale / 3, 0.02), 1.0)
    moved = shrink_toward(other, prior, films=30)
    assert np.abs(moved.median - other.median).max() < 0.01
    assert np.allclose(moved.scale, other.scale, rtol=0.1)
    weights = moved.meta["shrinkage"]["mean_prior_weight"]
    assert set(weights) == {"right", "left"} and all(0 <= w["median"] < 0.05 for w in weights.values())
    with pytest.raises(ConfigError, match="grid"):
        shrink_toward(NormativeModel(prior.median[:, :4], prior.scale[:, :4]), prior, films=5)


def test_cohort_model_outside_a_build_and_a_wrong_pin_are_errors(tmp_path):
    with pytest.raises(ConfigError, match="fitted by `ils build`"):
        get_synthesizer("normative").provenance()
    shipped = get_synthesizer("normative", model="shipped").provenance()
    assert shipped["model"]["training_data"].startswith("100 NIH")
    with pytest.raises(ConfigError, match="not the file this build fitted"):
        get_synthesizer("normative", model="shipped", sha256="0" * 64).provenance()


def test_build_fits_on_report_normal_studies_saves_reuses_and_records(cohort, tmp_path):
    out = tmp_path / "a"
    _build(cohort, out, _spec())
    meta = json.loads((out / "normative_fitted.json").read_text())
    assert meta["source"] == "cohort, shrunk toward normative_v1" and meta["films"] == len(meta["studies"]) >= 3
    assert meta["visited"] == 10 and meta["report_normal"] >= meta["films"]
    for study in meta["studies"]:  # report-normal: no reported lung finding in the cohort's truth
        truth = json.loads((cohort / "truth" / f"{study}.json").read_text())
        assert all(f["lesion"] == "cardiomegaly" for f in truth["findings"] if f["present"] and f["reported"])
    model = NormativeModel.load(out / FITTED_FILE)
    assert model.grid == (16, 8) and not np.allclose(model.median, NormativeModel.load().median)
    prov = json.loads((out / "provenance.json").read_text())
    synth = prov["backends"]["synthesizer"]
    assert synth["model"]["path"] == FITTED_FILE and synth["model"]["sha256"] == meta["sha256"]
    assert synth["settings"]["model"] == "cohort" and prov["backend_spec"]["synthesizer_kwargs"] == {"min_normals": "3"}
    assert f"Normal image: normative model `cohort, shrunk toward normative_v1`: {meta['films']} report-normal" in (
        out / "card.md").read_text()
    # elsewhere, with two workers: the same model and the same dataset, byte for byte
    pool = tmp_path / "pool"
    _build(cohort, pool, _spec(), workers=2)
    assert all((pool / name).read_bytes() == (out / name).read_bytes() for name in OUTPUTS)
    pytest.importorskip("ray")
    ray_out = tmp_path / "ray"
    _build(cohort, ray_out, _spec(), engine="ray", workers=2)
    assert all((ray_out / name).read_bytes() == (out / name).read_bytes() for name in OUTPUTS)
    # a resumed build reuses the saved model instead of fitting again
    (out / "units" / f"{meta['studies'][0]}.json").unlink()
    stamp = (out / FITTED_FILE).stat().st_mtime_ns
    _build(cohort, out, _spec())
    assert (out / FITTED_FILE).stat().st_mtime_ns == stamp
    assert all((pool / name).read_bytes() == (out / name).read_bytes() for name in OUTPUTS)


def test_too_few_normals_fall_back_to_the_shipped_model_and_pins_skip_the_fit(cohort, tmp_path):
    out = tmp_path / "few"
    _build(cohort, out, _spec(min_normals="50", max_normals="4"))
    meta = json.loads((out / "normative_fitted.json").read_text())
    assert meta["source"] == "shipped (fallback)" and "fewer than min_normals=50" in meta["note"]
    assert meta["films"] == 4  # the cap stops the reading
    assert np.allclose(NormativeModel.load(out / FITTED_FILE).median, NormativeModel.load().median, atol=1e-6)
    assert "fallback" in (out / "card.md").read_text()
    unshrunk = tmp_path / "unshrunk"
    _build(cohort, unshrunk, _spec(shrink="false"))
    assert json.loads((unshrunk / "normative_fitted.json").read_text())["source"] == "cohort"
    pinned = tmp_path / "pinned"
    _build(cohort, pinned, BackendSpec(synthesizer="normative", synthesizer_kwargs={"model": str(out / FITTED_FILE)}))
    assert not (pinned / FITTED_FILE).exists()
    assert json.loads((pinned / "provenance.json").read_text())["backends"]["synthesizer"]["model"]["sha256"] == \
        meta["sha256"]
    pseudo = tmp_path / "pseudo"
    _build(cohort, pseudo, BackendSpec(synthesizer="pseudo-normal"))
    assert not (pseudo / FITTED_FILE).exists() and "Normal image" not in (pseudo / "card.md").read_text()


def test_the_default_build_fits_the_cohort_model(cohort, tmp_path):
    """``ils build``'s default synthesizer is the normative model fitted on the build's report-normal studies."""
    assert BackendSpec().synthesizer == "normative"
    out = tmp_path / "default"
    _build(cohort, out, BackendSpec())
    meta = json.loads((out / "normative_fitted.json").read_text())
    assert meta["films"] > 0 and (out / FITTED_FILE).exists() and "Normal image" in (out / "card.md").read_text()


def test_film_score_flags_an_opacity_the_shipped_model_has_never_seen_in_normal_lungs():
    """The trim rule's score: the highest zone score under normative_v1; a dense patch lifts it over the threshold."""
    from cxrground.ils.cohort_normative import film_score

    prior = NormativeModel.load()
    yy, xx = np.mgrid[0:256, 0:256]
    right = ((yy - 128) / 90) ** 2 + ((xx - 70) / 40) ** 2 <= 1
    left = ((yy - 128) / 90) ** 2 + ((xx - 186) / 40) ** 2 <= 1
    image = np.full((256, 256), 200.0)  # mediastinum 200, evenly aerated lungs 40
    image[right | left] = 40.0
    base = film_score(prior, image, right, left)
    patch = right & (yy > 150)
    dense = image.copy()
    dense[patch] = 170.0
    assert film_score(prior, dense, right, left) > prior.zone_threshold > base


def test_trimmed_report_normal_films_are_left_out_of_the_fit_and_listed(cohort, tmp_path):
    out, untrimmed, prior_trim = tmp_path / "trim", tmp_path / "untrimmed", tmp_path / "prior"
    _build(cohort, out, _spec())
    _build(cohort, untrimmed, _spec(trim="off"))
    _build(cohort, prior_trim, _spec(trim="prior", min_normals="1"))
    meta = json.loads((out / "normative_fitted.json").read_text())
    plain = json.loads((untrimmed / "normative_fitted.json").read_text())
    threshold = NormativeModel.load().zone_threshold
    assert plain["trimmed"]["films"] == 0 and plain["settings"]["trim"] == "off"
    assert meta["settings"]["trim"] == "cohort" and meta["trimmed"]["mode"] == "cohort"
    for m in (meta, json.loads((prior_trim / "normative_fitted.json").read_text())):
        trimmed = {t["study"] for t in m["trimmed"]["studies"]}
        assert len(trimmed) == m["trimmed"]["films"]
        assert all(t["film_score"] > threshold for t in m["trimmed"]["studies"])
        assert trimmed.isdisjoint(m["studies"]) and set(m["studies"]) | trimmed == set(plain["studies"])
    with pytest.raises(ConfigError, match="trim must be one of"):
        _build(cohort, tmp_path / "bad", _spec(trim="sometimes"))


def test_the_cohort_trim_drops_the_films_its_own_fit_flags():
    """trim=cohort on cell arrays: 12 films near the prior and 2 with dense bases; the 2 are trimmed."""
    from cxrground.ils.cohort_normative import CohortNormals, trim_against_cohort

    prior = NormativeModel.load()
    rng = np.random.default_rng(1)
    cells = [prior.median + rng.normal(0, 0.3, prior.median.shape) * prior.scale for _ in range(12)]
    dense = [c.copy() for c in cells[:2]]
    for c in dense:
        c[:, 11:, :] += 6 * prior.scale[:, 11:, :]
    normals = CohortNormals(tuple(f"s{i}" for i in range(14)), tuple(cells + dense), 20, 14)
    kept = trim_against_cohort(normals, prior, shrink=True)
    assert kept.studies == tuple(f"s{i}" for i in range(12)) and [k for k, _ in kept.trimmed] == ["s12", "s13"]
    assert all(v > prior.zone_threshold for _, v in kept.trimmed)
    few = CohortNormals(("a", "b"), tuple(dense), 2, 2)
    assert trim_against_cohort(few, prior, shrink=True) == few
    with pytest.raises(ConfigError, match="do not fit"):
        prior.cell_film_score(prior.median[:, :4])
