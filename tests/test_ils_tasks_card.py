"""Work units from a folder (one image per study, splits) and the dataset card's tables."""

from __future__ import annotations

import numpy as np
import pytest

from cxrground.errors import ConfigError
from cxrground.ils.card import count_table, recall_table, render_card
from cxrground.ils.tasks import assign_split, build_tasks
from masks_helpers import blank_image as _img


def test_one_image_per_study_and_splits(tmp_path):
    files = tmp_path / "files"
    _img(files / "p10/p10000001/s50000001/bbb.jpg")
    _img(files / "p10/p10000001/s50000001/aaa.jpg")
    _img(files / "p10/p10000002/s50000002/ccc.jpg")
    (files / "p10/p10000001/s50000001.txt").write_text("FINDINGS: Clear.")
    (files / "p10/p10000002/s50000002.txt").write_text("FINDINGS: Clear.")
    tasks, failures = build_tasks(files)
    assert not failures and [t.study_key for t in tasks] == ["s50000001", "s50000002"]
    assert tasks[0].dicom_id == "aaa" and tasks[0].relative_image_path == "p10/p10000001/s50000001/aaa.jpg"
    split_csv = tmp_path / "split.csv"
    split_csv.write_text("dicom_id,study_id,subject_id,split\naaa,50000001,10000001,validate\n")
    tasks, failures = build_tasks(files, split_file=split_csv)
    assert [(t.study_key, t.split) for t in tasks] == [("s50000001", "val")]
    assert "not in the split file" in failures[0].reason
    tasks, _ = build_tasks(files, exclude=["50000002"])
    assert [t.study_key for t in tasks] == ["s50000001"]


def test_reports_from_a_table(tmp_path):
    _img(tmp_path / "files/p10/p10000001/s50000001/a.jpg")
    _img(tmp_path / "files/p10/p10000003/s50000003/c.jpg")
    table = tmp_path / "reports.jsonl"
    table.write_text('{"study_id": "50000001", "report": "FINDINGS: Small left effusion."}\n')
    tasks, failures = build_tasks(tmp_path / "files", table)
    assert [t.study_key for t in tasks] == ["s50000001"] and tasks[0].report_text.startswith("FINDINGS")
    assert "no report" in failures[0].reason


def test_subject_split_is_deterministic_and_follows_ratios():
    splits = [assign_split(f"p{i}", (0.8, 0.1, 0.1)) for i in range(2000)]
    assert splits == [assign_split(f"p{i}", (0.8, 0.1, 0.1)) for i in range(2000)]
    assert 0.75 < splits.count("train") / 2000 < 0.85 and splits.count("test") > 100
    assert assign_split("p1", (0, 0, 1)) == "test"
    with pytest.raises(ConfigError):
        assign_split("p1", (1, 1))


def test_count_table_and_recall():
    split = {"s1": {"instruction_answer_pairs": {
        "positive_pairs": [{"type": "basic", "target": "edema"}, {"type": "lesion_inference", "target": "edema"}],
        "negative_pairs": [{"type": "lesion_inference", "target": "opacity"}, {"type": "global", "target": "effusion"}],
    }}}
    t = count_table(split)
    assert t["edema"]["basic pos"] == 1 and t["edema"]["LI pos"] == 1 and t["edema"]["#IA"] == 2
    assert t["opacity"]["LI neg"] == 1 and t["effusion"]["global neg"] == 1 and t["total"]["#IA"] == 4
    r = recall_table([("edema", True), ("edema", False), ("effusion", True)])
    assert r["edema"]["recall"] == 0.5 and r["effusion"]["recall"] == 1.0
    assert r["avg (6 lung/pleural)"]["recall"] == pytest.approx(0.75)
    card = render_card({"train": split}, [("edema", True)], {"no usable report section": 2}, {"seed": 0})
    assert "| edema | 2 | 1 | 0 | 0 | 0 | 1 | 0 |" in card and "no usable report section | 2" in card
    assert "native size" in card
    assert "Report sections: `findings`: one section per study, findings, else impression" in card
    merged = render_card({"train": split}, [], {}, {"seed": 0, "config": {"sections": "findings+impression"},
                                                      "backends": {"structurer": {"name": "rules",
                                                                                  "alternatives": "present"}}})
    assert "Report sections: `findings+impression`: findings and impression together" in merged
    assert "Structurer: `rules`, alternatives present." in merged


