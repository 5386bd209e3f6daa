"""End to end: `ils build` on a small synthetic cohort — outputs, schema, resume after a kill,
local-pool and Ray equality, bad inputs recorded while the rest finishes."""

from __future__ import annotations

import base64
import html
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from cxrground.cli import main
from cxrground.datasets.synthetic import SynthConfig, write_cohort
from cxrground.datasets.views import find_view_table, read_view_table, view_table_record
from cxrground.errors import ConfigError, InputError
from cxrground.ils.build import DATASET_FILE, BackendSpec, backends_identity, build_dataset
from cxrground.ils.config import IlsConfig
from cxrground.ils.gallery import render_gallery
from cxrground.ils.layout import UNITS_DIR
from cxrground.ils.quality import score_against_truth
from cxrground.ils.schema import load_dataset, validate_dataset
from cxrground.ils.tasks import DEFAULT_SPLIT_RATIOS, build_tasks, split_record
from cxrground.io.image import read_image
from cxrground.io.masks import decode_rle, read_mask_png
from cxrground.lesions.lesion_zones import central_mask
from cxrground.reports.structure import RULES_VERSION

N_STUDIES = 8
#: What ``ils build`` records of its split without a split file (the library call is told it explicitly).
HASH_SPLIT = split_record(None, DEFAULT_SPLIT_RATIOS)


def _cli_inputs(cohort: Path) -> tuple[list, list, dict]:
    """``(tasks, scan failures, build_dataset keywords)`` as ``ils build --images COHORT/files`` makes them: the
    views from the cohort's view table beside ``files/``, the subject-hash split."""
    table = find_view_table(cohort / "files")
    views = read_view_table(table)
    tasks, failures = build_tasks(cohort / "files", views=views)
    return tasks, failures, {"view_table": view_table_record(table, views), "split": HASH_SPLIT}
OUTPUTS = (DATASET_FILE, "findings.jsonl", "masks.jsonl", "anatomy.jsonl", "failures.jsonl", "card.md",
           "provenance.json")


