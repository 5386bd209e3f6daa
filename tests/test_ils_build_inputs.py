"""A resumed ``ils build`` compares each study's inputs with those its unit was made from: an edited report or a
replaced image is processed again, the input index survives a kill, units of older versions are kept and counted,
and a build whose normative model was fitted on its own studies refuses a change to the films that model read."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from cxrground.cli import main
from cxrground.errors import ConfigError
from cxrground.ils.build import DATASET_FILE, BackendSpec, BuildSummary, build_dataset, input_lines
from cxrground.ils.config import IlsConfig
from cxrground.ils.tasks import build_tasks

SPEC = BackendSpec(synthesizer="pseudo-normal")
#: The default normative synthesizer, fitted on as few normal films as these tiny cohorts hold.
FITTED = BackendSpec(synthesizer="normative", synthesizer_kwargs={"min_normals": "2"})
#: What a fresh build and a resumed one must agree on.
COMPARED = (DATASET_FILE, "masks.jsonl", "findings.jsonl", "anatomy.jsonl", "failures.jsonl")
#: The study whose report the tests edit (its report names an opacity and cardiomegaly) and the new report.
EDITED = "s51074276"
NORMAL_REPORT = """                                 FINAL REPORT
 EXAMINATION:  CHEST (PA AND LAT)

 FINDINGS:

 Heart size is normal. There is no pleural effusion or pneumothorax. No focal consolidation.

 IMPRESSION:

 No acute cardiopulmonary process.
"""


@pytest.fixture(scope="module")
def cohort_template(tmp_path_factory) -> Path:
    """A 4-study synthetic cohort (seed 7, 256 px wide), copied by each test before it edits anything."""
    from cxrground.datasets.synthetic import SynthConfig, write_cohort

    out = tmp_path_factory.mktemp("inputs-cohort")
    write_cohort(out, 4, seed=7, config=SynthConfig(width=256), progress=False)
    return out


@pytest.fixture()
def cohort(cohort_template, tmp_path) -> Path:
    """This test's own copy of the cohort (modification times kept)."""
    return Path(shutil.copytree(cohort_template, tmp_path / "cohort"))


def _build(cohort: Path, out: Path, spec: BackendSpec = SPEC, keys: tuple[int, ...] = (0, 1, 2, 3), **kwargs):
    """``build_dataset`` of the studies ``keys`` (indices in study-key order) of ``cohort`` into ``out``."""
    tasks, failures = build_tasks(cohort / "files")
    return build_dataset([tasks[i] for i in keys], out, IlsConfig(seed=0), spec, scan_failures=failures,
                         progress=False, **kwargs)


def _outputs(out: Path) -> dict[str, bytes]:
    files = {name: (out / name).read_bytes() for name in COMPARED}
    for p in sorted((out / "lesion_mask").rglob("*")):
        files[p.relative_to(out).as_posix()] = p.read_bytes() if p.is_file() else b"<folder>"
    return files


def _positives(out: Path, key: str) -> list[str]:
    """The instructions of study ``key``'s positive pairs in the dataset of ``out``."""
    dataset = json.loads((out / DATASET_FILE).read_text())
    study = next(split[key] for split in dataset.values() if key in split)
    return [p["instruction"] for p in study["instruction_answer_pairs"]["positive_pairs"]]


def _report(cohort: Path, key: str) -> Path:
    return next((cohort / "files").rglob(f"{key}.txt"))


def _image(cohort: Path, key: str) -> Path:
    return next((cohort / "files").rglob(f"{key}/*.jpg"))


def test_an_edited_report_is_processed_again_and_its_pairs_follow_it(cohort, tmp_path):
    out = tmp_path / "ils"
    first = _build(cohort, out, keys=(0, 1, 2))  # the fourth study is added later, the second one removed
    tasks, _ = build_tasks(cohort / "files")
    removed, added = tasks[1].study_key, tasks[3].study_key
    assert tasks[0].study_key == EDITED and first.inputs_changed == 0
    assert "Segment the opacity in the right upper zone lung." in _positives(out, EDITED)
    _report(cohort, EDITED).write_text(NORMAL_REPORT)

    again = _build(cohort, out, keys=(0, 2, 3))
    assert (again.processed, again.skipped, again.inputs_changed) == (2, 1, 1)  # the edited study and the added one
    assert input_lines(again) == ["  1 study changed since its unit was built: processed again"]
    assert _positives(out, EDITED) == []  # a normal report now: negatives only
    fresh = tmp_path / "fresh"
    _build(cohort, fresh, keys=(0, 2, 3))
    kept = {name: data for name, data in _outputs(out).items() if removed not in name}  # its files stay
    assert kept == _outputs(fresh)  # the masks of the old report are gone too
    dataset = json.loads((out / DATASET_FILE).read_text())
    assert not any(removed in split for split in dataset.values())  # a removed study is not assembled
    assert any(added in split for split in dataset.values()) or added in (out / "failures.jsonl").read_text()
    provenance = json.loads((out / "provenance.json").read_text())
    assert provenance["studies_reprocessed_for_changed_inputs"] == 1
    assert "changed after their unit was built: 1." in (out / "card.md").read_text()
    assert "studies_reprocessed" not in (fresh / "provenance.json").read_text()

    # a later resume of the same inputs does nothing, and the card still counts the study redone
    third = _build(cohort, out, keys=(0, 2, 3))
    assert (third.processed, third.inputs_changed) == (0, 0)
    assert json.loads((out / "provenance.json").read_text())["studies_reprocessed_for_changed_inputs"] == 1