def test_frontal_view_rule():
    from cxrground.datasets.views import is_frontal

    views = ("PA", "AP")
    assert is_frontal("PA", views) and is_frontal("AP SUPINE", views) and is_frontal("AP ERECT", views)
    assert not is_frontal("LATERAL", views) and not is_frontal("AP AXIAL", views) and not is_frontal("PA LLD", views)


def test_segmentation_cross_check():
    from cxrground.anatomy.segment import LungHeartMasks
    from cxrground.ils.config import IlsConfig
    from cxrground.ils.pipeline import segmentation_disagreement

    def masks(shift: int = 0, heart_bottom: int = 80) -> LungHeartMasks:
        r = np.zeros((100, 100), bool)
        lft = np.zeros((100, 100), bool)
        h = np.zeros((100, 100), bool)
        r[10:90, 10 + shift : 45] = True
        lft[10:90, 55:90] = True
        h[50:heart_bottom, 40:65] = True
        return LungHeartMasks(r, lft, h, "truth", "test")

    cfg = IlsConfig()
    assert segmentation_disagreement(masks(), masks(), cfg) is None
    assert segmentation_disagreement(masks(), masks(shift=5), cfg) is None  # exactly 5 % of the width passes
    assert "outer right lung border" in segmentation_disagreement(masks(), masks(shift=6), cfg)
    assert "lowest heart row" in segmentation_disagreement(masks(), masks(heart_bottom=86), cfg)


def test_a_study_whose_first_image_is_empty_uses_its_next_image(tmp_path):
    files = tmp_path / "files"
    (files / "p10/p10000001/s50000001").mkdir(parents=True)
    (files / "p10/p10000001/s50000001/aaa.jpg").write_bytes(b"")  # PA rank and name would pick it first
    _img(files / "p10/p10000001/s50000001/bbb.jpg")
    (files / "p10/p10000002/s50000002").mkdir(parents=True)
    (files / "p10/p10000002/s50000002/ccc.jpg").write_bytes(b"")  # the study's only image
    (files / "p10/p10000001/s50000001.txt").write_text("FINDINGS: Clear.")
    (files / "p10/p10000002/s50000002.txt").write_text("FINDINGS: Clear.")
    tasks, failures = build_tasks(files)
    assert [(t.study_key, t.dicom_id) for t in tasks] == [("s50000001", "bbb")]
    reasons = {f.path.rsplit("/", 1)[-1]: f.reason for f in failures}
    assert set(reasons) == {"aaa.jpg", "ccc.jpg"} and all("empty (0 bytes)" in r for r in reasons.values())


def test_card_tables_survive_multi_line_and_pipe_reasons():
    rejections = {"input: cannot decode\nTraceback line 2\r\n  line 3": 2, "a | b": 1}
    grounding = {"qc failed:\nsecond line": 3}
    card = render_card({}, [], rejections, {"seed": 0}, grounding_reasons=grounding)
    lines = card.splitlines()
    assert "| input: cannot decode Traceback line 2 line 3 | 2 |" in lines
    assert r"| a \| b | 1 |" in lines and "| qc failed: second line | 3 |" in lines
    for title in ("## Studies not in the dataset, by reason", "## Reported positive findings without a mask"):
        start = next(i for i, line in enumerate(lines) if line.startswith(title))
        end = lines.index("", start + 2)
        rows = lines[start + 2:end]
        assert len(rows) >= 3 and all(len(row.replace(r"\|", "").split("|")) == 4 for row in rows), rows


def test_addendum_section_lists_the_studies_whose_addendum_names_a_lesion() -> None:
    from cxrground.ils.card import ADDENDUM_LISTED, addendum_lines

    assert addendum_lines([]) == []
    addenda = [(f"s{i}", ["effusion"] if i % 2 else []) for i in range(2 * ADDENDUM_LISTED + 6)]
    lines = addendum_lines(addenda)
    assert lines[0] == "## Report addenda"
    assert f"{len(addenda)} studies' reports carry an addendum" in lines[2]
    assert f"{ADDENDUM_LISTED + 3} of these addenda name" in lines[2]
    listed = [line for line in lines if line.startswith("- `")]
    assert len(listed) == ADDENDUM_LISTED and listed[0] == "- `s1`: effusion"
    assert lines[-2] == "- and 3 more (`addendum_lesions` in their unit records)"


def test_addendum_lesions_reads_the_addendum_only() -> None:
    from cxrground.reports import parse_report_text
    from cxrground.reports.reading import addendum_lesions

    plain = parse_report_text("FINDINGS: No pleural effusion.", report_id="a")
    assert addendum_lesions(plain) is None
    amended = parse_report_text("FINDINGS: No pleural effusion.\n\nADDENDUM: On review, there is a small left "
                                "pleural effusion and possible right lower lobe pneumonia.", report_id="b")
    assert addendum_lesions(amended) == ("effusion", "pneumonia")
    blank = parse_report_text("FINDINGS: Clear lungs.\n\nADDENDUM: ___", report_id="c")
    assert addendum_lesions(blank) is None