@pytest.fixture(scope="module")
def cohort(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("cohort")
    write_cohort(out, N_STUDIES, seed=7, config=SynthConfig(width=320), progress=False)
    return out


@pytest.fixture(scope="module")
def built(cohort, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ils")
    result = CliRunner().invoke(main, ["ils", "build", "--images", str(cohort / "files"), "--out", str(out),
                                       "--quiet", "--seed", "3"])
    assert result.exit_code == 0, result.output
    return out


def _bytes(folder: Path) -> dict[str, bytes]:
    files = {name: (folder / name).read_bytes() for name in OUTPUTS if name != "provenance.json"}
    for p in sorted((folder / "lesion_mask").rglob("*.png")):
        files[str(p.relative_to(folder))] = p.read_bytes()
    return files


def test_outputs_schema_and_masks(built, cohort):
    for name in OUTPUTS:
        assert (built / name).is_file(), name
    data = load_dataset(built / DATASET_FILE)
    assert validate_dataset(data, built / "lesion_mask") == []
    studies = {k: v for split in data.values() for k, v in split.items()}
    assert studies, "no study made it into the dataset"
    n_pos = 0
    for study in studies.values():
        image = read_image(cohort / "files" / study["image_path"])
        assert study["section_content"].startswith("(1) ")
        for p in study["instruction_answer_pairs"]["positive_pairs"]:
            n_pos += 1
            mask = read_mask_png(built / "lesion_mask" / p["seg_mask_path"])
            assert mask.shape == image.shape and mask.any()  # native size, not a square canvas
        negatives = study["instruction_answer_pairs"]["negative_pairs"]
        targets = [n["target"] for n in negatives]
        assert len(targets) == len(set(targets)) <= 7
    assert n_pos > 0
    index = [json.loads(line) for line in (built / "masks.jsonl").read_text().splitlines()]
    first = index[0]
    np.testing.assert_array_equal(decode_rle(first["rle"]), read_mask_png(built / "lesion_mask" / first["path"]))
    findings = [json.loads(line) for line in (built / "findings.jsonl").read_text().splitlines()]
    expected_keys = {"study", "entity", "sent_idx", "presence", "certainty", "reported_location"}
    assert findings and expected_keys <= set(findings[0])
    card = (built / "card.md").read_text()
    assert "Mask recall" in card and "native size" in card
    assert "Quality against the synthetic cohort's exact truth" in card and "without a mask, by reason" in card
    prov = json.loads((built / "provenance.json").read_text())
    assert prov["seed"] == 3 and prov["config"]["general"]["tau_ano"] == 0.10
    assert prov["backends"]["segmenter"]


def test_lung_lesion_masks_stay_off_heart_and_mediastinum(built):
    """Every lung-lesion mask lies outside the heart outline and the mediastinum of its study's anatomy (up to
    the resampling from the working canvas to native pixels); cardiomegaly masks are the heart itself."""
    anatomy = {r["study"]: r for r in map(json.loads, (built / "anatomy.jsonl").read_text().splitlines())}
    shares = []
    for split in load_dataset(built / DATASET_FILE).values():
        for sid, study in split.items():
            a = anatomy[sid]
            centre = central_mask(decode_rle(a["right_lung"]), decode_rle(a["left_lung"]),
                                  decode_rle(a["heart"]) if a.get("heart") else None, margin=0.0)
            for p in study["instruction_answer_pairs"]["positive_pairs"]:
                if p["target"] != "cardiomegaly":
                    mask = read_mask_png(built / "lesion_mask" / p["seg_mask_path"])
                    shares.append((mask & centre).sum() / mask.sum())
    assert shares and max(shares) <= 0.01, shares


def test_stats_command_prints_tables(built, tmp_path):
    result = CliRunner().invoke(main, ["ils", "stats", str(built)])
    assert result.exit_code == 0 and "basic pos" in result.output
    result = CliRunner().invoke(main, ["ils", "stats", str(built), "--json"])
    assert result.exit_code == 0, result.output
    counts = json.loads(result.output)
    data = json.loads((built / "mimic_ils_instruction_answer.json").read_text())
    for split in ("train", "val", "test"):
        studies = data.get(split, {})
        pairs = sum(len(p) for s in studies.values() for p in s["instruction_answer_pairs"].values())
        assert counts[split]["studies"] == len(studies) and counts[split]["total"]["#IA"] == pairs
    bare = tmp_path / "bare"  # a dataset without its card: one line per split
    bare.mkdir()
    (bare / "mimic_ils_instruction_answer.json").write_text(json.dumps(data))
    lines = CliRunner().invoke(main, ["ils", "stats", str(bare)]).output.splitlines()
    assert lines[0] == f"train: {counts['train']['studies']} studies, {counts['train']['total']['#IA']} pairs"


def test_quality_against_synthetic_truth(built, cohort, tmp_path):
    scores = score_against_truth(built, cohort)
    assert scores["total"]["masks"] > 0
    assert 0.0 <= scores["total"]["gIoU"] <= 1.0
    # with the cohort's exact anatomy, cardiomegaly masks are the true hearts: IoU 1 after the round trip
    # through the working canvas and back to native pixels
    out = tmp_path / "truth-anatomy"
    result = CliRunner().invoke(main, ["ils", "build", "--images", str(cohort / "files"), "--out", str(out),
                                       "--segmenter", "masks", "--segmenter-opt", f"root={cohort / 'masks'}",
                                       "--quiet", "--seed", "3"])
    assert result.exit_code == 0, result.output
    truth_scores = score_against_truth(out, cohort)
    ca = truth_scores["per_lesion"]["cardiomegaly"]
    assert ca["masks"] > 0 and ca["gIoU"] == pytest.approx(1.0)
    assert truth_scores["total"]["negative_correct"] > 0.8
    # --json is standard JSON: a rate without a denominator is null, never NaN
    as_json = CliRunner().invoke(main, ["ils", "quality", str(out), "--cohort", str(cohort), "--json"])
    assert as_json.exit_code == 0, as_json.output
    loaded = json.loads(as_json.output, parse_constant=lambda c: pytest.fail(f"non-standard JSON constant {c}"))
    assert loaded["total"]["masks"] == truth_scores["total"]["masks"]


def test_local_pool_and_ray_give_identical_output(cohort, built, tmp_path):
    tasks, failures, inputs = _cli_inputs(cohort)
    spec, config = BackendSpec(), IlsConfig(seed=3)
    build_dataset(tasks, tmp_path / "pool", config, spec, engine="local", workers=2, scan_failures=failures,
                  progress=False, truth_cohort=cohort, **inputs)
    assert _bytes(tmp_path / "pool") == _bytes(built)
    pytest.importorskip("ray")
    build_dataset(tasks, tmp_path / "ray", config, spec, engine="ray", workers=2, scan_failures=failures,
                  progress=False, truth_cohort=cohort, **inputs)
    assert _bytes(tmp_path / "ray") == _bytes(built)


def test_resume_after_kill_gives_identical_output(cohort, built, tmp_path):
    out = tmp_path / "killed"
    cmd = [sys.executable, "-m", "cxrground", "ils", "build", "--images", str(cohort / "files"), "--out", str(out),
           "--quiet", "--seed", "3"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + 120
    while time.time() < deadline and len(list((out / "units").glob("*.json"))) < 2 and proc.poll() is None:
        time.sleep(0.05)
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    done = len(list((out / "units").glob("*.json")))
    assert 0 < done < N_STUDIES or proc.returncode == 0
    assert not (out / DATASET_FILE).exists() or proc.returncode == 0
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr[-2000:]
    assert _bytes(out) == _bytes(built)


def test_the_card_and_provenance_do_not_depend_on_how_the_image_folder_is_named(cohort, built, tmp_path, monkeypatch):
    monkeypatch.chdir(cohort.parent)
    out = tmp_path / "relative"
    result = CliRunner().invoke(main, ["ils", "build", "--images", f"{cohort.name}/files", "--out", str(out),
                                       "--quiet", "--seed", "3"])
    assert result.exit_code == 0, result.output
    assert (out / "card.md").read_text() == (built / "card.md").read_text()
    here, there = (json.loads((folder / "provenance.json").read_text()) for folder in (out, built))
    assert here["view_table"] == there["view_table"] and Path(here["view_table"]["path"]).is_absolute()


def test_an_assembly_cut_short_leaves_no_card_of_other_files(cohort, built, tmp_path, monkeypatch):
    """The card is written last and the old one removed first: a folder whose assembly was killed after the dataset
    files were replaced holds no card describing the previous build; a rerun finishes it."""
    import cxrground.ils.build as build_module

    out = tmp_path / "copy"
    shutil.copytree(built, out)
    cmd = ["ils", "build", "--images", str(cohort / "files"), "--out", str(out), "--quiet", "--seed", "3"]

    def killed(*args, **kwargs):
        raise KeyboardInterrupt  # as a kill between the dataset files and the card

    monkeypatch.setattr(build_module, "render_card", killed)
    result = CliRunner().invoke(main, cmd)
    assert result.exit_code != 0 and (out / DATASET_FILE).is_file() and not (out / "card.md").exists()
    monkeypatch.undo()
    result = CliRunner().invoke(main, cmd)
    assert result.exit_code == 0, result.output
    assert (out / "card.md").read_bytes() == (built / "card.md").read_bytes()


def test_a_damaged_unit_is_named_and_redone_once_deleted(cohort, built, tmp_path):
    out = tmp_path / "damaged"
    shutil.copytree(built, out)
    unit = sorted((out / "units").glob("*.json"))[0]
    unit.write_text('{"study": "s5')  # cut short, as a disk filling up leaves it
    cmd = ["ils", "build", "--images", str(cohort / "files"), "--out", str(out), "--quiet", "--seed", "3"]
    result = CliRunner().invoke(main, cmd)
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert f"{unit} is damaged (" in result.output and "delete it and run the same command again" in result.output
    unit.unlink()
    result = CliRunner().invoke(main, cmd)
    assert result.exit_code == 0 and "(1 processed," in result.output, result.output
    assert _bytes(out) == _bytes(built)


def test_resume_refuses_another_version_and_warns_on_another_revision(cohort, built, tmp_path, monkeypatch):
    """Units of another cxrground version are never mixed in; another git revision of the same version warns."""
    from cxrground.ils import build as build_module

    out = tmp_path / "b"
    shutil.copytree(built, out)
    stamp = json.loads((out / "settings.json").read_text())
    tasks, failures, inputs = _cli_inputs(cohort)
    (out / "settings.json").write_text(json.dumps({**stamp, "code": "0.0.1"}))
    with pytest.raises(ConfigError, match=r"cxrground version 0\.0\.1 then, .* now"):
        build_dataset(tasks, out, IlsConfig(seed=3), BackendSpec(), scan_failures=failures, progress=False, **inputs)
    (out / "settings.json").write_text(json.dumps({**stamp, "code_revision": "abc1234"}))
    monkeypatch.setattr(build_module, "_code_version", lambda: "0.1.0+gdef5678")
    summary = build_dataset(tasks, out, IlsConfig(seed=3), BackendSpec(), scan_failures=failures, progress=False,
                            truth_cohort=cohort, **inputs)
    assert summary.processed == 0 and (summary.code_then, summary.code_now) == ("abc1234", "def5678")
    line = build_module.input_lines(summary)[-1]
    assert "abc1234" in line and "def5678" in line and "--overwrite" in line
    again = build_dataset(tasks, out, IlsConfig(seed=3), BackendSpec(), scan_failures=failures, progress=False,
                          truth_cohort=cohort, **inputs)
    assert again.code_then is None and not any("revision" in x for x in build_module.input_lines(again))


def test_resume_refuses_other_effective_backends(cohort, built, tmp_path):
    """Same options but other backends (e.g. new defaults after an upgrade): the build is not mixed."""
    out = tmp_path / "b"
    shutil.copytree(built, out)
    stamp = json.loads((out / "settings.json").read_text())
    tasks, failures, inputs = _cli_inputs(cohort)
    assert len(stamp["backends_hash"]) == 12
    # an unchanged rerun resumes: nothing processed again
    summary = build_dataset(tasks, out, IlsConfig(seed=3), BackendSpec(), scan_failures=failures, progress=False,
                            truth_cohort=cohort, **inputs)
    assert summary.processed == 0 and summary.skipped == N_STUDIES
    # a stamp from other backends (here: an older version's) is refused, and --overwrite rebuilds from scratch
    (out / "settings.json").write_text(json.dumps({**stamp, "backends_hash": "0123456789ab"}))
    with pytest.raises(ConfigError, match="other backends"):
        build_dataset(tasks, out, IlsConfig(seed=3), BackendSpec(), scan_failures=failures, progress=False, **inputs)
    # the refusal names what changed, from the previous build's provenance (here: the report rules' version)
    provenance = json.loads((out / "provenance.json").read_text())
    provenance["backends"]["structurer"]["version"] = "1"
    (out / "provenance.json").write_text(json.dumps(provenance))
    with pytest.raises(ConfigError, match=r"structurer\.version 1 then, \d+ now"):
        build_dataset(tasks, out, IlsConfig(seed=3), BackendSpec(), scan_failures=failures, progress=False, **inputs)
    summary = build_dataset(tasks, out, IlsConfig(seed=3), BackendSpec(), scan_failures=failures, progress=False,
                            overwrite=True, truth_cohort=cohort, **inputs)
    assert summary.processed == N_STUDIES and summary.skipped == 0
    assert json.loads((out / "settings.json").read_text())["backends_hash"] == stamp["backends_hash"]
    assert _bytes(out) == _bytes(built)
    # --overwrite with the same settings starts afresh too, and makes the same build
    summary = build_dataset(tasks, out, IlsConfig(seed=3), BackendSpec(), scan_failures=failures, progress=False,
                            overwrite=True, truth_cohort=cohort, **inputs)
    assert summary.processed == N_STUDIES and summary.skipped == 0 and _bytes(out) == _bytes(built)


def test_backends_identity_ignores_paths_and_follows_settings() -> None:
    from cxrground.ils import build as ils_build

    assert ils_build._without_paths({"a": "/x/y.npz", "b": ["/z", 1, "rel/p"], "c": {"d": "/q", "e": 2}}) == \
        {"b": [1, "rel/p"], "c": {"e": 2}}
    shipped = BackendSpec(synthesizer_kwargs={"model": "shipped"})
    assert backends_identity(shipped) == backends_identity(BackendSpec(synthesizer_kwargs={"model": "shipped"}))
    assert backends_identity(shipped) != backends_identity(BackendSpec(synthesizer_kwargs={"model": "shipped",
                                                                                          "band": 1.0}))


def test_bad_inputs_are_recorded_and_the_rest_finishes(cohort, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(cohort / "files", broken)
    images = sorted(broken.rglob("*.jpg"))
    images[0].write_bytes(images[0].read_bytes()[:200])  # truncated image
    report = images[1].parent.parent / f"{images[1].parent.name}.txt"
    report.write_text("   \n")  # empty report
    (broken / "p10" / "p10000000" / "s50000000").mkdir(parents=True)
    (broken / "p10" / "p10000000" / "s50000000" / "x.jpg").write_bytes(b"\xff\xd8\xff")  # no report at all
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["ils", "build", "--images", str(broken), "--out", str(out), "--quiet"])
    assert result.exit_code == 0, result.output
    failures = [json.loads(line) for line in (out / "failures.jsonl").read_text().splitlines()]
    reasons = " | ".join(f["reason"] for f in failures)
    assert len(failures) >= 3, reasons
    assert "corrupt" in reasons and "no report" in reasons
    assert any(str(images[0]) in f["path"] for f in failures)
    data = load_dataset(out / DATASET_FILE)
    kept = sum(len(v) for v in data.values())
    assert kept >= 1
    card = (out / "card.md").read_text()
    assert "Studies not in the dataset" in card


def test_a_folder_holding_another_commands_files_is_refused(cohort, built, tmp_path):
    """An `ils export` copy (or any folder with a card.md / failures.jsonl and no build) is not built into, with or
    without --overwrite; a build cut short (its units/ left) still resumes."""
    export = tmp_path / "export"
    res = CliRunner().invoke(main, ["ils", "export", "--dataset", str(built), "--out", str(export)])
    assert res.exit_code == 0, res.output
    card = (export / "card.md").read_bytes()
    for extra in ([], ["--overwrite"]):
        res = CliRunner().invoke(main, ["ils", "build", "--images", str(cohort / "files"), "--out", str(export),
                                        "--quiet", "--limit", "1", *extra])
        assert res.exit_code != 0 and "but no ILS build (no settings.json)" in res.output, res.output
    assert (export / "card.md").read_bytes() == card
    cut = tmp_path / "cut"
    shutil.copytree(built, cut)
    (cut / "settings.json").unlink()  # as a kill while --overwrite cleared the old build leaves it
    res = CliRunner().invoke(main, ["ils", "build", "--images", str(cohort / "files"), "--out", str(cut), "--quiet",
                                    "--seed", "3"])
    assert res.exit_code == 0, res.output


def test_quality_command(built, cohort):
    result = CliRunner().invoke(main, ["ils", "quality", str(built), "--cohort", str(cohort)])
    assert result.exit_code == 0 and "| total |" in result.output


def test_gallery_page(built, cohort, tmp_path):
    page = tmp_path / "g.html"
    result = CliRunner().invoke(main, ["ils", "gallery", str(built), "--images", str(cohort / "files"),
                                       "--html", str(page), "--limit", "3"])
    assert result.exit_code == 0, result.output
    text = page.read_text()
    assert text.count("data:image/jpeg;base64,") == 3 and "Segment the" in text and "[SEG]" in text
    assert "<ul class='sec grounding'><li>" in text  # how each reported finding was grounded


def test_gallery_split_all_shows_every_split_and_one_split_only_its_studies(built, cohort, tmp_path):
    data = load_dataset(built / DATASET_FILE)
    filled = [name for name in ("train", "val", "test") if data.get(name)]
    assert len(filled) > 1, "the fixture's dataset needs studies in two splits for this test"
    split = filled[0]
    pages = {}
    for choice in ("all", split):
        pages[choice] = tmp_path / f"{choice}.html"
        result = CliRunner().invoke(main, ["ils", "gallery", str(built), "--images", str(cohort / "files"),
                                           "--html", str(pages[choice]), "--split", choice, "--limit", "1000"])
        assert result.exit_code == 0, result.output
    every = sum(len(studies) for studies in data.values())
    assert pages["all"].read_text().count("data:image/jpeg;base64,") == every
    assert pages[split].read_text().count("data:image/jpeg;base64,") == len(data[split]) < every


def _gallery_grey(page: Path) -> np.ndarray:
    """The first study's image of a gallery page, as an (H, W, 3) int array."""
    url = page.read_text().split("src='data:image/jpeg;base64,", 1)[1].split("'", 1)[0]
    return np.asarray(Image.open(io.BytesIO(base64.b64decode(url))).convert("RGB"), dtype=int)


def test_gallery_says_how_a_film_was_read_and_shows_an_inverted_one_as_read(built, cohort, tmp_path):
    copy = tmp_path / "ds"
    shutil.copytree(built, copy)
    key = next(iter(next(iter(load_dataset(copy / DATASET_FILE).values()))))
    plain = tmp_path / "plain.html"
    render_gallery(copy, cohort / "files", plain, limit=1)
    assert "class='sec read'" not in plain.read_text()
    unit_file = copy / UNITS_DIR / f"{key}.json"
    unit = json.loads(unit_file.read_text())
    unit.update(image_note="stored inverted", tilt=4.5, content_box=[10, 0, 3, 3])
    unit_file.write_text(json.dumps(unit))
    page = tmp_path / "read.html"
    render_gallery(copy, cohort / "files", page, limit=1)
    text = page.read_text()
    assert ("film read as the grey-level negative (stored inverted); read turned upright (the segmenter&#x27;s "
            "option `deskew`; the angle is the unit&#x27;s `tilt`): 4.5°; read inside the uniform borders") in text
    assert "10, 0, 3, 3 px [top, bottom, left, right]" in text
    before, after = _gallery_grey(plain), _gallery_grey(page)
    grey = (np.ptp(before, axis=2) <= 3) & (np.ptp(after, axis=2) <= 3)  # pixels no mask colours in either
    assert grey.mean() > 0.5
    diff = np.abs(after[..., 1][grey] - (255 - before[..., 1][grey]))  # shown as read: the negative (JPEG noise)
    assert np.median(diff) <= 2 and np.percentile(diff, 95) <= 8


def test_gallery_page_in_a_missing_folder(built, cohort, tmp_path):
    page = tmp_path / "new" / "deeper" / "gallery.html"
    result = CliRunner().invoke(main, ["ils", "gallery", str(built), "--images", str(cohort / "files"),
                                       "--html", str(page), "--limit", "1"])
    assert result.exit_code == 0, result.output
    assert result.exception is None and page.read_text().count("data:image/jpeg;base64,") == 1
    data = load_dataset(built / DATASET_FILE)
    empty = next((name for name in ("train", "val", "test") if not data.get(name)), None)
    if empty is not None:  # a split without studies: an error, no empty page written over the old one
        res = CliRunner().invoke(main, ["ils", "gallery", str(built), "--images", str(cohort / "files"),
                                        "--html", str(page), "--split", empty])
        assert res.exit_code != 0 and f"no study to show in split {empty}" in res.output
        assert page.read_text().count("data:image/jpeg;base64,") == 1
    wrong = CliRunner().invoke(main, ["ils", "gallery", str(built), "--images", str(cohort), "--html",
                                      str(tmp_path / "w.html"), "--limit", "1"])
    assert wrong.exit_code != 0 and "image of study" in wrong.output and "is " + str(cohort) in wrong.output
    assert "Traceback" not in wrong.output


def test_gallery_lists_a_study_it_cannot_show_and_shows_the_others(built, cohort, tmp_path):
    data = load_dataset(built / DATASET_FILE)
    studies = [(key, study) for split in data.values() for key, study in split.items()]
    assert len(studies) >= 2
    images = tmp_path / "files"
    shutil.copytree(cohort / "files", images)
    bad_key, bad = studies[0]
    (images / bad["image_path"]).write_bytes(b"\x89PNG\r\n\x1a\n truncated")
    page = tmp_path / "g.html"
    result = CliRunner().invoke(main, ["ils", "gallery", str(built), "--images", str(images), "--html", str(page)])
    assert result.exit_code == 0, result.output
    assert f"{len(studies) - 1} studies, 1 not shown" in result.output
    assert f"study {bad_key} not shown: " in result.output and bad["image_path"] in result.output
    text = page.read_text()
    assert text.count("data:image/jpeg;base64,") == len(studies) - 1
    assert "1 of " in text and f"{html.escape(bad_key)} · " in text and "not shown: " in text
    one = render_gallery(built, images, tmp_path / "one.html", limit=1)  # a failure is not counted in the limit
    assert one.shown == 1 and [k for k, _ in one.failed] == [bad_key]
    for study in studies[1:]:
        (images / study[1]["image_path"]).unlink()
    with pytest.raises(InputError, match="image of study"):  # nothing to show: the error, no page
        render_gallery(built, images, tmp_path / "h.html", limit=1)
    assert not (tmp_path / "h.html").exists()


def test_qc_cross_check_runs_and_is_recorded(cohort, tmp_path):
    out = tmp_path / "qc"
    result = CliRunner().invoke(main, ["ils", "build", "--images", str(cohort / "files"), "--out", str(out),
                                       "--qc-segmenter", "masks", "--qc-segmenter-opt", f"root={cohort / 'masks'}",
                                       "--limit", "3", "--quiet"])
    assert result.exit_code == 0, result.output
    prov = json.loads((out / "provenance.json").read_text())
    assert prov["backend_spec"]["qc_segmenter"] == "masks" and prov["backends"]["qc_segmenter"]
    units = [json.loads(p.read_text()) for p in (out / "units").glob("*.json")]
    assert len(units) == 3
    for u in units:  # either kept, or dropped with the cross-check's reason
        assert u["status"] == "ok" or "disagree" in u["reason"] or u["stage"] != "qc"


def test_section_policy_and_alternatives_are_used_and_recorded(cohort, built, tmp_path):
    out = tmp_path / "merged"
    result = CliRunner().invoke(main, ["ils", "build", "--images", str(cohort / "files"), "--out", str(out),
                                       "--sections", "findings+impression", "--alternatives", "present",
                                       "--limit", "4", "--quiet", "--seed", "3"])
    assert result.exit_code == 0, result.output
    prov = json.loads((out / "provenance.json").read_text())
    assert prov["config"]["sections"] == "findings+impression"
    assert prov["backends"]["structurer"] == {"name": "rules", "version": RULES_VERSION, "alternatives": "present"}
    assert prov["backend_spec"]["structurer_kwargs"] == {"alternatives": "present"}
    card = (out / "card.md").read_text()
    assert "Report sections: `findings+impression`" in card and "alternatives present" in card
    assert "Report sections: `findings`: one section per study" in (built / "card.md").read_text()
    studies = {k: v for split in load_dataset(out / DATASET_FILE).values() for k, v in split.items()}
    default = {k: v for split in load_dataset(built / DATASET_FILE).values() for k, v in split.items()}
    merged = [k for k, v in studies.items() if v["section_name"] == "findings+impression"]
    assert merged, "the synthetic reports have findings and impression: some study must use both"
    for key in merged:
        # the findings sentences keep their numbers; the impression sentences follow them
        assert studies[key]["section_content"].startswith(default[key]["section_content"] + " (")
    units = [json.loads(p.read_text()) for p in (out / "units").glob("*.json")]
    for unit in units:
        pos = [f for f in unit.get("findings", []) if f["lesion"] and f["presence"] == "positive"]
        keys = [(f["lesion"], tuple(f["reported_location"])) for f in pos]
        assert len(keys) == len(set(keys)), "a lesion + location reported in both sections must count once"
    bad = CliRunner().invoke(main, ["ils", "build", "--images", str(cohort / "files"), "--out", str(tmp_path / "x"),
                                    "--structurer", "llm", "--alternatives", "present"])
    assert bad.exit_code != 0 and "rules structurer only" in bad.output


def _die_on(keys: frozenset[str], task, out, config, spec, max_pixels):
    """A study runner that SIGKILLs its own worker process on the studies ``keys`` (the OOM killer's way)."""
    from cxrground.ils.units import run_one

    if task.study_key in keys:
        os.kill(os.getpid(), signal.SIGKILL)
    return run_one(task, out, config, spec, max_pixels)


def test_a_dead_worker_is_recorded_and_the_rest_finishes(cohort, built, tmp_path):
    import functools

    from cxrground.ils.build import run_units
    from cxrground.ils.cohort_normative import resolve_spec

    tasks, failures, inputs = _cli_inputs(cohort)
    victim = sorted(t.study_key for t in tasks)[1]
    config = IlsConfig(seed=3)
    # the default normative synthesizer reads the model fitted by the build of ``built`` (run_units is below the fit)
    spec = resolve_spec(BackendSpec(), tasks, built, config)
    out = tmp_path / "oom"
    out.mkdir()
    processed, skipped = run_units(tasks, out, config, spec, "local", 2, progress=False,
                                   runner=functools.partial(_die_on, frozenset({victim})))
    assert (processed, skipped) == (len(tasks), 0)
    units = {p.stem: json.loads(p.read_text()) for p in (out / "units").glob("*.json")}
    assert set(units) == {t.study_key for t in tasks} and not list((out / "units").glob("*.running"))
    assert units[victim]["status"] == "failed" and "worker died" in units[victim]["reason"]
    assert all(u["status"] == built_status for k, u in units.items() if k != victim
               for built_status in [json.loads((built / "units" / f"{k}.json").read_text())["status"]])
    summary = build_dataset(tasks, out, config, spec, workers=2, scan_failures=failures, progress=False, **inputs)
    assert summary.processed == 0  # the rerun does not retry the study that killed its worker
    recorded = [json.loads(line) for line in (out / "failures.jsonl").read_text().splitlines()]
    assert [f["study"] for f in recorded if "worker died" in f["reason"]] == [victim]


def test_max_pixels_refuses_a_big_image_from_its_header(cohort, tmp_path):
    images = tmp_path / "files"
    shutil.copytree(cohort / "files", images)
    tasks, _ = build_tasks(images)
    big = Path(tasks[0].image_path)
    pixels = read_image(big).pixels
    from cxrground.io.image import write_image

    write_image(big, np.pad(pixels, ((0, 0), (0, 300))))  # a little over the limit set below
    limit = pixels.shape[0] * (pixels.shape[1] + 299)
    result = CliRunner().invoke(main, ["ils", "build", "--images", str(images), "--out", str(tmp_path / "o"),
                                       "--quiet", "--seed", "3", "--max-pixels", str(limit)])
    assert result.exit_code == 0, result.output
    recorded = [json.loads(line) for line in (tmp_path / "o" / "failures.jsonl").read_text().splitlines()]
    over = [f for f in recorded if "too many pixels" in f["reason"]]
    assert [f["study"] for f in over] == [tasks[0].study_key] and str(limit) in over[0]["reason"]
    assert len(recorded) == 1


def test_a_linked_film_is_named_by_its_link_and_keeps_its_fingerprint(cohort, tmp_path):
    """A film that is a symbolic link is named in failures.jsonl and the summary by the path under --images, not by
    the link's target; the link and its target are one input (same fingerprint), so a build over the links resumes."""
    from cxrground.ils.tasks import input_fingerprint

    images, elsewhere = tmp_path / "files", tmp_path / "elsewhere"
    for src in sorted((cohort / "files").rglob("*")):
        dst = images / src.relative_to(cohort / "files")
        if src.is_dir():
            dst.mkdir(parents=True, exist_ok=True)
        elif src.suffix.lower() in {".jpg", ".jpeg", ".png", ".dcm"}:
            dst.parent.mkdir(parents=True, exist_ok=True)
            dst.symlink_to(src)
        else:
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst)
    linked, _ = build_tasks(images)
    direct = {t.study_key: t for t in build_tasks(cohort / "files")[0]}
    assert all(Path(t.image_path).is_symlink() and Path(t.image_path).is_relative_to(images) for t in linked)
    assert all(input_fingerprint(t) == input_fingerprint(direct[t.study_key]) for t in linked)
    victim = linked[0]
    elsewhere.mkdir()
    broken = elsewhere / Path(victim.image_path).name
    broken.write_bytes(Path(victim.image_path).read_bytes()[:40])  # a truncated film behind the link
    Path(victim.image_path).unlink()
    Path(victim.image_path).symlink_to(broken)
    out = tmp_path / "o"
    args = ["ils", "build", "--images", str(images), "--out", str(out), "--seed", "3", "--limit", "2"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert f"first failure: {victim.image_path}: " in result.output and str(elsewhere) not in result.output
    recorded = [json.loads(line) for line in (out / "failures.jsonl").read_text().splitlines()]
    assert [(f["study"], f["path"]) for f in recorded] == [(victim.study_key, victim.image_path)]
    again = CliRunner().invoke(main, args)
    assert again.exit_code == 0 and "(0 processed, 2 already done" in again.output, again.output


def test_streamed_dataset_json_is_the_whole_dict_dump(built):
    """The driver writes the dataset JSON one study at a time: the bytes are those of ``json.dumps`` of the whole
    dict (the format before streaming), studies in key order within each split."""
    from cxrground.ils.schema import SPLITS

    dataset: dict = {s: {} for s in SPLITS}
    for path in sorted((built / "units").glob("*.json")):
        unit = json.loads(path.read_text())
        pairs = unit.get("study", {}).get("instruction_answer_pairs", {})
        if unit["status"] == "ok" and (pairs["positive_pairs"] or pairs["negative_pairs"]):
            dataset[unit["split"]][unit["study_key"]] = unit["study"]
    assert sum(len(v) for v in dataset.values()) > 1
    assert (built / DATASET_FILE).read_bytes() == json.dumps(dataset, ensure_ascii=False).encode()
    assert not list(built.glob(".assemble*"))


def test_assemble_refuses_tasks_out_of_order(built, cohort):
    from cxrground.ils.build import assemble

    tasks, _ = build_tasks(cohort / "files")
    with pytest.raises(ConfigError, match="study-key order"):
        assemble(built, iter(reversed(tasks)), IlsConfig(seed=3), BackendSpec(), (), {})


def _die_once(flag_dir: str, task, out, config, spec, max_pixels):
    """A study runner whose worker dies the first time it meets each study (a node lost, a transient OOM)."""
    from cxrground.ils.units import run_one

    flag = Path(flag_dir) / task.study_key
    if not flag.exists():
        flag.write_text("died once")
        os.kill(os.getpid(), signal.SIGKILL)
    return run_one(task, out, config, spec, max_pixels)


def test_a_worker_death_is_retried_once_and_retry_failed_redoes_failed_units(cohort, built, tmp_path):
    import functools

    from cxrground.ils.build import run_units
    from cxrground.ils.cohort_normative import resolve_spec

    tasks, failures, inputs = _cli_inputs(cohort)
    config = IlsConfig(seed=3)
    spec = resolve_spec(BackendSpec(), tasks, built, config)
    victim = tasks[2]
    out = tmp_path / "once"
    flags = tmp_path / "flags"
    flags.mkdir()
    # the worker dies under the victim once: the retry alone finishes it, nothing is recorded as failed
    processed, _ = run_units([victim], out, config, spec, "local", 2, progress=False,
                             runner=functools.partial(_die_once, str(flags)))
    unit = json.loads((out / "units" / f"{victim.study_key}.json").read_text())
    assert processed == 1 and unit["status"] != "failed"
    assert unit == json.loads((built / "units" / f"{victim.study_key}.json").read_text())
    # an earlier run recorded a failure (a dead worker): a plain rerun keeps it, --retry-failed redoes it
    again = tmp_path / "again"
    shutil.copytree(built, again)
    (again / "units" / f"{victim.study_key}.json").write_text(json.dumps(
        {"study_key": victim.study_key, "split": victim.split, "image_path": victim.image_path, "status": "failed",
         "stage": "worker", "error": "WorkerDied", "reason": "worker died (the process was killed)"}))
    assert build_dataset(tasks, again, config, BackendSpec(), scan_failures=failures, progress=False,
                         **inputs).processed == 0
    result = CliRunner().invoke(main, ["ils", "build", "--images", str(cohort / "files"), "--out", str(again),
                                       "--quiet", "--seed", "3", "--retry-failed"])
    assert result.exit_code == 0, result.output
    assert "(1 processed, 7 already done" in result.output
    assert _bytes(again) == _bytes(built)


def test_every_skipped_study_folder_is_recorded(cohort, tmp_path):
    """An empty study folder, a folder named like an image and GIF/BMP/TIFF images: each a scan failure naming
    it and why, in `scan` and in failures.jsonl; the valid studies are built."""
    from cxrground.datasets.folder import scan_folder

    files = tmp_path / "files"
    shutil.copytree(cohort / "files", files)
    base = files / "p19" / "p19000000"
    (base / "s59000001").mkdir(parents=True)  # empty study folder
    (base / "s59000002" / "view1.jpg").mkdir(parents=True)  # a folder named like an image
    for n, ext in enumerate(("gif", "bmp", "tif", "tiff"), start=3):
        (base / f"s5900000{n}").mkdir()
        (base / f"s5900000{n}" / f"img.{ext}").write_bytes(b"GIF89a" if ext == "gif" else b"BM")
        (base / f"s5900000{n}.txt").write_text("FINDINGS: Clear lungs.")
    studies, failures = scan_folder(files)
    by_path = {f.path: f.reason for f in failures}
    assert by_path[str(base / "s59000001")] == "study folder holds no image (JPEG, PNG or DICOM)"
    assert by_path[str(base / "s59000002" / "view1.jpg")] == "a folder named like an image (not a file)"
    for n, ext in enumerate(("gif", "bmp", "tif", "tiff"), start=3):
        assert by_path[str(base / f"s5900000{n}" / f"img.{ext}")].startswith(f"unsupported image format .{ext}")
    assert len(failures) == 6 and len(studies) == N_STUDIES
    scan = CliRunner().invoke(main, ["scan", "--images", str(files)])
    assert scan.exit_code == 0 and scan.output.count("failed:") == 6 and "s59000001" in scan.output
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["ils", "build", "--images", str(files), "--out", str(out), "--quiet",
                                       "--limit", "1"])
    assert result.exit_code == 0, result.output
    recorded = {f["path"]: f["reason"] for f in map(json.loads, (out / "failures.jsonl").read_text().splitlines())}
    assert recorded == by_path


def test_ray_cluster_with_a_node_killed_mid_build(cohort, built, tmp_path, caplog):
    """A Ray cluster of three nodes on this machine (a head without CPUs, two one-CPU workers), one actor on each
    worker; one worker node is killed once two studies are done and while it has a study in flight (each study
    takes a second longer than usual): that study reruns on the other node, nothing is lost, and the dataset is
    byte-identical to the local build's (its card aside, which names the fitted model it was given)."""
    import threading

    pytest.importorskip("ray")
    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    victim = cluster.add_node(num_cpus=1)
    cluster.add_node(num_cpus=1)
    out = tmp_path / "cluster"
    killed = threading.Event()

    def in_flight_on_victim() -> list[str]:
        """Studies the scheduler sent to the victim node whose unit is not written yet."""
        sent = [r.args[0] for r in list(caplog.records)
                if r.msg.startswith("study %s sent to Ray worker") and r.args[2] == victim.node_id]
        return [key for key in sent if not (out / "units" / f"{key}.json").exists()]

    def kill_a_node() -> None:
        deadline = time.time() + 240
        while time.time() < deadline and (len(list((out / "units").glob("*.json"))) < 2 or not in_flight_on_victim()):
            time.sleep(0.02)
        cluster.remove_node(victim, allow_graceful=False)
        killed.set()

    tasks, failures = build_tasks(cohort / "files")
    killer = threading.Thread(target=kill_a_node, daemon=True)
    def slow(task, out, config, spec, max_pixels):
        """The real runner, one second slower, so that the node is killed while a study of it is running."""
        import time as clock

        from cxrground.ils.units import run_one

        clock.sleep(1.0)
        return run_one(task, out, config, spec, max_pixels)

    from cxrground.ils.build import run_units
    from cxrground.ils.cohort_normative import resolve_spec

    config = IlsConfig(seed=3)
    spec = resolve_spec(BackendSpec(), tasks, built, config)  # the normative model the build of ``built`` fitted
    caplog.set_level("DEBUG", logger="cxrground.ils.ray_engine")
    try:
        cluster.wait_for_nodes()
        killer.start()
        processed, _ = run_units(tasks, out, config, spec, "ray", 2, progress=False, runner=slow,
                                 ray_address=cluster.address)
        killer.join(timeout=60)
    finally:
        if ray.is_initialized():
            ray.shutdown()
        cluster.shutdown()
    assert killed.is_set() and processed == N_STUDIES
    summary = build_dataset(tasks, out, config, spec, scan_failures=failures, progress=False, truth_cohort=cohort)
    assert summary.processed == 0  # every study was done on the cluster; this only assembles the dataset
    lost = [r.getMessage() for r in caplog.records if "Ray worker lost" in r.getMessage()]
    assert lost and all("attempt 1" in m for m in lost), lost  # each rerun once, on the surviving node
    got, want = _bytes(out), _bytes(built)
    assert got.pop("card.md") != b"" and want.pop("card.md")  # the card names the fitted model's path it was given
    assert got == want


@pytest.fixture
def s3_endpoint(monkeypatch):
    """moto's S3-compatible server on 127.0.0.1 (a real HTTP server speaking the S3 protocol) with one bucket."""
    pytest.importorskip("s3fs")
    moto_server = pytest.importorskip("moto.server")
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    import urllib.request

    # moto keeps its buckets in this process across servers: start from none
    urllib.request.urlopen(urllib.request.Request(f"{endpoint}/moto-api/reset", method="POST"), timeout=30).close()
    for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL": endpoint}.items():
        monkeypatch.setenv(key, value)
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()
    fs = s3fs.S3FileSystem(client_kwargs={"endpoint_url": endpoint})
    fs.mkdir("ils-test")
    try:
        yield fs
    finally:
        server.stop()


def _bucket_build_matches_local(fs, cmd: list[str], built: Path) -> dict[str, bytes]:
    """Run ``cmd`` (an ``ils build`` to ``…/ils-test/build``) twice: the first build's objects equal the local
    build's bytes (the card's synthetic-truth section aside), the rerun resumes everything; the local bytes."""
    result = CliRunner().invoke(main, cmd)
    assert result.exit_code == 0, result.output
    assert f"({N_STUDIES} processed, 0 already done, 0 failures)" in result.output
    assert len(fs.find("ils-test/build/units")) == N_STUDIES
    assert len(fs.find("ils-test/build/lesion_mask")) == len(list((built / "lesion_mask").rglob("*.png"))) > 0
    local = _bytes(built)
    for name, data in local.items():
        if name != "card.md":
            assert fs.cat_file(f"ils-test/build/{name}") == data, name
    assert "# ILS dataset card" in fs.cat_file("ils-test/build/card.md").decode()
    assert not [p for p in fs.find("ils-test/build") if p.endswith(".running")]
    from cxrground.ils.build import _stage_path
    from cxrground.ils.units import unit_store

    assert not _stage_path(unit_store(cmd[cmd.index("--out") + 1])).exists()  # the local stage is gone
    again = CliRunner().invoke(main, cmd)
    assert again.exit_code == 0 and f"(0 processed, {N_STUDIES} already done" in again.output, again.output
    assert fs.cat_file(f"ils-test/build/{DATASET_FILE}") == local[DATASET_FILE]
    # a resume that processes some studies: their units, written by the workers after the driver listed the
    # folder, are in the dataset (a cached listing had left them out without a word)
    for unit in sorted(fs.find("ils-test/build/units"))[:2]:
        fs.rm(unit)
    fs.invalidate_cache()
    partial = CliRunner().invoke(main, cmd)
    assert partial.exit_code == 0 and f"(2 processed, {N_STUDIES - 2} already done, 0 failures)" in partial.output, \
        partial.output
    fs.invalidate_cache()
    assert fs.cat_file(f"ils-test/build/{DATASET_FILE}") == local[DATASET_FILE]
    return local


def _ray_bucket_build_matches_local(fs, tasks, failures, out: str, local: dict[str, bytes]) -> None:
    """A Ray build of ``tasks`` to the bucket URL ``out`` gives the local build's bytes."""
    summary = build_dataset(tasks, out, IlsConfig(seed=3), BackendSpec(), engine="ray", workers=2,
                            scan_failures=failures, progress=False)
    assert summary.processed == N_STUDIES
    prefix = out.split("://", 1)[1]
    for name in (DATASET_FILE, "findings.jsonl", "masks.jsonl", "anatomy.jsonl", "failures.jsonl"):
        assert fs.cat_file(f"{prefix}/{name}") == local[name], name


def test_build_from_and_to_s3_is_byte_identical_and_resumes(cohort, built, s3_endpoint):
    """`ils build --images s3://… --out s3://… --workers 2` on moto's server: the same bytes as the local build
    (the card's synthetic-truth section aside, which needs the local cohort), units and masks as objects, a rerun
    resumes, and a Ray build from and to the bucket gives the same bytes too."""
    fs = s3_endpoint
    fs.put(str(cohort / "files"), "ils-test/files", recursive=True)
    url = "s3://ils-test/build"
    cmd = ["ils", "build", "--images", "s3://ils-test/files", "--out", url, "--quiet", "--seed", "3",
           "--workers", "2"]
    local = _bucket_build_matches_local(fs, cmd, built)
    # the cohort normative fit reads the bucket's reports and films as the local ones (it read none of them)
    from cxrground.ils.cohort_normative import collect_normals

    tasks, failures = build_tasks("s3://ils-test/files")
    on_disk, bucket = (collect_normals(t, BackendSpec(), IlsConfig(seed=3), 100, (8, 8))
                       for t in (build_tasks(cohort / "files")[0], tasks))
    assert bucket.studies == on_disk.studies and bucket.report_normal == on_disk.report_normal > 0
    assert all(np.array_equal(a, b) for a, b in zip(bucket.cells, on_disk.cells, strict=True))
    # the cluster setup: Ray actors reading the images from and writing the units to the bucket
    pytest.importorskip("ray")
    assert tasks[0].image_path.startswith("s3://ils-test/files/")
    _ray_bucket_build_matches_local(fs, tasks, failures, "s3://ils-test/ray", local)


@pytest.fixture
def gcs_endpoint(monkeypatch):
    """gcp-storage-emulator (a real HTTP server speaking the GCS JSON API, in memory) on 127.0.0.1 with one bucket,
    run as its own process; gcsfs reaches it through ``STORAGE_EMULATOR_HOST``."""
    pytest.importorskip("gcsfs")
    pytest.importorskip("gcp_storage_emulator")
    import socket
    import urllib.error
    import urllib.request

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "gcp_storage_emulator", "start", "--host", "127.0.0.1",
                               "--port", str(port), "--in-memory", "--default-bucket", "ils-test", "--quiet"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    endpoint = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 30
        while True:
            try:
                with urllib.request.urlopen(f"{endpoint}/storage/v1/b/ils-test", timeout=2):
                    break
            except (urllib.error.URLError, ConnectionError):
                if time.time() > deadline or server.poll() is not None:
                    pytest.fail(f"GCS emulator did not start on {endpoint}")
                time.sleep(0.1)
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", endpoint)
        from gcsfs.core import GCSFileSystem

        GCSFileSystem.clear_instance_cache()
        yield GCSFileSystem(token="anon")
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(timeout=10)


def _put_tree(fs, local: Path, bucket_prefix: str, suffix: str) -> int:
    """Upload the files under ``local`` ending in ``suffix`` to ``bucket_prefix``, keeping relative paths."""
    files = sorted(p for p in local.rglob(f"*{suffix}") if p.is_file())
    for p in files:
        fs.put_file(str(p), f"{bucket_prefix}/{p.relative_to(local).as_posix()}")
    return len(files)


def test_build_from_and_to_gcs_is_byte_identical_and_resumes(cohort, built, gcs_endpoint):
    """`ils build --images gs://… --reports gs://… --out gs://… --workers 2` on a GCS emulator: the same bytes as the
    local build (the card's synthetic-truth section aside), units and masks as objects, a rerun resumes, and a Ray
    build from and to the bucket gives the same bytes too."""
    fs = gcs_endpoint
    assert _put_tree(fs, cohort / "files", "ils-test/images", ".jpg") == N_STUDIES
    assert _put_tree(fs, cohort / "files", "ils-test/reports", ".txt") == N_STUDIES
    url = "gs://ils-test/build"
    cmd = ["ils", "build", "--images", "gs://ils-test/images", "--reports", "gs://ils-test/reports", "--out", url,
           "--quiet", "--seed", "3", "--workers", "2"]
    local = _bucket_build_matches_local(fs, cmd, built)
    # the cluster setup: Ray actors reading the images from and writing the units to the bucket
    pytest.importorskip("ray")
    tasks, failures = build_tasks("gs://ils-test/images", "gs://ils-test/reports")
    assert tasks[0].image_path.startswith("gs://ils-test/images/")
    assert tasks[0].report_path.startswith("gs://ils-test/reports/")
    _ray_bucket_build_matches_local(fs, tasks, failures, "gs://ils-test/ray", local)


def test_gcs_build_killed_midway_resumes_from_the_bucket(cohort, built, gcs_endpoint):
    """A `gs://` build killed (SIGKILL) after its first units reach the bucket: the bucket holds whole units and no
    dataset file, and a rerun (a new process) does only the studies left and gives the local build's bytes."""
    fs = gcs_endpoint
    _put_tree(fs, cohort / "files", "ils-test/files", "")
    cmd = [sys.executable, "-m", "cxrground", "ils", "build", "--images", "gs://ils-test/files", "--out",
           "gs://ils-test/killed", "--quiet", "--seed", "3"]

    def units() -> list[str]:
        return fs.find("ils-test/killed/units") if fs.exists("ils-test/killed/units") else []

    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        fs.invalidate_cache()
        if len(units()) >= 2:
            break
        time.sleep(0.1)
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    fs.invalidate_cache()
    done = len(units())
    assert 0 < done < N_STUDIES, f"{done} units after the kill (exit {proc.returncode}): the kill came too late"
    assert not fs.exists(f"ils-test/killed/{DATASET_FILE}")
    for unit in units():
        json.loads(fs.cat_file(unit))  # every unit in the bucket is whole
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr[-2000:]
    assert f"({N_STUDIES - done} processed, {done} already done, 0 failures)" in result.stdout + result.stderr
    fs.invalidate_cache()
    assert len(units()) == N_STUDIES
    for name, data in _bytes(built).items():
        if name != "card.md":
            assert fs.cat_file(f"ils-test/killed/{name}") == data, name


def test_gcs_without_credentials_is_a_clear_error(tmp_path, monkeypatch):
    """`ils build --images gs://…` with no Google Cloud credentials anywhere: gcsfs falls back to anonymous requests,
    and the bucket answers as GCS does (401 for an anonymous caller, here from a server on 127.0.0.1); the error
    names the URL, GCS's reason and how to give credentials, for the input listing and for an output upload."""
    pytest.importorskip("gcsfs")
    import http.server
    import threading

    import fsspec.config
    from gcsfs.core import GCSFileSystem

    from cxrground.errors import InputError
    from cxrground.io.store import Store

    body = json.dumps({"error": {"code": 401, "message": "Anonymous caller does not have storage.objects.list access "
                                 "to the Google Cloud Storage bucket.", "errors": [{"reason": "required"}]}}).encode()

    class Unauthorized(http.server.BaseHTTPRequestHandler):
        def answer(self) -> None:
            self.send_response(401)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = do_PUT = do_DELETE = answer

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Unauthorized)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    for key in ("GOOGLE_APPLICATION_CREDENTIALS", "STORAGE_EMULATOR_HOST"):
        monkeypatch.delenv(key, raising=False)
    for key in ("HOME", "CLOUDSDK_CONFIG"):  # no gcloud login, no cached gcsfs token
        monkeypatch.setenv(key, str(tmp_path))
    monkeypatch.setenv("NO_GCE_CHECK", "true")  # not on a GCE machine: no metadata-server probe
    monkeypatch.setitem(fsspec.config.conf, "gs", {"endpoint_url": f"http://127.0.0.1:{server.server_port}"})
    GCSFileSystem.clear_instance_cache()
    try:
        result = CliRunner().invoke(main, ["ils", "build", "--images", "gs://private-bucket/files", "--out",
                                           str(tmp_path / "out"), "--quiet"])
        assert result.exit_code != 0
        message = " ".join(result.output.split())
        assert "gs://private-bucket/files: cannot be read (Anonymous caller does not have" in message, message
        assert "no Google Cloud credentials were found" in message and "GOOGLE_APPLICATION_CREDENTIALS" in message
        assert "Traceback" not in result.output
        store = Store("gs://private-bucket/out")
        with pytest.raises(ConfigError, match=r"gs://private-bucket/out/units/s1\.json: cannot be written .*"
                                              "GOOGLE_APPLICATION_CREDENTIALS"):
            store.write_text("units/s1.json", "{}")
        with pytest.raises(InputError, match="no Google Cloud credentials"):
            store.read_bytes("settings.json")
        for key, said in (("missing.json", "which does not exist"), ("{}", "which holds no private key")):
            if key.startswith("{"):
                (tmp_path / "key.json").write_text(key)
                key = str(tmp_path / "key.json")
            monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", key)  # set, but names no usable key
            with pytest.raises(InputError, match=f"GOOGLE_APPLICATION_CREDENTIALS names .*, {said}"):
                Store("gs://private-bucket/out").read_bytes("settings.json")
    finally:
        GCSFileSystem.clear_instance_cache()
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def test_ray_actors_get_where_the_store_is_but_no_secret(monkeypatch):
    from cxrground.ils.ray_engine import actor_env

    for key in ("AWS_ENDPOINT_URL", "AWS_DEFAULT_REGION", "STORAGE_EMULATOR_HOST", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(key, f"value-of-{key}")
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    env = actor_env()
    assert env["OMP_NUM_THREADS"] == "1" and env["AWS_ENDPOINT_URL"] == "value-of-AWS_ENDPOINT_URL"
    assert env["STORAGE_EMULATOR_HOST"] == "value-of-STORAGE_EMULATOR_HOST" and "AWS_PROFILE" not in env
    assert "AWS_SECRET_ACCESS_KEY" not in env  # secrets come from the nodes, never through Ray's job metadata


def test_s3_without_credentials_says_which_variables_give_them(monkeypatch):
    from cxrground.io.store import Store

    store = Store.__new__(Store)  # only the message is under test
    store.location, store.fs = "s3://bucket/out", None
    said = store._failure("units/s1.json", "written", RuntimeError("Unable to locate credentials"))
    assert said.startswith("cannot be written (Unable to locate credentials); no AWS credentials were found")
    assert "AWS_ACCESS_KEY_ID" in said and "Ray" not in said  # not in a Ray worker here


def test_ray_actors_ask_for_a_gpu_only_for_gpu_backends():
    from cxrground.ils.ray_engine import gpus_per_worker

    assert gpus_per_worker(BackendSpec()) == 0  # built-ins: CPU actors
    assert gpus_per_worker(BackendSpec(synthesizer="radedit")) == 1
    assert gpus_per_worker(BackendSpec(synthesizer="radedit", synthesizer_kwargs={"device": "cpu"})) == 0
    assert gpus_per_worker(BackendSpec(detector="yolo")) == 1
    assert gpus_per_worker(BackendSpec(qc_segmenter="cxas")) == 1


def test_report_addenda_are_listed_on_the_card_for_review(cohort, built, tmp_path):
    """ILS §6 reads one section, so an addendum gives no pair; the card lists the studies whose addendum names a
    lesion, and each unit records what it names."""
    import shutil

    files = tmp_path / "files"
    shutil.copytree(cohort / "files", files)
    reports = sorted(files.rglob("*.txt"))[:2]
    with reports[0].open("a") as fh:
        fh.write("\n ADDENDUM:  On further review, a small left pleural effusion is also present.\n")
    with reports[1].open("a") as fh:
        fh.write("\n ADDENDUM:  The findings were discussed with Dr. ___ at 10:00.\n")
    out = tmp_path / "ils"
    result = CliRunner().invoke(main, ["ils", "build", "--images", str(files), "--out", str(out), "--quiet",
                                       "--seed", "3"])
    assert result.exit_code == 0, result.output
    units = {u["study_key"]: u for u in (json.loads(p.read_text()) for p in (out / "units").glob("*.json"))}
    named = {k: u["addendum_lesions"] for k, u in units.items() if "addendum_lesions" in u}
    assert sorted(named.values()) == [[], ["effusion"]]
    (effusion_key,) = [k for k, lesions in named.items() if lesions]
    card = (out / "card.md").read_text()
    assert "## Report addenda" in card and "2 studies' reports carry an addendum" in card
    assert "1 of these addenda name one of the seven lesions" in card
    assert f"- `{effusion_key}`: effusion" in card
    assert "## Report addenda" not in (built / "card.md").read_text()
    # the pairs are those of the chosen section alone: the same dataset as without the addenda
    assert load_dataset(out / DATASET_FILE) == load_dataset(built / DATASET_FILE)


def test_an_unreachable_ray_address_is_refused_before_any_study(tmp_path):
    import socket

    from cxrground.ils.ray_engine import check_reachable

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    start = time.monotonic()
    with pytest.raises(ConfigError, match=f"cannot reach the Ray cluster at 127.0.0.1:{port}"):
        build_dataset([], tmp_path / "out", IlsConfig(), BackendSpec(), engine="ray", workers=1,
                      ray_address=f"127.0.0.1:{port}", progress=False)
    assert time.monotonic() - start < 30
    assert not (tmp_path / "out").exists()
    with pytest.raises(ConfigError, match="not HOST:PORT"):
        check_reachable("nohost")
    with pytest.raises(ConfigError, match=f"ray://127.0.0.1:{port}"):
        check_reachable(f"ray://127.0.0.1:{port}", timeout=2)


def test_ray_address_auto_without_a_cluster_is_refused_before_any_study(tmp_path, monkeypatch):
    pytest.importorskip("ray")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path / "raytmp"))  # no cluster recorded there
    from ray._private.services import find_gcs_addresses

    if find_gcs_addresses():
        pytest.skip("a Ray cluster runs on this machine")
    with pytest.raises(ConfigError, match=r"--ray-address auto: no Ray cluster runs on this node; start one"):
        build_dataset([], tmp_path / "out", IlsConfig(), BackendSpec(), engine="ray", workers=1,
                      ray_address="auto", progress=False)
    assert not (tmp_path / "out").exists()


