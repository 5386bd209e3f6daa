"""Image views: the view table (MIMIC-CXR-JPG metadata), DICOM headers, and which image of a study a build uses."""

from __future__ import annotations

import gzip
import json
import shutil

import numpy as np
import pytest

from cxrground.datasets.views import find_view_table, is_frontal, read_view_table, view_rank
from cxrground.errors import ConfigError, InputError
from cxrground.ils.tasks import build_tasks
from masks_helpers import blank_image as _img

#: The columns of MIMIC-CXR-JPG's mimic-cxr-2.0.0-metadata.csv (made-up rows).
_MIMIC_HEADER = ("dicom_id,subject_id,study_id,PerformedProcedureStepDescription,ViewPosition,Rows,Columns,"
                 "StudyDate,StudyTime,ProcedureCodeSequence_CodeMeaning,ViewCodeSequence_CodeMeaning,"
                 "PatientOrientationCodeSequence_CodeMeaning")


def _row(dicom: str, view: str) -> str:
    return (f"{dicom},10000001,50000001,CHEST (PA AND LAT),{view},3056,2544,21800506,213014.531,"
            "CHEST (PA AND LAT),,Erect")


def _study(files, study: str, *names: str, subject: str = "p10000001") -> None:
    for name in names:
        _img(files / f"p10/{subject}/{study}/{name}")
    (files / f"p10/{subject}/{study}.txt").write_text("FINDINGS: Clear.")


def test_frontal_views_and_preference() -> None:
    assert is_frontal("pa") and is_frontal("AP_SUPINE") and not is_frontal("LATERAL") and not is_frontal("")
    order = sorted(["LATERAL", None, "AP", "PA", "LL", "AP ERECT"], key=lambda v: (view_rank(v), v or ""))
    assert order == ["PA", "AP", "AP ERECT", None, "LATERAL", "LL"]


def test_view_table_plain_and_gzipped(tmp_path) -> None:
    text = "\n".join([_MIMIC_HEADER, _row("aaa", "LATERAL"), _row("bbb", "PA"), _row("ccc", "")]) + "\n"
    plain, packed = tmp_path / "m.csv", tmp_path / "mimic-cxr-2.0.0-metadata.csv.gz"
    plain.write_text(text)
    packed.write_bytes(gzip.compress(text.encode()))
    assert read_view_table(plain) == read_view_table(packed) == {"aaa": "LATERAL", "bbb": "PA"}
    coded = tmp_path / "coded.csv"
    coded.write_text("\n".join([_MIMIC_HEADER, _row("ddd", "").replace(",,Erect", ",antero-posterior,Erect"),
                                _row("eee", "").replace(",,Erect", ",left lateral,Erect"),
                                _row("fff", "").replace(",,Erect", ",oblique,Erect")]) + "\n")
    assert read_view_table(coded) == {"ddd": "AP", "eee": "LATERAL"}
    (tmp_path / "files").mkdir()
    assert find_view_table(tmp_path / "files") == packed and find_view_table(tmp_path / "a" / "b") is None
    simple = tmp_path / "simple.csv"
    simple.write_text("dicom_id,view\nx1,ap supine\n")
    assert read_view_table(simple) == {"x1": "AP SUPINE"}


@pytest.mark.parametrize(("content", "reason"), [
    (b"dicom_id,study_id\naaa,1\n", "needs a dicom_id column and one of ViewPosition"),
    (b"\x1f\x8b\x08broken", "not a UTF-8 CSV"),
    (b"\x80\x00bad", "not a UTF-8 CSV"),
])
def test_a_bad_view_table_is_refused_by_name(tmp_path, content: bytes, reason: str) -> None:
    path = tmp_path / "views.csv"
    path.write_bytes(content)
    with pytest.raises(InputError, match=reason) as err:
        read_view_table(path)
    assert "views.csv" in str(err.value)


def test_the_study_image_is_frontal_when_the_table_says_which(tmp_path) -> None:
    files = tmp_path / "files"
    _study(files, "s50000001", "aaa.jpg", "bbb.jpg", "ccc.jpg")  # aaa lateral, bbb AP, ccc PA
    _study(files, "s50000002", "ddd.jpg", subject="p10000002")  # a lateral film alone
    _study(files, "s50000003", "eee.jpg", "fff.jpg", subject="p10000003")  # not in the table
    views = {"aaa": "LATERAL", "bbb": "AP", "ccc": "PA", "ddd": "LL"}
    blind, _ = build_tasks(files)
    assert [(t.dicom_id, t.view, t.images_in_study) for t in blind] == [
        ("aaa", None, 3), ("ddd", None, 1), ("eee", None, 2)]
    known, failures = build_tasks(files, views=views)
    assert not failures
    assert [(t.dicom_id, t.view, t.images_in_study) for t in known] == [
        ("ccc", "PA", 3), ("ddd", "LL", 1), ("eee", None, 2)]
    without_pa, _ = build_tasks(files, views={"aaa": "LATERAL", "bbb": "AP SUPINE"})
    assert without_pa[0].dicom_id == "bbb"
    unknown_before_lateral, _ = build_tasks(files, views={"aaa": "LATERAL"})
    assert unknown_before_lateral[0].dicom_id == "bbb"