def test_a_touched_or_replaced_image_is_processed_again(cohort, tmp_path):
    shutil.rmtree(cohort / "truth")  # a replaced film no longer matches the cohort's truth: not scored
    out = tmp_path / "ils"
    cmd = ["ils", "build", "--images", str(cohort / "files"), "--out", str(out), "--quiet", "--seed", "0",
           "--synthesizer", "pseudo-normal", "--no-pose-warning"]
    result = CliRunner().invoke(main, cmd)
    assert result.exit_code == 0, result.output
    assert "changed since" not in result.output
    image = _image(cohort, EDITED)
    st = image.stat()
    os.utime(image, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))  # touched: same bytes, newer time
    result = CliRunner().invoke(main, cmd)
    assert result.exit_code == 0, result.output
    assert "(1 processed, 3 already done" in result.output
    assert "1 study changed since its unit was built: processed again" in result.output

    other = _image(cohort, next(t.study_key for t in build_tasks(cohort / "files")[0] if t.study_key != EDITED))
    shutil.copyfile(other, image)  # replaced by another film
    result = CliRunner().invoke(main, cmd)
    assert result.exit_code == 0, result.output
    assert "(1 processed, 3 already done" in result.output and "1 study changed since" in result.output
    assert CliRunner().invoke(main, cmd).output.count("(0 processed, 4 already done") == 1


def test_a_torn_index_line_is_ignored_and_its_unit_is_read(cohort, tmp_path):
    out = tmp_path / "ils"
    _build(cohort, out)
    index = out / "unit_inputs.jsonl"
    lines = index.read_text().splitlines(keepends=True)
    assert len(lines) == 4 and all(line.endswith("\n") for line in lines)
    # killed while appending the edited study's entry: its line is torn (no newline), the others are whole
    rest = [line for line in lines if EDITED not in line]
    torn = next(line for line in lines if EDITED in line)[:20]
    index.write_text("".join(rest) + torn)
    _report(cohort, EDITED).write_text(NORMAL_REPORT)  # changed too: only its unit can tell
    again = _build(cohort, out)
    assert (again.processed, again.skipped, again.inputs_changed) == (1, 3, 1)
    text = index.read_text()
    # the torn line was ended, not joined to the next one, and the finished build compacted it away
    assert text.endswith("\n") and torn + "\n" not in text
    records = [json.loads(line) for line in text.splitlines()]
    assert {"changed": True, "study": EDITED} in records and records[-1]["study"] == EDITED
    assert records[-1]["inputs"] == json.loads((out / "units" / f"{EDITED}.json").read_text())["inputs"]

    # without any index (a run killed before its first entry, or a copied folder), every unit is read once
    index.unlink()
    third = _build(cohort, out)
    assert (third.processed, third.inputs_changed, third.predating_units) == (0, 0, 0)
    assert len(index.read_text().splitlines()) == 4


def test_units_without_a_fingerprint_are_kept_and_counted(cohort, tmp_path):
    out = tmp_path / "ils"
    _build(cohort, out)
    tasks, _ = build_tasks(cohort / "files")
    old = sorted(t.study_key for t in tasks)[:2]
    for key in old:  # as an older version wrote them, with no index beside them
        path = out / "units" / f"{key}.json"
        unit = json.loads(path.read_text())
        del unit["inputs"]
        path.write_text(json.dumps(unit, sort_keys=True))
    (out / "unit_inputs.jsonl").unlink()
    before = _outputs(out)
    _report(cohort, old[0]).write_text(NORMAL_REPORT)  # cannot be seen: the unit stays as it is
    again = _build(cohort, out)
    assert (again.processed, again.inputs_changed, again.predating_units) == (0, 0, 2)
    assert again.predating_named == tuple(old)
    assert input_lines(again) == [f"  warning: 2 units predate input fingerprints ({old[0]}, {old[1]}); rebuild "
                                  "with --overwrite to check them"]
    assert _outputs(out) == before
    records = [json.loads(line) for line in (out / "unit_inputs.jsonl").read_text().splitlines()]
    assert sorted(r["study"] for r in records if r["inputs"] is None) == old  # counted from the index next time
    assert _build(cohort, out).predating_units == 2
    many = BuildSummary(str(out), 12, 0, 0, 0, 0, 1.0, inputs_changed=12, predating_units=7,
                        predating_named=("s1", "s2", "s3", "s4", "s5"))
    assert input_lines(many) == ["  12 studies changed since their units were built: processed again",
                                 "  warning: 7 units predate input fingerprints (s1, s2, s3, s4, s5, …); rebuild "
                                 "with --overwrite to check them"]