def test_a_ray_address_without_the_ray_engine_is_a_usage_error(cohort, tmp_path):
    result = CliRunner().invoke(main, ["ils", "build", "--images", str(cohort / "files"), "--out",
                                       str(tmp_path / "out"), "--ray-address", "127.0.0.1:1"])
    assert result.exit_code == 2 and "--ray-address names the cluster of --engine ray" in result.output
    assert not (tmp_path / "out").exists()


def test_a_missing_bucket_is_named_and_bucket_urls_print_as_urls(cohort, s3_endpoint, tmp_path):
    from cxrground.ils.build import BuildSummary
    from cxrground.ils.request import build_lines

    result = CliRunner().invoke(main, ["ils", "build", "--images", str(cohort / "files"), "--out",
                                       "s3://no-such-bucket/build", "--quiet", "--limit", "1"])
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output
    assert "Error: s3://no-such-bucket/build/units: cannot be listed" in result.output, result.output
    lines = build_lines(BuildSummary(out_dir="s3://ils-test/b1", processed=1, skipped=0, studies_in_dataset=1,
                                     pairs=3, failures=0, seconds=1.0))
    assert "card: s3://ils-test/b1/card.md   failures: s3://ils-test/b1/failures.jsonl" in lines[1]
    assert "--dataset s3://ils-test/b1 --frame released" in lines[2] and "local copy" in lines[2]