def test_split_file_gzipped_found_beside_files_and_recorded(tmp_path):
    import gzip

    from cxrground.errors import InputError
    from cxrground.ils.card import render_card
    from cxrground.ils.request import BuildRequest
    from cxrground.ils.tasks import read_split_file, split_record

    files = tmp_path / "files"
    _img(files / "p10/p10000001/s50000001/aaa.jpg")
    (files / "p10/p10000001/s50000001.txt").write_text("FINDINGS: Clear.")
    official = tmp_path / "mimic-cxr-2.0.0-split.csv.gz"
    official.write_bytes(gzip.compress(b"dicom_id,study_id,subject_id,split\naaa,50000001,10000001,test\n"
                                       b"bbb,50000001,10000001,test\n"))
    assert read_split_file(official) == {"s50000001": "test"}
    request = BuildRequest(images=files, out=tmp_path / "out")
    assert request.splits() == official
    assert BuildRequest(images=files, out=tmp_path / "o", split_file=tmp_path / "x.csv").splits() == tmp_path / "x.csv"
    tasks, _ = build_tasks(files, split_file=request.splits())
    assert [t.split for t in tasks] == ["test"]
    record = split_record(official, (0.8, 0.1, 0.1))
    assert record["source"] == "file" and len(record["sha256"]) == 64
    card = render_card({"test": {}}, [], {}, {"seed": 0, "split": record})
    assert f"Splits from `{official}`." in card
    hashed = render_card({"test": {}}, [], {}, {"seed": 0, "split": split_record(None, (0.7, 0.15, 0.15))})
    assert "Splits by a hash of the subject id (train 0.7, val 0.15, test 0.15)" in hashed
    bad = tmp_path / "bad.csv"
    bad.write_text("study,part\n1,train\n")
    with pytest.raises(InputError, match="needs study_id and split columns") as err:
        read_split_file(bad)
    assert "bad.csv" in str(err.value)
    bad.write_text("study_id,split\n1,holdout\n")
    with pytest.raises(InputError, match="unknown split 'holdout'"):
        read_split_file(bad)


def test_a_resume_with_another_split_file_is_refused(build_tiny_ils, tiny_ils_tasks, tmp_path):
    from cxrground.ils.build import BackendSpec, build_dataset
    from cxrground.ils.config import IlsConfig
    from cxrground.ils.tasks import split_record

    tasks, failures = tiny_ils_tasks
    out = tmp_path / "out"
    first, second = tmp_path / "a.csv", tmp_path / "b.csv"
    first.write_text("study_id,split\n" + "".join(f"{t.study_key},train\n" for t in tasks))
    second.write_text("study_id,split\n" + "".join(f"{t.study_key},test\n" for t in tasks))
    spec = BackendSpec(synthesizer="pseudo-normal")
    build_dataset(tasks, out, IlsConfig(seed=0), spec, scan_failures=failures, progress=False,
                  split=split_record(first, (0.8, 0.1, 0.1)))
    build_dataset(tasks, out, IlsConfig(seed=0), spec, progress=False, split=split_record(first, (0.8, 0.1, 0.1)))
    with pytest.raises(ConfigError, match="other settings"):
        build_dataset(tasks, out, IlsConfig(seed=0), spec, progress=False, split=split_record(second, (0.8, 0.1, 0.1)))
    with pytest.raises(ConfigError, match="other settings"):
        build_dataset(tasks, out, IlsConfig(seed=0), spec, progress=False, split=split_record(None, (0.8, 0.1, 0.1)))


