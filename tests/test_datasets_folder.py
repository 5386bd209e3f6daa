"""A user's folder: MIMIC-CXR-JPG layout with reports, and a flat folder with an index."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cxrground.datasets.folder import scan_folder
from cxrground.errors import InputError
from masks_helpers import blank_image as _img


def test_mimic_layout_with_reports(tmp_path):
    files = tmp_path / "files"
    _img(files / "p10/p10000032/s50414267/02aa804e-bde0afdd-112c0b34-7bc16630-4e384014.jpg")
    _img(files / "p10/p10000032/s53189527/2a2277a9-b0ded155-c0de8eb9-c124d10e-82c5caab.jpg")
    _img(files / "p11/p11000011/s51029426/abc.jpg")
    reports = tmp_path / "reports" / "files"
    (reports / "p10/p10000032").mkdir(parents=True)
    (reports / "p10/p10000032/s50414267.txt").write_text("FINDINGS: No effusion.")
    (reports / "p10/p10000032/s53189527.txt").write_text("IMPRESSION: Clear.")
    (files / "stray.png").write_bytes(b"")
    studies, failures = scan_folder(files, tmp_path / "reports")
    assert [s.study_id for s in studies] == ["s50414267", "s53189527"]
    s = studies[0]
    assert s.subject_id == "p10000032" and s.dicom_id == "02aa804e-bde0afdd-112c0b34-7bc16630-4e384014"
    assert s.relative_image_path == "p10/p10000032/s50414267/02aa804e-bde0afdd-112c0b34-7bc16630-4e384014.jpg"
    reasons = {f.path.rsplit("/", 1)[-1]: f.reason for f in failures}
    assert "no report" in reasons["abc.jpg"] and "MIMIC-CXR layout" in reasons["stray.png"]


def test_flat_folder_with_jsonl_and_csv_index(tmp_path):
    _img(tmp_path / "img" / "a.png")
    _img(tmp_path / "img" / "b.png")
    (tmp_path / "r_a.txt").write_text("FINDINGS: Small left effusion.")
    rows = [
        {"image": "a.png", "study_id": "123", "report_path": "r_a.txt", "view": "PA"},
        {"image": "b.png", "study_id": "s456", "report": "IMPRESSION: Cardiomegaly."},
        {"image": "missing.png", "study_id": "789", "report": "x"},
        {"image": "b.png", "study_id": "999"},
    ]
    index = tmp_path / "index.jsonl"
    index.write_text("\n".join(json.dumps(r) for r in rows))
    studies, failures = scan_folder(tmp_path / "img", index=index)
    assert [(s.study_id, s.view) for s in studies] == [("s123", "PA"), ("s456", None)]
    assert studies[0].report_path == tmp_path / "r_a.txt" and studies[1].report_text.startswith("IMPRESSION")
    assert len(failures) == 2 and "not found" in failures[0].reason and "neither" in failures[1].reason

    csv_index = tmp_path / "index.csv"
    csv_index.write_text("image,study_id,report\na.png,1,FINDINGS: ok.\n")
    studies, failures = scan_folder(tmp_path / "img", index=csv_index)
    assert [s.study_id for s in studies] == ["s1"] and not failures


def test_symlink_loops_dangling_links_and_empty_images_are_failures(tmp_path):
    files = tmp_path / "files"
    study = files / "p10/p10000032/s50414267"
    _img(study / "good.jpg")
    (study / "loop.jpg").symlink_to(study / "loop.jpg")
    (study / "a.jpg").symlink_to(study / "b.jpg")
    (study / "b.jpg").symlink_to(study / "a.jpg")
    (study / "dangling.jpg").symlink_to(study / "gone.jpg")
    (study / "empty.jpg").write_bytes(b"")
    (study / "linked.jpg").symlink_to(study / "good.jpg")  # a good link is an image like any other
    (files / "p10/p10000032/s50414267.txt").write_text("FINDINGS: Clear.")
    studies, failures = scan_folder(files)
    assert sorted(s.image_path.name for s in studies) == ["good.jpg", "linked.jpg"]
    reasons = {f.path.rsplit("/", 1)[-1]: f.reason for f in failures}
    assert set(reasons) == {"loop.jpg", "a.jpg", "b.jpg", "dangling.jpg", "empty.jpg"}
    assert all("symbolic link loop" in reasons[n] for n in ("loop.jpg", "a.jpg", "b.jpg"))
    assert "target does not exist" in reasons["dangling.jpg"] and "empty (0 bytes)" in reasons["empty.jpg"]
    assert all(f.stage == "scan" for f in failures)


def test_index_rows_name_loops_and_empty_images(tmp_path):
    img = tmp_path / "img"
    _img(img / "a.png")
    (img / "loop.png").symlink_to(img / "loop.png")
    (img / "empty.png").write_bytes(b"")
    rows = [{"image": n, "study_id": str(i), "report": "FINDINGS: ok."}
            for i, n in enumerate(("a.png", "loop.png", "empty.png"))]
    index = tmp_path / "index.jsonl"
    index.write_text("\n".join(json.dumps(r) for r in rows))
    studies, failures = scan_folder(img, index=index)
    assert [s.study_id for s in studies] == ["s0"]
    assert "symbolic link loop" in failures[0].reason and failures[0].path.endswith("loop.png")
    assert "empty (0 bytes)" in failures[1].reason and failures[1].path.endswith("empty.png")


def test_one_study_with_two_reports_is_a_failure_naming_both_rows(tmp_path):
    """Two index rows giving one study different reports: the second row is a failure naming the first (nothing
    dropped silently); rows of one study with the same report (a file or its text) are its images."""
    for name in ("a.png", "b.png", "c.png", "d.png"):
        _img(tmp_path / "img" / name)
    (tmp_path / "r1.txt").write_text("FINDINGS: Small right effusion.\n")
    (tmp_path / "r1_copy.txt").write_text("FINDINGS: Small right effusion.")
    rows = [
        {"image": "a.png", "study_id": "12345", "report_path": "r1.txt"},
        {"image": "b.png", "study_id": "12345", "report_path": "r1_copy.txt"},  # the same text: one study, 2 images
        {"image": "c.png", "study_id": "12345", "report": "Lungs clear."},  # another report
        {"image": "d.png", "study_id": "777", "report": "Lungs clear."},
    ]
    index = tmp_path / "index.jsonl"
    index.write_text("\n".join(json.dumps(r) for r in rows))
    studies, failures = scan_folder(tmp_path / "img", index=index)
    assert [(s.study_id, s.image_path.name) for s in studies] == [("s12345", "a.png"), ("s12345", "b.png"),
                                                                 ("s777", "d.png")]
    assert len(failures) == 1 and failures[0].path == f"{index}:3"
    assert "s12345 has another report in" in failures[0].reason and f"{index}:1" in failures[0].reason


def test_an_index_without_report_columns_takes_its_reports_from_a_table(tmp_path):
    from click.testing import CliRunner

    from cxrground.cli import main
    from cxrground.ils.tasks import build_tasks

    for name in ("a.png", "b.png", "c.png"):
        _img(tmp_path / "img" / name)
    index = tmp_path / "index.csv"
    index.write_text("image,study_id\na.png,s50000001\nb.png,s50000002\nc.png,s50000003\n")
    table = tmp_path / "reports.jsonl"
    table.write_text('{"study_id": "s50000001", "report": "FINDINGS: Small right pleural effusion."}\n'
                     '{"study_id": "50000002", "report": "FINDINGS: Cardiomegaly."}\n')
    tasks, failures = build_tasks(tmp_path / "img", reports=table, index=index)
    assert [(t.study_key, t.report_text) for t in tasks] == [("s50000001", "FINDINGS: Small right pleural effusion."),
                                                             ("s50000002", "FINDINGS: Cardiomegaly.")]
    assert [f.reason for f in failures] == [f"no report for s50000003 in {table}"]
    scan = CliRunner().invoke(main, ["scan", "--images", str(tmp_path / "img"), "--index", str(index), "--reports",
                                     str(table)])
    assert scan.exit_code == 0, scan.output
    assert "2 studies (2 images), 1 failure" in scan.output and "no report for s50000003" in scan.output
    # without the table the rows need a report
    _, failures = build_tasks(tmp_path / "img", index=index)
    assert len(failures) == 3 and all("neither 'report_path' nor 'report'" in f.reason for f in failures)


def test_dicom_files_without_an_image_suffix_are_films_and_other_files_are_not(tmp_path):
    """A DICOM named by its UID (``1.2.840.5``) or with no suffix is found by its DICM marker, by scan_folder and
    find_images alike; a file of another kind with no suffix is neither a film nor a failure."""
    import numpy as np

    from cxrground.io.dicom import write_dicom
    from cxrground.io.image import find_images

    files = tmp_path / "files"
    one, two = files / "p10/p10000001/s50000001", files / "p10/p10000002/s50000002"
    pixels = np.full((8, 8), 900, np.uint16)
    write_dicom(one / "img1.dcm", pixels)
    write_dicom(one / "img2.dcm", pixels).rename(one / "img2")
    write_dicom(two / "x.dcm", pixels).rename(two / "1.2.840.5")
    (two / "README").write_bytes(b"\x00" * 200)  # no DICM marker: not a film
    for study in (one, two):
        (study.parent / f"{study.name}.txt").write_text("FINDINGS: Clear.")
    studies, failures = scan_folder(files)
    assert [(s.study_id, s.dicom_id, s.relative_image_path) for s in studies] == [
        ("s50000001", "img1", "p10/p10000001/s50000001/img1.dcm"),
        ("s50000001", "img2", "p10/p10000001/s50000001/img2"),
        ("s50000002", "1.2.840.5", "p10/p10000002/s50000002/1.2.840.5")]
    assert failures == []
    assert [p.name for p in find_images(files)] == ["img1.dcm", "img2", "1.2.840.5"]


def test_object_storage_finds_dicom_files_without_an_image_suffix_reading_their_first_bytes_only(tmp_path,
                                                                                                monkeypatch):
    """On object storage (fsspec's in-memory file system here) a DICOM named by its UID or with no suffix is found by
    its DICM marker as in a folder: the same studies as scan_folder, each such object read by one ranged request of
    its first 132 bytes; reports, tables, tiny objects and images with a suffix are not read at all."""
    import numpy as np
    from fsspec.implementations.memory import MemoryFileSystem

    from cxrground.datasets.folder import scan_store
    from cxrground.io.dicom import write_dicom
    from cxrground.io.image import read_image
    from cxrground.io.store import local_copy

    files = tmp_path / "files"
    one, two = files / "p10/p10000001/s50000001", files / "p10/p10000002/s50000002"
    pixels = np.full((8, 8), 900, np.uint16)
    write_dicom(one / "img1.dcm", pixels)
    write_dicom(one / "img2.dcm", pixels).rename(one / "img2")
    write_dicom(two / "x.dcm", pixels).rename(two / "1.2.840.5")
    (two / "README").write_bytes(b"\x00" * 200)  # no DICM marker: not a film
    (two / "tiny").write_bytes(b"\x00" * 20)  # too short to hold the marker: not read
    (two / "notes.csv").write_bytes(b"a,b\n" * 100)
    for study in (one, two):
        (study.parent / f"{study.name}.txt").write_text("FINDINGS: Clear.")
    fs = MemoryFileSystem()
    fs.put(str(files), "/scanstore/files", recursive=True)
    reads: list[tuple[str, int | None, int | None]] = []
    whole = MemoryFileSystem.cat_file

    def cat_file(self, path, start=None, end=None, **kwargs):
        reads.append((path.rsplit("/", 1)[-1], start, end))
        return whole(self, path, start=start, end=end, **kwargs)

    monkeypatch.setattr(MemoryFileSystem, "cat_file", cat_file)
    try:
        studies, failures = scan_store("memory://scanstore/files")
        local, _ = scan_folder(files)
        assert failures == []
        assert [(s.study_id, s.dicom_id, s.relative_image_path, s.report_path) for s in studies] == [
            (s.study_id, s.dicom_id, s.relative_image_path,
             f"memory://scanstore/files/{Path(s.report_path).relative_to(files).as_posix()}") for s in local]
        assert [s.dicom_id for s in studies] == ["img1", "img2", "1.2.840.5"]
        assert sorted(reads) == [("1.2.840.5", 0, 132), ("README", 0, 132), ("img2", 0, 132)]
        monkeypatch.setattr(MemoryFileSystem, "cat_file", whole)
        with local_copy(studies[2].image_path) as path:  # the worker fetches it and reads it as DICOM
            assert read_image(path).shape == (8, 8)
    finally:
        fs.rm("/scanstore", recursive=True)


def test_two_ids_that_name_one_study_key_are_a_failure_naming_both_rows(tmp_path):
    """``125`` and ``s125`` both become study ``s125``: the second row is a failure naming the first, never a
    second image of one study; the id as given stays visible (given_study_id, scan --json)."""
    from click.testing import CliRunner

    from cxrground.cli import main
    from cxrground.ils.tasks import read_split_file, report_table

    for name in ("a.png", "b.png", "c.png"):
        _img(tmp_path / "img" / name)
    index = tmp_path / "index.csv"
    index.write_text("image,study_id,report\na.png,125,FINDINGS: Clear.\nb.png,s125,FINDINGS: Clear.\n"
                     "c.png,abc,FINDINGS: Clear.\n")
    studies, failures = scan_folder(tmp_path / "img", index=index)
    assert [(s.study_id, s.given_study_id, s.image_path.name) for s in studies] == [
        ("s125", "125", "a.png"), ("sabc", "abc", "c.png")]
    assert [f.path for f in failures] == [f"{index}:3"]
    assert f"'s125' and study id '125' in {index}:2 both name study s125" in failures[0].reason
    res = CliRunner().invoke(main, ["scan", "--images", str(tmp_path / "img"), "--index", str(index), "--json"])
    lines = [json.loads(line) for line in res.output.splitlines()]
    assert [(r["study_id"], r["given_study_id"]) for r in lines if "study_id" in r] == [("s125", "125"),
                                                                                         ("sabc", "abc")]
    table = tmp_path / "reports.jsonl"
    table.write_text('{"study_id": "125", "report": "FINDINGS: a."}\n{"study_id": "s125", "report": "FINDINGS: b."}\n')
    texts, bad = report_table(table)
    assert texts == {"s125": "FINDINGS: a."} and len(bad) == 1 and bad[0].path.endswith("reports.jsonl:2")
    assert "both name study s125" in bad[0].reason
    split = tmp_path / "split.csv"
    split.write_text("study_id,split\n125,train\ns125,test\n")
    with pytest.raises(InputError, match="both name study s125"):
        read_split_file(split)


def test_one_study_id_under_two_subjects_is_a_failure_naming_both_folders(tmp_path):
    """MIMIC-CXR layout: ``s50000001`` under two patients is one study of the first patient (path order) and a
    failure naming both folders, never one study with two reports; an index that gives one study two subjects
    likewise. ``scan --json`` carries the subject."""
    from click.testing import CliRunner

    from cxrground.cli import main

    files = tmp_path / "files"
    for subject in ("p10/p10000001", "p11/p11000009"):
        _img(files / subject / "s50000001" / "a.png")
        (files / subject / "s50000001.txt").write_text(f"FINDINGS: {subject}.")
    studies, failures = scan_folder(files)
    assert [(s.study_id, s.subject_id) for s in studies] == [("s50000001", "p10000001")]
    assert [f.path for f in failures] == [str(files / "p11/p11000009/s50000001")]
    assert f"also under subject p10000001 ({files / 'p10/p10000001/s50000001'})" in failures[0].reason
    res = CliRunner().invoke(main, ["scan", "--images", str(files), "--json"])
    assert json.loads(res.output.splitlines()[0])["subject_id"] == "p10000001"

    index = tmp_path / "index.csv"
    index.write_text("image,study_id,subject_id,report\nfiles/p10/p10000001/s50000001/a.png,7,p1,FINDINGS: x.\n"
                     "files/p11/p11000009/s50000001/a.png,7,p2,FINDINGS: x.\n")
    studies, failures = scan_folder(tmp_path, index=index)
    assert len(studies) == 1 and [f.path for f in failures] == [f"{index}:3"]
    assert f"of subject p1 in {index}:2 and of subject p2 here" in failures[0].reason


def test_films_the_index_does_not_name_are_listed_and_a_repeated_row_is_read_once(tmp_path, caplog):
    """A film under the folder that no index row names is listed (scan's summary and --json), not dropped silently;
    a repeated row is a failure naming the first (not a second image), as is one film listed under two studies."""
    from click.testing import CliRunner

    from cxrground.cli import main
    from cxrground.datasets.folder import films_not_in_index

    for name in ("a.png", "b.png", "unlisted.png", "sub/also.jpg"):
        _img(tmp_path / "img" / name)
    (tmp_path / "img" / "notes.txt").write_text("not a film")
    index = tmp_path / "index.csv"
    index.write_text("image,study_id,report\na.png,1,FINDINGS: x.\na.png,1,FINDINGS: x.\nb.png,2,FINDINGS: y.\n"
                     "b.png,3,FINDINGS: y.\nmissing.png,4,FINDINGS: z.\n")
    studies, failures = scan_folder(tmp_path / "img", index=index)
    assert [(s.study_id, s.image_path.name) for s in studies] == [("s1", "a.png"), ("s2", "b.png")]
    assert [(f.path, f.reason) for f in failures[:2]] == [
        (f"{index}:3", f"repeats {index}:2 (the same image of the same study: read once)"),
        (f"{index}:5", f"image also listed for study s2 in {index}:4: a film belongs to one study")]
    unlisted = films_not_in_index(index, tmp_path / "img")
    assert [p.relative_to(tmp_path / "img").as_posix() for p in unlisted] == ["sub/also.jpg", "unlisted.png"]
    args = ["scan", "--images", str(tmp_path / "img"), "--index", str(index)]
    res = CliRunner().invoke(main, args)
    assert "2 studies (2 images), 3 failures" in res.output
    assert "2 films under the image folder are not in the index and not used:" in res.output
    assert f"  not in the index: {tmp_path / 'img' / 'unlisted.png'}" in res.output
    res = CliRunner().invoke(main, [*args, "--json"])
    assert [json.loads(line)["not_in_index"] for line in res.output.splitlines() if "not_in_index" in line] == [
        str(p) for p in unlisted]
    from cxrground.ils.tasks import build_tasks

    tasks, failures = build_tasks(tmp_path / "img", index=index)
    assert len(tasks) == 2 and "2 films under" in caplog.text and "are not in the index" in caplog.text
    # ils build records each as a failure (failures.jsonl, the card's count, --strict), after the index's own
    unindexed = [f for f in failures if f.reason.startswith("film not in the index")]
    assert [f.path for f in unindexed] == [str(p) for p in unlisted] and failures[-2:] == unindexed
    assert unindexed[0].reason == (f"film not in the index (no row of {index} names it, so it is not used: add a row "
                                   "for it, or move it out of the image folder)") and unindexed[0].stage == "scan"


def test_scan_json_tells_where_each_report_comes_from_and_names_every_path_absolute(tmp_path, monkeypatch):
    """scan --json: ``report_from`` tells an index row's inline text from a report file and from no report, and
    every path (images, reports, failures of the file system and of --check) is absolute, however the folder was
    given."""
    from click.testing import CliRunner

    from cxrground.cli import main

    for name in ("a.png", "b.png"):
        _img(tmp_path / "img" / name)
    (tmp_path / "img" / "zero.png").write_bytes(b"")
    (tmp_path / "img" / "bad.png").write_bytes(b"not a png at all")
    (tmp_path / "r.txt").write_text("FINDINGS: Clear.")
    rows = [{"image": "a.png", "study_id": "1", "report": "FINDINGS: Clear."},
            {"image": "b.png", "study_id": "2", "report_path": "r.txt"},
            {"image": "zero.png", "study_id": "3", "report": "FINDINGS: x."},
            {"image": "bad.png", "study_id": "4", "report": "FINDINGS: y."}]
    (tmp_path / "index.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(main, ["scan", "--images", "img", "--index", "index.jsonl", "--json", "--check"])
    lines = [json.loads(line) for line in res.output.splitlines()]
    studies = [r for r in lines if "study_id" in r]
    assert [(r["report_from"], r["report"], r["image"], r["relative_image_path"]) for r in studies] == [
        ("index", None, str(tmp_path / "img/a.png"), "a.png"),
        ("file", str(tmp_path / "r.txt"), str(tmp_path / "img/b.png"), "b.png")]
    assert [r["failure"]["path"] for r in lines if "failure" in r] == [str(tmp_path / "img/zero.png"),
                                                                       str(tmp_path / "img/bad.png")]


def test_link_loops_are_named_as_loops_by_scan_and_the_report_readers(tmp_path):
    """A study folder that links back to a folder above it is a loop (not "holds no image"), and a report that is a
    link to itself is a loop in the report readers as in scan (not "file does not exist")."""
    from cxrground.reports.readers import read_reports

    files = tmp_path / "files"
    _img(files / "p13/p13000001/s50000001/a.png")
    (files / "p13/p13000001/s50000001.txt").write_text("FINDINGS: Clear.")
    (files / "p13/p13000022").mkdir(parents=True)
    (files / "p13/p13000022/s50000022").symlink_to(files / "p13", target_is_directory=True)
    studies, failures = scan_folder(files)
    assert len(studies) == 1
    assert [(f.path, f.reason) for f in failures] == [(str(files / "p13/p13000022/s50000022"), "symbolic link loop: "
                                                       f"the folder link leads back to {files / 'p13'}, a folder above "
                                                       "it")]
    (tmp_path / "loop.txt").symlink_to(tmp_path / "loop.txt")
    _, failed = read_reports([tmp_path / "loop.txt"], progress=False)
    assert [f.reason for f in failed] == ["symbolic link loop (the link never reaches a file)"]


def test_a_folder_without_films_is_an_error_in_scan_as_in_the_report_commands(tmp_path):
    """An existing folder with nothing to read (a mistyped --images) exits 1 naming it, as `reports label` does for
    a folder without reports; it printed "0 studies" and exited 0."""
    from click.testing import CliRunner

    from cxrground.cli import main

    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "notes.txt").write_text("no film here")
    for args in (["scan", "--images", str(tmp_path / "empty")], ["reports", "label", str(tmp_path / "nothing")]):
        (tmp_path / "nothing").mkdir(exist_ok=True)
        res = CliRunner().invoke(main, args)
        assert res.exit_code == 1 and res.output.startswith("Error: ") and "in this folder or its subfolders" in \
            res.output, res.output
    res = CliRunner().invoke(main, ["scan", "--images", str(tmp_path / "empty"), "--json"])
    assert res.exit_code == 1 and "no films (PNG, JPEG or DICOM)" in res.output


def test_a_csv_index_without_its_columns_is_one_error_naming_the_header(tmp_path):
    """A ';'-separated index (European Excel) reads as one column: one error naming the header and the separator,
    not one failure per row."""
    _img(tmp_path / "img" / "a.png")
    index = tmp_path / "index.csv"
    index.write_text("image;study_id;report\na.png;1;FINDINGS: x.\nb.png;2;FINDINGS: y.\n")
    with pytest.raises(InputError, match=r"index needs the columns image and study_id; its header has "
                                         r"\['image;study_id;report'\] \(separated by ';': save the index with "
                                         r"commas\)"):
        scan_folder(tmp_path / "img", index=index)
    index.write_text("id,text\na.png,x\n")
    with pytest.raises(InputError, match=r"its header has \['id', 'text'\]$"):
        scan_folder(tmp_path / "img", index=index)