def test_llm_failures_name_the_report_step_status_attempts_and_retries_are_noted(tmp_path, monkeypatch):
    """An LLM failure's failures.jsonl line keeps the image as its path (what --retry-failed and the card read) and
    names the study's report file, the report, the step, the HTTP status and the attempts; --strict exits 3 while a
    study is failed; a rerun that retries prints a retry note."""
    from cxrground.testing.mock_server import MockServer

    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    assert runner.invoke(main, ["synth", "--out", "cohort", "--studies", "2", "--seed", "0", "--quiet"]).exit_code == 0
    opts = ["ils", "build", "--images", "cohort/files", "--out", "ils", "--seed", "0", "--quiet", "--synthesizer",
            "pseudo-normal", "--structurer", "llm", "--structurer-opt", "model=mock", "--structurer-opt",
            "max_retries=1", "--structurer-opt", "backoff=0.01", "--structurer-opt", "concurrency=1"]

    def no_findings(body):
        return json.dumps({"findings": []})

    with MockServer(no_findings, faults=["500", "500"]) as server:
        first = runner.invoke(main, [*opts, "--structurer-opt", f"base_url={server.base_url}"])
        assert first.exit_code == 0, first.output
        lines = [json.loads(x) for x in (tmp_path / "ils" / "failures.jsonl").read_text().splitlines()]
        assert len(lines) == 1, lines
        failure = lines[0]
        report = Path(failure["report_path"])
        assert report.is_absolute() and report == Path(failure["path"]).parent.with_suffix(".txt")  # MIMIC layout
        assert Path(failure["path"]).is_absolute() and Path(failure["path"]).suffix == ".jpg" and report.is_file()
        assert {k: failure[k] for k in ("stage", "error", "step", "http_status", "attempts")} == {
            "stage": "structure", "error": "LLMError", "step": "structure", "http_status": 500, "attempts": 2}
        assert failure["report"] == report.stem and failure["study"]
        assert failure["reason"] == 'HTTP 500: {"error": "boom"} (after 2 attempts)'
        strict = runner.invoke(main, [*opts, "--structurer-opt", f"base_url={server.base_url}", "--strict"])
        assert strict.exit_code == 3 and "(0 processed, 2 already done" in strict.output, strict.output
        assert strict.stderr.splitlines()[-1] == ("Error: the build finished, but 1 study failed (QC rejections not "
                                                  "counted); the reasons are in ils/failures.jsonl (--strict: exit "
                                                  "status 3)")
        server.faults = ["500"]  # the pre-pass (with a cache file) retries once, and says so
        again = runner.invoke(main, [*opts, "--structurer-opt", f"base_url={server.base_url}", "--structurer-opt",
                                     f"cache={tmp_path / 'c.sqlite'}", "--retry-failed", "--strict"])
        assert again.exit_code == 0 and "(1 processed, 1 already done" in again.output, again.output
        assert "LLM structurer: retrying 1 request (HTTP 500), next in 0.0 s" in again.stderr
        assert not (tmp_path / "ils" / "failures.jsonl").read_text().strip()