def test_dicom_headers_give_the_views_of_a_study_with_several_images(tmp_path) -> None:
    from cxrground.io.dicom import dicom_view, write_dicom

    files = tmp_path / "files"
    pixels = np.full((64, 64), 100, np.uint8)
    write_dicom(files / "p10/p10000001/s50000001/aaa.dcm", pixels, view="LATERAL")
    write_dicom(files / "p10/p10000001/s50000001/bbb.dcm", pixels, view="PA")
    (files / "p10/p10000001/s50000001.txt").write_text("FINDINGS: Clear.")
    assert dicom_view(files / "p10/p10000001/s50000001/aaa.dcm") == "LATERAL"
    (tmp_path / "broken.dcm").write_bytes(b"not a dicom")
    assert dicom_view(tmp_path / "broken.dcm") is None
    tasks, _ = build_tasks(files)
    assert [(t.dicom_id, t.view) for t in tasks] == [("bbb", "PA")]


@pytest.fixture(scope="module")
def cohort_with_laterals(tmp_path_factory):
    """A 3-study synthetic cohort in the MIMIC-CXR-JPG layout where the first two studies also hold a film named
    to sort first (``0lat``) that the view table calls LATERAL (its pixels are another study's frontal film, so
    only the table tells them apart); returns the ``files`` folder."""
    from cxrground.datasets.synthetic import SynthConfig, write_cohort

    root = tmp_path_factory.mktemp("laterals")
    write_cohort(root / "cohort", 3, seed=5, config=SynthConfig(width=256), progress=False)
    files = root / "cohort" / "files"
    images = sorted(files.rglob("*.jpg"))
    for n, image in enumerate(images[:2]):
        shutil.copy(images[2], image.parent / f"0lat{n}.jpg")
    rows = [_MIMIC_HEADER] + [_row(p.stem, "LATERAL" if p.stem.startswith("0lat") else "PA")
                              for p in sorted(files.rglob("*.jpg"))]
    (root / "cohort" / "mimic-cxr-2.0.0-metadata.csv.gz").write_bytes(gzip.compress("\n".join(rows).encode()))
    return files


def test_a_build_names_its_view_table_and_counts_blind_choices(cohort_with_laterals, tmp_path) -> None:
    from cxrground.ils.build import BackendSpec, build_dataset
    from cxrground.ils.request import BuildRequest

    files = cohort_with_laterals
    spec = BackendSpec(synthesizer="pseudo-normal")
    request = BuildRequest(images=files, out=tmp_path / "with")
    table = request.view_table()
    assert table == files.parent / "mimic-cxr-2.0.0-metadata.csv.gz"
    from cxrground.datasets.views import view_table_record

    views = read_view_table(table)
    record = view_table_record(table, views)
    tasks, failures = build_tasks(files, views=views)
    assert not any(t.dicom_id.startswith("0lat") for t in tasks) and [t.view for t in tasks] == ["PA"] * 3
    build_dataset(tasks, tmp_path / "with", spec=spec, scan_failures=failures, progress=False, view_table=record)
    card = (tmp_path / "with" / "card.md").read_text()
    assert "## Image views" in card and "Views of the chosen images: PA 3." in card and "offered several" not in card
    provenance = json.loads((tmp_path / "with" / "provenance.json").read_text())
    assert provenance["view_table"]["sha256"] == record["sha256"] and provenance["view_table"]["images"] == 5
    with pytest.raises(ConfigError, match="other settings"):  # the same folder without the table: other images
        build_dataset(build_tasks(files)[0], tmp_path / "with", spec=spec, progress=False)

    blind, failures = build_tasks(files)
    assert sorted(t.dicom_id for t in blind if t.dicom_id.startswith("0lat")) == ["0lat0", "0lat1"]
    summary = build_dataset(blind, tmp_path / "without", spec=spec, scan_failures=failures, progress=False)
    assert summary.blind_choices == 2
    from cxrground.ils.request import build_lines

    assert "warning: 2 studies offered several images of unknown view" in build_lines(summary)[-1]
    card = (tmp_path / "without" / "card.md").read_text()
    assert "Views of the chosen images: unknown 3." in card
    assert "**2 studies offered several images and no view for them**" in card and "--metadata" in card
    assert json.loads((tmp_path / "without" / "provenance.json").read_text())["view_table"] is None


def test_scan_shows_the_views_and_refuses_a_bad_table(tmp_path) -> None:
    from click.testing import CliRunner

    from cxrground.cli import main

    files = tmp_path / "files"
    _study(files, "s50000001", "aaa.jpg", "bbb.jpg")
    _study(files, "s50000002", "ccc.jpg", subject="p10000002")
    plain = CliRunner().invoke(main, ["scan", "--images", str(files)])
    assert plain.exit_code == 0 and "2 studies (3 images), 0 failures" in plain.output
    assert "views of the images: unknown 3 (no view table)" in plain.output
    table = tmp_path / "mimic-cxr-2.0.0-metadata.csv.gz"
    table.write_bytes(gzip.compress(b"dicom_id,ViewPosition\naaa,LATERAL\nbbb,PA\n"))
    found = CliRunner().invoke(main, ["scan", "--images", str(files)])
    assert f"views of the images: LATERAL 1, PA 1, unknown 1 (view table {table})" in found.output
    lines = [json.loads(line) for line in CliRunner().invoke(main, ["scan", "--images", str(files), "--json"])
             .output.splitlines()]
    assert {(r["dicom_id"], r["view"]) for r in lines} == {("aaa", "LATERAL"), ("bbb", "PA"), ("ccc", None)}
    bad = tmp_path / "bad.csv"
    bad.write_text("x,y\n")
    for command in (["scan", "--images", str(files), "--metadata", str(bad)],
                    ["ils", "build", "--images", str(files), "--out", str(tmp_path / "out"), "--metadata", str(bad)]):
        result = CliRunner().invoke(main, command)
        assert result.exit_code != 0 and "bad.csv" in result.output and "needs a dicom_id column" in result.output
        assert "Traceback" not in result.output