def test_exclusions_from_lines_and_from_ms_cxr_style_csvs(tmp_path, caplog):
    import gzip
    import logging

    from cxrground.errors import InputError
    from cxrground.ils.request import BuildRequest
    from cxrground.ils.tasks import read_exclusions

    lines = tmp_path / "ids.txt"
    lines.write_text("50000001\n\ns50000002\n50000001\n")
    assert read_exclusions(lines) == ("50000001", "s50000002")
    ms_cxr = tmp_path / "MS_CXR_Local_Alignment_v1.1.0.csv"
    ms_cxr.write_text("dicom_id,category_name,label_text,path,x,y,w,h,image_width,image_height\n"
                      "aaa,Pneumonia,left pneumonia,files/p10/p10000001/s50000001/aaa.jpg,1,2,3,4,100,100\n"
                      'bbb,Edema,"edema, mild",files/p10/p10000002/s50000002/bbb.jpg,1,2,3,4,100,100\n')
    assert read_exclusions(ms_cxr) == ("s50000001", "s50000002")
    table = tmp_path / "ex.csv.gz"
    table.write_bytes(gzip.compress(b"study_id,reason\n50000003,leak\n"))
    assert read_exclusions(table) == ("50000003",)
    files = tmp_path / "files"
    for n in (1, 2, 3):
        _img(files / f"p10/p1000000{n}/s5000000{n}/x{n}.jpg")
        (files / f"p10/p1000000{n}/s5000000{n}.txt").write_text("FINDINGS: Clear.")
    request = BuildRequest(images=files, out=tmp_path / "out", exclude=ms_cxr)
    tasks, _ = build_tasks(files, exclude=request.excluded())
    assert [t.study_key for t in tasks] == ["s50000003"]
    with caplog.at_level(logging.WARNING, logger="cxrground.ils.tasks"):
        build_tasks(files, exclude=["s59999999"])
    assert "none of the 1 excluded study ids is among the 3 studies" in caplog.text
    for content, reason in (("50000001 50000002\n", "line 1 is not one study id"),
                            ("dicom_id,label\naaa,x\n", "needs a study_id or path column"),
                            ("dicom_id,path\naaa,somewhere/aaa.jpg\n", "row 2 names no study")):
        bad = tmp_path / "bad.csv"
        bad.write_text(content)
        with pytest.raises(InputError, match=reason) as err:
            read_exclusions(bad)
        assert "bad.csv" in str(err.value)


def test_an_index_without_subject_ids_is_split_per_study_and_the_card_says_so(tmp_path, caplog):
    from cxrground.ils.tasks import split_record, studies_without_subject

    for name in ("a.png", "b.png", "c.png"):
        _img(tmp_path / "flat" / name)
    rows = ["image,study_id,report", "a.png,1,Clear.", "b.png,2,Clear.", "c.png,3,Clear."]
    (tmp_path / "index.csv").write_text("\n".join(rows) + "\n")
    with caplog.at_level("WARNING"):
        tasks, _ = build_tasks(tmp_path / "flat", index=tmp_path / "index.csv")
    assert studies_without_subject(tasks) == 3 and [t.subject_id for t in tasks] == ["s1", "s2", "s3"]
    assert "3 of 3 studies have no subject id" in caplog.text
    record = split_record(None, (0.8, 0.1, 0.1), studies_without_subject(tasks))
    card = render_card({"test": {}}, [], {}, {"seed": 0, "split": record})
    assert "; 3 studies named no subject (no `subject_id` in the index) and were each split on its own, so" in card
    (tmp_path / "index.csv").write_text("image,study_id,subject_id,report\na.png,1,p7,Clear.\nb.png,2,p7,Clear.\n")
    caplog.clear()
    with caplog.at_level("WARNING"):
        tasks, _ = build_tasks(tmp_path / "flat", index=tmp_path / "index.csv")
    assert studies_without_subject(tasks) == 0 and len({t.split for t in tasks}) == 1
    assert "no subject id" not in caplog.text
    assert "studies_without_subject" not in split_record(None, (0.8, 0.1, 0.1), 0)  # as before: settings unchanged
    assert "all studies of a patient share a split." in render_card(
        {"test": {}}, [], {}, {"seed": 0, "split": split_record(None, (0.8, 0.1, 0.1), 0)})


def test_studies_without_pairs_are_counted_on_the_summary_and_named_on_the_card():
    from cxrground.ils.build import BuildSummary
    from cxrground.ils.card import NO_PAIRS_LISTED, no_pairs_lines
    from cxrground.ils.request import build_lines

    summary = BuildSummary("out", 117, 0, 108, 509, 2, 1.0, without_pairs=7)
    assert "(117 processed, 0 already done, 2 failures, 7 without pairs: named on the card)" in build_lines(summary)[0]
    assert "without pairs" not in build_lines(BuildSummary("out", 3, 0, 3, 9, 0, 1.0))[0]
    keys = [f"s{i}" for i in range(NO_PAIRS_LISTED)]
    text = "\n".join(no_pairs_lines(keys, NO_PAIRS_LISTED + 5))
    assert "## Studies without pairs" in text and "`s0`" in text and "and 5 more" in text
    assert no_pairs_lines([], 0) == []