def test_llm_seed_and_max_tokens_flags_reach_every_request(tmp_path, monkeypatch):
    """``ils build --max-tokens`` and the build's ``--seed`` reach the LLM structurer's requests; ``--structurer-opt
    seed=N`` sets the LLM's seed apart from the build's; a ``--structurer-opt max_tokens`` of another value, or
    ``--max-tokens`` without the LLM structurer, is a usage error naming both."""
    from cxrground.ils.request import BuildRequest
    from cxrground.testing.mock_server import MockServer

    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    assert runner.invoke(main, ["synth", "--out", "cohort", "--studies", "1", "--seed", "0", "--quiet"]).exit_code == 0
    opts = ["ils", "build", "--images", "cohort/files", "--out", "ils", "--quiet", "--synthesizer", "pseudo-normal",
            "--structurer", "llm", "--structurer-opt", "model=mock"]
    with MockServer(lambda body: json.dumps({"findings": []}), keep_bodies=True) as server:
        url = ["--structurer-opt", f"base_url={server.base_url}"]
        done = runner.invoke(main, [*opts, *url, "--seed", "3", "--max-tokens", "99"])
        assert done.exit_code == 0, done.output
        assert server.bodies and {(b["seed"], b["max_tokens"]) for b in server.bodies} == {(3, 99)}
        for wrong, message in ((["--max-tokens", "99", "--structurer-opt", "max_tokens=98"],
                                "--max-tokens 99 and --structurer-opt max_tokens=98 give the structurer two values"),
                               (["--max-tokens", "99", "--structurer", "rules"],
                                "--max-tokens applies to the llm structurer only, and the structurer is rules")):
            refused = runner.invoke(main, [*opts, *url, *wrong])
            assert refused.exit_code == 2 and message in refused.output, refused.output
    llm = {"images": "cohort/files", "out": "x", "structurer": "llm"}
    assert BuildRequest(**llm, seed=3, max_tokens=99).backend_spec().structurer_kwargs == {"seed": "3",
                                                                                           "max_tokens": "99"}
    assert BuildRequest(**llm, seed=3, structurer_opt={"seed": "5"}).backend_spec().structurer_kwargs == {"seed": "5"}
    assert BuildRequest(**llm).backend_spec().structurer_kwargs == {}  # the default seed is the LLM's default
    assert BuildRequest(images="cohort/files", out="x", seed=3).backend_spec().structurer_kwargs == {}  # rules


