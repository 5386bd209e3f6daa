"""The built-in synthetic cohort: determinism, resume, truth/image/report consistency, CLI."""

from __future__ import annotations

import csv
import hashlib
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from cxrground.anatomy.ils_locations import ils_location_masks
from cxrground.cli import main
from cxrground.datasets.synthetic import (
    HEDGE_WORDS,
    StudyTruth,
    SynthConfig,
    generate_study,
    load_truth,
    normalise_whitespace,
    study_ids,
    summarize,
    write_cohort,
)
from cxrground.errors import ConfigError, InputError
from cxrground.io.masks import decode_rle, read_mask_png
from cxrground.vocab import ILS_LOCATION_LABELS, LESIONS, LUNG_LESIONS

SMALL = SynthConfig(width=256)
N_COHORT = 40


def _hashes(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


@pytest.fixture(scope="session")
def cohort(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("synth") / "cohort"
    write_cohort(out, N_COHORT, seed=7, config=SMALL, progress=False)
    return out


@pytest.fixture(scope="session")
def truths(cohort) -> list[StudyTruth]:
    return load_truth(cohort)


@pytest.fixture(scope="session")
def small_pair(tmp_path_factory) -> tuple[Path, Path, Path]:
    base = tmp_path_factory.mktemp("det")
    a, a2, b = base / "a", base / "a2", base / "b"
    write_cohort(a, 4, seed=3, config=SMALL, progress=False)
    write_cohort(a2, 4, seed=3, config=SMALL, progress=False)
    write_cohort(b, 6, seed=3, config=SMALL, progress=False)
    return a, a2, b


# --- determinism, ids, resume ---------------------------------------------------------------------

def test_same_seed_gives_byte_identical_files(small_pair):
    a, a2, _ = small_pair
    ha, ha2 = _hashes(a), _hashes(a2)
    assert ha == ha2
    kinds = {Path(k).suffix for k in ha}
    assert {".jpg", ".png", ".txt", ".json", ".csv", ".md"} <= kinds


def test_different_seed_differs():
    s3 = generate_study(3, 0, SMALL)
    s4 = generate_study(4, 0, SMALL)
    assert s3.truth.study_id != s4.truth.study_id
    assert s3.report != s4.report
    assert s3.image.shape != s4.image.shape or not np.array_equal(s3.image, s4.image)


def test_study_is_independent_of_cohort_size(small_pair):
    a, _, b = small_pair
    ha, hb = _hashes(a), _hashes(b)
    per_study = {k: v for k, v in ha.items() if k.startswith(("files/", "masks/", "truth/"))}
    assert per_study and all(hb.get(k) == v for k, v in per_study.items())
    assert len([k for k in hb if k.startswith("truth/")]) == 6


def test_ids_are_mimic_like_and_unique():
    ids = [study_ids(11, i) for i in range(300)]
    assert len({i.study_id for i in ids}) == 300
    assert len({i.dicom_id for i in ids}) == 300
    for i in ids:
        assert re.fullmatch(r"p1\d{7}", i.subject_id)
        assert re.fullmatch(r"s5\d{7}", i.study_id)
        assert re.fullmatch(r"([0-9a-f]{8}-){4}[0-9a-f]{8}", i.dicom_id)
    # some subjects have several studies; the later ones have a prior
    assert len({i.subject_id for i in ids}) < 300
    assert any(i.has_prior for i in ids)
    assert study_ids(11, 5) == ids[5]


def test_resume_regenerates_exactly_the_missing_study(small_pair, tmp_path):
    a, _, _ = small_pair
    work = tmp_path / "resume"
    shutil.copytree(a, work)
    before = _hashes(work)
    victim = sorted((work / "truth").glob("*.json"))[1]
    victim.unlink()
    summary = write_cohort(work, 4, seed=3, config=SMALL, progress=False)
    assert (summary.n_generated, summary.n_skipped, summary.n_studies) == (1, 3, 4)
    assert _hashes(work) == before


def test_other_seed_in_same_folder_is_refused_unless_overwrite(small_pair, tmp_path):
    a, _, _ = small_pair
    work = tmp_path / "foreign"
    shutil.copytree(a, work)
    with pytest.raises(ConfigError, match="another cohort"):
        write_cohort(work, 2, seed=4, config=SMALL, progress=False)
    summary = write_cohort(work, 2, seed=4, config=SMALL, overwrite=True, progress=False)
    assert summary.n_studies == 2
    assert {t.seed for t in load_truth(work)} == {4}
    assert len(list((work / "files").rglob("*.jpg"))) == 2


def test_png_format_and_config_round_trip(tmp_path):
    cfg = SynthConfig(width=128, format="png")
    assert SynthConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
    write_cohort(tmp_path / "png", 1, seed=0, config=cfg, progress=False)
    (truth,) = load_truth(tmp_path / "png")
    assert truth.image_path.endswith(".png")
    with Image.open(tmp_path / "png" / truth.image_path) as im:
        assert im.mode == "L" and im.size == (truth.width, truth.height)
    with pytest.raises(ConfigError):
        SynthConfig(format="tiff")
    with pytest.raises(ConfigError):
        SynthConfig(prevalence={"nodule": 0.5})


# --- cohort contents ------------------------------------------------------------------------------

def test_layout_index_and_metadata(cohort, truths):
    assert len(truths) == N_COHORT
    rows = list(csv.DictReader((cohort / "index.csv").open()))
    assert list(rows[0]) == ["subject_id", "study_id", "dicom_id", "view", "image_path", "report_path",
                             "height", "width"]
    assert [r["study_id"] for r in rows] == [t.study_id for t in truths]
    for r, t in zip(rows, truths, strict=True):
        assert r["image_path"] == f"files/{t.subject_id[:3]}/{t.subject_id}/{t.study_id}/{t.dicom_id}.jpg"
        assert r["report_path"] == f"files/{t.subject_id[:3]}/{t.subject_id}/{t.study_id}.txt"
        with Image.open(cohort / r["image_path"]) as im:
            assert im.size == (int(r["width"]), int(r["height"])) == (t.width, t.height)
        assert t.synthetic is True
    meta = json.loads((cohort / "cohort.json").read_text())
    assert meta["n_studies"] == N_COHORT and meta["seed"] == 7 and meta["synthetic"] is True
    assert meta["config"]["width"] == 256
    readme = (cohort / "README.md").read_text()
    assert "synthetic test data" in readme.lower() and "seed 7" in readme
    with Image.open(cohort / "preview.png") as im:
        assert im.mode == "RGB" and im.size[0] == 1024


def test_cohort_covers_every_lesion_and_variation(truths):
    summary = summarize_truths(truths)
    for lesion in LESIONS:
        assert summary[lesion] > 0, f"{lesion} never drawn"
    findings = [f for t in truths for f in t.findings]
    assert any(f.certainty == "tentative" for f in findings)
    assert any(f.present and not f.reported for f in findings)
    assert any(f.negated for f in findings)
    assert any(t.normal for t in truths)
    assert {t.view for t in truths} == {"PA", "AP"}
    assert any(t.height != t.width for t in truths)
    assert any(not t.has_findings_section for t in truths)
    assert {t.heart_status for t in truths} == {"normal", "borderline", "enlarged"}


def summarize_truths(truths: list[StudyTruth]) -> dict[str, int]:
    return {lesion: sum(1 for t in truths for f in t.present_findings if f.lesion == lesion) for lesion in LESIONS}


def test_summarize_matches_truth(cohort, truths):
    s = summarize(cohort)
    assert s["n_studies"] == N_COHORT
    counts = summarize_truths(truths)
    assert {k: v["present"] for k, v in s["lesions"].items()} == counts
    assert s["widths"] == [256, 256] and 224 <= s["heights"][0] <= s["heights"][1] <= 288


def _masks(cohort: Path, t: StudyTruth) -> dict[str, np.ndarray]:
    return {name: read_mask_png(cohort / ref.path, (t.height, t.width)) for name, ref in t.anatomy.items()}


def test_anatomy_orientation_and_ctr(cohort, truths):
    for t in truths:
        m = _masks(cohort, t)
        right, left, heart = m["right_lung"], m["left_lung"], m["heart"]
        assert right.any() and left.any() and heart.any()
        assert not (right & left).any() and not (heart & (right | left)).any()
        cx_r = np.nonzero(right)[1].mean()
        cx_l = np.nonzero(left)[1].mean()
        assert cx_r < t.width / 2 < cx_l, "the right lung must be on the image left"
        cols_h = np.flatnonzero(heart.any(axis=0))
        cols_l = np.flatnonzero((right | left).any(axis=0))
        ctr = (cols_h[-1] - cols_h[0] + 1) / (cols_l[-1] - cols_l[0] + 1)
        assert ctr == pytest.approx(t.ctr, abs=1e-4)
        # heart offset to the image right (patient's left)
        assert np.nonzero(heart)[1].mean() > t.width / 2
        if t.heart_status == "normal":
            assert t.ctr <= 0.45
        elif t.heart_status == "borderline":
            assert 0.45 < t.ctr <= 0.5
        else:
            assert t.ctr > 0.5
        if t.normal:
            assert t.heart_status == "normal" and not t.present_findings
        assert ("cardiomegaly" in t.lesions_present) == (t.heart_status == "enlarged")


def test_lesion_masks_are_consistent(cohort, truths):
    contrast: dict[str, list[float]] = {lesion: [] for lesion in LESIONS}
    for t in truths:
        m = _masks(cohort, t)
        lungs = m["right_lung"] | m["left_lung"]
        locs = ils_location_masks(m["right_lung"], m["left_lung"])
        with Image.open(cohort / t.image_path) as im:
            img = np.asarray(im.convert("L"), dtype=np.float32)
        all_lesions = np.zeros_like(lungs)
        masks = {}
        for f in t.present_findings:
            assert f.mask is not None and f.mask_index is not None
            assert f.mask.path == f"masks/{t.study_id}/lesion_{f.mask_index}_{f.lesion}.png"
            mask = read_mask_png(cohort / f.mask.path, (t.height, t.width))
            assert np.array_equal(mask, decode_rle(f.mask.rle, (t.height, t.width)))
            assert mask.any() and int(mask.sum()) == f.mask.area
            masks[f.mask_index] = mask
            all_lesions |= mask
        assert sorted(masks) == list(range(len(masks)))
        free_lung = lungs & ~all_lesions
        for f in t.present_findings:
            mask = masks[f.mask_index]
            if f.lesion == "cardiomegaly":
                assert np.array_equal(mask, m["heart"]) and f.overlap_location == ["heart"]
                assert img[mask].mean() > img[lungs].mean() + 40
                continue
            assert not (mask & ~lungs).any(), f"{t.study_id} {f.lesion} leaves the lungs"
            expected = [lab for lab in ILS_LOCATION_LABELS if (locs[lab] & mask).any()]
            assert f.overlap_location == expected
            if free_lung.sum() > 0.3 * lungs.sum():
                contrast[f.lesion].append(float(img[mask].mean() - img[free_lung].mean()))
            if f.lesion == "effusion":
                for side in ("right", "left"):
                    lung = m[f"{side}_lung"]
                    part = mask & lung
                    if part.any():
                        lowest = np.flatnonzero(lung.any(axis=1))[-1]
                        assert part[lowest - 1 :].any(), "an effusion fills the costophrenic angle"
                        assert f"{side} lung base" in f.overlap_location
            else:
                assert f.lesion in LUNG_LESIONS
    # lesions are added radiodensity: brighter than the lesion-free lung on average
    for lesion, values in contrast.items():
        if lesion != "cardiomegaly" and values:
            assert np.mean(values) > 10, (lesion, values)
            assert np.mean(np.array(values) > 0) >= 0.8, (lesion, values)


def test_reports_match_truth(cohort, truths):
    for t in truths:
        text = (cohort / t.report_path).read_text()
        flat = normalise_whitespace(text)
        assert text.lstrip().startswith("FINAL REPORT")
        assert "EXAMINATION:" in text and "INDICATION:" in text and "___" in text and "IMPRESSION:" in text
        assert ("FINDINGS:" in text) == t.has_findings_section
        findings_part = flat.split("IMPRESSION:")[0]
        for f in t.findings:
            if not f.reported:
                assert f.sentence is None and f.certainty is None
                continue
            assert f.sentence and normalise_whitespace(f.sentence) in flat
            if f.section == "findings":
                assert f.sentence in findings_part
            low = f.sentence.lower()
            if f.present:
                if f.certainty == "tentative":
                    assert any(w in low for w in HEDGE_WORDS), f.sentence
                else:
                    assert not any(re.search(rf"\b{w}\b", low) for w in HEDGE_WORDS), f.sentence
                if f.location_phrase:
                    assert f.location_phrase.lower() in low
                if f.impression_sentence:
                    assert f.impression_sentence in flat
            else:
                assert re.search(r"\b(no|without|not)\b", low), f.sentence
                assert f.lesion not in t.lesions_present


def test_truth_round_trip(truths):
    t = truths[0]
    assert StudyTruth.from_dict(json.loads(json.dumps(t.to_dict()))) == t


# --- CLI ------------------------------------------------------------------------------------------

def test_cli_synth_and_info(tmp_path):
    runner = CliRunner()
    out = tmp_path / "cli"
    res = runner.invoke(main, ["synth", "--out", str(out), "--studies", "3", "--seed", "5", "--width", "128",
                               "--quiet"])
    assert res.exit_code == 0, res.output
    assert "3 studies" in res.output and "index.csv" in res.output and "preview.png" in res.output
    res = runner.invoke(main, ["synth-info", str(out)])
    assert res.exit_code == 0, res.output
    for lesion in LESIONS:
        assert lesion in res.output
    res = runner.invoke(main, ["synth-info", str(out), "--json"])
    assert res.exit_code == 0 and json.loads(res.output)["n_studies"] == 3
    res = runner.invoke(main, ["synth", "--out", str(out), "--studies", "2", "--seed", "6", "--width", "128",
                               "--quiet"])
    assert res.exit_code != 0 and "another cohort" in res.output


def test_cli_synth_refuses_a_folder_holding_other_files(tmp_path):
    mine = tmp_path / "project"
    mine.mkdir()
    (mine / "README.md").write_text("my notes\n")
    res = CliRunner().invoke(main, ["synth", "--out", str(mine), "--studies", "1", "--width", "128", "--quiet"])
    assert res.exit_code != 0 and "holds no synthetic cohort" in res.output and "README.md" in res.output
    assert (mine / "README.md").read_text() == "my notes\n" and sorted(p.name for p in mine.iterdir()) == ["README.md"]
    cut = tmp_path / "cut"  # a cohort killed before its index files: only study folders, resumed
    (cut / "files").mkdir(parents=True)
    res = CliRunner().invoke(main, ["synth", "--out", str(cut), "--studies", "1", "--width", "128", "--quiet"])
    assert res.exit_code == 0, res.output


def test_a_cohort_of_other_settings_is_refused_naming_each_setting_that_differs(small_pair, tmp_path):
    """Extending a cohort with another seed, width or format: the error names each requested value beside the
    cohort's and the --overwrite option; --studies 0 is refused at the option; a damaged truth record says to delete
    it; a folder holding only hidden files (.DS_Store) takes a cohort."""
    a, _, _ = small_pair
    with pytest.raises(ConfigError, match=r"other settings: --seed 4 \(the cohort's: 3\); .* add --overwrite"):
        write_cohort(a, 4, seed=4, config=SMALL, progress=False)
    with pytest.raises(ConfigError, match=r"other settings: --width 128 \(the cohort's: 256\), --format png \(the "
                                          r"cohort's: jpg\);"):
        write_cohort(a, 4, seed=3, config=SynthConfig(width=128, format="png"), progress=False)
    res = CliRunner().invoke(main, ["synth", "--out", str(tmp_path / "zero"), "--studies", "0"])
    assert res.exit_code == 2 and "0 is not in the range x>=1" in res.output and not (tmp_path / "zero").exists()
    work = tmp_path / "damaged"
    shutil.copytree(a, work)
    victim = sorted((work / "truth").glob("*.json"))[0]
    victim.write_text("{}")
    with pytest.raises(InputError, match="delete this file and rerun the command to write the study again"):
        write_cohort(work, 4, seed=3, config=SMALL, overwrite=True, progress=False)
    (tmp_path / "hidden").mkdir()
    (tmp_path / "hidden" / ".DS_Store").write_bytes(b"\x00")
    assert write_cohort(tmp_path / "hidden", 1, seed=3, config=SMALL, progress=False).n_studies == 1