def test_a_cohort_fitted_build_keeps_its_model_unless_the_films_it_read_change(cohort, tmp_path):
    """A build whose normative model was fitted on its own studies: studies added, or changed outside the films the
    model read, are processed with that model (a warning, the provenance and the card say so); a change to a study
    whose film the model read, or its removal, is refused (``--overwrite`` builds afresh, as a fresh build)."""
    tasks, _ = build_tasks(cohort / "files")
    keys = [t.study_key for t in tasks]
    for key in keys[:3]:  # three report-normal studies: the fit reads their films
        _report(cohort, key).write_text(NORMAL_REPORT)
    out = tmp_path / "ils"
    first = _build(cohort, out, FITTED, keys=(0, 1, 2))  # the default: normative model fitted on the build
    assert first.processed == 3 and (out / "normative_fitted.npz").is_file()
    assert len((out / "normative_fitted.inputs.jsonl").read_text().splitlines()) == 3
    meta = json.loads((out / "normative_fitted.json").read_text())
    assert meta["source"].startswith("cohort")
    assert set(meta["studies"]) | set(meta["trimmed"]["studies"]) == set(keys[:3])

    added = _build(cohort, out, FITTED)  # a fourth study, not among the films the model read
    assert (added.processed, added.fit_inputs_since) == (1, {"added": 1, "removed": 0, "changed": 0})
    assert any("1 study added, 0 removed and 0 changed since the normative model" in line
               for line in input_lines(added))
    assert json.loads((out / "provenance.json").read_text())["inputs_since_normative_fit"]["added"] == 1
    assert "since the normative model was fitted on this build's studies: 1, 0 and 0" in (out / "card.md").read_text()

    _report(cohort, keys[1]).write_text(NORMAL_REPORT.replace("No focal consolidation.", "Small left effusion."))
    with pytest.raises(ConfigError) as refused:
        _build(cohort, out, FITTED)
    message = str(refused.value)
    assert str(out) in message and "1 of the studies its normative model" in message and keys[1] in message
    assert "--overwrite" in message
    assert len(list((out / "units").glob("*.json"))) == 4  # a refusal leaves the build as it was
    with pytest.raises(ConfigError, match="1 of the studies its normative model"):
        _build(cohort, out, FITTED, keys=(0, 2, 3))  # removed
    again = _build(cohort, out, FITTED, overwrite=True)
    assert (again.processed, again.skipped, again.inputs_changed, again.fit_inputs_since) == (4, 0, 0, None)
    fresh = tmp_path / "fresh"
    _build(cohort, fresh, FITTED)
    assert _outputs(out) == _outputs(fresh)
    assert (out / "normative_fitted.npz").read_bytes() == (fresh / "normative_fitted.npz").read_bytes()
    assert _build(cohort, out, FITTED).processed == 0  # the same inputs resume


def test_a_build_on_the_shipped_fallback_model_is_not_refused_for_an_edited_film(cohort, tmp_path):
    """Too few normal films: the shipped normative model is used, which no film of the build shaped, so an edit to
    one of the films it read is processed again (and counted), not refused."""
    tasks, _ = build_tasks(cohort / "files")
    keys = [t.study_key for t in tasks]
    _report(cohort, keys[0]).write_text(NORMAL_REPORT)
    out = tmp_path / "ils"
    _build(cohort, out, BackendSpec(), keys=(0, 1, 2))
    meta = json.loads((out / "normative_fitted.json").read_text())
    assert meta["source"].startswith("shipped") and keys[0] in meta["studies"]
    _report(cohort, keys[0]).write_text(NORMAL_REPORT.replace("No focal consolidation.", "Small left effusion."))
    again = _build(cohort, out, BackendSpec(), keys=(0, 1, 2))
    assert (again.processed, again.inputs_changed) == (1, 1)
    assert again.fit_inputs_since == {"added": 0, "removed": 0, "changed": 1}


def test_the_index_is_compacted_to_what_an_uninterrupted_build_writes(tmp_path):
    from cxrground.ils.inputs import InputIndex

    path = tmp_path / "unit_inputs.jsonl"
    a1, b1, a2 = ({"inputs": "f1", "study": "a"}, {"inputs": "g1", "study": "b"}, {"inputs": "f2", "study": "a"})
    lines = [a1, b1, b1, {"changed": True, "study": "a"}, a2, a2, a1]  # b handed out twice (a kill), a reverted
    path.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in lines) + '{"inputs": "h')
    InputIndex(path).compact()
    kept = [json.loads(line) for line in path.read_text().splitlines()]
    assert kept == [a1, b1, {"changed": True, "study": "a"}, a2, a1]
    index = InputIndex(path)
    assert index.recorded("a") == "f1" and index.recorded("b") == "g1" and index.changed == {"a"}