def test_llm_retries_of_the_workers_are_noted_and_counted_without_a_cache(tmp_path, monkeypatch, capfd):
    """Without a response cache the studies' own requests are the only ones: their retries are noted (by the driver
    with one worker, on each pool worker's stderr naming it with several) and the build's summary counts them."""
    from cxrground.testing.mock_server import MockServer

    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    assert runner.invoke(main, ["synth", "--out", "cohort", "--studies", "2", "--seed", "0", "--quiet"]).exit_code == 0
    opts = ["ils", "build", "--images", "cohort/files", "--quiet", "--synthesizer", "pseudo-normal", "--structurer",
            "llm", "--structurer-opt", "model=mock", "--structurer-opt", "backoff=0.01"]
    summary = "  LLM structurer: 3 requests, 0 cache hits, 1 retry, 0 schema fallbacks, 0 rejections"
    with MockServer(lambda body: json.dumps({"findings": []}), faults=["500"]) as server:
        one = runner.invoke(main, [*opts, "--out", "one", "--structurer-opt", f"base_url={server.base_url}"])
        assert one.exit_code == 0, one.output
        assert re.search(r"^LLM structurer: retrying 1 request \(HTTP 500\), next in 0\.0 s$", one.stderr, re.M), \
            one.stderr
        assert summary in one.stdout.splitlines(), one.stdout
        server.faults = ["500"]
        capfd.readouterr()
        two = runner.invoke(main, [*opts, "--out", "two", "--structurer-opt", f"base_url={server.base_url}",
                                   "--workers", "2"])
        assert two.exit_code == 0, two.output
        workers = capfd.readouterr().err  # the pool workers write to the process's stderr, not click's
        assert re.search(r"^LLM structurer \(worker \d+\): retrying 1 request \(HTTP 500\), next in 0\.0 s$",
                         workers, re.M), workers
        assert summary in two.stdout.splitlines(), two.stdout
